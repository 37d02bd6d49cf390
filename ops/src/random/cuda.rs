//! CUDA launch of `kernels/cuda/random.cu`.

use cudarc::driver::PushKernelArg;
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Result};

use super::Dist;
use crate::kernels::{self, config, float_dispatch, grid, launch_error, BLOCK};

const MODULE: &str = "random";

/// Enqueues the fill of a new `n`-element tensor.
pub(super) fn fill(
    scx: &mut StreamCx,
    dtype: DType,
    name: &'static str,
    dist: Dist,
    seed: u64,
    offset: u64,
    n: usize,
) -> Result<Buffer> {
    float_dispatch!(dtype, name, |T| fill_t::<T>(
        scx, name, dist, seed, offset, n
    ))
}

fn fill_t<T: Element>(
    scx: &mut StreamCx,
    name: &'static str,
    dist: Dist,
    seed: u64,
    offset: u64,
    n: usize,
) -> Result<Buffer> {
    let (code, kind) = match dist {
        Dist::Uniform { .. } => (0u16, "uniform"),
        Dist::Normal { .. } => (1, "normal"),
    };
    let f = kernels::function(scx, MODULE, code, T::DTYPE, || {
        format!("rand_{kind}_{}", T::DTYPE.name())
    })?;
    let mut y = kernels::alloc_out::<T>(scx, n)?;
    let (a, b) = dist.affine();
    let (k0, k1) = (seed as u32, (seed >> 32) as u32);
    let (o0, o1) = (offset as u32, (offset >> 32) as u32);
    let cfg = config(grid(scx, n.div_ceil(4).div_ceil(BLOCK as usize)), 0);
    {
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&mut y).arg(&n).arg(&k0).arg(&k1).arg(&o0).arg(&o1);
        lb.arg(&a).arg(&b);
        // SAFETY: `rand_{kind}_{dt}(T* y, size_t n, unsigned k0, unsigned k1, unsigned o0,
        // unsigned o1, float a, float b)` with T the dtype of `y`, which holds n > 0
        // elements; the kernel writes each y[i], i < n, and nothing else.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    }
    Ok(Buffer::from_cuda(y))
}
