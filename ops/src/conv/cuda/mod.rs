//! Convolution on CUDA: the per-stream cuDNN state ([`ConvState`]) and its algorithm
//! cache.
//!
//! # Per-stream state
//!
//! Each stream actor owns one [`ConvState`], created lazily on the actor thread the
//! first time a convolution runs there (`StreamCx::ext`; cuDNN handles are `!Send`):
//!
//! - a cuDNN handle bound to the stream;
//! - the algorithm cache: (direction, dtype, geometry incl. layout, TF32) → the
//!   descriptors and the chosen algorithm. The first call of a key searches on the real
//!   buffers (PyTorch's `cudnn.benchmark`): the legacy API's best by
//!   `cudnnFind*AlgorithmEx` (cuDNN's heuristic, `*_v7`, if that fails), and the plans
//!   of the graph API's engines (`graph.rs`), all timed against each other
//!   ([`ConvState::fastest`]), with a temporary workspace as large as the hungriest
//!   candidate asks (at most [`SEARCH_CAP`]). Later calls reuse the choice. Hits and
//!   misses are counted process-wide ([`conv_algo_cache_stats`]). The search blocks
//!   this actor once per key. Each stream searches for itself, so two streams can pick
//!   different engines for one key, and a convolution's results can differ between
//!   streams in the last bits (GEMMs cannot: a problem's algorithm is chosen once for
//!   the whole process).
//! - a workspace, grown (never shrunk) to the largest need of the chosen algorithms;
//!   the old one is freed stream-ordered, after the work that used it.
//!
//! # Math
//!
//! f32 is exact by default: the convolution's math type is forced to
//! `CUDNN_FMA_MATH` (no TF32), as PyTorch does without `allow_tf32`; `.tf32()` opts
//! in (`CUDNN_DEFAULT_MATH`). f16 and bf16 use `CUDNN_TENSOR_OP_MATH`. Every storage
//! type computes in f32 (the descriptor's compute type is `CUDNN_DATA_FLOAT`).
//!
//! # Fused bias + activation
//!
//! `cudnnConvolutionBiasActivationForward` is not used: it supports only ReLU and
//! identity (no GELU), identity only with `IMPLICIT_PRECOMP_GEMM` (which would
//! override the benchmarked algorithm), and restricts dtypes. Instead the forward
//! convolution is followed by one in-place bias + activation kernel
//! (`kernels/cuda/epilogue.cu`) on the same stream: one extra pass over `y`, any activation,
//! any dtype, either layout.

pub(super) mod dnn;
mod graph;
mod perf;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use crate::plan_cache::PlanCache;
use cudarc::driver::{CudaSlice, CudaStream};
use rtx_runtime::cuda::{Reclaimer, StreamCx};
use rtx_runtime::{DType, Element, Error, Result};

use self::dnn::{Choice, ConvDescs, Dir, Filter, Handle, Io};
use self::graph::GraphPlan;
use super::Conv2dParams;
use crate::gemm::device::{dptr, dptr_mut, require_library, scratch};
use crate::kernels::alloc_out;

use cudarc::cudnn::sys::cudnnMathType_t as Math;

/// The largest workspace the algorithm search offers (and any chosen algorithm
/// gets): algorithms that need more are not considered.
pub const SEARCH_CAP: usize = 1 << 30;

static ALGO_HITS: AtomicU64 = AtomicU64::new(0);
static ALGO_MISSES: AtomicU64 = AtomicU64::new(0);
static SEARCH_FALLBACKS: AtomicU64 = AtomicU64::new(0);

static GRAPH_CHOSEN: AtomicU64 = AtomicU64::new(0);
static LEGACY_CHOSEN: AtomicU64 = AtomicU64::new(0);

