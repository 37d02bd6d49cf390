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
//! - [`Conv2d`]: a 2-D convolution (+ bias, + optional fused ReLU) over
//!   `rtx_ops::conv` (cuDNN forward, backward data and backward filter on CUDA); the
//!   bias gradient is two `sum_dim` reductions of `dy`;
//! - [`LayerNorm`], [`Embedding`]: over `rtx_ops::{layer_norm, embedding}` and their
//!   backward ops;
//! - [`Cnn`]: a small CNN (conv, relu, conv, relu, flatten, linear);
//! - [`CausalSelfAttention`] and [`TransformerBlock`] (pre-norm: `x + attn(LN(x))`, then
//!   `x + MLP(LN(x))`), with heads split by `rtx_ops::layout::permute` and the flash
//!   attention op (causal);
//! - [`Mlp`]: a stack of [`Linear`] layers, whose backward chains the layers so that
//!   each activation's derivative is fused into the GEMM above it where the backend can
//!   (`LinearBackward::input_activation`);
//! - [`CharLm`]: a character-level causal transformer (embeddings, blocks, head) and
//!   [`lm`]'s text corpus (the repository's own sources, read at run time) and
//!   training loop;
//! - [`StackedMlp`]: `K` MLPs of one shape as one ensemble (weights `[K, out, in]`,
//!   batched GEMMs), trained exactly as its members would be alone;
//! - [`Param`] / [`Parameters`]: the (value, gradient) pairs an optimizer takes, with
//!   [`Param::update`] for in-place updates by donation; [`Module`] for anything that
//!   has parameters;
//! - [`AdamW`]: the optimizer over a [`Parameters`] list (one fused `adamw` op per
//!   step, in place by donation);
//! - [`init`]: parameter initialization (host-generated from a seed for now);
//! - [`pipeline`]: training jobs (model + optimizer + data + schedule) whose steps are
//!   submissions only, many at once on one runtime, with a data-parallel mode.
//!
//! Gradients are overwritten, not accumulated, by each backward.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod attention;
mod block;
mod cnn;
mod conv;
pub mod devices;
mod embedding;
pub mod init;
mod layer_norm;
mod linear;
pub mod lm;
mod mlp;
mod optim;
mod param;
pub mod pipeline;
mod stacked;

pub use attention::{AttentionConfig, AttentionCtx, CausalSelfAttention};
pub use block::{BlockConfig, BlockCtx, TransformerBlock};
pub use cnn::{Cnn, CnnConfig, CnnCtx};
pub use conv::{Conv2d, Conv2dConfig, Conv2dCtx};
pub use devices::DeviceParallel;
pub use embedding::{Embedding, EmbeddingCtx};
pub use layer_norm::{LayerNorm, LayerNormCtx};
pub use linear::{Linear, LinearConfig, LinearCtx};
pub use lm::{train_lm, CharLm, CharLmConfig, LmReport, LmRun, TextCorpus};
pub use mlp::{Mlp, MlpConfig, MlpCtx};
pub use optim::AdamW;
pub use param::{IterMut, Module, Param, Parameters};
pub use stacked::{StackedCtx, StackedMlp};

use rtx_runtime::{Result, Tensor};

/// `a + b` (same shape), for the residual connections and summed gradients.
pub(crate) fn add(rt: &rtx_runtime::Runtime, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    rt.run(rtx_ops::add(a, b))
}
