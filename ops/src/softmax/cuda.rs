//! CUDA launch of `kernels/cuda/softmax.cu`.

use cudarc::driver::PushKernelArg;
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Result};

use super::NAME;
use crate::kernels::{self, config, float_dispatch, launch, launch_error, resident};

/// Enqueues `y = softmax(x)` over rows of `cols` elements into a new output.
pub(super) fn softmax(
    scx: &mut StreamCx,
    dtype: DType,
    x: &Buffer,
    rows: usize,
    cols: usize,
) -> Result<Buffer> {
    float_dispatch!(dtype, NAME, |T| softmax_t::<T>(scx, x, rows, cols))
}

fn softmax_t<T: Element>(
    scx: &mut StreamCx,
    x: &Buffer,
    rows: usize,
    cols: usize,
) -> Result<Buffer> {
    let f = kernels::function(scx, "softmax", 0, T::DTYPE, || {
        format!("softmax_{}", T::DTYPE.name())
    })?;
    let x = x.cuda::<T>()?;
    let mut y = kernels::alloc_out::<T>(scx, rows * cols)?;
    // A warp per row (8 per block) up to 1024 columns, a block per row beyond.
    let cfg = config(launch::softmax_grid(rows, cols, resident(scx)), 0);
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(x).arg(&mut y).arg(&rows).arg(&cols);
    // SAFETY: matches softmax.cu's `softmax_{dt}(const T* x, T* y, size_t rows, size_t
    // cols)` with T the buffers' dtype; `x` and `y` hold rows * cols > 0 elements and the
    // kernel writes every element of `y`.
    unsafe { lb.launch(cfg) }.map_err(|e| launch_error(NAME, e))?;
    Ok(Buffer::from_cuda(y))
}
