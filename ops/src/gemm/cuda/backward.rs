//! `linear_train` and `linear_backward` on CUDA: cuBLASLt's training epilogues where
//! they apply, `kernels/cuda/linear_train.cu` where they do not.
//!
//! # Which epilogue runs where
//!
//! | step | fused (cuBLASLt) | otherwise |
//! |---|---|---|
//! | forward, GELU | `GELU_AUX(_BIAS)`: y and pre from one GEMM | GEMM(+`BIAS`) → pre, `act_fwd` → y |
//! | forward, ReLU | — (always the second column) | GEMM(+`BIAS`) → pre, `act_fwd` → y |
//! | `dz = dy ⊙ act'(pre)` | — | `act_grad` (one element-wise pass) |
//! | dx with `input_activation(Gelu, ..)` | `DGELU` on the dx GEMM | GEMM, then `act_grad` in place |
//! | dx with `input_activation(Relu, ..)` | — | GEMM, then `act_grad` in place |
//! | dw and db | `BGRADB` on the dw GEMM (out a multiple of 8) | GEMM, then `bias_grad` (column sums) |
//!
//! Why the table looks like this:
//!
//! - A cuBLASLt epilogue acts on a GEMM's *output*. The derivative `act'(pre)` multiplies
//!   the layer's incoming gradient `dy`, which is an input here, so it cannot be fused
//!   into this layer's GEMMs; it fuses into the GEMM that *produces* `dy`, the dx GEMM of
//!   the layer above. That is [`super::LinearBackward::input_activation`]: the layer
//!   above computes `dz` of the layer below (`DGELU`), and the layer below then runs
//!   with `Activation::None`, where `BGRADB` on its dw GEMM yields its bias gradient.
//!   (`DGELU_BGRAD` would also give that bias gradient from the dx GEMM; `BGRADB`
//!   downstream costs the same and keeps one output list per op.)
//! - ReLU's fused forms are not used: `RELU_AUX` saves a bit mask (one bit per
//!   element, leading dimension a multiple of 128) rather than the pre-activation, and
//!   `DRELU`/`DRELU_BGRAD` read only that mask. The saved tensor would then differ by
//!   backend (the CPU reference saves the pre-activation) and the fallback kernels would
//!   depend on the mask's undocumented bit order. ReLU costs one element-wise pass in
//!   the forward and one in the backward instead.
//! - The GELU aux matrix is the pre-activation in the output's dtype and layout; its
//!   leading dimension (the output's columns) must be a multiple of 8, so other widths
//!   take the unfused path.
//! - `BGRADB` is used only when the layer's outputs are a multiple of 8: for other
//!   widths (a classifier's 10 classes) cuBLASLt's one algorithm for it is a slow
//!   general kernel (`bgradb_ok`).
//!
//! Every time a fused epilogue was wanted but not available (the layout rule above, or
//! cuBLASLt's heuristic returned no algorithm, e.g. for some f32 problems) the unfused
//! path runs and [`linear_fused_fallbacks`] counts it; the plan (or its absence) is
//! cached per stream like every GEMM plan, under a key that includes the epilogue.

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::cublas::{CudaBlas, Gemm};
use cudarc::driver::{CudaSlice, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Element, Result, Shape};

use super::device::{alignment, dptr_mut};
use super::lt::{FusedKind, Fusion, LtPlan, Ptrs};
use super::{GemmArgs, GemmState, PLAN_HITS, PLAN_MISSES};
use crate::gemm::shape::GemmDims;
use crate::gemm::Activation;
use crate::kernels::{self, alloc_out, config, device_addr, grid, launch_error, BLOCK};

static FUSED_FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// How many times (process-wide) `linear_train` / `linear_backward` wanted a cuBLASLt
/// training epilogue (`GELU_AUX_BIAS`, `DGELU`, `BGRADB`) and ran the unfused path
/// instead: the layout ruled it out, or cuBLASLt had no algorithm. Not counted: ReLU,
/// which is unfused by design (see this module's docs).
pub fn linear_fused_fallbacks() -> u64 {
    FUSED_FALLBACKS.load(Ordering::Relaxed)
}

