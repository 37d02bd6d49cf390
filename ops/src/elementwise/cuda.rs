//! CUDA launches of `kernels/cuda/elementwise.cu`.
//!
//! A binary op picks one of three kernels: `ew_` when both operands have the output's
//! shape, `ewb_` when one does and the other repeats along the trailing dims (a row, or a
//! scalar), `ews_` otherwise (general strided broadcast, dims coalesced to at most 8).
//! In-place ops pass the output's address as the donated operand too, which the kernels
//! allow for an operand of `n` elements.

use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use super::{is_trailing, BinaryArgs, BinaryOp, UnaryOp};
use crate::kernels::{self, config, elementwise_grid, float_dispatch, launch_error, param};
use rtx_kernels::launch::{StridedArgs, MAX_DIMS};

const MODULE: &str = "elementwise";

/// How a binary op's operands map onto its output.
#[derive(Debug, PartialEq)]
enum Layout {
    /// Both operands have the output's `n` elements.
    Same,
    /// `y[i] = a[i % na] op b[i % nb]`.
    Trailing { na: usize, nb: usize },
    /// General broadcast.
    Strided(StridedArgs),
}

fn layout(a: &[usize], b: &[usize], y: &[usize]) -> Option<Layout> {
    let (na, nb, n) = (numel(a), numel(b), numel(y));
    Some(if na == n && nb == n {
        Layout::Same
    } else if na == n && is_trailing(b, y) || nb == n && is_trailing(a, y) {
        Layout::Trailing { na, nb }
    } else {
        Layout::Strided(strided_args(a, b, y)?)
    })
}

fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

/// Row-major strides of `shape` as broadcast into `y` (0 where broadcast).
fn bcast_strides(shape: &[usize], y: &[usize]) -> Vec<isize> {
    let off = y.len() - shape.len();
    let mut strides = vec![0isize; y.len()];
    let mut s = 1isize;
    for (i, &d) in shape.iter().enumerate().rev() {
        strides[off + i] = if d == 1 { 0 } else { s };
        s = s.saturating_mul(d as isize);
    }
    strides
}

/// The `ews_` arguments ([`StridedArgs::new`]: size-1 dims dropped, dims contiguous in
/// both operands merged); `None` when more than [`MAX_DIMS`] remain.
fn strided_args(a: &[usize], b: &[usize], y: &[usize]) -> Option<StridedArgs> {
    StridedArgs::new(y, &bcast_strides(a, y), &bcast_strides(b, y))
}

/// Rejects (at submit) a broadcast the strided kernel cannot express.
pub(super) fn check_rank(op: &str, a: &[usize], b: &[usize], y: &[usize]) -> Result<()> {
    match layout(a, b, y) {
        Some(_) => Ok(()),
        None => Err(Error::invalid(
            op,
            format!("broadcast of {a:?} with {b:?} needs more than {MAX_DIMS} dims on CUDA"),
        )),
    }
}

fn binary_kernel(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Max => "max",
        BinaryOp::Min => "min",
    }
}

fn unary_kernel(op: UnaryOp) -> &'static str {
    match op {
        UnaryOp::Neg => "neg",
        UnaryOp::Exp => "exp",
        UnaryOp::Log => "log",
        UnaryOp::Sin => "sin",
        UnaryOp::Cos => "cos",
        UnaryOp::Sqrt => "sqrt",
        UnaryOp::Abs => "abs",
        UnaryOp::Relu => "relu",
    }
}

// ---- batched launches (`ew_batch`) -----------------------------------------------------

/// Ops of at most this many elements may join their stream's launch batch
/// (`rtx_runtime::Settings::launch_batching`): one block of `ew_batch` does them in about
/// the time a launch of their own would take on the device.
pub(super) const BATCH_MAX_ELEMS: usize = 4096;

/// `ew_batch`'s step code (elementwise.cu, "batched launches"): 3 × op + dtype, the
/// unary ops 0-7 in [`UnaryOp`]'s order, the binary ones 8-13 in [`BinaryOp`]'s.
fn batch_code(op: u32, dtype: DType) -> u32 {
    let d = match dtype {
        DType::F16 => 1,
        DType::BF16 => 2,
        _ => 0,
    };
    3 * op + d
}

