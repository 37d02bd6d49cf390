//! GEMM on CUDA: the per-stream library state ([`GemmState`]) and its plan cache.
//!
//! # Per-stream state
//!
//! Each stream actor owns one [`GemmState`], created lazily on the actor thread the
//! first time a GEMM runs there (`StreamCx::ext`), and dropped with the actor:
//!
//! - a cuBLASLt handle and its workspace (32 MiB on Hopper and newer, 4 MiB before,
//!   NVIDIA's recommendation), used by every call on this stream only. A workspace is
//!   never shared between streams: two streams writing one workspace would race.
//! - a cuBLAS handle bound to the stream, for the fallback when cuBLASLt's heuristic
//!   has no algorithm, created only when the fallback first runs (dropping a cuBLAS
//!   handle synchronizes the whole context, which actors should not pay for nothing);
//! - the plan cache: [`PlanKey`] → the cuBLASLt plan (descriptors, layouts, chosen
//!   algorithm), or `None` when cuBLASLt had none (then cuBLAS runs, and for `linear`
//!   the bias/activation kernel of `epilogue.rs`). A hit skips descriptor creation and
//!   the heuristic; hits and misses are counted process-wide
//!   ([`gemm_plan_cache_stats`]).
//!
//! The same key on any stream gives the same algorithm (the heuristic is a pure
//! function of the problem, and which of its candidates runs is decided once per
//! process and device, `tune.rs`), so a GEMM gives bit-identical results on every
//! stream.

pub(crate) mod backward;
pub(crate) mod device;
pub(crate) mod epilogue;
mod lt;
mod small;
mod tune;

pub use self::small::small_gemm_launches;
pub use self::tune::gemm_tune_stats;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::cublas::{self, CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, CudaStream};
use rtx_runtime::cuda::{Reclaimer, StreamCx};
use rtx_runtime::{DType, Element, Error, Result};

use self::device::{alignment, cublas_error, dptr, dptr_mut, require_library};
use self::lt::{LtHandle, LtPlan, PlanKey, Ptrs};
use super::shape::GemmDims;
use super::Activation;
use crate::kernels::alloc_out;
use crate::plan_cache::PlanCache;

pub(super) static PLAN_HITS: AtomicU64 = AtomicU64::new(0);
pub(super) static PLAN_MISSES: AtomicU64 = AtomicU64::new(0);
static LT_FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// `(hits, misses)` of the per-stream cuBLASLt plan caches, summed over every stream
/// of every runtime in this process. A miss builds descriptors and runs the heuristic;
/// a hit reuses them.
pub fn gemm_plan_cache_stats() -> (u64, u64) {
    (
        PLAN_HITS.load(Ordering::Relaxed),
        PLAN_MISSES.load(Ordering::Relaxed),
    )
}

/// How many plans (process-wide) found no cuBLASLt algorithm and use the cuBLAS
/// fallback (plus the bias/activation kernel for `linear`). Expected to stay 0 for
/// ordinary f32/f16/bf16 problems; a count here is worth a look.
pub fn gemm_lt_fallbacks() -> u64 {
    LT_FALLBACKS.load(Ordering::Relaxed)
}

/// One GEMM as the CUDA backend runs it: `out = act(op(a) · op(b) + bias)`.
pub(crate) struct GemmArgs<'a, T> {
    pub a: &'a CudaSlice<T>,
    pub b: &'a CudaSlice<T>,
    pub bias: Option<&'a CudaSlice<T>>,
    pub dims: &'a GemmDims,
    pub trans_a: bool,
    pub trans_b: bool,
    pub tf32: bool,
    pub act: Activation,
}

impl<T: Element> GemmArgs<'_, T> {
    /// The plan key of this GEMM: its shapes and flags, the pointers' alignment `align`
    /// (our A, our B, the output, the bias) and the training epilogue `fused`, if any.
    ///
    /// `sm_target` is [`sm_target`]'s for the stream the GEMM runs on.
    pub(super) fn plan_key(
        &self,
        align: [u32; 4],
        fused: Option<lt::Fusion>,
        sm_target: u32,
    ) -> PlanKey {
        let dims = self.dims;
        PlanKey {
            dtype: T::DTYPE,
            m: dims.m,
            n: dims.n,
            k: dims.k,
            batch: dims.batch,
            a_bs: dims.a_bs,
            b_bs: dims.b_bs,
            trans_a: self.trans_a,
            trans_b: self.trans_b,
            bias: self.bias.is_some(),
            act: self.act,
            tf32: self.tf32 && T::DTYPE == DType::F32,
            align,
            fused,
            sm_target,
        }
    }

    /// The multiply-adds of this GEMM (saturating).
    fn macs(&self) -> usize {
        let d = self.dims;
        d.batch
            .saturating_mul(d.m)
            .saturating_mul(d.n)
            .saturating_mul(d.k)
    }
}

