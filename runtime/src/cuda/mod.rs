//! The CUDA backend: device contexts, stream actors with their event pools and library
//! handles, the completion watcher, transfers.
//!
//! Compiled in every build (cudarc with dynamic loading); used only when [`probe`] finds
//! a driver and a device.
//!
//! # Protocol (per op, see also `storage.rs`)
//!
//! 1. The actor takes the op, and for each input blocks until its producer has
//!    *published* (enqueued, with a ready mark). An input produced on another stream is
//!    waited on by the device (`cuStreamWaitEvent` on the producer's burst event, once
//!    that is recorded); one from this stream needs nothing.
//! 2. It runs the op, which enqueues kernels and sets its outputs, and publishes every
//!    output with the actor's open *burst* as ready mark. The burst's one event is
//!    recorded when the actor hands the burst's ops to its watcher: when its mailbox
//!    runs empty, 16 ops are pending, or before it blocks on another stream (`burst.rs`
//!    says why that cannot deadlock). One event record and one watcher wake-up per
//!    burst instead of per op.
//! 3. The watcher synchronizes events in FIFO order (blocking sync, no spinning), then
//!    completes the submission and hands the envelope back to the actor, which drops it:
//!    the op and its inputs (the keep-alive) are released only now, so memory is never
//!    freed under a kernel. Freed tensor memory goes to the block cache of the stream
//!    actor that allocated it, for its next allocation of that size (`alloc.rs`); other
//!    device memory is freed stream-ordered (`cuMemFreeAsync` on its stream).
//! 4. A failed synchronization is a sticky device error: the device is poisoned, every
//!    pending and later op on it fails with the error, nothing hangs.

pub(crate) mod actor;
mod alloc;
mod context;
pub mod event;
pub(crate) mod io;
mod pinned;
mod pool;

use std::panic::catch_unwind;
use std::sync::Arc as StdArc;
use std::sync::Mutex as StdMutex;

use cudarc::driver::{sys, CudaContext, CudaModule};
use dashmap::DashMap;

pub(crate) use alloc::recycle;
pub use alloc::{alloc_uninit, block_cache_stats, CACHE_MAX_BLOCK, CACHE_MAX_BYTES};
pub use context::StreamCx;
pub use pinned::{pinned_cache_stats, PINNED_MAX_BLOCK, PINNED_MAX_BYTES};

use crate::device::{Device, DeviceInfo, StreamId, StreamInfo, StreamKind};
use crate::error::{Error, Result};
use crate::mailbox::channel;
use crate::placement::{LoadCounters, Policy};
use crate::runtime::{spawn_named, BackendKind, Inner, Runtime, StreamEntry};
use crate::sync::{Arc, AtomicBool, Mutex};

/// Counts the CUDA devices, without panicking when no driver is installed.
pub fn probe() -> std::result::Result<usize, String> {
    let r = catch_unwind(|| {
        // SAFETY: `is_culib_present` only tries to dlopen the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err("CUDA driver library (libcuda) not found".to_string());
        }
        cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e}"))?;
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| format!("cuDeviceGetCount failed: {e}"))
    });
    r.unwrap_or_else(|_| {
        Err("the CUDA driver library is missing symbols (driver too old?)".to_string())
    })
}

/// For tests that need a device: whether a CUDA device is present. Without one the
/// caller should skip its CUDA part (this prints `cuda: skipped (no device)`), unless
/// `RTX_REQUIRE_CUDA=1` is set, which makes a missing device a panic (a failed test)
/// instead of a skip.
pub fn present_for_tests() -> bool {
    match probe() {
        Ok(n) if n > 0 => true,
        other => {
            if std::env::var("RTX_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("RTX_REQUIRE_CUDA=1 but CUDA is unavailable: {other:?}");
            }
            eprintln!("cuda: skipped (no device)");
            false
        }
    }
}

/// A device's shared state: context, poison flag, loaded modules, pinned staging cache.
pub(crate) struct DeviceShared {
    pub(crate) ordinal: usize,
    pub(crate) ctx: StdArc<CudaContext>,
    pub(crate) pinned: StdArc<pinned::PinnedCache>,
    pub(crate) arch: (i32, i32),
    pub(crate) sm_count: u32,
    poison: StdMutex<Option<String>>,
    pub(crate) modules: DashMap<String, StdArc<CudaModule>>,
}

