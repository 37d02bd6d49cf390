//! CUDA launches of `kernels/cuda/attention.cu` (FlashAttention-2, f16/bf16, D 64/128),
//! of `kernels/cuda/attention_wgmma.cu` and `kernels/cuda/attention_tma.cu` (the Hopper
//! forwards) and of
//! `kernels/cuda/attention_wgmma_bwd.cu` and `kernels/cuda/attention_tma_bwd.cu` (the
//! Hopper backward main kernels, D 128).
//!
//! Every kernel takes one `FlashParams` (`rtx_kernels::launch`) by value (the TMA
//! forward a `FlashTmaParams`: the same, its work-tile counters and three tensor maps;
//! the TMA backward a `FlashTmaBwdParams`: the same and five tensor maps, the f32
//! workspace's among them); the kernel table (grids, blocks, dynamic shared memory: the
//! ABI documented at the top of each `.cu` file) and the per-stream state are in
//! `launch.rs`, the TMA forward's grid of work tiles and its counters in `grid.rs`. The backward's f32 workspace (dq_accum, then
//! dsum) is kept per stream for the next call: every use of it is ordered on that one
//! stream, and the preprocess kernel rewrites all of it before the other two read it.
//!
//! # Which forward
//!
//! On compute capability 9.0 (H100, H200) the forward is `flash_fwd_wgmma_*`: warpgroup
//! MMA (`wgmma.mma_async`), which exists only on the architecture-specific target
//! `sm_90a` — rtx-kernels compiles that program for it by itself (its source is marked
//! arch-specific) and the CUBIN loads on 9.0 devices only. Everywhere else, and on a 9.0
//! device where that program fails to compile or load (the failure is logged once per
//! stream, which then stays on the fallback), the forward is the `mma.sync` kernel of
//! `attention.cu`. Both compute the same function (same ABI, masks, causal rule, lse
//! convention); `RTX_ATTN_WGMMA=0` in the environment forces the `mma.sync` forward.
//!
//! For D = 128 on 9.0 the forward is `flash_fwd_tma_d128_*` of `attention_tma.cu`:
//! FlashAttention-3's block (a producer warpgroup loading Q, K and V tiles with bulk
//! tensor copies, two consumer warpgroups in ping-pong, stages handed over by mbarriers),
//! 1.13-1.22× the wgmma kernel on the H200 (`benches/RESULTS.md`, "Attention"); a call
//! without a mask takes its build without the mask's loads, `flash_fwd_tma_nm_d128_*`
//! (fewer registers: the masked build spills 24 bytes, this one none). For D = 64 a call
//! without a mask runs `flash_fwd_tma_nm_d64_*` (FlashAttention-3's D = 64 block: three
//! consumer warpgroups of 64 rows, 192 rows per block; 1.21-1.28× the wgmma forward at
//! L ≥ 4096 on the H200), a call with one the wgmma forward (the masked build spills at
//! the 160 registers three consumers get). The TMA kernels read
//! q, k and v through tensor maps made on the host per call (`cuTensorMapEncodeTiled`);
//! a call whose maps the driver refuses runs the wgmma forward instead (or, where that
//! one is unavailable too, the `mma.sync` one), and a stream where the TMA kernel fails
//! to load runs those from then on.
//!
//! # Which backward
//!
//! The backward is three kernels on one stream: `attention.cu`'s preprocess (dsum,
//! dq_accum = 0), the main kernel (dK, dV, dq_accum), `attention.cu`'s convert (dq). On
//! compute capability 9.0 the main kernel is `flash_bwd_tma_d{64,128}_*` of
//! `attention_tma_bwd.cu` (the setting `attn_bwd_tma`, on by default; `RTX_ATTN_BWD_TMA=0`
//! turns it off): wgmma GEMMs fed by a producer warpgroup (bulk tensor copies of Q and dO
//! through tensor maps, K and V in boxes of 128 rows, Q and dO of a step's query rows: 128
//! at D = 64, FlashAttention-3's block, 64 at D = 128), with the forward's
//! fallback rules (maps refused: the kernel the setting off would run, for that call;
//! failed to load: that kernel on that stream from then on). With the setting off, or
//! where that kernel is unavailable, D = 128 on 9.0 runs `flash_bwd_wgmma_d128_*` of
//! `attention_wgmma_bwd.cu` (wgmma, sm_90a, 128 keys per block, every thread loading
//! with cp.async), with the same fallback rules (its own failure flag per stream;
//! `RTX_ATTN_WGMMA=0` turns both Hopper backwards off); otherwise the main kernel is
//! `attention.cu`'s `flash_bwd_dq_dk_dv_*` (64 keys per block).

