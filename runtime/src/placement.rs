//! The placement contract between the runtime and the scheduler.
//!
//! At submit time the runtime asks a [`Policy`] to choose one of the candidate streams
//! (the compute streams of the op's device) given the op's cost, where its inputs are
//! produced, and each stream's queued work. Policies live in `rtx-scheduler`; the runtime
//! ships [`Affinity`], a minimal default.

use std::time::Duration;

use crate::device::StreamId;
use crate::op::Cost;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// The op being placed.
#[derive(Debug)]
pub struct OpInfo<'a> {
    /// The op's name.
    pub name: &'a str,
    /// Its estimated work.
    pub cost: Cost,
    /// The streams producing its inputs (deduplicated, in input order).
    pub input_streams: &'a [StreamId],
    /// Those of `input_streams` whose output was not yet published when the op was
    /// submitted (its producer still queued): the op cannot start anywhere before that
    /// producer has run, so moving it off the producer's stream only adds an event wait.
    pub pending_input_streams: &'a [StreamId],
}

/// One candidate stream and its queued work.
#[derive(Debug, Clone)]
pub struct StreamLoad {
    /// The stream.
    pub id: StreamId,
    /// Ops submitted to it and not yet completed.
    pub queued_ops: usize,
    /// The estimated time of those ops, by their cost (bytes + flops), in nanoseconds as
    /// the runtime's own rough estimate; policies with a calibrated model keep their own.
    pub queued_ns: u64,
}

/// Chooses a stream for each op. Implementations must be cheap: this runs on every submit.
pub trait Policy: Send + Sync + 'static {
    /// A name for `info()` and traces.
    fn name(&self) -> &'static str;
    /// The index into `streams` (never empty) of the chosen stream.
    fn place(&self, op: &OpInfo<'_>, streams: &[StreamLoad]) -> usize;
    /// Called after each successful op with the host time of its `run`: the computation on
    /// the CPU backend; on CUDA only the enqueue (allocation and launches), not device
    /// time, so a model calibrated on it learns launch costs (device times come through
    /// [`Policy::observe_device`]). Default: ignored.
    fn observe(&self, _name: &str, _cost: Cost, _stream: StreamId, _took: Duration) {}
    /// On CUDA, after [`Policy::observe`] for a sample of the ops, their **device time**:
    /// one op in [`Settings::device_timing`](crate::settings::Settings::device_timing)
    /// per stream (every op while the timeline records) is timed by a pair of CUDA
    /// events around its launches. A cost model should learn from these where they
    /// come. Default: ignored.
    fn observe_device(&self, _name: &str, _cost: Cost, _stream: StreamId, _device: Duration) {}
}

/// The default policy: the stream of the first input with a producer (no cross-stream
/// wait), else the stream with the fewest queued ops.
#[derive(Debug, Default)]
pub struct Affinity;

impl Policy for Affinity {
    fn name(&self) -> &'static str {
        "affinity"
    }
    fn place(&self, op: &OpInfo<'_>, streams: &[StreamLoad]) -> usize {
        if let Some(s) = op.input_streams.first() {
            if let Some(i) = streams.iter().position(|l| l.id == *s) {
                return i;
            }
        }
        least_queued(streams)
    }
}

/// The index of the stream with the fewest queued ops (the first on ties).
pub fn least_queued(streams: &[StreamLoad]) -> usize {
    streams
        .iter()
        .enumerate()
        .min_by_key(|(_, l)| l.queued_ops)
        .map(|(i, _)| i)
        .unwrap_or(0)
}

/// The runtime's own rough cost estimate: bytes at 1 TB/s-ish host view plus flops at
/// 10 TFLOP/s, plus 5 µs per op. Only for `StreamLoad::queued_ns`.
pub(crate) fn rough_ns(c: Cost) -> u64 {
    (5_000.0 + c.bytes / 1000.0 + c.flops / 10_000.0) as u64
}

/// Per-stream load counters, updated at submit and completion.
#[derive(Default)]
pub(crate) struct LoadCounters {
    pub(crate) ops: AtomicUsize,
    pub(crate) ns: AtomicU64,
}

impl LoadCounters {
    pub(crate) fn add(&self, ns: u64) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }
    pub(crate) fn sub(&self, ns: u64) {
        self.ops.fetch_sub(1, Ordering::Relaxed);
        self.ns.fetch_sub(ns, Ordering::Relaxed);
    }
}
