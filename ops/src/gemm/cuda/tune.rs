//! Which of cuBLASLt's candidate algorithms a GEMM problem uses: the fastest by timing,
//! chosen once per problem and device in this process (as the convolution search does,
//! PyTorch's `cudnn.benchmark`).
//!
//! cuBLASLt's heuristic predicts; for small and batched problems its first pick is not
//! always the fastest (a tile that leaves most SMs idle, say). With the experimental
//! [`Settings::gemm_tune`](rtx_runtime::Settings::gemm_tune) on (off by default), the first
//! stream to plan a problem times up to [`CANDIDATES`] of the heuristic's algorithms on
//! the op's own buffers — [`ROUNDS`] rounds of one warm-up and [`REPS`] timed launches
//! each, a candidate's time its best round — and keeps the fastest when it beats the
//! heuristic's first by more than [`MARGIN`]. The timing blocks that actor once per
//! problem (it first hands over the ops it enqueued, `StreamCx::before_blocking`).
//!
//! Why it is off by default: on the H200 (runs f3-f4 of 2026-12-02) it chose
//! algorithms slower than the heuristic's first, both for the 8-chain's batched
//! 8×256³ GEMM (graph 1.03 ms against 0.93) and for 8192³ bf16 (1.62 ms against 1.37).
//! Launches of a few µs time the host's enqueue rate rather than the kernel, and long
//! ones drift with the clock as it ramps up; timing the candidates back to back on a
//! stream held by a device-side wait (or in a captured graph) is the next step.
//!
//! The choice is recorded process-wide per (device, problem), and every stream of every
//! runtime in the process uses the recorded one: a GEMM gives bit-identical results on
//! every stream and in a graph (whose warm-up run plans eagerly). Two streams planning
//! one problem at once may both time it; the first to record wins and both use its
//! choice. Nothing is timed (the heuristic's first is recorded) while the stream
//! captures a graph, under compute-sanitizer (`RTX_UNDER_SANITIZER`, where timings
//! mean nothing), with the setting off, or once [`CAP`] problems are recorded. Between
//! processes the choice can differ (timing noise), and with it the last bits of the
//! results: turn the setting off (`RTX_GEMM_TUNE=0`) for run-to-run reproducibility.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use super::lt::PlanKey;

/// Candidates requested from the heuristic (and timed, when tuning).
pub(crate) const CANDIDATES: usize = 8;
/// Timed launches per candidate and round.
pub(crate) const REPS: usize = 5;
/// Rounds over the candidates, alternately forward and in reverse; a candidate's time
/// is its best round (noise lands on one round, not on one candidate).
const ROUNDS: usize = 2;
/// Another candidate replaces the heuristic's first only when at least this much
/// faster (3 %): below that, timing noise would decide.
const MARGIN: f32 = 0.97;
/// At most this many (device, problem) choices are recorded; past it nothing more is
/// timed and new problems use the heuristic's first.
const CAP: usize = 1 << 16;

static CHOSEN: LazyLock<Mutex<HashMap<(usize, PlanKey), usize>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static SEARCHES: AtomicU64 = AtomicU64::new(0);
static CHANGED: AtomicU64 = AtomicU64::new(0);

/// `(searches, changed)`: how many GEMM problems (process-wide) were timed, and in how
/// many of them a candidate other than cuBLASLt's heuristic first was chosen.
pub fn gemm_tune_stats() -> (u64, u64) {
    (
        SEARCHES.load(Ordering::Relaxed),
        CHANGED.load(Ordering::Relaxed),
    )
}