mod grid;
mod launch;
mod tensor_map;

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use self::grid::{tile_counters, tma_forward_grid};
use self::launch::{
    backward_function, flash_params, forward_function, function, state, wgmma_backward_function,
    wgmma_forward_function, FlashParams, FlashTmaBwdParams, FlashTmaParams, Kernel, BWD, FWD,
};
use self::tensor_map::{dq_accum_map, tensor_map};
use super::geometry::Geometry;
use crate::gemm::device::{dptr, dptr_mut};
use crate::kernels;

/// Launches of the TMA backward main kernel in this process (see
/// `crate::attention::tma_backward_launches`).
pub(super) static TMA_BWD_LAUNCHES: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);
/// Launches of the TMA forward in this process: the masked build, the mask-less one (see
/// `crate::attention::tma_forward_launches`).
pub(super) static TMA_FWD_LAUNCHES: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Set once a call's tensor maps were refused (the warning is logged once per process).
static MAPS_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Largest backward workspace (bytes) kept per stream between calls; a larger one is
/// allocated for its call and freed (stream-ordered) after it.
const WORKSPACE_KEEP_MAX: usize = 256 << 20;

// ---- forward ---------------------------------------------------------------------------

/// Enqueues the forward: `(o, lse)` as new buffers.
pub(super) fn forward(
    scx: &mut StreamCx,
    g: &Geometry,
    dtype: DType,
    qkv: [&Buffer; 3],
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer)> {
    match dtype {
        DType::F16 => forward_t::<f16>(scx, g, qkv, mask),
        DType::BF16 => forward_t::<bf16>(scx, g, qkv, mask),
        other => Err(Error::dtype(FWD, DType::F16, other)),
    }
}

