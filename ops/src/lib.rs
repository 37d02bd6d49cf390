//! rtx-ops: the op library of rtx.
//!
//! One module per family — [`elementwise`], [`reduce`], [`softmax`](mod@softmax),
//! [`gemm`], [`conv`], [`attention`](mod@attention), and for training [`activation`],
//! [`convert`], [`loss`], [`norm`], [`compare`] — each with its validation (at submit
//! time), its CPU implementation (`cpu.rs`, also the reference) and its CUDA
//! implementation. The common constructors are
//! re-exported here: `rtx_ops::add(&a, &b)`, `rtx_ops::matmul(&a, &b)`, ...
//!
//! Ops that take an input by value (the `*_` forms, e.g. [`add_`], [`relu_`]) may write
//! into that input's memory when the handle they were given is the last one; otherwise
//! they allocate. The result is the same either way.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod activation;
pub mod attention;
pub mod compare;
pub mod conv;
pub mod convert;
pub mod cpu_util;
pub mod elementwise;
pub mod gemm;
mod kernels;
pub mod loss;
pub mod norm;
pub mod reduce;
pub mod softmax;

pub use activation::{
    add_scalar, add_scalar_, gelu, gelu_, gelu_backward, gelu_backward_, mul_scalar, mul_scalar_,
    relu_backward, relu_backward_, sigmoid, sigmoid_, sigmoid_backward, sigmoid_backward_, silu,
    silu_, silu_backward, silu_backward_, tanh, tanh_, tanh_backward, tanh_backward_,
};
pub use attention::{attention, attention_backward};
pub use compare::{eq, gt, lt, where_};
pub use conv::{conv2d, conv2d_backward_data, conv2d_backward_filter, Conv2dOpts, Layout};
pub use convert::{cast, fill, ones, zeros};
pub use elementwise::{
    abs, abs_, add, add_, cos, cos_, div, div_, exp, exp_, log, log_, maximum, maximum_, minimum,
    minimum_, mul, mul_, neg, neg_, relu, relu_, sin, sin_, sqrt, sqrt_, sub, sub_,
};
pub use gemm::{linear, matmul, Activation};
pub use loss::{cross_entropy, cross_entropy_backward, CrossEntropyOutput};
pub use norm::{layer_norm, layer_norm_backward};
pub use reduce::{
    argmax, argmax_dim, argmin, argmin_dim, max, max_dim, mean, mean_dim, min, min_dim, prod,
    prod_dim, sum, sum_dim,
};
pub use softmax::softmax;

#[doc(hidden)]
pub use kernels::{donations, set_poison_outputs};
