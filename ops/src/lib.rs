//! rtx-ops: the op library of rtx.
//!
//! One module per family — [`elementwise`], [`reduce`], [`softmax`](mod@softmax),
//! [`gemm`], [`conv`], [`attention`](mod@attention), and for training [`activation`],
//! [`convert`], [`loss`], [`norm`], [`compare`], [`random`], [`optim`], [`layout`],
//! [`embedding`](mod@embedding) — each with its validation (at submit time), its CPU
//! implementation (also the reference) and its CUDA implementation. The common
//! constructors are re-exported here: `rtx::ops::add(&a, &b)`, `rtx::ops::matmul(&a, &b)`,
//! ...
//!
//! Ops that take an input by value (the `*_` forms, e.g. [`add_`], [`relu_`]) may write
//! into that input's memory when the handle they were given is the last one; otherwise
//! they allocate. The result is the same either way.
//!
//! # Layout of a family
//!
//! Every family is a folder `src/<family>/` with the same three parts:
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the family's public face: its parameter types (`Activation`, `Conv2dParams`, `AttnParams`, the op kinds), the op structs and their constructors, validation (`plan`, at submit) and the one `match` on the backend in `run` |
//! | `cpu.rs` (or `cpu.rs` + `cpu/`) | the CPU kernels, public as the reference implementation; they re-export the parameter types they take |
//! | `cuda.rs` (or `cuda/mod.rs` + `cuda/`) | the CUDA side: kernel launches, library (cuBLAS, cuDNN) state and plans; crate-private |
//!
//! A family whose front end outgrows `mod.rs` moves its submit-time rules into one
//! sibling file named for them (`gemm/shape.rs`, `conv/shape.rs`,
//! `attention/geometry.rs`). The CUDA C of every kernel is in `kernels/cuda/*.cu` (the
//! `rtx-kernels` crate), and its launch ABI — block size, grid caps, by-value argument
//! structs — in `rtx_kernels::launch`; a family's `cuda.rs` launches through it and
//! through the helpers of this crate's private `kernels.rs` (function cache, output
//! allocation and poisoning, launch configuration). `docs/writing-an-op.md` walks
//! through a new op.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod activation;
pub mod attention;
pub mod compare;
pub mod conv;
pub mod convert;
mod cpu_util;
mod dim;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
mod kernels;
pub mod layout;
pub mod loss;
pub mod norm;
pub mod optim;
mod plan_cache;
pub mod random;
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
pub use cpu_util::{Float, FloatKind};
pub use dim::Dim;
pub use elementwise::{
    abs, abs_, add, add_, cos, cos_, div, div_, exp, exp_, log, log_, maximum, maximum_, minimum,
    minimum_, mul, mul_, neg, neg_, relu, relu_, sin, sin_, sqrt, sqrt_, sub, sub_,
};
pub use embedding::{embedding, embedding_backward};
pub use gemm::{linear, linear_backward, linear_train, matmul, Activation};
pub use layout::{concat, narrow, permute, transpose};
pub use loss::{cross_entropy, cross_entropy_backward, CrossEntropyOutput};
pub use norm::{layer_norm, layer_norm_backward};
pub use optim::{adamw, grad_norm, sgd};
pub use random::{normal, uniform};
pub use reduce::{
    argmax, argmax_dim, argmin, argmin_dim, max, max_dim, mean, mean_dim, min, min_dim, prod,
    prod_dim, sum, sum_dim,
};
pub use softmax::softmax;

#[cfg(feature = "test-util")]
pub use kernels::{donations, set_poison_outputs};