/// GEMMs of at most this many multiply-adds (512³) are "small" for
/// [`Settings::gemm_sm_share`](rtx_runtime::Settings::gemm_sm_share): a few µs each,
/// bound by latency rather than by the device's throughput.
const SMALL_GEMM_MACS: usize = 1 << 27;

/// The SM count cuBLASLt plans `g` for on `scx`'s device: with a `gemm_sm_share` of
/// n > 1, a small GEMM gets 1/n of the multiprocessors (at least 8), so that n streams'
/// small GEMMs fit side by side; 0 (the whole device) otherwise.
pub(super) fn sm_target<T: Element>(scx: &StreamCx, g: &GemmArgs<'_, T>) -> u32 {
    let share = scx.settings().gemm_sm_share;
    if share <= 1 || g.macs() > SMALL_GEMM_MACS {
        return 0;
    }
    (scx.sm_count() / share).max(8)
}

/// A stream's cuBLAS / cuBLASLt handles, workspace and plan cache.
/// (The fields are visible to `backward.rs`, which plans the training epilogues
/// through the same handle, workspace and cache.)
pub(crate) struct GemmState {
    pub(super) stream: Arc<CudaStream>,
    pub(super) lt: LtHandle,
    pub(super) workspace: CudaSlice<u32>,
    /// Created by the first fallback (see the module docs).
    blas: Option<CudaBlas>,
    /// Bounded by the `plan_cache` setting (see `plan_cache.rs`).
    pub(super) plans: PlanCache<PlanKey, Option<LtPlan>>,
    /// Library calls that fail to allocate go through it: the caches are emptied and
    /// the call retried once (`runtime/src/driver/reclaim.rs`).
    pub(super) reclaim: Reclaimer,
}

impl GemmState {
    /// Creates the handles on the actor thread (the `ext` initializer).
    pub fn new(scx: &StreamCx) -> Result<Self> {
        // SAFETY: the presence probes only try to dlopen the libraries.
        require_library("cublasLt", || unsafe {
            cudarc::cublaslt::sys::is_culib_present()
        })?;
        // SAFETY: as above.
        require_library("cublas", || unsafe {
            cudarc::cublas::sys::is_culib_present()
        })?;
        scx.context()
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        let stream = scx.stream().clone();
        let reclaim = scx.reclaimer();
        let lt = reclaim.retry(LtHandle::new)?;
        let bytes = if scx.arch().0 >= 9 { 32 << 20 } else { 4 << 20 };
        // Counted in u32 words so the runtime's allocator (typed OOM errors) applies.
        let workspace = scx.alloc::<u32>(bytes / 4)?;
        Ok(GemmState {
            stream,
            lt,
            workspace,
            blas: None,
            plans: PlanCache::new(scx.settings().plan_cache),
            reclaim,
        })
    }

    /// The plan key of `g` writing into `d` (shapes, flags and the pointers' alignment).
    fn key<T: Element>(&self, g: &GemmArgs<'_, T>, d: &CudaSlice<T>, sm_target: u32) -> PlanKey {
        let stream: &CudaStream = &self.stream;
        let align = [
            alignment(dptr(g.a, stream).0),
            alignment(dptr(g.b, stream).0),
            alignment(out_ptr(d, stream)),
            g.bias.map_or(256, |s| alignment(dptr(s, stream).0)),
        ];
        g.plan_key(align, None, sm_target)
    }