fn count_fallback(what: &str, why: &str) {
    FUSED_FALLBACKS.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(epilogue = what, reason = why, "linear: unfused path");
}

const MODULE: &str = "linear_train";

/// Whether the dw GEMM takes the `BGRADB` epilogue: only when the layer's outputs are a
/// multiple of 8. With other widths cuBLASLt's only `BGRADB` algorithm is a slow
/// general kernel: for a classifier's output layer (10 outputs, 512 rows, 128 inputs,
/// bf16) Nsight Compute on the H200 showed `magma_sgemmEx_kernel` on 2 blocks for 34 µs
/// and a separate bias-gradient kernel, where the plain GEMM and `bias_grad` take about
/// 4 µs and 3 µs.
fn bgradb_ok(out: usize) -> bool {
    out & 7 == 0
}

/// cuBLASLt's rule for a GELU aux matrix: its leading dimension is a multiple of 8.
/// (A mask rather than `%`: `is_multiple_of` needs Rust 1.87; the MSRV is 1.80.)
fn gelu_aux_ld_ok(ld: usize) -> bool {
    ld & 7 == 0
}

fn act_code(act: Activation) -> i32 {
    match act {
        Activation::None => 0,
        Activation::Relu => 1,
        Activation::Gelu => 2,
    }
}

/// `y = act(pre)` over `n` elements.
fn act_fwd<T: Element>(
    scx: &mut StreamCx,
    y: &mut CudaSlice<T>,
    pre: &CudaSlice<T>,
    act: Activation,
) -> Result<()> {
    let f = kernels::function(scx, MODULE, 0, T::DTYPE, || {
        format!("act_fwd_{}", T::DTYPE.name())
    })?;
    let n = y.len();
    let cfg = config(grid(scx, n.div_ceil(BLOCK as usize)), 0);
    let code = act_code(act);
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(y).arg(pre).arg(&n).arg(&code);
    // SAFETY: matches `act_fwd_{dt}(T* y, const T* pre, size_t n, int act)` for this
    // `T`; `y` and `pre` both hold `n` elements (same shape, checked at submit) and are
    // distinct allocations; both outlive the work (op keep-alive, or freed stream-ordered).
    unsafe { lb.launch(cfg) }.map_err(|e| launch_error("linear_train", e))?;
    Ok(())
}

/// `dz = dy ⊙ act'(pre)`; with `dy` `None`, in place (`dz` is also the incoming gradient).
fn act_grad<T: Element>(
    scx: &mut StreamCx,
    dz: &mut CudaSlice<T>,
    dy: Option<&CudaSlice<T>>,
    pre: &CudaSlice<T>,
    act: Activation,
) -> Result<()> {
    let f = kernels::function(scx, MODULE, 1, T::DTYPE, || {
        format!("act_grad_{}", T::DTYPE.name())
    })?;
    let n = dz.len();
    let cfg = config(grid(scx, n.div_ceil(BLOCK as usize)), 0);
    let code = act_code(act);
    let dy_addr = match dy {
        Some(s) => device_addr(s, scx),
        None => device_addr(dz, scx),
    };
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(dz).arg(&dy_addr).arg(pre).arg(&n).arg(&code);
    // SAFETY: matches `act_grad_{dt}(T* dz, const T* dy, const T* pre, size_t n, int
    // act)`; `dz`, `dy` and `pre` hold `n` elements (same shapes, checked at submit);
    // `dy` is either a distinct input or `dz` itself, which the kernel allows (each
    // element is read, then written, by one thread); all outlive the work.
    unsafe { lb.launch(cfg) }.map_err(|e| launch_error("linear_backward", e))?;
    Ok(())
}

/// `db[j] = Σ_r dz[r, j]` over a row-major `[rows, cols]` `dz`.
fn bias_grad<T: Element>(
    scx: &mut StreamCx,
    db: &mut CudaSlice<T>,
    dz: &CudaSlice<T>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let f = kernels::function(scx, MODULE, 2, T::DTYPE, || {
        format!("bias_grad_{}", T::DTYPE.name())
    })?;
    let cfg = config(grid(scx, cols.div_ceil(32)), 0);
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(db).arg(dz).arg(&rows).arg(&cols);
    // SAFETY: matches `bias_grad_{dt}(T* db, const T* dz, size_t rows, size_t cols)`;
    // `dz` holds rows·cols elements and `db` cols, distinct allocations; the kernel
    // writes each `db[j]`, j < cols, once; both outlive the work.
    unsafe { lb.launch(cfg) }.map_err(|e| launch_error("linear_backward", e))?;
    Ok(())
}