fn chosen() -> MutexGuard<'static, HashMap<(usize, PlanKey), usize>> {
    // A panic while holding the lock cannot leave the map inconsistent (one insert).
    CHOSEN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the candidate for `key` on device `ordinal` is still to be decided (so a
/// planning stream may block to time it).
pub(crate) fn undecided(ordinal: usize, key: &PlanKey) -> bool {
    let map = chosen();
    map.len() < CAP && !map.contains_key(&(ordinal, *key))
}

/// The candidate (an index below `n`) that every stream uses for `key` on device
/// `ordinal`: the recorded one; else, with `time`, the fastest by `time_one(i)` (mean
/// milliseconds of candidate `i`, `None` when it failed), else the heuristic's first;
/// recorded for the others.
pub(crate) fn choose(
    ordinal: usize,
    key: &PlanKey,
    n: usize,
    time: bool,
    time_one: impl FnMut(usize) -> Option<f32>,
) -> usize {
    if n <= 1 {
        return 0;
    }
    {
        let map = chosen();
        if let Some(&i) = map.get(&(ordinal, *key)) {
            return i.min(n - 1);
        }
        if map.len() >= CAP {
            return 0;
        }
    }
    // Timed without the lock: other streams plan other problems meanwhile.
    let mine = if time { fastest(n, time_one) } else { 0 };
    let mut map = chosen();
    if map.len() >= CAP {
        return map.get(&(ordinal, *key)).copied().unwrap_or(0).min(n - 1);
    }
    (*map.entry((ordinal, *key)).or_insert(mine)).min(n - 1)
}

/// The fastest of `n` candidates by `time_one`, or 0 (the heuristic's first) unless
/// another beats it by [`MARGIN`].
fn fastest(n: usize, mut time_one: impl FnMut(usize) -> Option<f32>) -> usize {
    let mut best = vec![f32::INFINITY; n];
    for round in 0..ROUNDS {
        // Every other round in reverse, so a clock that drifts during the search does
        // not favour the candidates timed last.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..n).collect()
        } else {
            (0..n).rev().collect()
        };
        for i in order {
            if round > 0 && !best[i].is_finite() {
                continue; // failed in the first round
            }
            if let Some(ms) = time_one(i) {
                best[i] = best[i].min(ms);
            }
        }
    }
    SEARCHES.fetch_add(1, Ordering::Relaxed);
    let pick = pick(&best);
    if pick != 0 {
        CHANGED.fetch_add(1, Ordering::Relaxed);
    }
    pick
}

/// The index [`fastest`] keeps for the best times `best` (infinite: failed).
fn pick(best: &[f32]) -> usize {
    let (i, t) = best
        .iter()
        .copied()
        .enumerate()
        .fold(
            (0, f32::INFINITY),
            |(bi, bt), (i, t)| {
                if t < bt {
                    (i, t)
                } else {
                    (bi, bt)
                }
            },
        );
    if !t.is_finite() || i == 0 {
        0
    } else if !best[0].is_finite() || t < MARGIN * best[0] {
        i
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtx_runtime::DType;

    fn key(m: usize) -> PlanKey {
        PlanKey {
            dtype: DType::BF16,
            m,
            n: 64,
            k: 64,
            batch: 1,
            a_bs: m * 64,
            b_bs: 64 * 64,
            trans_a: false,
            trans_b: false,
            bias: false,
            act: crate::gemm::Activation::None,
            tf32: false,
            align: [256; 4],
            fused: None,
            sm_target: 0,
        }
    }

    #[test]
    fn the_heuristic_first_stays_unless_clearly_beaten() {
        assert_eq!(pick(&[1.0, 0.99, 1.2]), 0, "within the margin");
        assert_eq!(pick(&[1.0, 0.5, 0.9]), 1);
        assert_eq!(pick(&[1.0, 0.9, 0.5]), 2);
        assert_eq!(pick(&[f32::INFINITY, 2.0, 3.0]), 1, "the first failed");
        assert_eq!(pick(&[f32::INFINITY; 3]), 0, "all failed");
        assert_eq!(pick(&[1.0, f32::INFINITY]), 0);
    }

    #[test]
    fn the_first_choice_recorded_is_everyones() {
        // A device ordinal no real device has, so other tests cannot collide.
        let dev = 9_001;
        let k = key(48);
        assert!(undecided(dev, &k));
        let mut timed = Vec::new();
        let first = choose(dev, &k, 4, true, |i| {
            timed.push(i);
            Some([1.0, 0.4, 0.8, 0.9][i])
        });
        assert_eq!(first, 1);
        assert_eq!(
            timed,
            [0, 1, 2, 3, 3, 2, 1, 0],
            "two rounds, the second reversed"
        );
        assert!(!undecided(dev, &k));
        // Later callers get the record without timing, even if timing would differ.
        let again = choose(dev, &k, 4, true, |_| panic!("timed a recorded problem"));
        assert_eq!(again, 1);
        // Without timing, an unseen problem records the heuristic's first.
        let k2 = key(80);
        assert_eq!(choose(dev, &k2, 4, false, |_| panic!("timed")), 0);
        assert_eq!(choose(dev, &k2, 4, true, |_| Some(0.1)), 0);
        // One candidate: nothing to choose, nothing recorded.
        let k3 = key(96);
        assert_eq!(choose(dev, &k3, 1, true, |_| panic!("timed")), 0);
        assert!(undecided(dev, &k3));
        // Another device decides for itself.
        assert_eq!(
            choose(dev + 1, &k, 4, true, |i| Some([0.2, 1.0, 1.0, 1.0][i])),
            0
        );
    }
}
