//! Scaled dot-product attention (causal, masks, grouped KV heads): forward and backward.
//!
//! - `geometry.rs`: validation at submit shared by both directions (shapes, dtypes,
//!   mask layout, what CUDA supports);
//! - `op.rs`: the public ops [`attention`] and [`attention_backward`] — validation at
//!   submit (shapes, dtypes, mask layout, what CUDA supports), one `match` on the
//!   backend in `run`;
//! - `cpu.rs` (+ `cpu/`): the f32-accumulating CPU reference, forward and backward;
//! - `cuda.rs`: the launches of `kernels/cuda/attention.cu` (FlashAttention-2 for
//!   f16/bf16, D 64 and 128) and, for the forward on compute capability 9.0, of
//!   `kernels/cuda/attention_wgmma.cu` (Hopper `wgmma`, sm_90a; the `mma.sync` forward
//!   is the fallback elsewhere, or if it cannot be loaded; `RTX_ATTN_WGMMA=0` forces the
//!   fallback): the forward and backward launches and the backward's workspace;
//! - `launch.rs`: the `FlashParams` mirror, the kernel table (blocks, shared memory,
//!   grids), which kernel runs on this device, per-stream function setup.
pub mod cpu;
mod cuda;
mod geometry;
mod launch;
mod op;

pub use op::{
    attention, attention_backward, Attention, AttentionBackward, AttentionBackwardInputs,
};
