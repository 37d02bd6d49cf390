//! A runtime's counters: the CUDA block and pinned caches' hits, misses and bytes held,
//! and the opt-in timing of the phases of each op (submit, the stream actors, the CUDA
//! watchers; setting `profile`, `RTX_PROFILE=1`), to see where an op's host time goes.
//! Read with [`Runtime::stats`](crate::Runtime::stats). Profiling is off by default;
//! when off each phase costs one load of a flag.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// A snapshot of a runtime's counters, from [`Runtime::stats`](crate::Runtime::stats).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// The CUDA stream actors' device block caches: allocations served from a cache
    /// (hits) and allocations that went to a pool (misses).
    pub block_cache: CacheStats,
    /// The pinned host staging caches: transfers that reused a cached block (hits) and
    /// transfers that pinned new memory (misses).
    pub pinned_cache: CacheStats,
    /// Every phase sampled so far, when the runtime profiles (else empty).
    pub phases: Vec<PhaseStats>,
    /// CUDA eager launch batching ([`Settings::launch_batching`](crate::Settings::launch_batching)):
    /// batch launches made and the ops whose launches they carried.
    pub launch_batches: BatchStats,
}

/// What the CUDA actors' launch batching did ([`Stats::launch_batches`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchStats {
    /// Batch launches (each one `cuLaunchKernel`).
    pub launches: u64,
    /// Launches of ops carried by them (`ops / launches`: the mean batch).
    pub ops: u64,
}

/// Hits and misses of one kind of cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Requests served from the cache.
    pub hits: u64,
    /// Requests that allocated.
    pub misses: u64,
    /// Of the hits, those served from the cache of another stream of the same device
    /// (device blocks only: a stream short of a size class takes an idle block another
    /// stream keeps before it allocates; 0 for the pinned caches).
    pub from_other_stream: u64,
    /// Bytes the cache holds now (free blocks kept for reuse): a gauge, which
    /// [`Runtime::reset_stats`](crate::Runtime::reset_stats) leaves as it is. 0 once
    /// the memory went back (a runtime's caches are freed when it drops).
    pub bytes: u64,
}

/// The time spent in one phase of the ops' lives: on the submitting threads, the stream
/// actors (CPU and CUDA) and the CUDA completion watchers.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseStats {
    /// The phase: `submit`, `inputs`, `blocked`, `execute`, `alloc`, `record`,
    /// `publish`, `send`, `watch_wait`, `watch_finish`, `release` or `idle` (see
    /// `Phase` in `runtime/src/stats.rs` for what each covers).
    pub phase: &'static str,
    /// Mean microseconds per sample.
    pub mean_us: f64,
    /// Samples taken.
    pub samples: u64,
}

/// A phase of an op's life on a submitting thread, an actor or a CUDA watcher.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Phase {
    /// `submit` on the submitting thread: validation (`plan`), placement, the op's
    /// packaging and the send into the stream's mailbox (a wait for room included).
    Submit,
    /// On an actor, when every input was published already: the poison check (CUDA),
    /// taking the inputs and the cross-stream event waits (`cuStreamWaitEvent`).
    Inputs,
    /// The same when some input was not published yet: the wait for its producer (e.g.
    /// a download submitted right behind a long chain) is counted here, not above.
    Blocked,
    /// The op's `run` (CPU: the computation; CUDA: allocation and launches),
    /// bookkeeping included.
    Execute,
    /// Device allocations inside `run`.
    Alloc,
    /// Kernel launches inside `run` (CUDA: the driver's `cuLaunchKernel` calls of the
    /// built-in kernels, [`StreamCx::timed_launch`](crate::cuda::StreamCx::timed_launch)).
    Launch,
    /// Recording a burst's event and handing the burst to the watcher (per burst).
    Record,
    /// Publishing the outputs (CPU: completing the op and dropping it too).
    Publish,
    /// Queueing the op for its burst's hand-off to the watcher.
    Send,
    /// The watcher's wait for a batch's newest event (per batch).
    WatchWait,
    /// The watcher's completion of one op, its keep-alive release included.
    WatchFinish,
    /// An actor dropping a batch of finished ops' keep-alives (per batch; the memory
    /// goes back to the block caches here).
    Release,
    /// An idle actor waiting for its next message (CUDA: polling, then sleeping, per
    /// wait; CPU: per message).
    Idle,
}

/// The number of [`Phase`]s.
const PHASES: usize = 13;

const NAMES: [&str; PHASES] = [
    "submit",
    "inputs",
    "blocked",
    "execute",
    "alloc",
    "launch",
    "record",
    "publish",
    "send",
    "watch_wait",
    "watch_finish",
    "release",
    "idle",
];

