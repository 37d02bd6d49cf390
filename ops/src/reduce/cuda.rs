//! CUDA launches of `kernels/cuda/reduce.cu`.
//!
//! A reduction whose output has one element (all elements, or a dim with `outer * inner
//! == 1`) is one `reduce_all_*` / `argreduce_all_*` launch: every block leaves a partial
//! in the stream's [`ReduceWorkspace`] and the last block to finish combines them and
//! resets the workspace's counter to 0. Other dims launch `reduce_dim_*` /
//! `argreduce_dim_*` on the `[outer, r, inner]` view.

use cudarc::driver::{CudaSlice, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use super::{ArgReduceOp, ReduceKind, ReduceOp, Split};
use crate::kernels::{
    self, config, device_addr, float_dispatch, kernel_dtype, launch, launch_error, resident,
};

const MODULE: &str = "reduce";

/// Most blocks of a full reduction (the workspace's size).
const MAX_PARTIAL_BLOCKS: usize = launch::REDUCE_ALL_MAX_GRID as usize;

/// The full reductions' per-stream scratch: `MAX_PARTIAL_BLOCKS` partial values and
/// indices and the last-block counter, zeroed once here and left at 0 by every launch.
/// Launches on one stream run in order, so they never share it concurrently.
struct ReduceWorkspace {
    partials: u64,
    indices: u64,
    counter: u64,
    // Owners of the memory above, freed with the stream's context.
    _mem: (CudaSlice<f32>, CudaSlice<u32>, CudaSlice<u32>),
}

impl ReduceWorkspace {
    fn new(scx: &StreamCx) -> Result<Self> {
        let partials = scx.alloc::<f32>(MAX_PARTIAL_BLOCKS)?;
        let indices = scx.alloc::<u32>(MAX_PARTIAL_BLOCKS)?;
        let mut counter = scx.alloc::<u32>(1)?;
        scx.stream()
            .memset_zeros(&mut counter)
            .map_err(|e| Error::cuda("cuMemsetD8Async", e))?;
        Ok(ReduceWorkspace {
            partials: device_addr(&partials, scx),
            indices: device_addr(&indices, scx),
            counter: device_addr(&counter, scx),
            _mem: (partials, indices, counter),
        })
    }
}

fn value_kernel(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Mean => "mean",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::Prod => "prod",
    }
}

fn arg_kernel(op: ArgReduceOp) -> &'static str {
    match op {
        ArgReduceOp::ArgMax => "argmax",
        ArgReduceOp::ArgMin => "argmin",
    }
}

/// Enqueues the reduction of `x` (viewed as `split`) into a new output.
pub(super) fn reduce(
    scx: &mut StreamCx,
    dtype: DType,
    kind: ReduceKind,
    name: &'static str,
    x: &Buffer,
    split: Split,
) -> Result<Buffer> {
    float_dispatch!(dtype, name, |T| {
        let x = x.cuda::<T>()?;
        match kind {
            ReduceKind::Value(op) => {
                reduce_t::<T, T>(scx, name, x, split, 0, op as u16, || value_kernel(op))
            }
            ReduceKind::Arg(op) => {
                reduce_t::<T, u32>(scx, name, x, split, 1, op as u16, || arg_kernel(op))
            }
        }
    })
}

/// One launch; `Out` is `T` for values and `u32` for indices (`arg` is then 1).
fn reduce_t<T: Element, Out: Element>(
    scx: &mut StreamCx,
    name: &'static str,
    x: &CudaSlice<T>,
    s: Split,
    arg: u16,
    op: u16,
    op_name: impl FnOnce() -> &'static str,
) -> Result<Buffer> {
    let n = s.outer * s.r * s.inner;
    let all = s.outer * s.inner == 1;
    let prefix = match (arg, all) {
        (0, true) => "reduce_all",
        (0, false) => "reduce_dim",
        (_, true) => "argreduce_all",
        (_, false) => "argreduce_dim",
    };
    let code = (arg << 1 | all as u16) << 8 | op;
    let f = kernels::function(scx, MODULE, code, T::DTYPE, || {
        format!("{prefix}_{}_{}", op_name(), T::DTYPE.name())
    })?;
    let dt = kernel_dtype(T::DTYPE).ok_or_else(|| Error::dtype(name, DType::F32, T::DTYPE))?;
    let mut y = kernels::alloc_out::<Out>(scx, s.outer * s.inner)?;
    if all {
        let ws = scx.ext::<ReduceWorkspace>(ReduceWorkspace::new)?;
        let (partials, indices, counter) = (ws.partials, ws.indices, ws.counter);
        // The full reductions run at 4 blocks per SM (`__launch_bounds__(256, 4)`).
        let cap = launch::resident_blocks(scx.sm_count(), 4);
        let cfg = config(launch::reduce_all_grid(n, dt, cap), 0);
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(x).arg(&n).arg(&partials);
        if arg == 1 {
            lb.arg(&indices);
        }
        lb.arg(&counter).arg(&mut y);
        // SAFETY: matches reduce.cu's `reduce_all_{op}_{dt}(const T* x, size_t n, float*
        // partials, unsigned* counter, T* out)` or `argreduce_all_{op}_{dt}(const T* x,
        // size_t n, float* pval, unsigned* pidx, unsigned* counter, unsigned* out)`: `x`
        // holds n > 0 elements (n < 2^32 for indices, checked at submit); the workspace
        // holds 1024 partials and indices, at least the grid (capped at 1024), and a
        // zeroed counter that only this stream uses, in order; `y` holds one element,
        // written by the last block.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    } else {
        let grid = launch::reduce_dim_grid(s.outer, s.r, s.inner, dt, resident(scx));
        let cfg = config(grid, 0);
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(x).arg(&mut y).arg(&s.outer).arg(&s.r).arg(&s.inner);
        // SAFETY: matches reduce.cu's `reduce_dim_{op}_{dt}(const T* x, T* y, size_t
        // outer, size_t r, size_t inner)` (or `argreduce_dim_*` with `unsigned* y`): `x`
        // holds outer * r * inner elements, `y` outer * inner, each written once; r > 0
        // (empty inputs are rejected at submit) and r < 2^32 for indices.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    }
    Ok(Buffer::from_cuda(y))
}
