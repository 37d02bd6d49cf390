//! The CUDA side of the timeline recorder (`trace.rs`): a pair of timing events around
//! each op's launches, read by the completion watcher once the op has finished; and the
//! sampled ops' pairs (`Settings::device_timing`) whose device time the placement
//! policy learns from.

use std::sync::Arc as StdArc;
use std::time::Instant;

use cudarc::driver::CudaStream;

use crate::device::StreamId;
use crate::driver::event::{EventPool, PooledEvent};
use crate::trace::{Recorder, TraceSpan};

/// An actor's origin: an event recorded on its (idle) stream and synchronized at the
/// actor's start, and the recorder time of that synchronization.
pub(super) struct Origin {
    event: PooledEvent,
    us: f64,
}

/// The origin of the actor of `stream`, or `None` when the recorder is off or the
/// events cannot be made (then nothing of this stream is traced).
pub(super) fn origin(
    pool: &StdArc<EventPool>,
    stream: &CudaStream,
    rec: &Recorder,
) -> Option<StdArc<Origin>> {
    if !rec.on() {
        return None;
    }
    let made = pool.record(stream).and_then(|e| {
        e.event().synchronize()?;
        Ok(e)
    });
    match made {
        Ok(event) => Some(StdArc::new(Origin {
            event,
            us: rec.us_since_origin(Instant::now()),
        })),
        Err(e) => {
            tracing::warn!(error = %e, "timing events unavailable; this stream is not traced");
            None
        }
    }
}

/// One op's pair of events, the start recorded before its launches, with what its
/// timeline span needs.
pub(super) struct OpTiming {
    origin: StdArc<Origin>,
    pair: Sample,
    stream: StreamId,
    detail: String,
}

impl OpTiming {
    /// Records the start event on `stream` (`None` if that fails: the op is not traced).
    pub(super) fn start(
        origin: &StdArc<Origin>,
        pool: &StdArc<EventPool>,
        stream: &CudaStream,
        id: StreamId,
        detail: String,
    ) -> Option<OpTiming> {
        Some(OpTiming {
            origin: origin.clone(),
            pair: Sample::start(pool, stream)?,
            stream: id,
            detail,
        })
    }

    /// Records the end event behind the op's launches.
    pub(super) fn end(&mut self, pool: &StdArc<EventPool>, stream: &CudaStream) {
        self.pair.end(pool, stream);
    }

    /// Once the op has finished on the device: the device time between its events.
    pub(super) fn device_time(&self) -> Option<std::time::Duration> {
        self.pair.device_time()
    }

    /// Once the op has finished on the device: its span, into `rec`.
    pub(super) fn resolve(self, name: &'static str, rec: &Recorder) {
        let (Ok(from_origin), Some(dur)) = (
            self.origin
                .event
                .event()
                .elapsed_ms(self.pair.start.event()),
            self.pair.device_time(),
        ) else {
            return;
        };
        rec.push(TraceSpan {
            stream: self.stream,
            name,
            detail: self.detail,
            start_us: self.origin.us + f64::from(from_origin) * 1e3,
            dur_us: dur.as_secs_f64() * 1e6,
        });
    }
}

/// A pair of timing events around an op's launches: a traced op's (`OpTiming`), or a
/// sampled op's for the placement policy's cost model (`Settings::device_timing`).
/// Both come from the actor's timing pool and go back to it when the pair drops (no
/// driver call: see `driver/event.rs`).
pub(super) struct Sample {
    start: PooledEvent,
    end: Option<PooledEvent>,
}

impl Sample {
    /// Records the start event on `stream` (`None` if that fails: not timed).
    pub(super) fn start(pool: &StdArc<EventPool>, stream: &CudaStream) -> Option<Sample> {
        let start = pool.record(stream).ok()?;
        Some(Sample { start, end: None })
    }

    /// Records the end event behind the op's launches.
    pub(super) fn end(&mut self, pool: &StdArc<EventPool>, stream: &CudaStream) {
        self.end = pool.record(stream).ok();
    }

    /// Once the op has finished on the device: the time between the events (`None`
    /// without an end event).
    pub(super) fn device_time(&self) -> Option<std::time::Duration> {
        let ms = self
            .start
            .event()
            .elapsed_ms(self.end.as_ref()?.event())
            .ok()?;
        Some(std::time::Duration::from_secs_f64(
            f64::from(ms.max(0.0)) / 1e3,
        ))
    }
}
