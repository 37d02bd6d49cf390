//! Comparisons and selection: [`eq`], [`gt`], [`lt`] give `u32` masks (1 where true, 0
//! elsewhere) and [`where_`] selects by mask.
//!
//! - `cpu.rs`: the CPU loops (the reference).
//! - `cuda.rs`: the launches of `kernels/cuda/compare.cu`.
//! - here: the public constructors, validation and backend dispatch.
//!
//! Operands have the same shape (no broadcasting) and the same dtype, any of f32, f16,
//! bf16, i32 and u32: `eq(argmax_dim(logits, 1, false), labels)` compares u32 indices.
//! Comparisons with NaN are false (IEEE). Masks are `u32`, so device-side accuracy is
//! `mean(cast(eq(argmax_dim(logits, 1, false), labels), F32))`.

pub mod cpu;
mod cuda;

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Tensor,
    TensorSpec,
};

pub use cpu::CmpOp;

use crate::kernels::any_dispatch;
use crate::kernels::cpu_out_u32;

/// An element-wise comparison giving a `u32` mask, built by [`eq`], [`gt`] and [`lt`].
pub struct Compare {
    op: CmpOp,
    a: Tensor,
    b: Tensor,
}

impl Compare {
    /// The comparison.
    pub fn kind(&self) -> CmpOp {
        self.op
    }
    /// Gives the operands back.
    pub fn into_inputs(self) -> (Tensor, Tensor) {
        (self.a, self.b)
    }
}

macro_rules! cmp_ctor {
    ($name:ident, $op:ident, $what:literal, $want:literal) => {
        #[doc = concat!("The mask `a ", $what, " b` (u32: 1 where true, 0 elsewhere), element-wise;")]
        /// `a` and `b` have the same shape and dtype (float or integer). NaN compares false.
        ///
        /// # Errors (at submit)
        ///
        /// [`Error::ShapeMismatch`] for different shapes, [`Error::DTypeMismatch`] for
        /// different dtypes.
        ///
        /// # Examples
        ///
        /// ```
        /// use rtx_runtime::Runtime;
        /// let rt = Runtime::cpu(1);
        /// let a = rt.upload(&[1.0f32, 2.0, 3.0], [3])?;
        /// let b = rt.upload(&[2.0f32, 2.0, 2.0], [3])?;
        #[doc = concat!("let m = rt.submit(rtx_ops::compare::", stringify!($name), "(&a, &b))?.wait()?;")]
        #[doc = concat!("assert_eq!(rt.to_vec::<u32>(&m)?.wait()?, vec!", $want, ");")]
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn $name(a: &Tensor, b: &Tensor) -> Compare {
            Compare {
                op: CmpOp::$op,
                a: a.clone(),
                b: b.clone(),
            }
        }
    };
}

cmp_ctor!(eq, Eq, "==", "[0, 1, 0]");
cmp_ctor!(gt, Gt, ">", "[0, 0, 1]");
cmp_ctor!(lt, Lt, "<", "[1, 0, 0]");

/// Selection by mask, built by [`where_`].
pub struct Where {
    mask: Tensor,
    a: Tensor,
    b: Tensor,
}

impl Where {
    /// Gives the operands back, `(mask, a, b)`.
    pub fn into_inputs(self) -> (Tensor, Tensor, Tensor) {
        (self.mask, self.a, self.b)
    }
}

/// `y[i] = if mask[i] != 0 { a[i] } else { b[i] }`: `mask` is u32 (as [`eq`] gives it),
/// `a` and `b` have its shape and one dtype (any), copied bit for bit.
///
/// # Errors (at submit)
///
/// [`Error::DTypeMismatch`] when the mask is not u32 or `a` and `b` differ in dtype,
/// [`Error::ShapeMismatch`] for different shapes.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let m = rt.upload(&[1u32, 0, 7], [3])?;
/// let a = rt.upload(&[1.0f32, 2.0, 3.0], [3])?;
/// let b = rt.upload(&[-1.0f32, -2.0, -3.0], [3])?;
/// let y = rt.submit(rtx_ops::where_(&m, &a, &b))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![1.0, -2.0, 3.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn where_(mask: &Tensor, a: &Tensor, b: &Tensor) -> Where {
    Where {
        mask: mask.clone(),
        a: a.clone(),
        b: b.clone(),
    }
}

fn same(name: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::dtype(name, a.dtype(), b.dtype()));
    }
    if a.dims() != b.dims() {
        return Err(Error::shape(
            name,
            a.shape(),
            b.shape(),
            "operands must have the same shape",
        ));
    }
    if a.numel() == 0 {
        return Err(Error::invalid(
            name,
            format!("zero-size tensor {}", a.shape()),
        ));
    }
    Ok(())
}

impl Op for Compare {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        match self.op {
            CmpOp::Eq => "eq",
            CmpOp::Gt => "gt",
            CmpOp::Lt => "lt",
        }
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.a, &self.b]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        same(self.name(), &self.a, &self.b)?;
        let n = self.a.numel();
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.a.shape().clone(), DType::U32)],
            cost: Cost {
                flops: n as f64,
                bytes: (n * (2 * self.a.dtype().size() + 4)) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (op, dtype, n) = (self.op, self.a.dtype(), self.a.numel());
        let a = cx.input(&self.a)?;
        let b = cx.input(&self.b)?;
        let out = match cx.backend() {
            BackendCx::Cpu => any_dispatch!(dtype, |T| compare_cpu::<T>(op, &a, &b, n)),
            BackendCx::Cuda(scx) => cuda::compare(scx, op, dtype, &a, &b, n),
        }?;
        cx.set_output(0, out)
    }
}

fn compare_cpu<T: Element>(op: CmpOp, a: &Buffer, b: &Buffer, n: usize) -> Result<Buffer> {
    let mut y = cpu_out_u32(n);
    cpu::compare(op, a.cpu::<T>()?, b.cpu::<T>()?, &mut y);
    Ok(Buffer::from_vec(y))
}

impl Op for Where {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "where_"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.mask, &self.a, &self.b]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        if self.mask.dtype() != DType::U32 {
            return Err(Error::dtype("where_", DType::U32, self.mask.dtype()));
        }
        same("where_", &self.a, &self.b)?;
        if self.mask.dims() != self.a.dims() {
            return Err(Error::shape(
                "where_",
                self.mask.shape(),
                self.a.shape(),
                "the mask must have the operands' shape",
            ));
        }
        let n = self.a.numel();
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.a.shape().clone(), self.a.dtype())],
            cost: Cost {
                flops: n as f64,
                bytes: (n * (3 * self.a.dtype().size() + 4)) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (dtype, n) = (self.a.dtype(), self.a.numel());
        let m = cx.input(&self.mask)?;
        let a = cx.input(&self.a)?;
        let b = cx.input(&self.b)?;
        let out = match cx.backend() {
            BackendCx::Cpu => any_dispatch!(dtype, |T| where_cpu::<T>(&m, &a, &b)),
            BackendCx::Cuda(scx) => cuda::select(scx, dtype, &m, &a, &b, n),
        }?;
        cx.set_output(0, out)
    }
}

fn where_cpu<T: Element>(m: &Buffer, a: &Buffer, b: &Buffer) -> Result<Buffer> {
    Ok(Buffer::from_vec(cpu::select(
        m.cpu::<u32>()?,
        a.cpu::<T>()?,
        b.cpu::<T>()?,
    )))
}