/// Defers `code` over `n` elements (y from a, b) into the stream's launch batch; `false`
/// when the batch declines (the caller launches its own kernel).
fn defer_step(scx: &mut StreamCx, code: u32, n: usize, a: u64, b: u64, y: u64) -> Result<bool> {
    if n > BATCH_MAX_ELEMS {
        return Ok(false);
    }
    let f = kernels::function(scx, MODULE, 0xff00, DType::F32, || "ew_batch".to_string())?;
    // `EwStep` as C lays it out: u32 code, u32 n, then the three addresses, the rest
    // reserved.
    let mut step = [0u8; rtx_runtime::cuda::BATCH_STEP_BYTES];
    step[0..4].copy_from_slice(&code.to_ne_bytes());
    step[4..8].copy_from_slice(&(n as u32).to_ne_bytes());
    step[8..16].copy_from_slice(&a.to_ne_bytes());
    step[16..24].copy_from_slice(&b.to_ne_bytes());
    step[24..32].copy_from_slice(&y.to_ne_bytes());
    // SAFETY: `ew_batch` is a batch kernel of `StreamCx::defer_launch`'s form (one
    // `EwBatch` by value, one block of BLOCK threads, steps in order with
    // `__syncthreads()` between them, loads through ld.global.cg). The step's addresses
    // are the op's own operands and output, each of n elements (`y` may be `a`: the
    // kernel reads a[i] before it writes y[i], in the same thread), held by the op
    // until its completion; its code names the op and the buffers' dtype.
    let geo = rtx_runtime::cuda::Geometry {
        grid: 1,
        threads: kernels::BLOCK,
        coop: false,
    };
    Ok(unsafe { scx.defer_launch(&f, geo, &step) })
}

/// Enqueues `y = a op b`; `a` is read from `donated` (in place) or from `a`.
pub(super) fn binary(
    scx: &mut StreamCx,
    dtype: DType,
    args: &BinaryArgs<'_>,
    a: Option<&Buffer>,
    donated: Option<Buffer>,
    b: &Buffer,
) -> Result<Buffer> {
    float_dispatch!(dtype, args.name, |T| binary_t::<T>(
        scx, args, a, donated, b
    ))
}

fn binary_t<T: Element>(
    scx: &mut StreamCx,
    args: &BinaryArgs<'_>,
    a: Option<&Buffer>,
    donated: Option<Buffer>,
    b: &Buffer,
) -> Result<Buffer> {
    let name = args.name;
    let n = numel(args.y_dims);
    let layout = layout(args.a_dims, args.b_dims, args.y_dims).ok_or_else(|| {
        Error::invalid(name, format!("broadcast needs more than {MAX_DIMS} dims"))
    })?;
    let (kind, prefix) = match layout {
        Layout::Same => (1u16, "ew"),
        Layout::Trailing { .. } => (2, "ewb"),
        Layout::Strided(_) => (3, "ews"),
    };
    let f = kernels::function(scx, MODULE, kind << 8 | args.op as u16, T::DTYPE, || {
        format!("{prefix}_{}_{}", binary_kernel(args.op), T::DTYPE.name())
    })?;
    let (y, a) = kernels::output_and_input::<T>(scx, name, n, donated, a)?;
    let b = b.cuda::<T>()?;
    let cfg = config(elementwise_grid(scx, n, std::mem::size_of::<T>()), 0);
    // The parameter block, on the stack: device addresses as `u64`, sizes as `usize`
    // (`size_t`), the strided form's `StridedArgs` by value.
    let (mut pa, mut pb, mut py, mut pn) = (
        a.addr(scx),
        kernels::device_addr(b, scx),
        kernels::device_addr(&y, scx),
        n,
    );
    if matches!(layout, Layout::Same)
        && defer_step(scx, batch_code(8 + args.op as u32, T::DTYPE), n, pa, pb, py)?
    {
        return Ok(Buffer::from_cuda(y));
    }
    let launched = match layout {
        Layout::Same => {
            let mut params = [
                param(&mut pa),
                param(&mut pb),
                param(&mut py),
                param(&mut pn),
            ];
            // SAFETY: `ew_{op}_{dt}(const T* a, const T* b, T* y, size_t n)` (elementwise.cu),
            // T the dtype of the buffers, each entry pointing at a live local of that C
            // type. `y` holds n elements; `a` holds n elements or is `y` itself (an aliasing
            // the kernels allow); `b` holds n elements; the kernel writes every y[i], i < n.
            unsafe { kernels::launch_direct(scx, &f, cfg, &mut params) }
        }
        Layout::Trailing { na, nb } => {
            let (mut na, mut nb) = (na, nb);
            let mut params = [
                param(&mut pa),
                param(&mut pb),
                param(&mut py),
                param(&mut pn),
                param(&mut na),
                param(&mut nb),
            ];
            // SAFETY: `ewb_{op}_{dt}(const T* a, const T* b, T* y, size_t n, size_t na,
            // size_t nb)`, entries as above; `a` holds na and `b` nb elements (the operands'
            // sizes, one of them n, the other repeating along the trailing dims), `a` may
            // be `y` itself when na == n; the kernel reads a[i % na], b[i % nb] and writes
            // every y[i], i < n.
            unsafe { kernels::launch_direct(scx, &f, cfg, &mut params) }
        }
        Layout::Strided(mut s) => {
            let mut params = [
                param(&mut pa),
                param(&mut pb),
                param(&mut py),
                param(&mut pn),
                param(&mut s),
            ];
            // SAFETY: `ews_{op}_{dt}(const T* a, const T* b, T* y, size_t n, StridedArgs s)`,
            // entries as above, `s` the `repr(C)` struct of the C layout (rtx-kernels'
            // `launch::StridedArgs`); its shape and strides are derived from the operands'
            // shapes broadcast into y's, so every index read is inside `a` and `b`; the
            // kernel writes every y[i], i < n.
            unsafe { kernels::launch_direct(scx, &f, cfg, &mut params) }
        }
    };
    launched.map_err(|e| launch_error(name, e))?;
    Ok(Buffer::from_cuda(y))
}

