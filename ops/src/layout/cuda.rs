//! CUDA launches of `kernels/cuda/layout.cu`.

use cudarc::driver::{DeviceRepr, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, Element, Error, Result};

use super::cpu::CopyPlan;
use crate::kernels::{self, config, device_addr, grid, launch_error, BLOCK};

const MODULE: &str = "layout";

/// Most dims the kernel takes.
pub(super) const MAX_DIMS: usize = 8;

/// Mirrors `struct CopyArgs` of `layout.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CopyArgs {
    ndim: i32,
    shape: [i64; MAX_DIMS],
    ss: [i64; MAX_DIMS],
    ds: [i64; MAX_DIMS],
}

// SAFETY: `CopyArgs` is `repr(C)` with the field types and order of the C struct (200
// bytes, 8-aligned, 4 bytes of padding after `ndim` on both sides); plain integers.
unsafe impl DeviceRepr for CopyArgs {}

/// Enqueues the strided copies `plans` from `xs[k]` into `y` (`plans[k]` reads `xs[k]`).
pub(super) fn copies<T: Element>(
    scx: &mut StreamCx,
    name: &'static str,
    xs: &[&Buffer],
    plans: &[CopyPlan],
    y: &mut cudarc::driver::CudaSlice<T>,
) -> Result<()> {
    let size = std::mem::size_of::<T>();
    let (code, kname) = match size {
        2 => (0u16, "layout_copy_b2"),
        _ => (1, "layout_copy_b4"),
    };
    let f = kernels::function(scx, MODULE, code, T::DTYPE, || kname.into())?;
    let y_addr = device_addr(y, scx);
    for (x, plan) in xs.iter().zip(plans) {
        let p = plan.coalesced();
        if p.shape.len() > MAX_DIMS {
            return Err(Error::invalid(
                name,
                format!("copy needs {} dims (at most {MAX_DIMS})", p.shape.len()),
            ));
        }
        let mut args = CopyArgs {
            ndim: p.shape.len() as i32,
            ..CopyArgs::default()
        };
        for k in 0..p.shape.len() {
            args.shape[k] = p.shape[k] as i64;
            args.ss[k] = p.src[k] as i64;
            args.ds[k] = p.dst[k] as i64;
        }
        let n = p.numel();
        let src = device_addr(x.cuda::<T>()?, scx) + (p.src_base * size) as u64;
        let dst = y_addr + (p.dst_base * size) as u64;
        let cfg = config(grid(scx, n.div_ceil(BLOCK as usize)), 0);
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&src).arg(&dst).arg(&n).arg(&args);
        // SAFETY: layout_copy_{b2,b4}(const T* x, T* y, size_t n, CopyArgs a) with T of
        // the buffers' element size; the plan was built (and checked at submit) so that
        // every source index lies inside `x` and every destination inside `y`, distinct
        // per index; x and y are different buffers.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    }
    Ok(())
}
