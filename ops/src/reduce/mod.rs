//! Reductions: sum, mean, max, min, prod and argmax/argmin, over all elements or one dim.
//!
//! - `cpu.rs`: the CPU kernels (f64 accumulation).
//! - `cuda.rs`: launches of `kernels/cuda/reduce.cu` (f32 accumulation) and the
//!   per-stream workspace of the full reductions.
//! - here: the op kinds ([`ReduceOp`], [`ArgReduceOp`]), the public constructors,
//!   validation and backend dispatch.
//!
//! Over all elements the result is a scalar (shape `[]`); over one dim that dim is
//! removed, or kept with size 1 with `keepdim`. Values keep the input's dtype (f32, f16,
//! bf16; f16 and bf16 accumulate in f32 or better); argmax/argmin give `u32` indices
//! (flat over all elements, along the dim otherwise): the smallest index among ties, and
//! the first NaN if there is one. max and min propagate NaN.
//!
//! Zero-size inputs are rejected with [`Error::InvalidOp`] for every reduction (even
//! sum, whose empty value 0 is well defined): one rule is easier to rely on than
//! per-op identities. Argmax/argmin also need fewer than 2^32 elements.

pub mod cpu;
mod cuda;

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Shape,
    Tensor, TensorSpec,
};

use crate::cpu_util::Float;
use crate::dim::Dim;
use crate::kernels::{check_float, cpu_out, cpu_out_u32, float_dispatch};

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (0 for no elements).
    Sum,
    /// Arithmetic mean (NaN for no elements).
    Mean,
    /// Maximum, NaN if any element is NaN (-inf for no elements).
    Max,
    /// Minimum, NaN if any element is NaN (+inf for no elements).
    Min,
    /// Product (1 for no elements).
    Prod,
}

/// An index-returning reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgReduceOp {
    /// Index of the maximum (first NaN if any; smallest index on ties).
    ArgMax,
    /// Index of the minimum (first NaN if any; smallest index on ties).
    ArgMin,
}

/// What a [`Reduce`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// A value of the input's dtype.
    Value(ReduceOp),
    /// A `u32` index.
    Arg(ArgReduceOp),
}

/// A reduction over all elements (`dim: None`) or along one dim, built by [`sum`],
/// [`sum_dim`], [`argmax`], [`argmax_dim`] and friends.
pub struct Reduce {
    kind: ReduceKind,
    x: Tensor,
    dim: Option<usize>,
    /// The dim as asked for, when it was out of range (for the error at submit).
    bad_dim: Option<isize>,
    keepdim: bool,
}

impl Reduce {
    /// A reduction of `x` of `kind`, over all elements or along `dim`.
    pub fn new(kind: ReduceKind, x: &Tensor, dim: Option<usize>, keepdim: bool) -> Self {
        Reduce {
            kind,
            x: x.clone(),
            dim,
            bad_dim: None,
            keepdim,
        }
    }
    /// Along `dim` counted from the end when negative; one out of range fails at submit.
    fn along(kind: ReduceKind, x: &Tensor, dim: Dim, keepdim: bool) -> Self {
        match dim.resolve("reduce", x.rank()) {
            Ok(d) => Reduce::new(kind, x, Some(d), keepdim),
            // Out of range: kept as asked (a negative one as usize::MAX), failing at submit.
            Err(_) => Reduce {
                bad_dim: Some(dim.0),
                ..Reduce::new(
                    kind,
                    x,
                    Some(usize::try_from(dim.0).unwrap_or(usize::MAX)),
                    keepdim,
                )
            },
        }
    }
    /// What is computed.
    pub fn kind(&self) -> ReduceKind {
        self.kind
    }
    /// The reduced dim, `None` for all elements.
    pub fn dim(&self) -> Option<usize> {
        self.dim
    }
    /// Gives the input back (for instance from a rejected submission).
    pub fn into_input(self) -> Tensor {
        self.x
    }
    /// The output shape, or the error that `plan` reports.
    fn out_shape(&self) -> Result<Shape> {
        let name = self.name();
        let dims = self.x.dims();
        match self.dim {
            None => Ok(Shape::scalar()),
            Some(d) if d < dims.len() => Ok(Shape::new(cpu::reduced_shape(dims, d, self.keepdim))),
            Some(d) => Err(Error::invalid_dim(
                name,
                format!(
                    "dim {} out of range for shape {}",
                    self.bad_dim.map_or(d as i128, |b| b as i128),
                    self.x.shape()
                ),
            )),
        }
    }
}

