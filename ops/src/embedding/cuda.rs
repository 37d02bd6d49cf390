//! CUDA launches of `kernels/cuda/embedding.cu`.
//!
//! The backward enqueues four launches on the op's stream: `emb_count_*` (ids per row),
//! `emb_scan` (bucket offsets), `emb_rank_*` (the stable sort of positions by id) and
//! `emb_bwd_*` (each gradient element sums its bucket in order). Its scratch (counts,
//! offsets, positions) is freed stream-ordered after them.

use cudarc::driver::{CudaSlice, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use crate::kernels::{
    self, alloc_out, config, device_addr, float_dispatch, grid, launch_error, BLOCK,
};

const MODULE: &str = "embedding";

/// The ids' address and kernel suffix.
fn ids_addr(scx: &StreamCx, ids: &Buffer) -> Result<(u64, u16, &'static str)> {
    Ok(match ids.dtype() {
        DType::I32 => (device_addr(ids.cuda::<i32>()?, scx), 0, "i32"),
        _ => (device_addr(ids.cuda::<u32>()?, scx), 1, "u32"),
    })
}

fn zeroed(scx: &StreamCx, n: usize) -> Result<CudaSlice<u32>> {
    let mut s = scx.alloc::<u32>(n)?;
    scx.stream()
        .memset_zeros(&mut s)
        .map_err(|e| Error::cuda("cuMemsetD8Async", e))?;
    Ok(s)
}

/// Enqueues the lookup; returns (y, bad).
pub(super) fn forward(
    scx: &mut StreamCx,
    name: &'static str,
    dtype: DType,
    table: &Buffer,
    ids: &Buffer,
    rows: usize,
    d: usize,
) -> Result<(Buffer, Buffer)> {
    let (ids_ptr, icode, iname) = ids_addr(scx, ids)?;
    let n = ids.len();
    let mut bad = zeroed(scx, 1)?;
    let y = float_dispatch!(dtype, name, |T| {
        let f = kernels::function(scx, MODULE, 0x100 | icode, T::DTYPE, || {
            format!("emb_fwd_{}_{iname}", T::DTYPE.name())
        })?;
        let mut y = alloc_out::<T>(scx, n * d)?;
        let tab = table.cuda::<T>()?;
        let cfg = config(grid(scx, (n * d).div_ceil(BLOCK as usize)), 0);
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(tab)
            .arg(&ids_ptr)
            .arg(&mut y)
            .arg(&n)
            .arg(&rows)
            .arg(&d)
            .arg(&mut bad);
        // SAFETY: emb_fwd_{dt}_{it}(const T* table, const I* ids, T* y, size_t n, size_t V,
        // size_t D, unsigned* bad): `tab` holds V * D elements of T, `ids_ptr` n ids of I,
        // `y` n * D (each written once), `bad` one zeroed counter; invalid ids are not
        // used as addresses.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
        Ok::<_, Error>(Buffer::from_cuda(y))
    })?;
    Ok((y, Buffer::from_cuda(bad)))
}

/// Enqueues the deterministic scatter-add; returns (dtable, bad).
pub(super) fn backward(
    scx: &mut StreamCx,
    name: &'static str,
    dtype: DType,
    dy: &Buffer,
    ids: &Buffer,
    rows: usize,
    d: usize,
) -> Result<(Buffer, Buffer)> {
    let (ids_ptr, icode, iname) = ids_addr(scx, ids)?;
    let n = ids.len();
    let mut bad = zeroed(scx, 1)?;
    let mut counts = zeroed(scx, rows)?;
    let mut offsets = scx.alloc::<u32>(rows + 1)?;
    let mut next = scx.alloc::<u32>(rows)?;
    let mut positions = scx.alloc::<u32>(n.max(1))?;
    let one = config(1, 0);
    {
        let f = kernels::function(scx, MODULE, 0x200 | icode, DType::U32, || {
            format!("emb_count_{iname}")
        })?;
        let cfg = config(grid(scx, n.div_ceil(BLOCK as usize)), 0);
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&ids_ptr)
            .arg(&n)
            .arg(&rows)
            .arg(&mut counts)
            .arg(&mut bad);
        // SAFETY: emb_count_{it}(const I* ids, size_t n, size_t V, unsigned* counts,
        // unsigned* bad): n ids; `counts` holds V zeroed counters, `bad` one.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    }
    {
        let f = kernels::function(scx, MODULE, 0x300, DType::U32, || "emb_scan".into())?;
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&counts).arg(&rows).arg(&mut offsets).arg(&mut next);
        // SAFETY: emb_scan(const unsigned* counts, size_t V, unsigned* offsets, unsigned*
        // next), one block of 256: V counts in, V + 1 offsets and V cursors out.
        unsafe { lb.launch(one) }.map_err(|e| launch_error(name, e))?;
    }
    {
        let f = kernels::function(scx, MODULE, 0x400 | icode, DType::U32, || {
            format!("emb_rank_{iname}")
        })?;
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&ids_ptr)
            .arg(&n)
            .arg(&rows)
            .arg(&mut next)
            .arg(&mut positions);
        // SAFETY: emb_rank_{it}(const I* ids, size_t n, size_t V, unsigned* next, unsigned*
        // positions), one block of 256: the cursors from emb_scan; `positions` holds n
        // entries (at least 1), one per valid id, each written once.
        unsafe { lb.launch(one) }.map_err(|e| launch_error(name, e))?;
    }
    let dt = float_dispatch!(dtype, name, |T| {
        let f = kernels::function(scx, MODULE, 0x500, T::DTYPE, || {
            format!("emb_bwd_{}", T::DTYPE.name())
        })?;
        let mut dt = alloc_out::<T>(scx, rows * d)?;
        let dys = dy.cuda::<T>()?;
        let cfg = config(grid(scx, (rows * d).div_ceil(BLOCK as usize)), 0);
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(dys)
            .arg(&offsets)
            .arg(&positions)
            .arg(&mut dt)
            .arg(&rows)
            .arg(&d);
        // SAFETY: emb_bwd_{dt}(const T* dy, const unsigned* offsets, const unsigned*
        // positions, T* dtable, size_t V, size_t D): `dys` holds n * D elements, the
        // offsets and positions (written above, stream order) index rows of it below n;
        // `dt` holds V * D, each written once.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
        Ok::<_, Error>(Buffer::from_cuda(dt))
    })?;
    Ok((dt, Buffer::from_cuda(bad)))
}
