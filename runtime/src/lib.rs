//! rtx-runtime: the core of rtx.
//!
//! Devices, stream actors, owned tensors, completions (futures), errors, the loom shim,
//! and the CPU and CUDA backends. See `../shared/DESIGN.md` for the architecture; each
//! module documents the part of the protocol it owns:
//!
//! - `storage.rs`: who writes a tensor's memory when, and how readers wait for it;
//! - `completion.rs`: how a finished op wakes its submitter;
//! - `mailbox.rs`: backpressure between submitters and actors;
//! - `job.rs`: what travels to an actor and what happens if it is lost;
//! - `cuda/mod.rs`: events, the watcher, keep-alive release and poisoning on CUDA.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod actor;
mod buffer;
mod burst;
mod completion;
pub mod cuda;
mod device;
mod dtype;
mod error;
mod io;
mod job;
#[cfg(all(test, loom))]
mod loom_tests;
mod mailbox;
mod marker;
mod op;
pub mod placement;
#[doc(hidden)]
pub mod profile;
mod runtime;
mod shape;
mod storage;
mod submit_async;
mod sync;
mod tensor;

pub use buffer::{Buffer, CpuData, CudaData};
pub use completion::{block_on, Submission};
pub use device::{Device, DeviceInfo, StreamId, StreamInfo, StreamKind};
pub use dtype::{DType, Element};
pub use error::{CublasStatus, CudaCode, CudnnStatus, Error, Result, SubmitError};
pub use marker::Marker;
pub use op::{BackendCx, BufferRef, Cost, ExecCx, Op, Outputs, Plan, PlanCx, TensorSpec};
pub use runtime::{Backend, BackendKind, Builder, Runtime, RuntimeInfo, Shutdown, SubmitAsync};
pub use shape::Shape;
pub use tensor::Tensor;

pub use half::{bf16, f16};
