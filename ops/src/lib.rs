//! rtx-ops
#![deny(unsafe_op_in_unsafe_fn)]

pub mod attention;
pub mod conv;
pub mod cpu_util;
pub mod elementwise;
pub mod gemm;
mod kernels;
pub mod reduce;
pub mod softmax;

#[doc(hidden)]
pub use kernels::{donations, set_poison_outputs};