/// Launches timed per candidate and round when choosing between the legacy algorithm
/// and the graph API's plans.
const TIMED_REPS: usize = 10;
/// Rounds over all candidates; a candidate's time is its best round. Interleaving the
/// rounds spreads clock and scheduling noise over all candidates instead of letting it
/// land on one: with one round of 5 launches (runs 19-34) the 56²·64→64 3×3 layer read
/// 0.88-1.21× PyTorch from run to run.
const TIMED_ROUNDS: usize = 3;
/// Rounds after the first time again only the candidates within this factor of the
/// best so far (a search of ~40 candidates then costs about twice the launches of the
/// old single round, not 5.5 times).
const RETIME_WITHIN: f32 = 1.3;

/// `(launches per timing, rounds)` of the search: [`TIMED_REPS`] and [`TIMED_ROUNDS`],
/// or `(1, 1)` under compute-sanitizer (`RTX_UNDER_SANITIZER` set, as the GPU runner's
/// `sanitize` suite does). There every candidate still runs (its warm-up launch and one
/// timed), which is what the sanitizer is to check; the timings mean nothing under its
/// instrumentation, and the full search made one small convolution test need more than
/// the 10 minutes of a device call under racecheck.
fn search_reps() -> (usize, usize) {
    static QUICK: LazyLock<bool> =
        LazyLock::new(|| std::env::var_os("RTX_UNDER_SANITIZER").is_some());
    if *QUICK {
        (1, 1)
    } else {
        (TIMED_REPS, TIMED_ROUNDS)
    }
}

/// `(graph, legacy)`: how many algorithm searches (process-wide) chose a plan of cuDNN's
/// graph API and how many a legacy-API algorithm.
pub fn conv_engine_stats() -> (u64, u64) {
    (
        GRAPH_CHOSEN.load(Ordering::Relaxed),
        LEGACY_CHOSEN.load(Ordering::Relaxed),
    )
}

/// Mean milliseconds per call of `launch` on `stream`: one warm-up call, then
/// [`TIMED_REPS`] ([`search_reps`]) between two timing events. `None` if a call or the timing fails.
fn time_ms(stream: &Arc<CudaStream>, mut launch: impl FnMut() -> Result<()>) -> Option<f32> {
    use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    launch().ok()?;
    let start = stream.record_event(Some(CU_EVENT_DEFAULT)).ok()?;
    let reps = search_reps().0;
    for _ in 0..reps {
        launch().ok()?;
    }
    let end = stream.record_event(Some(CU_EVENT_DEFAULT)).ok()?;
    end.synchronize().ok()?;
    start.elapsed_ms(&end).ok().map(|ms| ms / reps as f32)
}

/// `(hits, misses)` of the per-stream convolution algorithm caches, summed over every
/// stream of every runtime in this process. A miss runs the algorithm search.
pub fn conv_algo_cache_stats() -> (u64, u64) {
    (
        ALGO_HITS.load(Ordering::Relaxed),
        ALGO_MISSES.load(Ordering::Relaxed),
    )
}

/// How many algorithm searches (process-wide) fell back to cuDNN's heuristic because
/// the benchmarking search failed or found nothing usable. Expected to stay 0.
pub fn conv_search_fallbacks() -> u64 {
    SEARCH_FALLBACKS.load(Ordering::Relaxed)
}

/// What selects an algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct AlgoKey {
    dir: Dir,
    dtype: DType,
    p: Conv2dParams,
    tf32: bool,
    /// The byte alignment (≤ 16) of every buffer: graph plans are built for it.
    align: i64,
}

/// A cached plan: what the search chose for one key.
enum Planned {
    /// A legacy-API algorithm with its descriptors.
    Legacy { descs: ConvDescs, choice: Choice },
    /// A graph-API execution plan.
    Graph(GraphPlan),
}

impl Planned {
    fn workspace(&self) -> usize {
        match self {
            Planned::Legacy { choice, .. } => choice.workspace,
            Planned::Graph(g) => g.workspace,
        }
    }