fn forward_t<T: Element>(
    scx: &mut StreamCx,
    g: &Geometry,
    [q, k, v]: [&Buffer; 3],
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer)> {
    let p = &g.p;
    let f = forward_function(scx, p.d, T::DTYPE, mask.is_some())?;
    // The TMA kernel's stand-in for a call whose tensor maps the driver refuses (taken
    // here, before the stream is borrowed; its own failure fails only such a call).
    let stand_in = match f.kernel {
        Kernel::ForwardTma | Kernel::ForwardTmaNoMask => {
            Some(wgmma_forward_function(scx, p.d, T::DTYPE))
        }
        _ => None,
    };
    // The TMA forward's work-tile counters (before the stream is borrowed below).
    let sched = match stand_in {
        Some(_) => tile_counters(scx)?,
        None => 0,
    };
    let mut o = kernels::alloc_out::<T>(scx, p.q_len())?;
    let mut lse = kernels::alloc_out::<f32>(scx, p.lse_len())?;
    let (q, k, v) = (q.cuda::<T>()?, k.cuda::<T>()?, v.cuda::<T>()?);
    let mask = mask.map(|m| m.cuda::<T>()).transpose()?;
    {
        let stream: &CudaStream = scx.stream();
        let (qp, _gq) = dptr(q, stream);
        let (kp, _gk) = dptr(k, stream);
        let (vp, _gv) = dptr(v, stream);
        let (mp, _gm) = mask.map(|m| dptr(m, stream)).unzip();
        let (op, _go) = dptr_mut(&mut o, stream);
        let (lp, _gl) = dptr_mut(&mut lse, stream);
        let params = FlashParams {
            q: qp,
            k: kp,
            v: vp,
            mask: mp.unwrap_or(0),
            o: op,
            lse: lp,
            ..flash_params(g)
        };
        let rows = f.kernel.rows_per_block(p.d);
        let grid = match f.kernel {
            Kernel::ForwardTma | Kernel::ForwardTmaNoMask => {
                tma_forward_grid(f.kernel, p.d, (p.lq, p.lk, p.h, p.b), scx.sm_count()).ok_or_else(
                    || Error::invalid(FWD, "more query tiles than the TMA forward counts (2^31)"),
                )?
            }
            _ => (p.lq.div_ceil(rows) as u32, p.h as u32, p.b as u32),
        };
        let maps = || {
            let dt = T::DTYPE;
            Ok::<_, String>((
                tensor_map(qp, dt, p.d, p.lq, p.b * p.h, Kernel::tma_fwd_q_rows(p.d))?,
                tensor_map(kp, dt, p.d, p.lk, p.b * p.h_kv, 128)?,
                tensor_map(vp, dt, p.d, p.lk, p.b * p.h_kv, 128)?,
            ))
        };
        // SAFETY (both launches): q, k, v are the op's inputs ([B,H,Lq,D], [B,Hkv,Lk,D]
        // x2 of T, kept alive by the op until its completion), the mask (if any) holds
        // the planes its strides in `params` address (validated at submit), o and lse
        // are fresh allocations of B*H*Lq*D T and B*H*Lq f32 on this stream; all are
        // whole, contiguous device allocations (aligned beyond the 16 bytes the kernels
        // need). The tensor maps are those of q, k and v, made by `tensor_map` for these
        // pointers and shapes.
        match stand_in {
            // SAFETY: the buffers above; `f` is not the TMA kernel (no stand-in).
            None => unsafe { f.launch(stream, grid, &params) }?,
            Some(stand_in) => match maps() {
                Ok((q, k, v)) => {
                    let tp = FlashTmaParams {
                        p: params,
                        sched,
                        q,
                        k,
                        v,
                    };
                    // SAFETY: the buffers above and their maps, for the TMA kernel `f` is.
                    unsafe { f.launch_tma(stream, grid, &tp) }?;
                    let nm = (f.kernel == Kernel::ForwardTmaNoMask) as usize;
                    TMA_FWD_LAUNCHES[nm].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => {
                    let w = stand_in?;
                    maps_refused(&e, &w);
                    // Its own grid: the D = 64 TMA forward takes 192 rows a block, the
                    // wgmma and mma.sync ones 128.
                    let rows = w.kernel.rows_per_block(p.d);
                    let grid = (p.lq.div_ceil(rows) as u32, p.h as u32, p.b as u32);
                    // SAFETY: the buffers above; `w` is a FlashParams kernel, launched
                    // over its own grid.
                    unsafe { w.launch(stream, grid, &params) }?;
                }
            },
        }
    }
    Ok((Buffer::from_cuda(o), Buffer::from_cuda(lse)))
}

/// Logs (once per process) that the driver refused a call's tensor maps (`e`) and that
/// `w` runs such calls instead.
fn maps_refused(e: &str, w: &launch::Launch) {
    if !MAPS_REFUSED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "attention: the driver refused the tensor maps of a call ({e}); \
             {} runs such calls (logged once)",
            w.kernel.name()
        );
    }
}

// ---- backward --------------------------------------------------------------------------

