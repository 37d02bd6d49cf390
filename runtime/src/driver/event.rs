//! Pooled CUDA events (raw driver calls, kept to this module).
//!
//! Completion events are created with timing disabled and blocking sync (the watcher
//! sleeps in `cuEventSynchronize` instead of spinning); a timing pool
//! ([`EventPool::timing`]) holds the events that time sampled ops on the device.
//! Pooling matters under concurrency: `cuEventCreate` and `cuEventDestroy` take driver
//! locks that the other actors' launches wait on (on the H200 host, with a fresh pair
//! of events for one op in 32, the 8-chain's fused eager form on 4 streams took 8.2 ms
//! against 5.5 ms with the sampling off: `benches/RESULTS.md`, run j2).
//!
//! An event goes back to its stream's pool only when the last holder drops it: the
//! storage whose ready mark it is, the watcher, any consumer mid-wait. Re-recording an
//! event that a consumer may still wait on would make the consumer wait on later work
//! (and could close a cycle between streams), so a pooled event is never shared between
//! two live marks.

use std::sync::Arc as StdArc;
use std::sync::Mutex as StdMutex;

use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};

/// A CUDA event owned by rtx.
pub(crate) struct RawEvent {
    ev: sys::CUevent,
    ctx: StdArc<CudaContext>,
}

// SAFETY: a CUevent is an opaque driver handle; the driver API is thread-safe for events
// (record, wait, synchronize and destroy may be called from any thread with the context).
unsafe impl Send for RawEvent {}
// SAFETY: as above; no method takes `&mut`-only driver state.
unsafe impl Sync for RawEvent {}

impl RawEvent {
    /// A completion event (`timing` false: timing disabled, blocking sync) or a timing
    /// event (`timing` true: the default flags, which keep timing).
    fn new(ctx: &StdArc<CudaContext>, timing: bool) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let mut ev = std::ptr::null_mut();
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT as u32
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
                | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
        };
        // SAFETY: `ev` is a valid out-pointer and the context is bound to this thread.
        unsafe { sys::cuEventCreate(&mut ev, flags) }.result()?;
        Ok(RawEvent {
            ev,
            ctx: ctx.clone(),
        })
    }

    /// Captures the work enqueued on `stream` so far.
    pub(crate) fn record(&self, stream: &CudaStream) -> Result<(), DriverError> {
        // SAFETY: the event is live (owned by self) and the stream is live (borrowed).
        unsafe { sys::cuEventRecord(self.ev, stream.cu_stream()) }.result()
    }

    /// Makes `stream` wait (on the device) for the captured work.
    pub(crate) fn wait_on(&self, stream: &CudaStream) -> Result<(), DriverError> {
        // SAFETY: both handles are live for the duration of the call.
        unsafe {
            result::stream::wait_event(
                stream.cu_stream(),
                self.ev,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
    }

    /// Blocks the calling thread until the captured work is done (sleeping, not spinning).
    pub(crate) fn synchronize(&self) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the event is live (owned by self).
        unsafe { result::event::synchronize(self.ev) }
    }

    /// Milliseconds on the device from `self` to `later`, both timing events of one
    /// context ([`EventPool::timing`]) whose work has completed.
    pub(crate) fn elapsed_ms(&self, later: &RawEvent) -> Result<f32, DriverError> {
        // SAFETY: both events are live (borrowed); the driver checks that both were
        // recorded, have completed and keep timing.
        unsafe { result::event::elapsed(self.ev, later.ev) }
    }

    /// Whether the captured work is done, without blocking.
    pub(crate) fn query(&self) -> Result<bool, DriverError> {
        // SAFETY: the event is live (owned by self).
        match unsafe { sys::cuEventQuery(self.ev) } {
            sys::cudaError_enum::CUDA_SUCCESS => Ok(true),
            sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(DriverError(e)),
        }
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: the event was created by `new` and is destroyed exactly once, here.
        self.ctx
            .record_err(unsafe { result::event::destroy(self.ev) });
    }
}

/// A free list of events for one stream.
pub(crate) struct EventPool {
    ctx: StdArc<CudaContext>,
    free: StdMutex<Vec<RawEvent>>,
    timing: bool,
}

impl EventPool {
    /// A pool of completion events (no timing, blocking sync).
    pub(crate) fn new(ctx: StdArc<CudaContext>) -> StdArc<Self> {
        Self::with_timing(ctx, false)
    }

    /// A pool of timing events ([`RawEvent::elapsed_ms`]).
    pub(crate) fn timing(ctx: StdArc<CudaContext>) -> StdArc<Self> {
        Self::with_timing(ctx, true)
    }

    fn with_timing(ctx: StdArc<CudaContext>, timing: bool) -> StdArc<Self> {
        StdArc::new(EventPool {
            ctx,
            free: StdMutex::new(Vec::new()),
            timing,
        })
    }

    /// An event recorded now on `stream`.
    pub(crate) fn record(
        self: &StdArc<Self>,
        stream: &CudaStream,
    ) -> Result<PooledEvent, DriverError> {
        let ev = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let ev = match ev {
            Some(e) => e,
            None => RawEvent::new(&self.ctx, self.timing)?,
        };
        ev.record(stream)?;
        Ok(PooledEvent {
            event: Some(ev),
            pool: self.clone(),
        })
    }
}

/// An event that returns to its pool when dropped.
pub(crate) struct PooledEvent {
    event: Option<RawEvent>,
    pool: StdArc<EventPool>,
}

impl PooledEvent {
    /// The event.
    pub(crate) fn event(&self) -> &RawEvent {
        self.event.as_ref().expect("present until drop")
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < 256 {
                free.push(e);
            }
        }
    }
}
