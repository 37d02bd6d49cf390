//! CUDA launches of `kernels/cuda/norm.cu`.
//!
//! With the experimental setting `layer_norm_bulk`, on compute capability 9.0 and newer,
//! 16-byte aligned rows of the register path take `ln_fwd_bulk_*` and `ln_bwd_bulk_*`
//! (norm_bulk.cuh: whole rows copied into rings in shared memory by bulk copies, one block
//! per SM; the backward then `ln_bwd_final_*` as below) instead of the kernels below.
//!
//! The backward, when a row fits the kernels' register path (16-byte aligned rows of at
//! most 1024 vectors of 16 bytes, d <= 8192) and is at least 8 KiB long, is two launches:
//! `ln_bwd_pipe_*` (dx, and each block's partial sums of dgamma and dbeta over its rows,
//! so that dy and x are read once, staged through a cp.async ring in 118 KiB of shared
//! memory, one block per SM) or, where the device lacks that shared memory or cp.async
//! (before compute capability 8.0), `ln_bwd_fused_*` (the same in registers); then
//! `ln_bwd_final_*` (the partials summed in block order). Otherwise it is three:
//! dx, the partial sums over chunks of rows (`ln_bwd_part_*`, rereading dy and x), and
//! their sum in chunk order. Both are deterministic: every sum's order depends only on
//! the shape and the device's SM count. The partials live in the stream's persistent
//! scratch (`StreamCx::scratch`), so the backward allocates only its outputs and can be
//! captured into a graph.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use super::{BWD, FWD};
use crate::kernels::{self, config, device_addr, float_dispatch, grid, launch_error, BLOCK};

const MODULE: &str = "norm";

/// Blocks per SM of `ln_bwd_fused_*` (`LN_FUSED_BLOCKS` in norm.cu, its launch bound): its
/// grid, and so the number of partial rows, is the SM count times this.
const FUSED_BLOCKS_PER_SM: usize = 2;
/// Most 16-byte vectors per thread of the register path (`LN_NV` in norm.cu).
const LN_NV: usize = 4;
/// Longest row of `ln_bwd_fused_*` (`LN_RED` in norm.cu: its shared row of partials).
const FUSED_MAX_D: usize = 8192;
/// Shortest row (bytes) for which the backward takes `ln_bwd_fused_*`.
const FUSED_MIN_BYTES: usize = 8192;
/// Columns per block of `ln_bwd_final_*`.
const FINAL_COLUMNS: usize = 32;
/// Threads per block of `ln_bwd_final_*` (`LN_FINAL_BLOCK` in norm.cu: 32 chunk lanes x
/// 32 columns).
const FINAL_BLOCK: u32 = 1024;
/// `ln_bwd_pipe_*`'s ring (`LN_BPIPE_NV`, `LN_BPIPE_S` in norm.cu): 16-byte vectors per
/// thread and stages.
const PIPE_NV: usize = 4;
const PIPE_STAGES: usize = 3;
/// Blocks per SM of `ln_bwd_pipe_*` (`LN_BPIPE_BLOCKS`, its launch bound): its grid is the
/// SM count times this.
const PIPE_BLOCKS_PER_SM: usize = 1;
/// `ln_bwd_pipe_*`'s dynamic shared memory at [`BLOCK`] threads: per stage dy and x
/// (`PIPE_NV` vectors of 16 bytes per thread each) and mean, rstd (4 bytes each), then
/// gamma (`PIPE_NV` vectors per thread).
const PIPE_SMEM: usize = PIPE_STAGES * (2 * PIPE_NV * BLOCK as usize * 16 + 8 * BLOCK as usize)
    + PIPE_NV * BLOCK as usize * 16;

/// `ln_fwd_bulk_*` (norm_bulk.cuh, `LN_FWD_BULK_*` in norm.cu): threads per block, most
/// 16-byte vectors per thread, most ring stages.
const BULK_FWD: (usize, usize, usize) = (256, 16, 12);
/// `ln_bwd_bulk_*` (`LN_BWD_BULK_*`): the same.
const BULK_BWD: (usize, usize, usize) = (256, 4, 12);
/// The most dynamic shared memory the bulk kernels ask for: a block's 227 KiB on compute
/// capability 9.0 less 2 KiB for their static shared memory (less where the device's
/// per-block limit is lower).
const BULK_SMEM: usize = 232_448 - 2048;