macro_rules! reduce_ctor {
    ($all:ident, $dim:ident, $kind:expr, $what:literal, $example:literal) => {
        #[doc = concat!("The ", $what, " of all elements of `x`: a scalar (shape `[]`).")]
        ///
        /// # Errors (at submit)
        ///
        /// [`Error::DTypeMismatch`] for a non-float input, [`Error::InvalidOp`] for an
        /// empty one.
        ///
        /// # Examples
        ///
        /// ```
        /// use rtx::Runtime;
        /// let rt = Runtime::cpu(1);
        /// let x = rt.upload(&[3.0f32, 1.0, 4.0, 1.0, 5.0, 9.0], [2, 3])?;
        #[doc = concat!("let y = rt.submit(rtx_ops::reduce::", stringify!($all), "(&x))?.wait()?;")]
        /// assert_eq!(y.dims(), &[] as &[usize]);
        #[doc = $example]
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn $all(x: &Tensor) -> Reduce {
            Reduce::new($kind, x, None, false)
        }

        #[doc = concat!("The ", $what, " of `x` along `dim`; `dim` is removed, or kept with size 1")]
        /// with `keepdim`.
        ///
        /// # Errors (at submit)
        ///
        /// [`Error::InvalidDim`] when `dim >= x.rank()`, [`Error::DTypeMismatch`] for a
        /// non-float input, [`Error::InvalidOp`] for an empty one.
        ///
        /// # Examples
        ///
        /// ```
        /// use rtx::Runtime;
        /// let rt = Runtime::cpu(1);
        /// let x = rt.upload(&[3.0f32, 1.0, 4.0, 1.0, 5.0, 9.0], [2, 3])?;
        #[doc = concat!("let y = rt.submit(rtx_ops::reduce::", stringify!($dim), "(&x, 1, true))?.wait()?;")]
        /// assert_eq!(y.dims(), &[2, 1]);
        #[doc = concat!("let z = rt.submit(rtx_ops::reduce::", stringify!($dim), "(&x, 0, false))?.wait()?;")]
        /// assert_eq!(z.dims(), &[3]);
        #[doc = concat!("let last = rt.submit(rtx_ops::reduce::", stringify!($dim), "(&x, -1, false))?.wait()?;")]
        /// assert_eq!(last.dims(), &[2]);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn $dim(x: &Tensor, dim: impl Into<Dim>, keepdim: bool) -> Reduce {
            Reduce::along($kind, x, dim.into(), keepdim)
        }
    };
}

reduce_ctor!(
    sum,
    sum_dim,
    ReduceKind::Value(ReduceOp::Sum),
    "sum",
    "assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![23.0]);"
);
reduce_ctor!(
    mean,
    mean_dim,
    ReduceKind::Value(ReduceOp::Mean),
    "mean",
    "assert!((rt.to_vec::<f32>(&y)?.wait()?[0] - 23.0 / 6.0).abs() < 1e-6);"
);
reduce_ctor!(
    max,
    max_dim,
    ReduceKind::Value(ReduceOp::Max),
    "maximum (NaN if any element is NaN)",
    "assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![9.0]);"
);
reduce_ctor!(
    min,
    min_dim,
    ReduceKind::Value(ReduceOp::Min),
    "minimum (NaN if any element is NaN)",
    "assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![1.0]);"
);
reduce_ctor!(
    prod,
    prod_dim,
    ReduceKind::Value(ReduceOp::Prod),
    "product",
    "assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![540.0]);"
);
reduce_ctor!(
    argmax,
    argmax_dim,
    ReduceKind::Arg(ArgReduceOp::ArgMax),
    "`u32` index of the maximum (smallest index among ties, first NaN if any)",
    "assert_eq!(rt.to_vec::<u32>(&y)?.wait()?, vec![5]);"
);
reduce_ctor!(
    argmin,
    argmin_dim,
    ReduceKind::Arg(ArgReduceOp::ArgMin),
    "`u32` index of the minimum (smallest index among ties, first NaN if any)",
    "assert_eq!(rt.to_vec::<u32>(&y)?.wait()?, vec![1]);"
);

