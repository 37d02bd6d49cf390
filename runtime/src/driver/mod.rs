//! The CUDA driver layer: what the runtime needs of a device below any actor, job or
//! tensor. It depends only on the basics (`error`, `device`, `dtype`, `shape`,
//! `settings`, `stats`, `sync`); everything above may use it (the `layers` test checks).
//!
//! - `device.rs`: opening a device ([`DeviceShared`]: context, poison flag, loaded
//!   modules, pinned cache) and [`probe`];
//! - `event.rs`: pooled CUDA events;
//! - `pool.rs`: stream-ordered memory pools;
//! - `alloc.rs`: each stream actor's block cache, and the allocator handle that device
//!   buffers carry back to it;
//! - `pinned.rs`: the pinned host staging cache for transfers;
//! - `stream.rs`: [`StreamCx`], what a CUDA op sees of its stream;
//! - `batch.rs`: eager launch batching (small ops' launches queued on a stream, one
//!   launch);
//! - `teardown.rs`: the process-wide serialization of driver teardown;
//! - `capture.rs`: the thread-local capture mode (no allocation inside a graph capture);
//! - `reclaim.rs`: out of memory inside a library: empty the caches, retry once;
//! - `parking.rs`: frees from other threads held back while their stream is captured.

pub(crate) mod alloc;
pub(crate) mod batch;
pub(crate) mod block_cache;
pub(crate) mod capture;
mod device;
pub(crate) mod event;
pub(crate) mod parking;
pub(crate) mod pinned;
mod pool;
pub(crate) mod reclaim;
mod stream;
pub(crate) mod teardown;

pub use alloc::{alloc_uninit, CACHE_MAX_BLOCK, CACHE_MAX_BYTES};
pub use batch::{Geometry, BATCH_STEPS, BATCH_STEP_BYTES};
#[cfg(any(test, feature = "test-util"))]
pub use device::present_for_tests;
pub use device::probe;
pub(crate) use device::{open_device, DeviceShared};
pub use pinned::{PINNED_MAX_BLOCK, PINNED_MAX_BYTES};
pub use reclaim::{is_library_alloc_failure, retry_after_reclaim, Reclaimer};
pub use stream::StreamCx;