/// One runtime's counters, shared by its actors, watchers, allocators and caches.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) block_hits: AtomicU64,
    pub(crate) block_misses: AtomicU64,
    /// Block-cache hits served from another stream's cache (see `driver/alloc.rs`).
    pub(crate) block_steals: AtomicU64,
    pub(crate) pinned_hits: AtomicU64,
    pub(crate) pinned_misses: AtomicU64,
    /// Bytes held by the block caches of the runtime's stream actors (a gauge).
    pub(crate) block_bytes: AtomicU64,
    /// Bytes held by the runtime's pinned staging caches (a gauge).
    pub(crate) pinned_bytes: AtomicU64,
    /// Batch launches of the CUDA actors, and the ops' launches they carried.
    pub(crate) batch_launches: AtomicU64,
    pub(crate) batched_ops: AtomicU64,
    /// Whether phases are timed (the `profile` setting).
    profile: bool,
    ns: [AtomicU64; PHASES],
    count: [AtomicU64; PHASES],
    /// The timeline recorder (the `trace` setting; see `trace.rs`).
    pub(crate) trace: crate::trace::Recorder,
}

impl Counters {
    /// Counters of a runtime that times its phases when `profile` is set.
    pub(crate) fn new(profile: bool) -> Self {
        Counters {
            profile,
            ..Counters::default()
        }
    }

    /// These counters with a timeline recorder that records when `on`.
    pub(crate) fn with_trace(mut self, on: bool) -> Self {
        self.trace = crate::trace::Recorder::new(on);
        self
    }

    /// Adds one sample of `d` to `phase`.
    pub(crate) fn add(&self, phase: Phase, d: Duration) {
        self.ns[phase as usize].fetch_add(d.as_nanos() as u64, Relaxed);
        self.count[phase as usize].fetch_add(1, Relaxed);
    }

    /// Adds the time since `*t` to `phase` and restarts `*t`, if profiling is on.
    pub(crate) fn lap(&self, phase: Phase, t: &mut Option<Instant>) {
        if let Some(start) = t {
            let now = Instant::now();
            self.add(phase, now - *start);
            *t = Some(now);
        }
    }

    /// Counts one batch launch carrying `ops` ops' launches.
    pub(crate) fn batched(&self, ops: u64) {
        self.batch_launches.fetch_add(1, Relaxed);
        self.batched_ops.fetch_add(ops, Relaxed);
    }

    /// A clock for [`Counters::lap`]: `Some(now)` when profiling is on.
    pub(crate) fn clock(&self) -> Option<Instant> {
        self.profile.then(Instant::now)
    }

    /// A snapshot.
    pub(crate) fn snapshot(&self) -> Stats {
        let phases = (0..NAMES.len())
            .filter_map(|i| {
                let n = self.count[i].load(Relaxed);
                (n > 0).then(|| PhaseStats {
                    phase: NAMES[i],
                    mean_us: self.ns[i].load(Relaxed) as f64 / n as f64 / 1e3,
                    samples: n,
                })
            })
            .collect();
        Stats {
            block_cache: CacheStats {
                hits: self.block_hits.load(Relaxed),
                misses: self.block_misses.load(Relaxed),
                from_other_stream: self.block_steals.load(Relaxed),
                bytes: self.block_bytes.load(Relaxed),
            },
            pinned_cache: CacheStats {
                hits: self.pinned_hits.load(Relaxed),
                misses: self.pinned_misses.load(Relaxed),
                from_other_stream: 0,
                bytes: self.pinned_bytes.load(Relaxed),
            },
            phases,
            launch_batches: BatchStats {
                launches: self.batch_launches.load(Relaxed),
                ops: self.batched_ops.load(Relaxed),
            },
        }
    }

    /// Clears every counter (not the byte gauges: they say what is held now).
    pub(crate) fn reset(&self) {
        for a in [
            &self.block_hits,
            &self.block_misses,
            &self.block_steals,
            &self.pinned_hits,
            &self.pinned_misses,
            &self.batch_launches,
            &self.batched_ops,
        ] {
            a.store(0, Relaxed);
        }
        for i in 0..NAMES.len() {
            self.ns[i].store(0, Relaxed);
            self.count[i].store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_timed_only_when_profiling_and_reset_clears_all() {
        let off = Counters::new(false);
        let mut t = off.clock();
        off.lap(Phase::Execute, &mut t);
        assert!(off.snapshot().phases.is_empty());

        let on = Counters::new(true);
        on.add(Phase::Alloc, Duration::from_micros(3));
        on.add(Phase::Alloc, Duration::from_micros(5));
        on.block_hits.fetch_add(2, Relaxed);
        on.block_steals.fetch_add(1, Relaxed);
        let s = on.snapshot();
        assert_eq!(s.phases.len(), 1);
        assert_eq!(s.phases[0].phase, "alloc");
        assert_eq!(s.phases[0].samples, 2);
        assert!((s.phases[0].mean_us - 4.0).abs() < 1e-9);
        assert_eq!(
            s.block_cache,
            CacheStats {
                hits: 2,
                misses: 0,
                from_other_stream: 1,
                bytes: 0
            }
        );
        on.reset();
        assert_eq!(on.snapshot(), Stats::default());
    }
}
