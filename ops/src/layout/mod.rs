//! Layout ops into contiguous memory: [`permute`] / [`transpose`], [`narrow`] and
//! [`concat()`], for every dtype (f32, f16, bf16, i32, u32: the elements are copied as bits).
//!
//! - `cpu.rs`: the strided-copy plan every op reduces to, and its CPU execution.
//! - `cuda.rs`: the launches of `kernels/cuda/layout.cu` (one per input).
//! - here: the public constructors, validation and dispatch.
//!
//! Dims are `isize`: a negative dim counts from the end (`-1` is the last), as in
//! PyTorch. The result is always a new contiguous tensor.

pub mod cpu;
mod cuda;

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Device, Element, Error, ExecCx, Op, Plan, PlanCx, Result,
    Shape, Tensor, TensorSpec,
};

use crate::kernels::alloc_out;
use crate::kernels::any_dispatch;
use cpu::{strides, CopyPlan};

/// `dim` (negative: from the end) as an index below `rank`.
pub fn resolve_dim(op: &str, dim: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    let d = if dim < 0 { dim + r } else { dim };
    if (0..r).contains(&d) {
        Ok(d as usize)
    } else {
        Err(Error::invalid_dim(
            op,
            format!("dim {dim} out of range for rank {rank}"),
        ))
    }
}

/// What a [`LayoutOp`] does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutKind {
    /// Output dim `k` is input dim `perm[k]`.
    Permute(Vec<isize>),
    /// `len` elements of `dim` from `start`.
    Narrow {
        /// The dim.
        dim: isize,
        /// First index kept.
        start: usize,
        /// How many.
        len: usize,
    },
    /// The inputs joined along `dim`.
    Concat(isize),
}

/// A layout op, built by [`permute`], [`transpose`], [`narrow`] or [`concat()`].
pub struct LayoutOp {
    kind: LayoutKind,
    xs: Vec<Tensor>,
}

impl LayoutOp {
    /// What it does.
    pub fn kind(&self) -> &LayoutKind {
        &self.kind
    }
    /// Gives the inputs back (for instance from a rejected submission).
    pub fn into_inputs(self) -> Vec<Tensor> {
        self.xs
    }

    /// The output shape and one copy plan per input (validated).
    fn plans(&self) -> Result<(Shape, Vec<CopyPlan>)> {
        let name = self.name();
        match &self.kind {
            LayoutKind::Permute(perm) => {
                let x = &self.xs[0];
                let rank = x.rank();
                if perm.len() != rank {
                    return Err(Error::invalid_dim(
                        name,
                        format!(
                            "{} dims in the permutation of a rank-{rank} tensor",
                            perm.len()
                        ),
                    ));
                }
                let mut seen = vec![false; rank];
                let mut p = Vec::with_capacity(rank);
                for &d in perm {
                    let d = resolve_dim(name, d, rank)?;
                    if std::mem::replace(&mut seen[d], true) {
                        return Err(Error::invalid_dim(
                            name,
                            format!("dim {d} repeats in {perm:?}"),
                        ));
                    }
                    p.push(d);
                }
                let xs = strides(x.dims());
                let dims: Vec<usize> = p.iter().map(|&d| x.dims()[d]).collect();
                let plan = CopyPlan {
                    src: p.iter().map(|&d| xs[d]).collect(),
                    dst: strides(&dims),
                    shape: dims.clone(),
                    src_base: 0,
                    dst_base: 0,
                };
                Ok((Shape::new(dims), vec![plan]))
            }
            LayoutKind::Narrow { dim, start, len } => {
                let x = &self.xs[0];
                let d = resolve_dim(name, *dim, x.rank())?;
                let size = x.dims()[d];
                let end = start.checked_add(*len);
                if *len == 0 || !matches!(end, Some(e) if e <= size) {
                    return Err(Error::invalid_dim(
                        name,
                        format!("[{start}, {start} + {len}) is not a non-empty range of dim {d} (size {size})"),
                    ));
                }
                let xs = strides(x.dims());
                let mut dims = x.dims().to_vec();
                dims[d] = *len;
                let plan = CopyPlan {
                    src: xs.clone(),
                    dst: strides(&dims),
                    shape: dims.clone(),
                    src_base: start * xs[d],
                    dst_base: 0,
                };
                Ok((Shape::new(dims), vec![plan]))
            }
            LayoutKind::Concat(dim) => {
                let first = self
                    .xs
                    .first()
                    .ok_or_else(|| Error::invalid(name, "no inputs"))?;
                let d = resolve_dim(name, *dim, first.rank())?;
                let mut total = 0usize;
                for x in &self.xs {
                    if x.dtype() != first.dtype() {
                        return Err(Error::dtype(name, first.dtype(), x.dtype()));
                    }
                    let same = x.rank() == first.rank()
                        && (0..x.rank()).all(|k| k == d || x.dims()[k] == first.dims()[k]);
                    if !same {
                        let what = format!("all dims but {d} must agree");
                        return Err(Error::shape(name, first.shape(), x.shape(), what));
                    }
                    total = total
                        .checked_add(x.dims()[d])
                        .ok_or_else(|| Error::invalid(name, "sizes overflow usize"))?;
                }
                let mut dims = first.dims().to_vec();
                dims[d] = total;
                let ys = strides(&dims);
                let mut at = 0;
                let plans = self
                    .xs
                    .iter()
                    .map(|x| {
                        let p = CopyPlan {
                            shape: x.dims().to_vec(),
                            src: strides(x.dims()),
                            dst: ys.clone(),
                            src_base: 0,
                            dst_base: at * ys[d],
                        };
                        at += x.dims()[d];
                        p
                    })
                    .collect();
                Ok((Shape::new(dims), plans))
            }
        }
    }
}