    /// Enqueues the product into `d` (`key` is [`GemmState::key`]'s). Returns whether
    /// the bias/activation epilogue is still to be applied (the cuBLAS fallback has no
    /// epilogue). A new plan's candidate is chosen as `tune` says (`tune.rs`).
    fn run<T: Element>(
        &mut self,
        g: &GemmArgs<'_, T>,
        d: &mut CudaSlice<T>,
        key: PlanKey,
        tune: Tune,
    ) -> Result<bool>
    where
        CudaBlas: Gemm<T>,
    {
        let GemmState {
            stream,
            lt,
            workspace,
            blas,
            plans,
            reclaim,
        } = self;
        let owned_stream: &Arc<CudaStream> = stream;
        let stream: &CudaStream = stream;
        let ws_len = workspace.len() * 4;
        let (a, _ga) = dptr(g.a, stream);
        let (b, _gb) = dptr(g.b, stream);
        let bias = g.bias.map(|s| dptr(s, stream));
        let bias_ptr = bias.as_ref().map(|(p, _)| *p);
        let (ws, _gw) = dptr_mut(workspace, stream);
        let (plan, hit) = plans.get_or_try_insert(key, || {
            let plan = reclaim.retry(|| LtPlan::new(lt, &key, bias_ptr, ws_len))?;
            if plan.is_none() {
                LT_FALLBACKS.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Error>(plan)
        })?;
        if hit {
            PLAN_HITS.fetch_add(1, Ordering::Relaxed);
        } else {
            PLAN_MISSES.fetch_add(1, Ordering::Relaxed);
        }
        match plan {
            Some(plan) => {
                let (dp, _gd) = dptr_mut(d, stream);
                let ptrs = Ptrs {
                    a,
                    b,
                    d: dp,
                    bias: bias_ptr,
                    workspace: (ws, ws_len),
                };
                if !hit {
                    let time_one = |i: usize| {
                        // SAFETY: as the launch below (the same plan, buffers and
                        // workspace; each candidate writes only `d`, which the chosen
                        // one rewrites after).
                        let launch = || unsafe {
                            plan.launch_candidate(i, lt, &ptrs, None, stream.cu_stream() as _)
                        };
                        time_ms(owned_stream, launch)
                    };
                    let i =
                        tune::choose(tune.ordinal, &key, plan.candidates(), tune.time, time_one);
                    plan.choose(i);
                }
                // SAFETY: `a`, `b` (and `bias`) are the op's input buffers, validated at
                // submit to hold `batch·m·k`, `batch·k·n` (or one matrix when broadcast)
                // and `n` elements of `T`; `d` was allocated for `batch·m·n`; the
                // workspace is this stream's own, `ws_len` bytes. The op keeps its inputs
                // alive until completion and owns `d`; `d` is fresh, so it overlaps
                // nothing; `lt` built the plan.
                reclaim.retry(|| unsafe { plan.launch(lt, &ptrs, stream.cu_stream() as _) })?;
                Ok(false)
            }
            None => {
                let blas = match blas {
                    Some(b) => b,
                    None => {
                        let h = reclaim.retry(|| {
                            CudaBlas::new(owned_stream.clone())
                                .map_err(|e| cublas_error("cublasCreate", e.0))
                        })?;
                        // cuBLAS gets this stream's workspace (shared with cuBLASLt:
                        // both run stream-ordered on this one stream), so it never
                        // allocates one itself: capture-safe in a graph.
                        // SAFETY: `ws` is this stream's live workspace of `ws_len`
                        // bytes, kept as long as the handle (both in this state).
                        let st = unsafe {
                            cublas::sys::cublasSetWorkspace_v2(
                                *h.handle(),
                                ws as *mut std::ffi::c_void,
                                ws_len,
                            )
                        };
                        if st != cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                            return Err(cublas_error("cublasSetWorkspace", st));
                        }
                        blas.insert(h)
                    }
                };
                reclaim.retry(|| blas_gemm(blas, g, d))?;
                Ok(g.bias.is_some() || g.act != Activation::None)
            }
        }
    }
}

/// The output's address (for its alignment).
fn out_ptr<T>(d: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    dptr(d, stream).0
}