fn reduce_name(kind: ReduceKind, per_dim: bool) -> &'static str {
    let names = match kind {
        ReduceKind::Value(ReduceOp::Sum) => ["sum", "sum_dim"],
        ReduceKind::Value(ReduceOp::Mean) => ["mean", "mean_dim"],
        ReduceKind::Value(ReduceOp::Max) => ["max", "max_dim"],
        ReduceKind::Value(ReduceOp::Min) => ["min", "min_dim"],
        ReduceKind::Value(ReduceOp::Prod) => ["prod", "prod_dim"],
        ReduceKind::Arg(ArgReduceOp::ArgMax) => ["argmax", "argmax_dim"],
        ReduceKind::Arg(ArgReduceOp::ArgMin) => ["argmin", "argmin_dim"],
    };
    names[per_dim as usize]
}

/// The view `[outer, r, inner]` of a reduction; all-element reductions are `[1, n, 1]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) outer: usize,
    pub(crate) r: usize,
    pub(crate) inner: usize,
}

impl Op for Reduce {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        reduce_name(self.kind, self.dim.is_some())
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let name = self.name();
        let dtype = self.x.dtype();
        let shape = self.out_shape()?;
        check_float(name, dtype)?;
        let n = self.x.numel();
        if n == 0 {
            return Err(Error::invalid(
                name,
                format!("empty input {}", self.x.shape()),
            ));
        }
        let out_dtype = match self.kind {
            ReduceKind::Value(_) => dtype,
            ReduceKind::Arg(_) => {
                if n > u32::MAX as usize {
                    return Err(Error::invalid(
                        name,
                        format!("{n} elements: indices must fit in u32"),
                    ));
                }
                DType::U32
            }
        };
        let bytes = n * dtype.size() + shape.numel() * out_dtype.size();
        Ok(Plan {
            outputs: vec![TensorSpec::new(shape, out_dtype)],
            cost: Cost {
                flops: n as f64,
                bytes: bytes as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (name, kind, dtype) = (self.name(), self.kind, self.x.dtype());
        let n = self.x.numel();
        let split = match self.dim {
            Some(d) => {
                let (outer, r, inner) = cpu::split_dims(self.x.dims(), d);
                Split { outer, r, inner }
            }
            None => Split {
                outer: 1,
                r: n,
                inner: 1,
            },
        };
        let x = cx.input(&self.x)?;
        let out = match cx.backend() {
            BackendCx::Cpu => {
                float_dispatch!(dtype, name, |T| reduce_cpu::<T>(kind, &x, split))
            }
            BackendCx::Cuda(scx) => cuda::reduce(scx, dtype, kind, name, &x, split),
        }?;
        cx.set_output(0, out)
    }
}

fn reduce_cpu<T: Float + Element>(kind: ReduceKind, x: &Buffer, s: Split) -> Result<Buffer> {
    let x = x.cpu::<T>()?;
    let all = s.outer * s.inner == 1;
    Ok(match kind {
        ReduceKind::Value(op) if all => Buffer::from_vec(vec![cpu::reduce_all(op, x)]),
        ReduceKind::Value(op) => {
            let mut y = cpu_out::<T>(s.outer * s.inner);
            cpu::reduce_dim(op, x, s.outer, s.r, s.inner, &mut y);
            Buffer::from_vec(y)
        }
        ReduceKind::Arg(op) if all => Buffer::from_vec(vec![cpu::argreduce_all(op, x)]),
        ReduceKind::Arg(op) => {
            let mut y = cpu_out_u32(s.outer * s.inner);
            cpu::argreduce_dim(op, x, s.outer, s.r, s.inner, &mut y);
            Buffer::from_vec(y)
        }
    })
}