/// The backward workspace (f32: dq_accum `[B,H,Lq,D]`, then dsum `[B,H,Lq]`) of at
/// least `n` elements: this stream's cached one when big enough, else a new one (the
/// too-small one is freed, stream-ordered after its last use).
fn take_workspace(scx: &mut StreamCx, n: usize) -> Result<CudaSlice<f32>> {
    if let Some(ws) = state(scx)?.workspace.take() {
        if ws.len() >= n {
            return Ok(ws);
        }
    }
    scx.alloc::<f32>(n)
}

/// Keeps `ws` for the next backward on this stream unless it is too large to hold.
fn keep_workspace(scx: &mut StreamCx, ws: CudaSlice<f32>) -> Result<()> {
    if ws.len() * 4 <= WORKSPACE_KEEP_MAX {
        state(scx)?.workspace = Some(ws);
    }
    Ok(())
}

/// Enqueues the backward: `(dq, dk, dv)` as new buffers. `ins` is q, k, v, o, dO.
pub(super) fn backward(
    scx: &mut StreamCx,
    g: &Geometry,
    dtype: DType,
    ins: [&Buffer; 5],
    lse: &Buffer,
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer, Buffer)> {
    match dtype {
        DType::F16 => backward_t::<f16>(scx, g, ins, lse, mask),
        DType::BF16 => backward_t::<bf16>(scx, g, ins, lse, mask),
        other => Err(Error::dtype(BWD, DType::F16, other)),
    }
}

