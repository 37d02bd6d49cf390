//! CUDA launches of `kernels/cuda/activation.cu`.
//!
//! In-place ops pass the output's address as the donated operand too, which the kernels
//! allow for an operand of `n` elements.

use cudarc::driver::PushKernelArg;
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Result};

use super::{GradOp, MapOp};
use crate::kernels::{self, config, elementwise_grid, float_dispatch, launch_error};

const MODULE: &str = "activation";

/// The kernel's op name, its cache code and its scalar argument.
fn map_kernel(op: MapOp) -> (&'static str, u16, f32) {
    match op {
        MapOp::Tanh => ("tanh", 0, 0.0),
        MapOp::Sigmoid => ("sigmoid", 1, 0.0),
        MapOp::Gelu => ("gelu", 2, 0.0),
        MapOp::Silu => ("silu", 3, 0.0),
        MapOp::AddScalar(s) => ("add_scalar", 4, s),
        MapOp::MulScalar(s) => ("mul_scalar", 5, s),
    }
}

fn grad_kernel(op: GradOp) -> (&'static str, u16) {
    match op {
        GradOp::Relu => ("relu", 0x100),
        GradOp::Gelu => ("gelu", 0x101),
        GradOp::Silu => ("silu", 0x102),
        GradOp::Tanh => ("tanh", 0x103),
        GradOp::Sigmoid => ("sigmoid", 0x104),
    }
}

/// Enqueues `y = op(x)`; `x` is read from `donated` (in place) or from `x`.
pub(super) fn map(
    scx: &mut StreamCx,
    dtype: DType,
    op: MapOp,
    name: &'static str,
    x: Option<&Buffer>,
    donated: Option<Buffer>,
    n: usize,
) -> Result<Buffer> {
    float_dispatch!(dtype, name, |T| map_t::<T>(scx, op, name, x, donated, n))
}

fn map_t<T: Element>(
    scx: &mut StreamCx,
    op: MapOp,
    name: &'static str,
    x: Option<&Buffer>,
    donated: Option<Buffer>,
    n: usize,
) -> Result<Buffer> {
    let (kname, code, s) = map_kernel(op);
    let f = kernels::function(scx, MODULE, code, T::DTYPE, || {
        format!("act_{kname}_{}", T::DTYPE.name())
    })?;
    let (mut y, x) = kernels::output_and_input::<T>(scx, name, n, donated, x)?;
    let cfg = config(elementwise_grid(scx, n, std::mem::size_of::<T>()), 0);
    {
        let mut lb = scx.stream().launch_builder(&f);
        x.push(&mut lb);
        lb.arg(&mut y).arg(&n).arg(&s);
        // SAFETY: `act_{op}_{dt}(const T* x, T* y, size_t n, float s)` with T the buffers'
        // dtype; `y` holds n elements and `x` holds n elements or is `y` itself (allowed);
        // the kernel writes every y[i], i < n.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    }
    Ok(Buffer::from_cuda(y))
}

/// Enqueues `dx = op(dy, v)`; `dy` is read from `donated` (in place) or from `dy`.
#[allow(clippy::too_many_arguments)]
pub(super) fn grad(
    scx: &mut StreamCx,
    dtype: DType,
    op: GradOp,
    name: &'static str,
    dy: Option<&Buffer>,
    donated: Option<Buffer>,
    v: &Buffer,
    n: usize,
) -> Result<Buffer> {
    float_dispatch!(dtype, name, |T| grad_t::<T>(
        scx, op, name, dy, donated, v, n
    ))
}

fn grad_t<T: Element>(
    scx: &mut StreamCx,
    op: GradOp,
    name: &'static str,
    dy: Option<&Buffer>,
    donated: Option<Buffer>,
    v: &Buffer,
    n: usize,
) -> Result<Buffer> {
    let (kname, code) = grad_kernel(op);
    let f = kernels::function(scx, MODULE, code, T::DTYPE, || {
        format!("actb_{kname}_{}", T::DTYPE.name())
    })?;
    let (mut dx, dy) = kernels::output_and_input::<T>(scx, name, n, donated, dy)?;
    let v = v.cuda::<T>()?;
    let cfg = config(elementwise_grid(scx, n, std::mem::size_of::<T>()), 0);
    {
        let mut lb = scx.stream().launch_builder(&f);
        dy.push(&mut lb);
        lb.arg(v).arg(&mut dx).arg(&n);
        // SAFETY: `actb_{op}_{dt}(const T* dy, const T* v, T* dx, size_t n)` with T the
        // buffers' dtype; `v` and `dx` hold n elements, `dy` holds n elements or is `dx`
        // itself (allowed); the kernel writes every dx[i], i < n.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    }
    Ok(Buffer::from_cuda(dx))
}