/// `x` with its dims reordered: output dim `k` is input dim `perm[k]` (negative dims
/// count from the end), copied into contiguous memory. E.g. `[B, L, H, D]` with
/// `[0, 2, 1, 3]` gives `[B, H, L, D]`.
///
/// # Errors (at submit)
///
/// [`Error::InvalidDim`] when `perm` is not a permutation of `0..rank`.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[1u32, 2, 3, 4, 5, 6], [2, 3])?;
/// let y = rt.submit(rtx_ops::layout::permute(&x, &[-1, 0]))?.wait()?;
/// assert_eq!(y.dims(), &[3, 2]);
/// assert_eq!(rt.to_vec::<u32>(&y)?.wait()?, vec![1, 4, 2, 5, 3, 6]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn permute(x: &Tensor, perm: &[isize]) -> LayoutOp {
    LayoutOp {
        kind: LayoutKind::Permute(perm.to_vec()),
        xs: vec![x.clone()],
    }
}

/// `x` with dims `d0` and `d1` swapped (a [`permute`]); negative dims count from the end.
///
/// # Errors (at submit)
///
/// [`Error::InvalidDim`] for a dim out of range.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [1, 2, 3])?;
/// let y = rt.submit(rtx_ops::layout::transpose(&x, -1, -2))?.wait()?;
/// assert_eq!(y.dims(), &[1, 3, 2]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn transpose(x: &Tensor, d0: isize, d1: isize) -> LayoutOp {
    let rank = x.rank();
    let mut perm: Vec<isize> = (0..rank as isize).collect();
    // Out-of-range dims are reported by `plan`: leave a marker it rejects.
    match (
        resolve_dim("transpose", d0, rank),
        resolve_dim("transpose", d1, rank),
    ) {
        (Ok(a), Ok(b)) => perm.swap(a, b),
        _ => perm.push(rank as isize),
    }
    LayoutOp {
        kind: LayoutKind::Permute(perm),
        xs: vec![x.clone()],
    }
}