/// Enqueues `y = op(x)`; `x` is read from `donated` (in place) or from `x`.
pub(super) fn unary(
    scx: &mut StreamCx,
    dtype: DType,
    op: UnaryOp,
    name: &'static str,
    x: Option<&Buffer>,
    donated: Option<Buffer>,
    n: usize,
) -> Result<Buffer> {
    float_dispatch!(dtype, name, |T| unary_t::<T>(scx, op, name, x, donated, n))
}

fn unary_t<T: Element>(
    scx: &mut StreamCx,
    op: UnaryOp,
    name: &'static str,
    x: Option<&Buffer>,
    donated: Option<Buffer>,
    n: usize,
) -> Result<Buffer> {
    let f = kernels::function(scx, MODULE, op as u16, T::DTYPE, || {
        format!("ew_{}_{}", unary_kernel(op), T::DTYPE.name())
    })?;
    let (y, x) = kernels::output_and_input::<T>(scx, name, n, donated, x)?;
    let cfg = config(elementwise_grid(scx, n, std::mem::size_of::<T>()), 0);
    let (mut px, mut py, mut pn) = (x.addr(scx), kernels::device_addr(&y, scx), n);
    if defer_step(scx, batch_code(op as u32, T::DTYPE), n, px, 0, py)? {
        return Ok(Buffer::from_cuda(y));
    }
    let mut params = [param(&mut px), param(&mut py), param(&mut pn)];
    // SAFETY: `ew_{op}_{dt}(const T* x, T* y, size_t n)` (elementwise.cu), T the buffers'
    // dtype, each entry pointing at a live local of that C type; `y` holds n elements and
    // `x` holds n elements or is `y` itself (allowed); the kernel writes every y[i], i < n.
    unsafe { kernels::launch_direct(scx, &f, cfg, &mut params) }
        .map_err(|e| launch_error(name, e))?;
    Ok(Buffer::from_cuda(y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        assert_eq!(layout(&[5, 7], &[5, 7], &[5, 7]), Some(Layout::Same));
        assert_eq!(
            layout(&[5, 7], &[7], &[5, 7]),
            Some(Layout::Trailing { na: 35, nb: 7 })
        );
        assert_eq!(
            layout(&[], &[5, 7], &[5, 7]),
            Some(Layout::Trailing { na: 1, nb: 35 })
        );
        let Some(Layout::Strided(s)) = layout(&[5, 1], &[1, 7], &[5, 7]) else {
            panic!("general broadcast expected");
        };
        assert_eq!(s.ndim, 2);
        assert_eq!((s.shape[0], s.sa[0], s.sb[0]), (5, 1, 0));
        assert_eq!((s.shape[1], s.sa[1], s.sb[1]), (7, 0, 1));
        // [4, 3, 5] with [4, 1, 5]: nothing merges across the broadcast dim.
        let s = strided_args(&[4, 3, 5], &[4, 1, 5], &[4, 3, 5]).unwrap();
        assert_eq!(s.ndim, 3);
        // [2, 3, 4, 1] with [1, 1, 1, 6]: the first three dims of `a` merge.
        let s = strided_args(&[2, 3, 4, 1], &[1, 1, 1, 6], &[2, 3, 4, 6]).unwrap();
        assert_eq!(s.ndim, 2);
        assert_eq!((s.shape[0], s.sa[0], s.sb[0]), (24, 1, 0));
        assert_eq!((s.shape[1], s.sa[1], s.sb[1]), (6, 0, 1));
    }
}
