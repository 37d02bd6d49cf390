//! CUDA launches of `kernels/cuda/loss.cu`.
//!
//! The forward combines its per-block partials in the stream's [`LossWorkspace`]: the last
//! block to finish sums them in a fixed order and resets the workspace's counter to 0.
//! Launches on one stream run in order, so they never share it concurrently.

use cudarc::driver::{CudaSlice, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use super::{BWD, FWD};
use crate::kernels::{self, config, device_addr, float_dispatch, grid, launch_error};

const MODULE: &str = "loss";

/// Most blocks of a forward launch (the workspace's size).
const MAX_BLOCKS: usize = 1024;

struct LossWorkspace {
    part_loss: u64,
    part_count: u64,
    part_bad: u64,
    counter: u64,
    // Owners of the memory above, freed with the stream's context.
    _mem: (
        CudaSlice<u32>,
        CudaSlice<u32>,
        CudaSlice<u32>,
        CudaSlice<u32>,
    ),
}

impl LossWorkspace {
    fn new(scx: &StreamCx) -> Result<Self> {
        // f64 partials, as pairs of u32 (device allocations are 256-byte aligned).
        let part_loss = scx.alloc::<u32>(2 * MAX_BLOCKS)?;
        let part_count = scx.alloc::<u32>(MAX_BLOCKS)?;
        let part_bad = scx.alloc::<u32>(MAX_BLOCKS)?;
        let mut counter = scx.alloc::<u32>(1)?;
        scx.stream()
            .memset_zeros(&mut counter)
            .map_err(|e| Error::cuda("cuMemsetD8Async", e))?;
        Ok(LossWorkspace {
            part_loss: device_addr(&part_loss, scx),
            part_count: device_addr(&part_count, scx),
            part_bad: device_addr(&part_bad, scx),
            counter: device_addr(&counter, scx),
            _mem: (part_loss, part_count, part_bad, counter),
        })
    }
}

fn label_code(l: DType) -> (u16, &'static str) {
    if l == DType::I32 {
        (1, "i32")
    } else {
        (0, "u32")
    }
}

/// Enqueues the forward; returns (loss, lse, bad-label count).
#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    scx: &mut StreamCx,
    dtype: DType,
    ldtype: DType,
    x: &Buffer,
    labels: &Buffer,
    rows: usize,
    cols: usize,
    ignore: Option<i64>,
) -> Result<[Buffer; 3]> {
    float_dispatch!(dtype, FWD, |T| match ldtype {
        DType::I32 => forward_t::<T, i32>(scx, x, labels, rows, cols, ignore),
        _ => forward_t::<T, u32>(scx, x, labels, rows, cols, ignore),
    })
}

fn forward_t<T: Element, L: Element>(
    scx: &mut StreamCx,
    x: &Buffer,
    labels: &Buffer,
    rows: usize,
    cols: usize,
    ignore: Option<i64>,
) -> Result<[Buffer; 3]> {
    let (lc, lname) = label_code(L::DTYPE);
    let f = kernels::function(scx, MODULE, lc, T::DTYPE, || {
        format!("ce_fwd_{}_{lname}", T::DTYPE.name())
    })?;
    let (x, labels) = (x.cuda::<T>()?, labels.cuda::<L>()?);
    let ws = scx.ext::<LossWorkspace>(LossWorkspace::new)?;
    let (pl, pc, pb, counter) = (ws.part_loss, ws.part_count, ws.part_bad, ws.counter);
    let mut loss = kernels::alloc_out::<f32>(scx, 1)?;
    let mut lse = kernels::alloc_out::<f32>(scx, rows)?;
    let mut bad = kernels::alloc_out::<u32>(scx, 1)?;
    let blocks = grid(scx, rows).min(MAX_BLOCKS as u32);
    let (ign, has) = (ignore.unwrap_or(0), ignore.is_some() as i32);
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(x)
        .arg(labels)
        .arg(&mut lse)
        .arg(&mut loss)
        .arg(&mut bad);
    lb.arg(&rows).arg(&cols).arg(&ign).arg(&has);
    lb.arg(&pl).arg(&pc).arg(&pb).arg(&counter);
    // SAFETY: matches loss.cu's `ce_fwd_{dt}_{lt}(const T* x, const L* labels, float* lse,
    // float* loss, unsigned* bad, size_t rows, size_t cols, long long ignore, int
    // has_ignore, double* part_loss, unsigned* part_count, unsigned* part_bad, unsigned*
    // counter)` with T and L the buffers' types: `x` holds rows * cols elements, `labels`
    // and `lse` rows, `loss` and `bad` one; labels are only used as indices after a range
    // check. The workspace holds MAX_BLOCKS partials (>= the grid) and a counter at 0
    // that only this stream uses, in order; the last block writes loss and bad.
    unsafe { lb.launch(config(blocks, 0)) }.map_err(|e| launch_error(FWD, e))?;
    Ok([
        Buffer::from_cuda(loss),
        Buffer::from_cuda(lse),
        Buffer::from_cuda(bad),
    ])
}

/// Enqueues the backward into a new `[rows, cols]` gradient.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    scx: &mut StreamCx,
    dtype: DType,
    ldtype: DType,
    x: &Buffer,
    labels: &Buffer,
    lse: &Buffer,
    rows: usize,
    cols: usize,
    ignore: Option<i64>,
    scale: f32,
) -> Result<Buffer> {
    float_dispatch!(dtype, BWD, |T| match ldtype {
        DType::I32 => backward_t::<T, i32>(scx, x, labels, lse, rows, cols, ignore, scale),
        _ => backward_t::<T, u32>(scx, x, labels, lse, rows, cols, ignore, scale),
    })
}

#[allow(clippy::too_many_arguments)]
fn backward_t<T: Element, L: Element>(
    scx: &mut StreamCx,
    x: &Buffer,
    labels: &Buffer,
    lse: &Buffer,
    rows: usize,
    cols: usize,
    ignore: Option<i64>,
    scale: f32,
) -> Result<Buffer> {
    let (lc, lname) = label_code(L::DTYPE);
    let f = kernels::function(scx, MODULE, 0x100 | lc, T::DTYPE, || {
        format!("ce_bwd_{}_{lname}", T::DTYPE.name())
    })?;
    let (x, labels, lse) = (x.cuda::<T>()?, labels.cuda::<L>()?, lse.cuda::<f32>()?);
    let mut dx = kernels::alloc_out::<T>(scx, rows * cols)?;
    let (ign, has) = (ignore.unwrap_or(0), ignore.is_some() as i32);
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(x).arg(labels).arg(lse).arg(&mut dx);
    lb.arg(&rows).arg(&cols).arg(&ign).arg(&has).arg(&scale);
    // SAFETY: matches loss.cu's `ce_bwd_{dt}_{lt}(const T* x, const L* labels, const
    // float* lse, T* dx, size_t rows, size_t cols, long long ignore, int has_ignore, float
    // scale)`: `x` and `dx` hold rows * cols elements (dx written entirely), `labels` and
    // `lse` rows; labels are only compared, never used as indices.
    unsafe { lb.launch(config(grid(scx, rows), 0)) }.map_err(|e| launch_error(BWD, e))?;
    Ok(Buffer::from_cuda(dx))
}
