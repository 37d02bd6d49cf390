//! CUDA launches of `kernels/cuda/convert.cu`.

use cudarc::driver::{CudaSlice, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use crate::kernels::any_dispatch;
use crate::kernels::{self, config, elementwise_grid, launch_error};

const MODULE: &str = "convert";

fn code(d: DType) -> u16 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::I32 => 3,
        DType::U32 => 4,
    }
}

/// Enqueues `y = (to) x` into a new output.
pub(super) fn cast(scx: &mut StreamCx, x: &Buffer, from: DType, to: DType) -> Result<Buffer> {
    any_dispatch!(from, |A| {
        let x = x.cuda::<A>()?;
        match to {
            DType::F32 => cast_t::<A, f32>(scx, x),
            DType::F16 => cast_t::<A, half::f16>(scx, x),
            DType::BF16 => cast_t::<A, half::bf16>(scx, x),
            other => Err(Error::dtype("cast", DType::F32, other)),
        }
    })
}

fn cast_t<A: Element, B: Element>(scx: &mut StreamCx, x: &CudaSlice<A>) -> Result<Buffer> {
    let n = x.len();
    let f = kernels::function(
        scx,
        MODULE,
        code(A::DTYPE) << 4 | code(B::DTYPE),
        A::DTYPE,
        || format!("cast_{}_{}", A::DTYPE.name(), B::DTYPE.name()),
    )?;
    let mut y = kernels::alloc_out::<B>(scx, n)?;
    let elem = std::mem::size_of::<A>().max(std::mem::size_of::<B>());
    let cfg = config(elementwise_grid(scx, n, elem), 0);
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(x).arg(&mut y).arg(&n);
    // SAFETY: `cast_{a}_{b}(const A* x, B* y, size_t n)` with A and B the element types of
    // `x` and `y`, which both hold n elements; the kernel writes every y[i], i < n.
    unsafe { lb.launch(cfg) }.map_err(|e| launch_error("cast", e))?;
    Ok(Buffer::from_cuda(y))
}

/// Enqueues a new tensor of `n` elements of `dtype`, each with the bit pattern `bits`
/// (the low 16 bits for 2-byte dtypes).
pub(super) fn fill(scx: &mut StreamCx, dtype: DType, n: usize, bits: u32) -> Result<Buffer> {
    any_dispatch!(dtype, |T| fill_t::<T>(scx, n, bits))
}

fn fill_t<T: Element>(scx: &mut StreamCx, n: usize, bits: u32) -> Result<Buffer> {
    let wide = std::mem::size_of::<T>() == 4;
    let f = kernels::function(scx, MODULE, 0x100 | wide as u16, DType::U32, || {
        (if wide { "fill_b32" } else { "fill_b16" }).to_string()
    })?;
    // Unpoisoned: every element is written.
    let mut y = scx.alloc::<T>(n)?;
    let cfg = config(elementwise_grid(scx, n, std::mem::size_of::<T>()), 0);
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(&mut y).arg(&n).arg(&bits);
    // SAFETY: `fill_b32(unsigned* y, size_t n, unsigned bits)` for 4-byte T and
    // `fill_b16(unsigned short* y, size_t n, unsigned bits)` for 2-byte T: `y` holds n
    // elements of that size; the kernel writes every one.
    unsafe { lb.launch(cfg) }.map_err(|e| launch_error("fill", e))?;
    Ok(Buffer::from_cuda(y))
}
