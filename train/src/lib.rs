//! rtx-train: layers for training on rtx, with hand-written backward passes.
//!
//! Each layer owns its parameters and their gradients as rtx tensors ([`Param`]); its
//! `forward` returns the output and what the backward needs (a context value), and its
//! `backward` takes the output's gradient and that context, stores the parameter
//! gradients and returns the input's gradient. Both only submit ops: no value comes back
//! to the host, so a whole step (forward, loss, backward, optimizer) is a sequence of
//! submissions that the streams run as their inputs become ready.
//!
//! - [`Linear`]: `act(x · wᵀ + b)` over `rtx_ops::gemm::{linear_train, linear_backward}`;
//! - [`Mlp`]: a stack of [`Linear`] layers, whose backward chains the layers so that
//!   each activation's derivative is fused into the GEMM above it where the backend can
//!   (`LinearBackward::input_activation`);
//! - [`Param`] / [`Parameters`]: the (value, gradient) pairs an optimizer takes, with
//!   [`Param::update`] for in-place updates by donation; [`Module`] for anything that
//!   has parameters;
//! - [`init`]: parameter initialization (host-generated from a seed for now);
//! - [`pipeline`]: training jobs (model + optimizer + data + schedule) whose steps are
//!   submissions only, many at once on one runtime, with a data-parallel mode.
//!
//! Gradients are overwritten, not accumulated, by each backward.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod init;
mod linear;
mod mlp;
mod param;
pub mod pipeline;

pub use linear::{Linear, LinearConfig, LinearCtx};
pub use mlp::{Mlp, MlpConfig, MlpCtx};
pub use param::{IterMut, Module, Param, Parameters};

use rtx_runtime::{Error, Op, Result, Runtime};

/// Submits `op` and returns its output handles at once (the op runs asynchronously; an
/// error at run time reaches the ops that read these outputs, and whoever waits on
/// them). A rejected submission is its typed error.
pub(crate) fn submit<O>(rt: &Runtime, op: O) -> Result<O::Output>
where
    O: Op,
    O::Output: Clone,
{
    let name = op.name();
    let sub = rt.submit(op).map_err(|e| e.error)?;
    sub.outputs()
        .cloned()
        .ok_or_else(|| Error::invalid(name, "the op has no tensor outputs"))
}