    /// Enqueues the planned convolution.
    ///
    /// # Safety
    /// As [`GraphPlan::launch`] / [`ConvDescs::launch`].
    unsafe fn launch(&self, h: &Handle, io: Io, ws: (u64, usize)) -> Result<()> {
        match self {
            // SAFETY: forwarded from this function's contract.
            Planned::Legacy { descs, choice } => unsafe { descs.launch(h, choice, io, ws) },
            // SAFETY: as above.
            Planned::Graph(g) => unsafe { g.launch(h, io, ws) },
        }
    }
}

/// A stream's cuDNN handle, algorithm cache and workspace.
pub(crate) struct ConvState {
    // Field order is drop order: the plans (whose cuDNN descriptors refer to the handle)
    // and the workspace before the handle.
    /// Bounded by the `plan_cache` setting (see `plan_cache.rs`).
    plans: PlanCache<AlgoKey, Planned>,
    workspace: Option<CudaSlice<u8>>,
    handle: Handle,
    stream: Arc<CudaStream>,
    /// cuDNN calls that fail to allocate go through it: the caches are emptied and the
    /// call retried once (`runtime/src/driver/reclaim.rs`).
    reclaim: Reclaimer,
}

impl ConvState {
    /// Creates the handle on the actor thread (the `ext` initializer).
    pub fn new(scx: &StreamCx) -> Result<Self> {
        // SAFETY: the presence probe only tries to dlopen the library.
        require_library("cudnn", || unsafe {
            cudarc::cudnn::sys::is_culib_present()
        })?;
        scx.context()
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        let reclaim = scx.reclaimer();
        Ok(ConvState {
            stream: scx.stream().clone(),
            handle: reclaim.retry(|| Handle::new(scx.stream()))?,
            reclaim,
            plans: PlanCache::new(scx.settings().plan_cache),
            workspace: None,
        })
    }

    /// Plans (once per key) and enqueues one convolution on the buffers of `io`.
    ///
    /// # Safety
    /// `io` must address live buffers of `key`'s geometry and dtype on this device: the
    /// inputs written by earlier stream-ordered work, the output a fresh allocation;
    /// all must stay alive until the enqueued work completes.
    unsafe fn run(&mut self, key: AlgoKey, io: Io) -> Result<()> {
        let need = match self.plans.get(&key) {
            Some(planned) => {
                ALGO_HITS.fetch_add(1, Ordering::Relaxed);
                planned.workspace()
            }
            None => {
                ALGO_MISSES.fetch_add(1, Ordering::Relaxed);
                // SAFETY: forwarded from this function's contract.
                let planned = unsafe { self.plan(&key, io) }?;
                let need = planned.workspace();
                self.plans.insert(key, planned);
                need
            }
        };
        let ws = self.grow_workspace(need)?;
        let planned = self.plans.peek(&key).expect("cached just above");
        // SAFETY: buffers as guaranteed by the caller (aligned as the key records);
        // `ws` addresses at least `need` bytes of this stream's workspace, which lives
        // until replaced, and is then freed stream-ordered after this work.
        self.reclaim
            .retry(|| unsafe { planned.launch(&self.handle, io, ws) })
    }

