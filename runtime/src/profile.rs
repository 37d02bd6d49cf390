//! Opt-in timing of the stream actors' phases (`RTX_PROFILE=1`), to see where an op's
//! host time goes. Off by default; when off each phase costs one load of a cached flag.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// A phase of an op's life on a CUDA actor or watcher.
#[derive(Clone, Copy, Debug)]
pub enum Phase {
    /// The poison check and taking the inputs, when all were published already.
    Inputs,
    /// The same when some input was not published yet: the wait for its producer (e.g.
    /// a download submitted right behind a long chain) is counted here, not above.
    Blocked,
    /// The cross-stream event waits (`cuStreamWaitEvent`) and dropping the input views.
    StreamWait,
    /// The op's `run` (allocation and launches), bookkeeping included.
    Execute,
    /// Device allocations inside `run`.
    Alloc,
    /// Recording a burst's event and handing the burst to the watcher (per burst).
    Record,
    /// Publishing the outputs.
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
    /// An idle actor waiting for its next message (polling, then sleeping), per wait.
    Idle,
}

const NAMES: [&str; 12] = [
    "inputs",
    "blocked",
    "stream_wait",
    "execute",
    "alloc",
    "record",
    "publish",
    "send",
    "watch_wait",
    "watch_finish",
    "release",
    "idle",
];
static NS: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];
static COUNT: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];
static ON: LazyLock<bool> = LazyLock::new(|| std::env::var("RTX_PROFILE").is_ok_and(|v| v == "1"));

/// Whether profiling is on (`RTX_PROFILE=1`).
pub fn enabled() -> bool {
    *ON
}

/// Adds one sample of `d` to `phase`.
pub fn add(phase: Phase, d: Duration) {
    NS[phase as usize].fetch_add(d.as_nanos() as u64, Relaxed);
    COUNT[phase as usize].fetch_add(1, Relaxed);
}

/// Adds the time since `*t` to `phase` and restarts `*t`, if profiling is on.
pub(crate) fn lap(phase: Phase, t: &mut Option<Instant>) {
    if let Some(start) = t {
        let now = Instant::now();
        add(phase, now - *start);
        *t = Some(now);
    }
}

/// A clock for [`lap`]: `Some(now)` when profiling is on.
pub(crate) fn clock() -> Option<Instant> {
    enabled().then(Instant::now)
}

/// (phase, mean µs per sample, samples) for every phase sampled so far.
pub fn report() -> Vec<(&'static str, f64, u64)> {
    (0..NAMES.len())
        .filter_map(|i| {
            let n = COUNT[i].load(Relaxed);
            (n > 0).then(|| (NAMES[i], NS[i].load(Relaxed) as f64 / n as f64 / 1e3, n))
        })
        .collect()
}

/// Clears every phase.
pub fn reset() {
    for i in 0..NAMES.len() {
        NS[i].store(0, Relaxed);
        COUNT[i].store(0, Relaxed);
    }
}