/// The extra operand of a training epilogue.
enum Extra<'a, T> {
    /// `GeluAux`: the pre-activation, written.
    GeluAux(&'a mut CudaSlice<T>),
    /// `DGelu`: the pre-activation, read.
    DGelu(&'a CudaSlice<T>),
    /// `BgradB`: the bias gradient, written.
    BgradB(&'a mut CudaSlice<T>),
}

/// Runs `g` with a training epilogue into a new output. `Ok(None)`, with nothing
/// enqueued and nothing allocated, when cuBLASLt has no plan for it (the caller runs
/// the unfused path).
///
/// The plan is looked up before the output is allocated: inside a graph capture an
/// allocation dropped for the unfused path would have taken the output buffer the
/// unfused GEMM needs (`runtime/src/driver/capture.rs`). The key assumes the fresh
/// output 256-byte aligned, as the caching allocator's whole blocks are (checked).
fn gemm_fused<T: Element>(
    scx: &mut StreamCx,
    g: &GemmArgs<'_, T>,
    extra: Extra<'_, T>,
) -> Result<Option<CudaSlice<T>>> {
    let dims = g.dims;
    let (kind, what) = match &extra {
        Extra::GeluAux(_) => (FusedKind::GeluAux, "GELU_AUX_BIAS"),
        Extra::DGelu(_) => (FusedKind::DGelu, "DGELU"),
        Extra::BgradB(_) => (FusedKind::BgradB, "BGRADB"),
    };
    let a = device_addr(g.a, scx);
    let b = device_addr(g.b, scx);
    let aux = match &extra {
        Extra::GeluAux(p) => Some(device_addr(p, scx)),
        Extra::DGelu(p) => Some(device_addr(p, scx)),
        Extra::BgradB(_) => None,
    };
    // The bias pointer: the bias input (GELU_AUX_BIAS) or the gradient output (BGRADB).
    let bias = match &extra {
        Extra::BgradB(p) => Some(device_addr(p, scx)),
        _ => g.bias.map(|s| device_addr(s, scx)),
    };
    let key = g.plan_key(
        [alignment(a), alignment(b), 256, bias.map_or(256, alignment)],
        Some(Fusion {
            kind,
            aux_ld: if aux.is_some() { dims.n } else { 0 },
            aux_align: aux.map_or(256, alignment),
        }),
        super::sm_target(scx, g),
    );
    {
        let st = scx.ext::<GemmState>(GemmState::new)?;
        let ws_len = st.workspace.len() * 4;
        let lt = &st.lt;
        let (plan, hit) = st
            .plans
            .get_or_try_insert(key, || {
                // A descriptor this cuBLASLt rejects (an attribute it does not know) is
                // "no plan" too: the unfused path computes the same result.
                Ok::<_, std::convert::Infallible>(
                    LtPlan::with_aux(lt, &key, bias, aux, ws_len).unwrap_or_else(|e| {
                        tracing::debug!(error = %e, "linear: training epilogue descriptor rejected");
                        None
                    }),
                )
            })
            .unwrap_or_else(|never| match never {});
        if hit {
            PLAN_HITS.fetch_add(1, Ordering::Relaxed);
        } else {
            PLAN_MISSES.fetch_add(1, Ordering::Relaxed);
        }
        if plan.is_none() {
            count_fallback(what, "cuBLASLt returned no algorithm");
            return Ok(None);
        }
    }
    let len = dims.batch * dims.m * dims.n;
    let d = alloc_out::<T>(scx, len)?;
    let dp = device_addr(&d, scx);
    if alignment(dp) < 256 {
        return Err(rtx_runtime::Error::invalid(
            "linear",
            "a fresh GEMM output is not 256-byte aligned, which its cuBLASLt plan assumes",
        ));
    }
    let GemmState {
        stream,
        lt,
        workspace,
        plans,
        reclaim,
        ..
    } = scx.ext::<GemmState>(GemmState::new)?;
    let stream: &cudarc::driver::CudaStream = stream;
    let ws_len = workspace.len() * 4;
    let (ws, _gws) = dptr_mut(workspace, stream);
    let plan = plans
        .peek(&key)
        .and_then(Option::as_ref)
        .expect("looked up above, nothing inserted since");
    let ptrs = Ptrs {
        a,
        b,
        d: dp,
        bias,
        workspace: (ws, ws_len),
    };
    // SAFETY: `a`, `b` (and the bias input) are the op's inputs, validated at submit
    // for the plan's shapes (`batch·m·k`, `batch·k·n`, `n`); `d` is fresh, `batch·m·n`
    // elements; the aux matrix is the `m × n` pre-activation (ld `n`), fresh for
    // GELU_AUX (written) or an input for DGELU (read), borrowed through `extra` for
    // this call; the BGRADB output is fresh with one element per row of our output
    // (`m`), borrowed mutably through `extra`; fresh buffers overlap nothing. All
    // outlive the work (op keep-alive, or returned as outputs); the workspace is this
    // stream's own.
    reclaim.retry(|| unsafe { plan.launch_aux(lt, &ptrs, aux, stream.cu_stream() as _) })?;
    drop((_gws, extra));
    Ok(Some(d))
}

/// `linear_train` on CUDA: `(y, pre)`; `pre` is `None` for `Activation::None`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_train<T: Element>(
    scx: &mut StreamCx,
    x: &CudaSlice<T>,
    w: &CudaSlice<T>,
    bias: Option<&CudaSlice<T>>,
    dims: &GemmDims,
    act: Activation,
    tf32: bool,
) -> Result<(CudaSlice<T>, Option<CudaSlice<T>>)>
where
    CudaBlas: Gemm<T>,
{
    let g = |act| GemmArgs {
        a: x,
        b: w,
        bias,
        dims,
        trans_a: false,
        trans_b: true,
        tf32,
        act,
    };
    if act == Activation::None {
        return Ok((super::gemm(scx, g(act))?, None));
    }
    let len = dims.m * dims.n;
    if act == Activation::Gelu {
        if gelu_aux_ld_ok(dims.n) {
            let mut pre = alloc_out::<T>(scx, len)?;
            if let Some(y) = gemm_fused(scx, &g(act), Extra::GeluAux(&mut pre))? {
                return Ok((y, Some(pre)));
            }
        } else {
            count_fallback("GELU_AUX_BIAS", "out_features not a multiple of 8");
        }
    }
    let pre = super::gemm(scx, g(Activation::None))?;
    let mut y = alloc_out::<T>(scx, len)?;
    act_fwd(scx, &mut y, &pre, act)?;
    Ok((y, Some(pre)))
}

/// The operands of `linear_backward` on CUDA (shapes validated at submit).
pub(crate) struct BackwardArgs<'a, T> {
    pub dy: &'a CudaSlice<T>,
    pub x: &'a CudaSlice<T>,
    pub w: &'a CudaSlice<T>,
    pub pre: Option<&'a CudaSlice<T>>,
    pub act: Activation,
    pub input_act: Option<(Activation, &'a CudaSlice<T>)>,
    pub has_bias: bool,
    /// Rows (flattened leading dims), in_features, out_features.
    pub rows: usize,
    pub inp: usize,
    pub out: usize,
    /// `x`'s shape (that of dx).
    pub x_shape: &'a Shape,
    pub tf32: bool,
}

/// The gradients `(dx, dw, db)` on CUDA.
pub(crate) type CudaGrads<T> = (CudaSlice<T>, CudaSlice<T>, Option<CudaSlice<T>>);

/// A `CudaSlice` view of a stream's scratch memory: never frees it (leaked on drop).
struct ScratchView<T>(Option<CudaSlice<T>>);

impl<T> ScratchView<T> {
    fn get(&self) -> &CudaSlice<T> {
        self.0.as_ref().expect("a view until dropped")
    }
    fn get_mut(&mut self) -> &mut CudaSlice<T> {
        self.0.as_mut().expect("a view until dropped")
    }
}

impl<T> Drop for ScratchView<T> {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            // The memory is the stream's scratch, not this view's to free.
            let _ = s.leak();
        }
    }
}