/// The slice `start..start + len` of `x` along `dim` (negative: from the end), copied
/// into contiguous memory.
///
/// # Errors (at submit)
///
/// [`Error::InvalidDim`] for a dim out of range or an empty or out-of-range slice.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[1i32, 2, 3, 4, 5, 6], [2, 3])?;
/// let y = rt.submit(rtx_ops::layout::narrow(&x, -1, 1, 2))?.wait()?;
/// assert_eq!(rt.to_vec::<i32>(&y)?.wait()?, vec![2, 3, 5, 6]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn narrow(x: &Tensor, dim: isize, start: usize, len: usize) -> LayoutOp {
    LayoutOp {
        kind: LayoutKind::Narrow { dim, start, len },
        xs: vec![x.clone()],
    }
}

/// `xs` joined along `dim` (negative: from the end); all other dims and the dtype must
/// agree.
///
/// # Errors (at submit)
///
/// [`Error::InvalidOp`] for no inputs, [`Error::InvalidDim`] for a dim out of range,
/// [`Error::ShapeMismatch`] / [`Error::DTypeMismatch`] when the inputs disagree.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let a = rt.upload(&[1.0f32, 2.0], [2, 1])?;
/// let b = rt.upload(&[3.0f32, 4.0, 5.0, 6.0], [2, 2])?;
/// let y = rt.submit(rtx_ops::layout::concat(&[a, b], 1))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![1.0, 3.0, 4.0, 2.0, 5.0, 6.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn concat(xs: &[Tensor], dim: isize) -> LayoutOp {
    LayoutOp {
        kind: LayoutKind::Concat(dim),
        xs: xs.to_vec(),
    }
}

impl Op for LayoutOp {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        match self.kind {
            LayoutKind::Permute(_) => "permute",
            LayoutKind::Narrow { .. } => "narrow",
            LayoutKind::Concat(_) => "concat",
        }
    }
    fn inputs(&self) -> Vec<&Tensor> {
        self.xs.iter().collect()
    }
    fn plan(&self, cx: &PlanCx) -> Result<Plan> {
        let name = self.name();
        let (shape, plans) = self.plans()?;
        let n = shape.numel();
        if matches!(cx.device, Device::Cuda(_)) {
            for p in &plans {
                let dims = p.coalesced().shape.len();
                if dims > cuda::MAX_DIMS {
                    return Err(Error::invalid(
                        name,
                        format!(
                            "the copy needs {dims} dims on CUDA (at most {})",
                            cuda::MAX_DIMS
                        ),
                    ));
                }
            }
        }
        let dtype = self.xs[0].dtype();
        Ok(Plan {
            outputs: vec![TensorSpec::new(shape, dtype)],
            cost: Cost {
                flops: 0.0,
                bytes: (2 * n * dtype.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let name = self.name();
        let (shape, plans) = self.plans()?;
        let bufs = self
            .xs
            .iter()
            .map(|x| cx.input(x))
            .collect::<Result<Vec<_>>>()?;
        let xs: Vec<&Buffer> = bufs.iter().map(|b| &**b).collect();
        let n = shape.numel();
        let dtype = self.xs[0].dtype();
        let out = match cx.backend() {
            BackendCx::Cpu => any_dispatch!(dtype, |T| run_cpu::<T>(&xs, &plans, n)),
            BackendCx::Cuda(scx) => any_dispatch!(dtype, |T| {
                let mut y = alloc_out::<T>(scx, n)?;
                cuda::copies::<T>(scx, name, &xs, &plans, &mut y)?;
                Ok(Buffer::from_cuda(y))
            }),
        }?;
        cx.set_output(0, out)
    }
}

fn run_cpu<T: Element>(xs: &[&Buffer], plans: &[CopyPlan], n: usize) -> Result<Buffer> {
    // Poisoned like every op's output (NaN, or the extreme integer), so that an element
    // no plan writes shows up in the tests; every element is written by exactly one plan.
    let poison = match T::DTYPE {
        DType::I32 => T::from_f64(i32::MIN as f64),
        DType::U32 => T::from_f64(u32::MAX as f64),
        _ => T::from_f64(f64::NAN),
    };
    let mut y = vec![poison; n];
    for (x, p) in xs.iter().zip(plans) {
        p.run(x.cpu::<T>()?, &mut y);
    }
    Ok(Buffer::from_vec(y))
}