/// Threads per row group of the register path for rows of `nv` 16-byte vectors
/// (norm.cu's `ln_group`): the fewest, a power of two from a warp to the block, that
/// hold the row at `per` vectors per thread.
fn row_group(nv: usize, per: usize, block: usize) -> usize {
    let mut gn = 32;
    while gn < block && gn * per < nv {
        gn *= 2;
    }
    gn
}

/// (groups per block, dynamic shared memory) of a bulk kernel of `(threads, per, stages)`
/// for rows of `nv` vectors, `operands` rows per slot (x; or dy and x): as many stages,
/// up to `stages`, as `budget` bytes hold (the kernel derives the same count from the
/// dynamic shared memory it is given). `None` where the row is off its register path or
/// not one stage fits.
fn bulk_plan(
    nv: usize,
    (threads, per, stages): (usize, usize, usize),
    operands: usize,
    budget: usize,
) -> Option<(usize, u32)> {
    if nv == 0 || nv > threads * per {
        return None;
    }
    let gpb = threads / row_group(nv, per, threads);
    let stage = gpb * operands * nv * 16;
    let s = stages.min(budget / stage);
    (s > 0).then(|| (gpb, (s * stage) as u32))
}

const _: () = assert!(
    PIPE_NV == LN_NV,
    "ln_bwd_pipe takes the rows of the register path's gate"
);

/// Per-stream state of this launcher: whether `ln_bwd_pipe_*` runs here, per float dtype
/// (f32, f16, bf16): `None` until its first use, then whether its shared memory could be
/// granted.
#[derive(Default)]
struct NormState {
    pipe: [Option<bool>; 3],
    bulk: [Option<usize>; 3],
}

/// Whether `ln_bwd_pipe_*` for `T` can run on this stream's device: compute capability
/// 8.0 or newer (cp.async) and [`PIPE_SMEM`] bytes of dynamic shared memory granted to
/// the function (asked for once per stream and dtype; a refusal is remembered and the
/// backward takes `ln_bwd_fused_*`).
fn pipe_ready<T: Element>(scx: &mut StreamCx) -> Result<bool> {
    let slot = kernels::dtype_slot(T::DTYPE);
    if let Some(ok) = scx.ext::<NormState>(|_| Ok(NormState::default()))?.pipe[slot] {
        return Ok(ok);
    }
    let ok = scx.arch().0 >= 8 && {
        let f = kernels::function(scx, MODULE, 5, T::DTYPE, || {
            format!("ln_bwd_pipe_{}", T::DTYPE.name())
        })?;
        let granted = kernels::allow_dynamic_smem(scx, &f, PIPE_SMEM);
        if !granted {
            tracing::debug!(
                "layer_norm_backward: {PIPE_SMEM} bytes of shared memory refused on device {}; \
                 using ln_bwd_fused",
                scx.ordinal()
            );
        }
        granted
    };
    scx.ext::<NormState>(|_| Ok(NormState::default()))?.pipe[slot] = Some(ok);
    Ok(ok)
}

/// The dynamic shared memory the bulk-copy kernels (`ln_fwd_bulk_*`, `ln_bwd_bulk_*`)
/// may take for `T` on this stream, 0 where they do not run: the setting
/// `layer_norm_bulk` off, compute capability below 9.0, or the device refusing
/// [`BULK_SMEM`] capped at its per-block limit less 2 KiB (asked for once per stream and
/// dtype; a refusal is remembered and the ops take their other kernels).
fn bulk_budget<T: Element>(scx: &mut StreamCx) -> Result<usize> {
    if !scx.settings().layer_norm_bulk || scx.arch().0 < 9 {
        return Ok(0);
    }
    let slot = kernels::dtype_slot(T::DTYPE);
    if let Some(budget) = scx.ext::<NormState>(|_| Ok(NormState::default()))?.bulk[slot] {
        return Ok(budget);
    }
    let mut fns = Vec::with_capacity(2);
    for (code, kernel) in [(6u16, "fwd_bulk"), (7, "bwd_bulk")] {
        fns.push(kernels::function(scx, MODULE, code, T::DTYPE, || {
            format!("ln_{kernel}_{}", T::DTYPE.name())
        })?);
    }
    let budget = kernels::grant_dynamic_smem(scx, &fns, BULK_SMEM, "ln_fwd_bulk, ln_bwd_bulk");
    scx.ext::<NormState>(|_| Ok(NormState::default()))?.bulk[slot] = Some(budget);
    Ok(budget)
}

