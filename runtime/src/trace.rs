//! The timeline recorder: what ran on which stream and when, one [`TraceSpan`] per op.
//!
//! Opt-in (setting `trace`, `RTX_TRACE=1`; see [`settings`](crate::settings)). When off,
//! each op pays one load of a flag. When on:
//!
//! - the CPU actors take the host clock before and after each op's `run` (which is the
//!   computation on the CPU backend);
//! - the CUDA actors record a pair of timing events around each op's launches on its
//!   stream; the completion watcher, once the op has finished, reads their device times
//!   (`cuEventElapsedTime`) against an origin event that the actor recorded and
//!   synchronized at its start, taken at the host time of that synchronization. So a
//!   span is device time; spans of different streams share the host clock's origin to
//!   within the few microseconds an idle stream takes to pass an event.
//!
//! [`Runtime::take_trace`](crate::Runtime::take_trace) takes the spans recorded so far.

use std::sync::Mutex;
use std::time::Instant;

use crate::device::StreamId;

/// One op's interval on one stream.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSpan {
    /// The stream that ran it.
    pub stream: StreamId,
    /// The op's name.
    pub name: &'static str,
    /// Its outputs' shapes and dtypes, e.g. `[512, 10] f32`.
    pub detail: String,
    /// Start, in microseconds since the runtime started.
    pub start_us: f64,
    /// Duration in microseconds.
    pub dur_us: f64,
}

/// The recorder of one runtime (inside its counters, which every actor and watcher
/// holds).
pub(crate) struct Recorder {
    on: bool,
    origin: Instant,
    spans: Mutex<Vec<TraceSpan>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new(false)
    }
}

impl Recorder {
    /// A recorder, recording when `on`.
    pub(crate) fn new(on: bool) -> Self {
        Recorder {
            on,
            origin: Instant::now(),
            spans: Mutex::new(Vec::new()),
        }
    }

    /// Whether it records.
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// Microseconds from the recorder's origin to `t` (0 for an earlier `t`).
    pub(crate) fn us_since_origin(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64() * 1e6
    }

    /// Adds a span (when on).
    pub(crate) fn push(&self, span: TraceSpan) {
        if self.on {
            self.spans
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(span);
        }
    }

    /// A span from host instants.
    pub(crate) fn push_host(
        &self,
        stream: StreamId,
        name: &'static str,
        detail: String,
        start: Instant,
        end: Instant,
    ) {
        if self.on {
            let start_us = self.us_since_origin(start);
            let dur_us = end.saturating_duration_since(start).as_secs_f64() * 1e6;
            self.push(TraceSpan {
                stream,
                name,
                detail,
                start_us,
                dur_us,
            });
        }
    }

    /// Takes every span recorded so far, ordered by start.
    pub(crate) fn take(&self) -> Vec<TraceSpan> {
        let mut v = std::mem::take(&mut *self.spans.lock().unwrap_or_else(|p| p.into_inner()));
        v.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorder_that_is_off_keeps_nothing_and_one_that_is_on_sorts_by_start() {
        let off = Recorder::new(false);
        let t = Instant::now();
        off.push_host(StreamId(0), "x", String::new(), t, t);
        assert!(off.take().is_empty());
        let on = Recorder::new(true);
        let later = Instant::now() + std::time::Duration::from_millis(2);
        on.push_host(StreamId(1), "b", "[2] f32".into(), later, later);
        on.push_host(StreamId(0), "a", String::new(), on.origin, later);
        let v = on.take();
        assert_eq!(v.iter().map(|s| s.name).collect::<Vec<_>>(), ["a", "b"]);
        assert!(v[0].dur_us >= 2000.0 && v[1].start_us >= 2000.0);
        assert!(on.take().is_empty(), "take drains");
    }
}