fn backward_t<T: Element>(
    scx: &mut StreamCx,
    g: &Geometry,
    [q, k, v, o, dout]: [&Buffer; 5],
    lse: &Buffer,
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer, Buffer)> {
    let p = &g.p;
    let d = p.d;
    let pre = function(scx, Kernel::Preprocess, d, T::DTYPE)?;
    let main = backward_function(scx, d, T::DTYPE)?;
    // The TMA kernel's stand-in for a call whose tensor maps the driver refuses (taken
    // here, before the stream is borrowed; its own failure fails only such a call).
    let stand_in = match main.kernel {
        Kernel::DqDkDvTma => Some(wgmma_backward_function(scx, d, T::DTYPE)),
        _ => None,
    };
    let conv = function(scx, Kernel::ConvertDq, d, T::DTYPE)?;
    let mut dq = kernels::alloc_out::<T>(scx, p.q_len())?;
    let mut dk = kernels::alloc_out::<T>(scx, p.kv_len())?;
    let mut dv = kernels::alloc_out::<T>(scx, p.kv_len())?;
    let mut ws = take_workspace(scx, p.q_len() + p.lse_len())?;
    let (q, k, v) = (q.cuda::<T>()?, k.cuda::<T>()?, v.cuda::<T>()?);
    let (o, dout, lse) = (o.cuda::<T>()?, dout.cuda::<T>()?, lse.cuda::<f32>()?);
    let mask = mask.map(|m| m.cuda::<T>()).transpose()?;
    {
        let stream: &CudaStream = scx.stream();
        let (qp, _gq) = dptr(q, stream);
        let (kp, _gk) = dptr(k, stream);
        let (vp, _gv) = dptr(v, stream);
        let (mp, _gm) = mask.map(|m| dptr(m, stream)).unzip();
        let (op, _go) = dptr(o, stream);
        let (lp, _gl) = dptr(lse, stream);
        let (dop, _gdo) = dptr(dout, stream);
        let (wp, _gw) = dptr_mut(&mut ws, stream);
        let (dqp, _gdq) = dptr_mut(&mut dq, stream);
        let (dkp, _gdk) = dptr_mut(&mut dk, stream);
        let (dvp, _gdv) = dptr_mut(&mut dv, stream);
        let params = FlashParams {
            q: qp,
            k: kp,
            v: vp,
            mask: mp.unwrap_or(0),
            o: op,
            lse: lp,
            dout: dop,
            dq_accum: wp,
            // After dq_accum's B*H*Lq*D floats: a multiple of 256 bytes in (D >= 64).
            dsum: wp + 4 * p.q_len() as u64,
            dq: dqp,
            dk: dkp,
            dv: dvp,
            ..flash_params(g)
        };
        let rows = p.b * p.h * p.lq;
        let rows_per_block = 256 / (d / 8);
        let pre_grid = (rows.div_ceil(rows_per_block) as u32, 1, 1);
        let keys = main.kernel.keys_per_block(d);
        let main_grid = (p.lk.div_ceil(keys) as u32, p.h_kv as u32, p.b as u32);
        let conv_grid = ((p.q_len() / 4).div_ceil(256).clamp(1, 65_535) as u32, 1, 1);
        // SAFETY (all three): q, k, v, o, dO, lse and the mask are the op's inputs in
        // the shapes and dtypes validated at submit (o/dO/dq [B,H,Lq,D] and k/v/dk/dv
        // [B,Hkv,Lk,D] of T, lse [B,H,Lq] f32), kept alive by the op until completion;
        // dq, dk, dv are fresh allocations on this stream; the workspace holds
        // B*H*Lq*(D+1) f32 (dq_accum then dsum, both 16-byte aligned) and is only
        // used on this stream. All are whole, contiguous device allocations (aligned
        // beyond the 16 bytes the kernels need). The launches are ordered on one stream
        // as attention.cu requires: preprocess, dq/dk/dv (either main kernel: the same
        // inputs and outputs; its grid covers Lk in blocks of its keys), convert dq.
        unsafe { pre.launch(stream, pre_grid, &params) }?;
        match stand_in {
            // SAFETY: as above; `main` is not the TMA kernel (no stand-in).
            None => unsafe { main.launch(stream, main_grid, &params) }?,
            Some(stand_in) => {
                let dt = T::DTYPE;
                let qrows = Kernel::tma_bwd_query_rows(d);
                let maps = (|| {
                    Ok::<_, String>((
                        tensor_map(qp, dt, d, p.lq, p.b * p.h, qrows)?,
                        tensor_map(kp, dt, d, p.lk, p.b * p.h_kv, 128)?,
                        tensor_map(vp, dt, d, p.lk, p.b * p.h_kv, 128)?,
                        tensor_map(dop, dt, d, p.lq, p.b * p.h, qrows)?,
                        dq_accum_map(wp, d, p.lq, p.b * p.h)?,
                    ))
                })();
                match maps {
                    Ok((q, k, v, dout, dq)) => {
                        let tp = FlashTmaBwdParams {
                            p: params,
                            q,
                            k,
                            v,
                            dout,
                            dq,
                        };
                        // SAFETY: as above, and the maps are those of q, k, v and dO
                        // made by `tensor_map` for these pointers and shapes (boxes of
                        // the kernel's query rows per step for q and dO, 128-row ones
                        // for k and v) and that of dq_accum (the workspace's first
                        // B*H*Lq*D floats) made by `dq_accum_map`, for the TMA
                        // kernel `main` is; its grid covers Lk in blocks of its 128 keys.
                        unsafe { main.launch_tma_bwd(stream, main_grid, &tp) }?;
                        TMA_BWD_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => {
                        let w = stand_in?;
                        maps_refused(&e, &w);
                        // Its own grid: the mma.sync kernel (D = 64) takes 64 keys a block.
                        let keys = w.kernel.keys_per_block(d);
                        let grid = (p.lk.div_ceil(keys) as u32, p.h_kv as u32, p.b as u32);
                        // SAFETY: as above; `w` is a FlashParams kernel with the same
                        // inputs and outputs, launched over its own grid.
                        unsafe { w.launch(stream, grid, &params) }?;
                    }
                }
            }
        }
        // SAFETY: as above (the main kernel, whichever ran, was enqueued before).
        unsafe { conv.launch(stream, conv_grid, &params) }?;
    }
    keep_workspace(scx, ws)?;
    Ok((
        Buffer::from_cuda(dq),
        Buffer::from_cuda(dk),
        Buffer::from_cuda(dv),
    ))
}