/// Enqueues the forward; returns `(y, mean, rstd)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    scx: &mut StreamCx,
    dtype: DType,
    x: &Buffer,
    g: &Buffer,
    b: &Buffer,
    rows: usize,
    d: usize,
    eps: f32,
) -> Result<[Buffer; 3]> {
    float_dispatch!(dtype, FWD, |T| forward_t::<T>(scx, x, g, b, rows, d, eps))
}

fn forward_t<T: Element>(
    scx: &mut StreamCx,
    x: &Buffer,
    g: &Buffer,
    b: &Buffer,
    rows: usize,
    d: usize,
    eps: f32,
) -> Result<[Buffer; 3]> {
    let (x, g, b) = (x.cuda::<T>()?, g.cuda::<T>()?, b.cuda::<T>()?);
    let v = 16 / std::mem::size_of::<T>();
    // ln_fwd_bulk_{dt} (the setting layer_norm_bulk) on 16-byte aligned rows of its
    // register path: one block per SM (at most one per row group), else ln_fwd_{dt}.
    let bulk = d.is_multiple_of(v)
        && [
            device_addr(x, scx),
            device_addr(g, scx),
            device_addr(b, scx),
        ]
        .iter()
        .all(|a| a % 16 == 0);
    let plan = if bulk {
        bulk_plan(d / v, BULK_FWD, 1, bulk_budget::<T>(scx)?)
    } else {
        None
    };
    let (f, cfg) = match plan {
        Some((gpb, smem)) => {
            let f = kernels::function(scx, MODULE, 6, T::DTYPE, || {
                format!("ln_fwd_bulk_{}", T::DTYPE.name())
            })?;
            let blocks = rows.div_ceil(gpb).min(scx.sm_count() as usize).max(1) as u32;
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (BULK_FWD.0 as u32, 1, 1),
                shared_mem_bytes: smem,
            };
            (f, cfg)
        }
        None => {
            let f = kernels::function(scx, MODULE, 0, T::DTYPE, || {
                format!("ln_fwd_{}", T::DTYPE.name())
            })?;
            (f, config(grid(scx, rows), 0))
        }
    };
    let mut y = kernels::alloc_out::<T>(scx, rows * d)?;
    let mut mean = kernels::alloc_out::<f32>(scx, rows)?;
    let mut rstd = kernels::alloc_out::<f32>(scx, rows)?;
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(x)
        .arg(g)
        .arg(b)
        .arg(&mut y)
        .arg(&mut mean)
        .arg(&mut rstd);
    lb.arg(&rows).arg(&d).arg(&eps);
    // SAFETY: matches norm.cu's `ln_fwd_{dt}(const T* x, const T* gamma, const T* beta, T*
    // y, float* mean, float* rstd, size_t rows, size_t d, float eps)`, and
    // `ln_fwd_bulk_{dt}` with the same arguments: `x` and `y` hold rows * d elements,
    // `gamma`, `beta` d, `mean`, `rstd` rows; every output is written (both are
    // grid-stride over rows). The bulk kernel's block is its launch bound, its dynamic
    // shared memory at most the budget bulk_budget had granted.
    unsafe { lb.launch(cfg) }.map_err(|e| launch_error(FWD, e))?;
    Ok([
        Buffer::from_cuda(y),
        Buffer::from_cuda(mean),
        Buffer::from_cuda(rstd),
    ])
}

/// Enqueues the backward; returns `(dx, dgamma, dbeta)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    scx: &mut StreamCx,
    dtype: DType,
    dy: &Buffer,
    x: &Buffer,
    mean: &Buffer,
    rstd: &Buffer,
    g: &Buffer,
    rows: usize,
    d: usize,
) -> Result<[Buffer; 3]> {
    float_dispatch!(dtype, BWD, |T| backward_t::<T>(
        scx, dy, x, mean, rstd, g, rows, d
    ))
}

/// Rows per chunk of the parameter-gradient pass, and the chunks: about 4 blocks per SM
/// in all, at most 65535 chunks (the grid's y limit).
fn chunking(sm_count: usize, rows: usize, d: usize) -> (usize, usize) {
    let tiles = d.div_ceil(BLOCK as usize);
    let want = (4 * sm_count / tiles).clamp(1, 65535).min(rows);
    let rpc = rows.div_ceil(want).max(rows.div_ceil(65535));
    (rpc, rows.div_ceil(rpc))
}