/// The fallback: cuBLAS strided-batched GEMM, same row-major trick as `lt.rs`.
fn blas_gemm<T: Element>(blas: &CudaBlas, g: &GemmArgs<'_, T>, d: &mut CudaSlice<T>) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    use cublas::sys::{cublasMath_t as M, cublasOperation_t as Op};
    let mode = if g.tf32 && T::DTYPE == DType::F32 {
        M::CUBLAS_TF32_TENSOR_OP_MATH
    } else {
        M::CUBLAS_DEFAULT_MATH
    };
    // SAFETY: the handle is live (owned by `blas`); setting its math mode has no other
    // effect, and only this actor thread uses the handle.
    unsafe { cublas::sys::cublasSetMathMode(*blas.handle(), mode) }
        .result()
        .map_err(|e| cublas_error("cublasSetMathMode", e.0))?;
    let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
    let dm = g.dims;
    let (m, n, k) = (dm.m as i32, dm.n as i32, dm.k as i32);
    let cfg = StridedBatchedConfig {
        gemm: GemmConfig {
            transa: op(g.trans_b),
            transb: op(g.trans_a),
            m: n,
            n: m,
            k,
            alpha: T::from_f64(1.0),
            lda: if g.trans_b { k } else { n },
            ldb: if g.trans_a { m } else { k },
            beta: T::from_f64(0.0),
            ldc: n,
        },
        batch_size: dm.batch as i32,
        stride_a: dm.b_bs as i64,
        stride_b: dm.a_bs as i64,
        stride_c: (dm.m * dm.n) as i64,
    };
    // SAFETY: the configuration describes exactly the validated buffers: our B
    // (cuBLAS's A) and our A (cuBLAS's B) with their leading dimensions and batch
    // strides (0 broadcasts), and `d` with `batch·m·n` elements; all sizes fit in i32
    // (checked at submit). The buffers outlive the enqueued work (op keep-alive).
    unsafe { blas.gemm_strided_batched(cfg, g.b, g.a, d) }
        .map_err(|e| cublas_error("cublasGemmStridedBatchedEx", e.0))
}

/// Runs one GEMM on this stream and returns the new output buffer.
pub(crate) fn gemm<T: Element>(scx: &mut StreamCx, g: GemmArgs<'_, T>) -> Result<CudaSlice<T>>
where
    CudaBlas: Gemm<T>,
{
    let len = g.dims.batch * g.dims.m * g.dims.n;
    let mut d = alloc_out::<T>(scx, len)?;
    if let Some(ops) = small::eligible(scx, &g, &d) {
        if scx.settings().small_gemm == rtx_runtime::SmallGemm::Eager {
            // A capture of this op (its warm-up ran here, eagerly) records cuBLASLt,
            // which may not allocate its handle's workspace while capturing: make it now.
            scx.ext::<GemmState>(|s| {
                // Its workspace is memory work on the stream: deferred launches first.
                s.flush_launches();
                GemmState::new(s)
            })?;
        }
        small::run(scx, &g, ops, &mut d)?;
        return Ok(d);
    }
    // cuBLASLt enqueues on the stream: launches deferred there go first.
    scx.flush_launches();
    let tune = Tune::new(scx);
    let sms = sm_target(scx, &g);
    let state = scx.ext::<GemmState>(GemmState::new)?;
    let key = state.key(&g, &d, sms);
    if tune.time && !state.plans.contains(&key) && tune::undecided(tune.ordinal, &key) {
        // The candidates are about to be timed (a synchronize).
        scx.before_blocking();
    }
    let state = scx.ext::<GemmState>(GemmState::new)?;
    let pending_epilogue = state.run(&g, &mut d, key, tune)?;
    if pending_epilogue {
        epilogue::bias_act(scx, &mut d, g.bias, g.dims.n, 1, g.act)?;
    }
    Ok(d)
}

/// How a new plan's candidate is chosen (`tune.rs`): on which device, and whether
/// timing is allowed.
#[derive(Clone, Copy)]
struct Tune {
    ordinal: usize,
    time: bool,
}

impl Tune {
    fn new(scx: &StreamCx) -> Self {
        static SANITIZER: std::sync::LazyLock<bool> =
            std::sync::LazyLock::new(|| std::env::var_os("RTX_UNDER_SANITIZER").is_some());
        Tune {
            ordinal: scx.ordinal(),
            time: scx.settings().gemm_tune && !scx.capturing() && !*SANITIZER,
        }
    }
}

/// Mean milliseconds per call of `launch` on `stream`: one warm-up call, then
/// [`tune::REPS`] between two timing events. `None` if a call or the timing fails.
fn time_ms(stream: &Arc<CudaStream>, mut launch: impl FnMut() -> Result<()>) -> Option<f32> {
    use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    launch().ok()?;
    let start = stream.record_event(Some(CU_EVENT_DEFAULT)).ok()?;
    for _ in 0..tune::REPS {
        launch().ok()?;
    }
    let end = stream.record_event(Some(CU_EVENT_DEFAULT)).ok()?;
    end.synchronize().ok()?;
    start.elapsed_ms(&end).ok().map(|ms| ms / tune::REPS as f32)
}
