//! CUDA launches of `kernels/cuda/compare.cu`.

use cudarc::driver::PushKernelArg;
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Result};

use super::CmpOp;
use crate::kernels::any_dispatch;
use crate::kernels::{self, config, elementwise_grid, launch_error};

const MODULE: &str = "compare";

fn op_name(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Eq => "eq",
        CmpOp::Gt => "gt",
        CmpOp::Lt => "lt",
    }
}

/// Enqueues the mask `a op b` into a new u32 output.
pub(super) fn compare(
    scx: &mut StreamCx,
    op: CmpOp,
    dtype: DType,
    a: &Buffer,
    b: &Buffer,
    n: usize,
) -> Result<Buffer> {
    any_dispatch!(dtype, |T| compare_t::<T>(scx, op, a, b, n))
}

fn compare_t<T: Element>(
    scx: &mut StreamCx,
    op: CmpOp,
    a: &Buffer,
    b: &Buffer,
    n: usize,
) -> Result<Buffer> {
    let name = op_name(op);
    let f = kernels::function(scx, MODULE, op as u16, T::DTYPE, || {
        format!("cmp_{name}_{}", T::DTYPE.name())
    })?;
    let (a, b) = (a.cuda::<T>()?, b.cuda::<T>()?);
    let mut y = kernels::alloc_out::<u32>(scx, n)?;
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(a).arg(b).arg(&mut y).arg(&n);
    // SAFETY: `cmp_{op}_{dt}(const T* a, const T* b, unsigned* y, size_t n)` with T the
    // operands' type; all three hold n elements; every y[i] is written.
    unsafe { lb.launch(config(elementwise_grid(scx, n, 4), 0)) }
        .map_err(|e| launch_error(name, e))?;
    Ok(Buffer::from_cuda(y))
}

/// Enqueues `mask ? a : b` into a new output of the operands' dtype.
pub(super) fn select(
    scx: &mut StreamCx,
    dtype: DType,
    m: &Buffer,
    a: &Buffer,
    b: &Buffer,
    n: usize,
) -> Result<Buffer> {
    any_dispatch!(dtype, |T| select_t::<T>(scx, m, a, b, n))
}

fn select_t<T: Element>(
    scx: &mut StreamCx,
    m: &Buffer,
    a: &Buffer,
    b: &Buffer,
    n: usize,
) -> Result<Buffer> {
    let wide = std::mem::size_of::<T>() == 4;
    let f = kernels::function(scx, MODULE, 0x100 | wide as u16, DType::U32, || {
        (if wide { "where_b32" } else { "where_b16" }).to_string()
    })?;
    let (m, a, b) = (m.cuda::<u32>()?, a.cuda::<T>()?, b.cuda::<T>()?);
    let mut y = kernels::alloc_out::<T>(scx, n)?;
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(m).arg(a).arg(b).arg(&mut y).arg(&n);
    // SAFETY: `where_b32(const unsigned* m, const unsigned* a, const unsigned* b, unsigned*
    // y, size_t n)` for 4-byte T, `where_b16` with unsigned short for 2-byte T: the
    // kernels copy bits, so any T of that width is valid; all four hold n elements.
    unsafe { lb.launch(config(elementwise_grid(scx, n, 4), 0)) }
        .map_err(|e| launch_error("where_", e))?;
    Ok(Buffer::from_cuda(y))
}