#[allow(clippy::too_many_arguments)]
fn backward_t<T: Element>(
    scx: &mut StreamCx,
    dy: &Buffer,
    x: &Buffer,
    mean: &Buffer,
    rstd: &Buffer,
    g: &Buffer,
    rows: usize,
    d: usize,
) -> Result<[Buffer; 3]> {
    let name = |k: &str| format!("ln_bwd_{k}_{}", T::DTYPE.name());
    let f_final = kernels::function(scx, MODULE, 3, T::DTYPE, || name("final"))?;
    let (dy, x, g) = (dy.cuda::<T>()?, x.cuda::<T>()?, g.cuda::<T>()?);
    let (mean, rstd) = (mean.cuda::<f32>()?, rstd.cuda::<f32>()?);
    let mut dx = kernels::alloc_out::<T>(scx, rows * d)?;
    let mut dg = kernels::alloc_out::<T>(scx, d)?;
    let mut db = kernels::alloc_out::<T>(scx, d)?;
    // The register path of norm.cu: V = 16 / size_of::<T>() elements per vector.
    let v = 16 / std::mem::size_of::<T>();
    let aligned = [
        device_addr(dy, scx),
        device_addr(x, scx),
        device_addr(g, scx),
    ]
    .iter()
    .all(|a| a % 16 == 0);
    // The fused pass runs at half the dx kernel's occupancy (its accumulators): on the
    // H200 it won at bf16 8192 x 4096 (bwd 0.0953 ms against 0.0992) and lost at 8192 x
    // 768 (0.0355 against 0.0312), so it is taken for rows of at least FUSED_MIN_BYTES.
    let fused = aligned
        && d.is_multiple_of(v)
        && d / v <= BLOCK as usize * LN_NV
        && d <= FUSED_MAX_D
        && d * std::mem::size_of::<T>() >= FUSED_MIN_BYTES;
    // ln_bwd_bulk_{dt} (the setting layer_norm_bulk) on every row of its register path,
    // short ones too.
    let bulk_smem = if aligned && d.is_multiple_of(v) {
        bulk_plan(d / v, BULK_BWD, 2, bulk_budget::<T>(scx)?).map(|(_, smem)| smem)
    } else {
        None
    };
    let pipe = bulk_smem.is_none() && fused && pipe_ready::<T>(scx)?;
    let sms = scx.sm_count() as usize;
    let (rpc, chunks) = if bulk_smem.is_some() {
        (0, rows.min(sms).max(1))
    } else if pipe {
        (0, rows.min(sms * PIPE_BLOCKS_PER_SM).max(1))
    } else if fused {
        (0, rows.min(sms * FUSED_BLOCKS_PER_SM).max(1))
    } else {
        chunking(sms, rows, d)
    };
    let scratch = chunks
        .checked_mul(d)
        .ok_or_else(|| Error::invalid(BWD, "parameter-gradient scratch overflows"))?;
    // The stream's persistent scratch (its uses on this stream are ordered).
    let part_g = scx.scratch::<f32>("ln_bwd.part_g", scratch)?;
    let part_b = scx.scratch::<f32>("ln_bwd.part_b", scratch)?;
    if bulk_smem.is_some() || fused {
        // ln_bwd_bulk_{dt} where bulk_budget and its plan allow, ln_bwd_pipe_{dt} where
        // pipe_ready granted its ring, else ln_bwd_fused_{dt}: the same arguments and
        // results (a partial row per block).
        let (code, kernel, smem, threads) = match bulk_smem {
            Some(smem) => (7, "bulk", smem, BULK_BWD.0 as u32),
            None if pipe => (5, "pipe", PIPE_SMEM as u32, BLOCK),
            None => (4, "fused", 0, BLOCK),
        };
        let f = kernels::function(scx, MODULE, code, T::DTYPE, || name(kernel))?;
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(dy)
            .arg(x)
            .arg(mean)
            .arg(rstd)
            .arg(g)
            .arg(&mut dx)
            .arg(&part_g)
            .arg(&part_b)
            .arg(&rows)
            .arg(&d);
        // SAFETY: `ln_bwd_fused_{dt}(const T* dy, const T* x, const float* mean, const
        // float* rstd, const T* gamma, T* dx, float* part_g, float* part_b, size_t rows,
        // size_t d)`, and `ln_bwd_pipe_{dt}`, `ln_bwd_bulk_{dt}` with the same arguments:
        // `dy`, `x`, `dx` hold rows * d elements, `mean`, `rstd` rows, `gamma` d; the
        // register path's conditions of the kernel taken hold (checked above; dx is a
        // fresh 256-byte aligned allocation), so dx is written entirely and each block b <
        // chunks writes part_*[b * d .. (b + 1) * d] (scratch = chunks * d). The dynamic
        // shared memory (the pipe's PIPE_SMEM, the bulk kernel's at most its budget) was
        // granted to its function by pipe_ready or bulk_budget; `threads` is the kernel's
        // launch bound.
        let cfg = LaunchConfig {
            grid_dim: (chunks as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(BWD, e))?;
    } else {
        let f_dx = kernels::function(scx, MODULE, 1, T::DTYPE, || name("dx"))?;
        let f_part = kernels::function(scx, MODULE, 2, T::DTYPE, || name("part"))?;
        {
            let mut lb = scx.stream().launch_builder(&f_dx);
            lb.arg(dy)
                .arg(x)
                .arg(mean)
                .arg(rstd)
                .arg(g)
                .arg(&mut dx)
                .arg(&rows)
                .arg(&d);
            // SAFETY: `ln_bwd_dx_{dt}(const T* dy, const T* x, const float* mean, const
            // float* rstd, const T* gamma, T* dx, size_t rows, size_t d)`: `dy`, `x`, `dx`
            // hold rows * d elements, `mean`, `rstd` rows, `gamma` d; dx is written
            // entirely.
            unsafe { lb.launch(config(grid(scx, rows), 0)) }.map_err(|e| launch_error(BWD, e))?;
        }
        let cfg = LaunchConfig {
            grid_dim: (d.div_ceil(BLOCK as usize) as u32, chunks as u32, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut lb = scx.stream().launch_builder(&f_part);
        lb.arg(dy)
            .arg(x)
            .arg(mean)
            .arg(rstd)
            .arg(&part_g)
            .arg(&part_b);
        lb.arg(&rows).arg(&d).arg(&rpc);
        // SAFETY: `ln_bwd_part_{dt}(const T* dy, const T* x, const float* mean, const
        // float* rstd, float* part_g, float* part_b, size_t rows, size_t d, size_t rpc)`
        // with grid (ceil(d / 256), chunks), chunks = ceil(rows / rpc) <= 65535: every
        // part_*[c * d + j], c < chunks, j < d, is written (part_g and part_b are two
        // distinct scratch buffers of at least scratch = chunks * d f32 each).
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(BWD, e))?;
    }
    {
        let mut lb = scx.stream().launch_builder(&f_final);
        lb.arg(&part_g)
            .arg(&part_b)
            .arg(&mut dg)
            .arg(&mut db)
            .arg(&chunks)
            .arg(&d);
        // SAFETY: `ln_bwd_final_{dt}(const float* part_g, const float* part_b, T* dgamma,
        // T* dbeta, size_t chunks, size_t d)`, blocks of 1024 (its launch bound) over
        // column tiles of 32 (any grid): the partials hold chunks * d elements, written
        // by the launches before on this stream; dgamma, dbeta d, each written.
        let blocks = d.div_ceil(FINAL_COLUMNS).clamp(1, u32::MAX as usize) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (FINAL_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(BWD, e))?;
    }
    Ok([
        Buffer::from_cuda(dx),
        Buffer::from_cuda(dg),
        Buffer::from_cuda(db),
    ])
}

#[cfg(test)]
mod tests {
    #[test]
    fn chunking_covers_the_rows_within_the_grid_limit() {
        for (sm, rows, d) in [
            (132, 8192, 768),
            (132, 1, 1),
            (1, 1 << 20, 4096),
            (132, 7, 100_000),
        ] {
            let (rpc, chunks) = super::chunking(sm, rows, d);
            assert!(
                rpc * chunks >= rows && (chunks - 1) * rpc < rows,
                "{sm} {rows} {d}"
            );
            assert!((1..=65535).contains(&chunks));
        }
    }
}