    /// Builds the descriptors and searches the algorithm for `key`.
    ///
    /// # Safety
    /// As [`ConvState::run`] (the search writes the output buffer).
    unsafe fn plan(&mut self, key: &AlgoKey, io: Io) -> Result<Planned> {
        let exact = key.dtype == DType::F32 && !key.tf32;
        let math = match key.dtype {
            DType::F32 if exact => Math::CUDNN_FMA_MATH,
            DType::F32 => Math::CUDNN_DEFAULT_MATH,
            _ => Math::CUDNN_TENSOR_OP_MATH,
        };
        let descs = ConvDescs::new(&key.p, key.dtype, math)?;
        let filter = Filter {
            exact_f32: exact,
            no_fft: key.dir == Dir::BackwardData && (key.p.stride.0 > 1 || key.p.stride.1 > 1),
        };
        let want = descs.max_workspace(&self.handle, key.dir, SEARCH_CAP);
        // Without room for the search workspace, search among the algorithms that need none.
        let tmp = scratch(&self.stream, want).ok();
        let ws = match &tmp {
            Some(t) => (dptr(t, &self.stream).0, want),
            None => (0, 0),
        };
        // SAFETY: buffers as guaranteed by the caller; `ws` addresses `ws.1` bytes of
        // `tmp`, alive until after the (blocking) search returns.
        let found = self
            .reclaim
            .retry(|| unsafe { descs.find(&self.handle, key.dir, io, ws, filter) });
        drop(tmp);
        let choice = match found {
            Ok(Some(c)) => c,
            _ => {
                SEARCH_FALLBACKS.fetch_add(1, Ordering::Relaxed);
                descs
                    .heuristic(&self.handle, key.dir, SEARCH_CAP, filter)?
                    .ok_or_else(|| {
                        Error::cudnn(
                            "algorithm search",
                            cudarc::cudnn::sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED,
                            format!("no {:?} algorithm for {:?} {:?}", key.dir, key.dtype, key.p),
                        )
                    })?
            }
        };
        descs.set_math(choice.math)?;
        let legacy = Planned::Legacy { descs, choice };
        let graph = match graph::candidates(
            &self.handle,
            &key.p,
            key.dir,
            key.dtype,
            filter,
            key.align,
            SEARCH_CAP,
        ) {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(error = %e, "cuDNN graph API unavailable for this convolution");
                Vec::new()
            }
        };
        if graph.is_empty() {
            LEGACY_CHOSEN.fetch_add(1, Ordering::Relaxed);
            return Ok(legacy);
        }
        // SAFETY: forwarded from this function's contract.
        let best = unsafe { self.fastest(legacy, graph, io) }?;
        match &best {
            Planned::Legacy { .. } => LEGACY_CHOSEN.fetch_add(1, Ordering::Relaxed),
            Planned::Graph(g) => {
                tracing::debug!(engine = g.engine, ?key, "cuDNN graph engine chosen");
                GRAPH_CHOSEN.fetch_add(1, Ordering::Relaxed)
            }
        };
        Ok(best)
    }

    /// Times the legacy choice and every graph plan on the real buffers (CUDA events,
    /// [`TIMED_ROUNDS`] rounds of [`TIMED_REPS`] launches after one warm-up each, the
    /// later rounds over the contenders only, a candidate's best round counting; blocks
    /// this actor) and returns the fastest; a candidate whose launch fails is skipped,
    /// and the legacy choice is kept when nothing could be timed.
    ///
    /// # Safety
    /// As [`ConvState::run`] (every candidate writes the output buffer).
    unsafe fn fastest(
        &mut self,
        legacy: Planned,
        graph: Vec<GraphPlan>,
        io: Io,
    ) -> Result<Planned> {
        let mut all: Vec<Planned> = vec![legacy];
        all.extend(graph.into_iter().map(Planned::Graph));
        let most = all.iter().map(Planned::workspace).max().unwrap_or(0);
        let tmp = if most > 0 {
            match scratch(&self.stream, most) {
                Ok(t) => Some(t),
                // Without room to time them all, keep the legacy choice (the search
                // already fitted it to the memory there was).
                Err(_) => return Ok(all.swap_remove(0)),
            }
        } else {
            None
        };
        let ws = match &tmp {
            Some(t) => (dptr(t, &self.stream).0, most),
            None => (0, 0),
        };
        // Each candidate's best round; `None` once a launch of it failed.
        let mut times: Vec<Option<f32>> = vec![Some(f32::INFINITY); all.len()];
        for round in 0..search_reps().1 {
            // After the first round only the contenders are timed again: those within
            // [`RETIME_WITHIN`] of the best so far.
            let leader = times
                .iter()
                .flatten()
                .copied()
                .fold(f32::INFINITY, f32::min);
            for (cand, t) in all.iter().zip(times.iter_mut()) {
                let Some(prev) = *t else { continue };
                if round > 0 && prev > leader * RETIME_WITHIN {
                    continue;
                }
                // SAFETY: buffers as guaranteed by the caller; `ws` addresses `most`
                // bytes, at least what this candidate needs, alive until after the
                // timing syncs.
                let ms = time_ms(&self.stream, || unsafe {
                    cand.launch(&self.handle, io, ws)
                });
                *t = ms.map(|ms| ms.min(prev));
            }
        }
        drop(tmp);
        let mut best: Option<(f32, usize)> = None;
        for (i, (cand, ms)) in all.iter().zip(&times).enumerate() {
            let engine = match cand {
                Planned::Legacy { choice, .. } => format!("legacy {:?}", choice.algo),
                Planned::Graph(g) => format!("graph engine {}", g.engine),
            };
            tracing::debug!(engine, ms, "convolution candidate timed");
            if let Some(ms) = *ms {
                if best.is_none_or(|(b, _)| ms < b) {
                    best = Some((ms, i));
                }
            }
        }
        let i = best.map_or(0, |(_, i)| i);
        Ok(all.swap_remove(i))
    }

    /// This stream's workspace, grown to at least `bytes`: (address, size).
    fn grow_workspace(&mut self, bytes: usize) -> Result<(u64, usize)> {
        if bytes == 0 {
            return Ok((0, 0));
        }
        if self.workspace.as_ref().map_or(0, |w| w.len()) < bytes {
            // Dropping the old workspace frees it stream-ordered, after its users.
            self.workspace = None;
            self.workspace = Some(scratch(&self.stream, bytes)?);
        }
        let w = self.workspace.as_ref().expect("allocated above");
        Ok((dptr(w, &self.stream).0, w.len()))
    }
}

