//! Choosing among cuBLASLt's candidate algorithms by timing them, once per problem and
//! device: the GEMM counterpart of the convolution search (and of PyTorch's
//! `cudnn.benchmark`).
//!
//! # Why
//!
//! cuBLASLt's heuristic ranks its algorithms by a model, and its first choice is not
//! always the fastest on the device at hand. PyTorch's plain `matmul` goes through
//! cuBLAS, whose own selection can land on a different kernel; on the H200 that made
//! single large cases (f16 8192³, tf32 4096³) read 0.97-0.98× PyTorch in several runs
//! with the heuristic's choice (`benches/RESULTS.md`, runs 33-35).
//!
//! # How
//!
//! When a stream builds a plan for a problem of at least [`MIN_VOLUME`] multiply-adds,
//! [`choose`] times the heuristic's candidates on the call's own buffers: [`ROUNDS`]
//! rounds over all candidates, each one warm-up launch and [`REPS`] timed between CUDA
//! events, a candidate's best round counting (interleaved rounds spread clock and
//! power drift over all candidates). Problems whose first candidate takes longer than
//! [`MAX_LAUNCH_MS`] per launch keep the heuristic's choice, which bounds the one-time
//! cost. The actor blocks while it times, like the first convolution of a shape.
//!
//! # Same answers on every stream
//!
//! The choice is recorded per device and plan key ([`TUNED`]); a stream that builds a
//! plan for a key already tuned on its device takes that choice instead of timing, and
//! two streams that time the same key at once both adopt whichever choice was recorded
//! first. So a GEMM gives bit-identical results on every stream of a device within a
//! process. Between processes the choice can differ (timing noise), and with it the
//! last bits of large GEMMs' results, as with `cudnn.benchmark`; `RTX_GEMM_TUNE=0`
//! keeps the heuristic's choice everywhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use cudarc::cublaslt::sys::cublasLtMatmulAlgo_t as Algo;
use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
use cudarc::driver::CudaStream;
use rtx_runtime::Result;

use super::lt::{algo_config, LtHandle, LtPlan, PlanKey, Ptrs};

/// Problems with fewer multiply-adds (`m·n·k·batch`) keep the heuristic's choice: their
/// launches are too short to time apart reliably and too cheap for a gain to matter.
pub(crate) const MIN_VOLUME: usize = 1 << 27;
/// Rounds over all candidates.
const ROUNDS: usize = 3;
/// Timed launches per candidate and round (after one warm-up).
const REPS: usize = 3;
/// A first candidate slower than this per launch is kept without timing the others.
const MAX_LAUNCH_MS: f32 = 4.0;

/// The chosen algorithm per (device ordinal, plan key), process-wide.
static TUNED: LazyLock<Mutex<HashMap<(usize, PlanKey), Algo>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

static TIMED: AtomicU64 = AtomicU64::new(0);
static CHANGED: AtomicU64 = AtomicU64::new(0);

/// `(timed, changed)`: plans whose candidates were timed (process-wide), and how many of
/// those chose another algorithm than the heuristic's first.
pub fn gemm_tune_stats() -> (u64, u64) {
    (
        TIMED.load(Ordering::Relaxed),
        CHANGED.load(Ordering::Relaxed),
    )
}

/// Whether tuning is on (`RTX_GEMM_TUNE=0` turns it off).
fn enabled() -> bool {
    static ON: LazyLock<bool> =
        LazyLock::new(|| std::env::var("RTX_GEMM_TUNE").map_or(true, |v| v != "0"));
    *ON
}