/// `linear_backward` on CUDA (see the module docs for the path each step takes).
pub(crate) fn linear_backward<T: Element>(
    scx: &mut StreamCx,
    p: BackwardArgs<'_, T>,
) -> Result<CudaGrads<T>>
where
    CudaBlas: Gemm<T>,
{
    let (rows, inp, out) = (p.rows, p.inp, p.out);
    // dz = dy ⊙ act'(pre): a temporary in the stream's persistent scratch (no allocation
    // per call, so the backward can be captured into a graph); its uses on this stream
    // are ordered after the GEMMs below read it.
    let dz_owned = match (p.act, p.pre) {
        (Activation::None, _) | (_, None) => None,
        (act, Some(pre)) => {
            let n = rows.checked_mul(out).ok_or_else(|| {
                rtx_runtime::Error::invalid("linear_backward", "rows * out overflows")
            })?;
            let addr = scx.scratch::<T>("linear_backward.dz", n)?;
            // SAFETY: `addr` is this stream's scratch of at least `n` elements of T
            // (`StreamCx::scratch`), alive as long as the stream, used only by ops on this
            // stream (ordered); the view never frees it (`ScratchView` leaks it).
            let mut dz = ScratchView(Some(unsafe {
                scx.stream().upgrade_device_ptr::<T>(addr, n)
            }));
            act_grad(scx, dz.get_mut(), Some(p.dy), pre, act)?;
            Some(dz)
        }
    };
    let dz = dz_owned.as_ref().map_or(p.dy, ScratchView::get);

    // dx = dz · w ([rows, out] · [out, in]), with the input's activation derivative.
    let dx_dims = GemmDims {
        batch: 1,
        m: rows,
        n: inp,
        k: out,
        a_bs: 0,
        b_bs: 0,
        out: p.x_shape.clone(),
    };
    let gx = || GemmArgs {
        a: dz,
        b: p.w,
        bias: None,
        dims: &dx_dims,
        trans_a: false,
        trans_b: false,
        tf32: p.tf32,
        act: Activation::None,
    };
    let dx = match p.input_act {
        None | Some((Activation::None, _)) => super::gemm(scx, gx())?,
        Some((act_in, pre_in)) => {
            let fused = if act_in == Activation::Gelu && gelu_aux_ld_ok(inp) {
                gemm_fused(scx, &gx(), Extra::DGelu(pre_in))?
            } else {
                if act_in == Activation::Gelu {
                    count_fallback("DGELU", "in_features not a multiple of 8");
                }
                None
            };
            match fused {
                Some(dx) => dx,
                None => {
                    let mut dx = super::gemm(scx, gx())?;
                    act_grad(scx, &mut dx, None, pre_in, act_in)?;
                    dx
                }
            }
        }
    };

    // dw = dzᵀ · x ([out, rows] · [rows, in]); db = Σ_rows dz.
    let dw_dims = GemmDims {
        batch: 1,
        m: out,
        n: inp,
        k: rows,
        a_bs: 0,
        b_bs: 0,
        out: Shape::new(vec![out, inp]),
    };
    let gw = || GemmArgs {
        a: dz,
        b: p.x,
        bias: None,
        dims: &dw_dims,
        trans_a: true,
        trans_b: false,
        tf32: p.tf32,
        act: Activation::None,
    };
    let (dw, db) = if p.has_bias {
        let mut db = alloc_out::<T>(scx, out)?;
        let fused = if bgradb_ok(out) {
            gemm_fused(scx, &gw(), Extra::BgradB(&mut db))?
        } else {
            count_fallback("BGRADB", "out_features not a multiple of 8");
            None
        };
        match fused {
            Some(dw) => (dw, Some(db)),
            None => {
                let dw = super::gemm(scx, gw())?;
                bias_grad(scx, &mut db, dz, rows, out)?;
                (dw, Some(db))
            }
        }
    } else {
        (super::gemm(scx, gw())?, None)
    };
    drop(dz_owned);
    Ok((dx, dw, db))
}