/// The operands of one convolution: `(x, w)` forward, `(dy, w)` backward data,
/// `(x, dy)` backward filter.
pub(crate) fn conv<T: Element>(
    scx: &mut StreamCx,
    dir: Dir,
    p: &Conv2dParams,
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
    tf32: bool,
) -> Result<CudaSlice<T>> {
    let len = match dir {
        Dir::Forward => p.y_len(),
        Dir::BackwardData => p.x_len(),
        Dir::BackwardFilter => p.w_len(),
    };
    let mut out = alloc_out::<T>(scx, len)?;
    let stream = scx.stream().clone();
    let (pa, _ga) = dptr(a, &stream);
    let (pb, _gb) = dptr(b, &stream);
    let (po, _go) = dptr_mut(&mut out, &stream);
    let io = match dir {
        Dir::Forward => Io {
            x: pa,
            w: pb,
            y: po,
        },
        Dir::BackwardData => Io {
            x: po,
            w: pb,
            y: pa,
        },
        Dir::BackwardFilter => Io {
            x: pa,
            w: po,
            y: pb,
        },
    };
    let key = AlgoKey {
        dir,
        dtype: T::DTYPE,
        p: *p,
        tf32: tf32 && T::DTYPE == DType::F32,
        align: graph::alignment(io),
    };
    // The first use of a key runs the algorithm search (milliseconds, synchronizing):
    // hand the ops before this one to the watcher first, so that their consumers on
    // other streams are not held up by the search (see `StreamCx::before_blocking`).
    if !scx.ext::<ConvState>(ConvState::new)?.plans.contains(&key) {
        scx.before_blocking();
    }
    let state = scx.ext::<ConvState>(ConvState::new)?;
    // SAFETY: `a` and `b` are the op's inputs, validated at submit to have the shapes
    // `p` implies for this direction, kept alive by the op until completion and
    // written by earlier work this stream waited on; `out` is a fresh allocation of
    // the output's length, owned by the op until completion.
    unsafe { state.run(key, io) }?;
    drop((_ga, _gb, _go));
    Ok(out)
}
