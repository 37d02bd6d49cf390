//! rtx-runtime: the core of rtx.
//!
//! Devices, stream actors, owned tensors, completions (futures), errors, the loom shim,
//! and the CPU and CUDA backends. Users reach all of it through the `rtx` facade crate
//! (`rtx::Runtime`, `rtx::Tensor`...).
//!
//! # Layers
//!
//! The modules of `runtime/src` form layers; each may use the layers below it, never one
//! above (the `layers` test, `runtime/tests/layers.rs`, fails on any import cycle between
//! top-level modules and on a driver or core module naming a layer above it):
//!
//! 1. **Basics** — `error`, `device`, `dtype`, `shape`, `settings`, `stats`, `sync`,
//!    `trace`:
//!    plain types and the loom shim; they depend on nothing else of the crate (the
//!    error type names `device`, `dtype` and `shape`).
//! 2. **Driver** — `driver/`: CUDA contexts and devices, events, memory pools, each
//!    stream's block cache and the allocator handle buffers carry, the pinned staging
//!    cache, [`cuda::StreamCx`]. Depends on the basics only: no actor, job, storage or
//!    runtime.
//! 3. **Core** — `buffer`, `burst`, `storage`, `tensor`, `completion`, `mailbox`, `op`,
//!    `job`, `placement`, `gate`, `reentry`: memory, its sync state, the op contract, jobs in flight. They
//!    name no backend: a storage's CUDA ready mark is a driver event, a buffer's way
//!    back to its block cache a driver allocator handle.
//! 4. **Backends** — `actor` (what the backends share: running a job, what `start`
//!    returns), `cpu/` (the CPU actor and its `start`) and `cuda/` (stream actors,
//!    watchers, transfers and `start`).
//! 5. **Runtime** — `runtime` (builder, submission, placement, shutdown, assembled
//!    from what the backend's `start` returned), `io`, `marker`, `submit_async`.
//!
//! # Protocols
//!
//! Each module documents the part of the protocol it owns:
//!
//! - `storage.rs`: who writes a tensor's memory when, and how readers wait for it;
//! - `completion.rs`: how a finished op wakes its submitter;
//! - `mailbox.rs`: backpressure between submitters and actors;
//! - `gate.rs`: the shutdown gate every job send passes, and why closing it never blocks;
//! - `reentry.rs`: why an op's `run` never waits for the runtime's work (actor threads
//!   are marked, and waits on them fail);
//! - `job.rs`: what travels to an actor and what happens if it is lost;
//! - `burst.rs`: one ready event per burst of ops, and why waiting for it cannot
//!   deadlock;
//! - `cuda/mod.rs`: events, the watcher, keep-alive release and poisoning on CUDA;
//! - `driver/alloc.rs` and `driver/pinned.rs`: why reusing cached device and pinned
//!   blocks is safe.
//!
//! # Settings
//!
//! Every knob is a [`Builder`] option, with an environment variable that overrides it;
//! the table is in [`settings`].
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod actor;
mod buffer;
mod burst;
mod collective;
mod completion;
mod cpu;
pub mod cuda;
mod device;
mod driver;
mod dtype;
mod error;
mod gate;
mod io;
mod job;
#[cfg(all(test, loom))]
mod loom_tests;
mod mailbox;
mod marker;
mod op;
pub mod placement;
mod reentry;
mod runtime;
pub mod settings;
mod shape;
mod stats;
mod storage;
mod submit_async;
mod sync;
mod tensor;
mod trace;

pub use buffer::{Buffer, CpuData, CudaData, Element};
pub use collective::ReduceOp;
pub use completion::{block_on, Submission};
pub use device::{Device, DeviceInfo, StreamId, StreamInfo, StreamKind};
pub use dtype::DType;
pub use error::{CaptureHazard, CublasStatus, CudaCode, CudnnStatus, Error, Result, SubmitError};
pub use marker::Marker;
pub use op::{BackendCx, BufferRef, Cost, ExecCx, Op, Outputs, Plan, PlanCx, TensorSpec};
pub use runtime::graph::{Capture, Graph, Launch};
pub use runtime::{Backend, BackendKind, Builder, Runtime, RuntimeInfo, Shutdown, Values};
pub use settings::{Settings, SmallGemm};
pub use shape::Shape;
pub use stats::{BatchStats, CacheStats, PhaseStats, Stats};
pub use submit_async::SubmitAsync;
pub use tensor::Tensor;
pub use trace::TraceSpan;

pub use half::{bf16, f16};