/// Sets `plan`'s algorithm for `key` on device `ordinal`: the device's recorded choice,
/// else (for problems worth it) the fastest candidate by timing, recorded for the
/// device. Leaves the heuristic's choice when tuning is off, the problem is small, there
/// is one candidate, or nothing could be timed. Timing failures are not errors.
///
/// # Safety
/// As [`LtPlan::launch`] for `p` and `lt`, on `stream`: every candidate writes the
/// output `p.d` (the call's real launch comes after and overwrites it).
pub(crate) unsafe fn choose(
    plan: &mut LtPlan,
    lt: &LtHandle,
    key: &PlanKey,
    ordinal: usize,
    p: &Ptrs,
    stream: &CudaStream,
) -> Result<()> {
    let volume = key.m * key.n * key.k * key.batch;
    if !enabled() || plan.candidates().len() < 2 || volume < MIN_VOLUME {
        return Ok(());
    }
    let slot = (ordinal, *key);
    let recorded = TUNED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&slot)
        .copied();
    if let Some(algo) = recorded.filter(|a| is_candidate(plan, a)) {
        plan.set_algo(algo);
        return Ok(());
    }
    // SAFETY: forwarded from this function's contract.
    let Some(best) = (unsafe { fastest(plan, key, lt, p, stream) }) else {
        return Ok(());
    };
    TIMED.fetch_add(1, Ordering::Relaxed);
    let chosen = *TUNED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(slot)
        .or_insert(best);
    let chosen = if is_candidate(plan, &chosen) {
        chosen
    } else {
        best
    };
    if chosen.data != plan.candidates()[0].data {
        CHANGED.fetch_add(1, Ordering::Relaxed);
    }
    plan.set_algo(chosen);
    Ok(())
}

fn is_candidate(plan: &LtPlan, algo: &Algo) -> bool {
    plan.candidates().iter().any(|c| c.data == algo.data)
}

/// The fastest candidate (see the module docs), or `None` when the first one could not
/// be timed or is too slow to be worth it. Leaves `plan` set to the last one timed.
///
/// # Safety
/// As [`choose`].
unsafe fn fastest(
    plan: &mut LtPlan,
    key: &PlanKey,
    lt: &LtHandle,
    p: &Ptrs,
    stream: &CudaStream,
) -> Option<Algo> {
    let candidates = plan.candidates().to_vec();
    // SAFETY: forwarded (the plan runs its first candidate).
    let first = unsafe { time_ms(plan, lt, p, stream, 1) }?;
    if first > MAX_LAUNCH_MS {
        return None;
    }
    let mut best = vec![f32::INFINITY; candidates.len()];
    for _ in 0..ROUNDS {
        for (algo, b) in candidates.iter().zip(best.iter_mut()) {
            plan.set_algo(*algo);
            // SAFETY: forwarded; `algo` is one of the plan's validated candidates.
            if let Some(ms) = unsafe { time_ms(plan, lt, p, stream, REPS) } {
                *b = b.min(ms);
            }
        }
    }
    plan.set_algo(candidates[0]);
    let (i, ms) = best
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, ms)| ms.is_finite())
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    if tracing::enabled!(tracing::Level::DEBUG) {
        use cudarc::cublaslt::sys::cublasLtMatmulAlgoConfigAttributes_t as C;
        let times: Vec<String> = candidates
            .iter()
            .zip(&best)
            .map(|(a, ms)| {
                format!(
                    "{}/{}: {ms:.4}",
                    algo_config(a, C::CUBLASLT_ALGO_CONFIG_ID),
                    algo_config(a, C::CUBLASLT_ALGO_CONFIG_TILE_ID)
                )
            })
            .collect();
        tracing::debug!(
            dtype = ?key.dtype, m = key.m, n = key.n, k = key.k, batch = key.batch,
            tf32 = key.tf32, chosen = i, ms, candidates = ?times,
            "cuBLASLt candidates timed (algo id/tile: ms)"
        );
    }
    Some(candidates[i])
}

/// Mean ms per launch of the plan's current algorithm: one warm-up launch, then `reps`
/// between two events. `None` if a launch or the timing fails.
///
/// # Safety
/// As [`choose`].
unsafe fn time_ms(
    plan: &LtPlan,
    lt: &LtHandle,
    p: &Ptrs,
    stream: &CudaStream,
    reps: usize,
) -> Option<f32> {
    let cu = stream.cu_stream() as _;
    // SAFETY: forwarded from the caller.
    unsafe { plan.launch(lt, p, cu) }.ok()?;
    let start = stream.record_event(Some(CU_EVENT_DEFAULT)).ok()?;
    for _ in 0..reps {
        // SAFETY: as above.
        unsafe { plan.launch(lt, p, cu) }.ok()?;
    }
    let end = stream.record_event(Some(CU_EVENT_DEFAULT)).ok()?;
    end.synchronize().ok()?;
    start.elapsed_ms(&end).ok().map(|ms| ms / reps as f32)
}
