//! Matrix products (batched, transposed, broadcast) and the linear epilogue (bias +
//! activation).
//!
//! - `op.rs`: the [`Matmul`] and [`Linear`] ops — validation at submit, one `match` on
//!   the backend in `run`;
//! - `shape.rs`: the shape rules (batch broadcast, transposes, 32-bit limits);
//! - `cpu.rs`: the CPU kernels (the `gemm` crate, then [`cpu::linear_epilogue`]);
//! - `cuda.rs`: per-stream cuBLAS / cuBLASLt state and the plan cache;
//! - `lt.rs`: cuBLASLt descriptors, layouts and plans at the `result`/`sys` level;
//! - `epilogue.rs` + `epilogue.cu`: the bias + activation kernel where no library
//!   epilogue applies (cuBLAS fallback, convolution);
//! - `device.rs`: what GEMM and convolution share (pointers, workspaces, library
//!   status codes to errors);
//! - `backward.rs` (+ `backward_cpu.rs`, `backward_cuda.rs`): the training forms,
//!   [`linear_train`] (forward saving the pre-activation) and [`linear_backward`]
//!   (`dx`, `dw`, `db`), with cuBLASLt's training epilogues on CUDA.
mod backward;
mod backward_cpu;
mod backward_cuda;
pub mod cpu;
pub(crate) mod cuda;
pub(crate) mod device;
pub(crate) mod epilogue;
mod lt;
mod op;
pub(crate) mod shape;

pub use backward::{
    linear_backward, linear_train, LinearBackward, LinearGrads, LinearSaved, LinearTrain,
};
pub use backward_cpu::activation_grad;
pub use backward_cuda::linear_fused_fallbacks;
pub use cpu::Activation;
pub use cuda::{gemm_lt_fallbacks, gemm_plan_cache_stats};
pub use op::{linear, matmul, Linear, Matmul};