impl DeviceShared {
    pub(crate) fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }
    /// The poisoning error, if the device hit a sticky error.
    pub(crate) fn poisoned(&self) -> Option<Error> {
        let g = self.poison.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(|c| Error::DevicePoisoned {
            device: self.device(),
            cause: c.clone(),
        })
    }
    pub(crate) fn poison(&self, cause: String) {
        let mut g = self.poison.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            tracing::error!(device = self.ordinal, %cause, "CUDA device poisoned");
            *g = Some(cause);
        }
    }
}

/// The CUDA side of a runtime.
pub(crate) struct Devices {
    pub(crate) shared: Vec<StdArc<DeviceShared>>,
    pub(crate) copy_streams: Vec<(usize, StreamId)>,
}

fn open_device(ordinal: usize) -> Result<StdArc<DeviceShared>> {
    let cuda = |call: &str, e: cudarc::driver::DriverError| Error::cuda(call, e);
    let ctx = CudaContext::new(ordinal).map_err(|e| cuda("cuCtxCreate", e))?;
    // SAFETY: called right after creating the context, before any slice exists; the
    // runtime orders every access by its own events from here on.
    unsafe { ctx.disable_event_tracking() };
    let arch = ctx
        .compute_capability()
        .map_err(|e| cuda("cuDeviceGetAttribute", e))?;
    pool::MemPool::keep_memory(&ctx).map_err(|e| cuda("cuMemPoolSetAttribute", e))?;
    let sm = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| cuda("cuDeviceGetAttribute", e))?;
    Ok(StdArc::new(DeviceShared {
        ordinal,
        pinned: pinned::PinnedCache::new(ctx.clone()),
        ctx,
        arch,
        sm_count: sm.max(1) as u32,
        poison: StdMutex::new(None),
        modules: DashMap::new(),
    }))
}

/// Starts a CUDA runtime: `n` compute streams and one copy stream per device.
pub(crate) fn start(
    ords: &[usize],
    n: usize,
    mailbox: usize,
    policy: Arc<dyn Policy>,
) -> Result<Runtime> {
    let mut shared = Vec::new();
    let mut devices = Vec::new();
    for &o in ords {
        let d = open_device(o)?;
        devices.push(DeviceInfo {
            device: d.device(),
            name: d.ctx.name().unwrap_or_else(|_| "CUDA device".into()),
            memory: d.ctx.total_mem().ok(),
            compute_capability: Some(d.arch),
        });
        shared.push(d);
    }
    // Every device gets n compute actors and one copy actor.
    let spin = actor::idle_spin(shared.len() * (n + 1));
    let mut streams = Vec::new();
    let mut threads = Vec::new();
    let mut copy_streams = Vec::new();
    for d in &shared {
        for k in 0..=n {
            let kind = if k < n {
                StreamKind::Compute
            } else {
                StreamKind::Copy
            };
            let id = StreamId(streams.len());
            let (tx, rx) = channel(mailbox);
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let actor = crate::actor::ActorCx {
                stream: id,
                device: d.device(),
                policy: policy.clone(),
            };
            let dev = d.clone();
            let name = format!(
                "rtx-cuda{}-{}{}",
                d.ordinal,
                if kind == StreamKind::Copy {
                    "copy"
                } else {
                    "s"
                },
                k
            );
            let release = tx.clone();
            threads.push(spawn_named(name, move || {
                actor::cuda_actor(rx, release, actor, dev, ready_tx, spin)
            }));
            ready_rx.recv().map_err(|_| Error::Synchronization {
                code: None,
                message: "a stream actor died while starting".into(),
            })??;
            if kind == StreamKind::Copy {
                copy_streams.push((d.ordinal, id));
            }
            streams.push(StreamEntry {
                info: StreamInfo {
                    id,
                    device: d.device(),
                    kind,
                },
                tx,
                load: Arc::new(LoadCounters::default()),
            });
        }
    }
    Ok(Runtime {
        inner: Arc::new(Inner {
            id: crate::runtime::next_runtime_id(),
            kind: BackendKind::Cuda,
            devices,
            streams,
            policy,
            closed: AtomicBool::new(false),
            gate: crate::sync::RwLock::new(false),
            threads: Mutex::new(threads),
            cuda: Some(Devices {
                shared,
                copy_streams,
            }),
        }),
    })
}
