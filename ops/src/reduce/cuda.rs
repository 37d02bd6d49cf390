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
use crate::kernels::{self, config, device_addr, float_dispatch, grid, launch_error, BLOCK};

const MODULE: &str = "reduce";

/// Most blocks of a full reduction (the workspace's size).
const MAX_PARTIAL_BLOCKS: usize = 1024;

/// Outputs (in 16-byte vectors) from which the column kernel runs a thread per output.
const COLS_THREAD_MODE: usize = 65536;

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
    let mut y = kernels::alloc_out::<Out>(scx, s.outer * s.inner)?;
    if all {
        let ws = scx.ext::<ReduceWorkspace>(ReduceWorkspace::new)?;
        let (partials, indices, counter) = (ws.partials, ws.indices, ws.counter);
        let v = 16 / std::mem::size_of::<T>();
        let blocks = n.div_ceil(BLOCK as usize * 4 * v);
        let cap = (4 * scx.sm_count() as usize).min(MAX_PARTIAL_BLOCKS);
        let cfg = config(blocks.clamp(1, cap) as u32, 0);
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
        let cfg = config(dim_grid::<T>(scx, s, x), 0);
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

/// The per-dim grid reduce.cu documents: rows by warp (8 per block) or by block, columns
/// by tiles of 16-byte vectors; capped at 8 blocks per SM.
#[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; MSRV is 1.80
fn dim_grid<T: Element>(scx: &StreamCx, s: Split, x: &CudaSlice<T>) -> u32 {
    let blocks = if s.inner == 1 {
        if s.outer >= 2048 || s.r <= 1024 {
            s.outer.div_ceil(8)
        } else {
            s.outer
        }
    } else {
        let v = 16 / std::mem::size_of::<T>();
        let aligned = device_addr(x, scx) % 16 == 0;
        let nv = if s.inner % v == 0 && aligned {
            s.inner / v
        } else {
            s.inner
        };
        let items = s.outer * nv;
        let per_block = if items >= COLS_THREAD_MODE {
            BLOCK as usize
        } else {
            nv.next_power_of_two().clamp(1, 8)
        };
        items.div_ceil(per_block)
    };
    grid(scx, blocks)
}
