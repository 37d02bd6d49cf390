//! The CUDA backend: stream actors with their event pools and library handles, the
//! completion watchers, transfers; [`StreamCx`], what a CUDA op sees of its stream.
//! Built on the driver layer (`runtime/src/driver/`: contexts, events, pools, block and
//! pinned caches), which knows nothing of actors and jobs.
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
//!    actor that produced it, for its next allocation of that size (`driver/alloc.rs`); other
//!    device memory is freed stream-ordered (`cuMemFreeAsync` on its stream).
//! 4. A failed synchronization is a sticky device error: the device is poisoned, every
//!    pending and later op on it fails with the error, nothing hangs.

pub(crate) mod actor;
pub(crate) mod graph;
pub(crate) mod io;
mod timing;
mod watcher;

use std::sync::Arc as StdArc;

#[cfg(any(test, feature = "test-util"))]
pub use crate::driver::present_for_tests;
pub use crate::driver::{
    alloc_uninit, is_library_alloc_failure, probe, retry_after_reclaim, Geometry, Reclaimer,
    StreamCx, BATCH_STEPS, BATCH_STEP_BYTES, CACHE_MAX_BLOCK, CACHE_MAX_BYTES, PINNED_MAX_BLOCK,
    PINNED_MAX_BYTES,
};
pub use graph::CudaGraph;

use crate::actor::{spawn_named, StartCx, Started, StreamEntry};
use crate::device::{DeviceInfo, StreamId, StreamInfo, StreamKind};
use crate::driver::{open_device, DeviceShared};
use crate::error::{Error, Result};
use crate::mailbox::channel;
use crate::placement::LoadCounters;
use crate::sync::Arc;

/// The CUDA backend's state in a runtime: its devices and their copy streams.
pub(crate) struct Devices {
    pub(crate) shared: Vec<StdArc<DeviceShared>>,
    pub(crate) copy_streams: Vec<(usize, StreamId)>,
}

impl Devices {
    /// The copy stream of device `ord`.
    pub(crate) fn copy_stream(&self, ord: usize) -> Result<StreamId> {
        self.copy_streams
            .iter()
            .find(|(o, _)| *o == ord)
            .map(|(_, s)| *s)
            .ok_or_else(|| {
                Error::DeviceNotFound(format!("cuda:{ord} is not a device of this runtime"))
            })
    }
    /// Device `ord`'s shared state.
    pub(crate) fn device(&self, ord: usize) -> Result<&StdArc<DeviceShared>> {
        self.shared
            .iter()
            .find(|d| d.ordinal == ord)
            .ok_or_else(|| {
                Error::DeviceNotFound(format!("cuda:{ord} is not a device of this runtime"))
            })
    }
}

/// Starts the CUDA backend on devices `ords`: `cx.streams` compute streams, one copy
/// stream and, with `comm`, one communication stream (the collectives) per device.
pub(crate) fn start(cx: &StartCx, ords: &[usize], comm: bool) -> Result<Started<Devices>> {
    let mut shared = Vec::new();
    let mut devices = Vec::new();
    for &o in ords {
        let d = open_device(o, cx.counters.clone())?;
        devices.push(DeviceInfo {
            device: d.device(),
            name: d.ctx.name().unwrap_or_else(|_| "CUDA device".into()),
            memory: d.ctx.total_mem().ok(),
            compute_capability: Some(d.arch),
        });
        shared.push(d);
    }
    let n = cx.streams;
    // Every device gets n compute actors, one copy actor and maybe a comm actor.
    let per = n + 1 + usize::from(comm);
    let spin = actor::idle_spin(cx.settings.actor_spin, shared.len() * per);
    let mut streams = Vec::new();
    let mut threads = Vec::new();
    let mut copy_streams = Vec::new();
    for d in &shared {
        for k in 0..per {
            let kind = match k {
                k if k < n => StreamKind::Compute,
                k if k == n => StreamKind::Copy,
                _ => StreamKind::Comm,
            };
            let id = StreamId(streams.len());
            let (tx, rx) = channel(cx.mailbox);
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let actor = cx.actor(id, d.device());
            let dev = d.clone();
            let name = match kind {
                StreamKind::Compute => format!("rtx-cuda{}-s{k}", d.ordinal),
                StreamKind::Copy => format!("rtx-cuda{}-copy{k}", d.ordinal),
                StreamKind::Comm => format!("rtx-cuda{}-comm", d.ordinal),
            };
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
    Ok(Started {
        devices,
        streams,
        threads,
        state: Devices {
            shared,
            copy_streams,
        },
    })
}
