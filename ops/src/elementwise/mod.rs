//! Element-wise ops: unary maps and broadcasting binary ops.
//!
//! - `cpu.rs`: the CPU kernels (slices and shapes in, rayon inside).
//! - `cuda.rs`: picks and launches the kernels of `kernels/cuda/elementwise.cu`.
//! - here: the op kinds ([`UnaryOp`], [`BinaryOp`]), the public constructors,
//!   validation (`plan`) and backend dispatch (`run`).
//!
//! Binary ops follow numpy broadcasting; both operands must have the same float dtype
//! (f32, f16 or bf16; f16 and bf16 compute in f32 and round once). Zero-size outputs
//! are rejected with [`Error::InvalidOp`]. On CUDA, exp of f16 on sm_90 takes a shorter
//! path with the same results bit for bit (every one of the 65,536 inputs is tested:
//! `exp_f16_every_input_is_correctly_rounded` in `ops/tests/elementwise.rs`).
//!
//! The `*_` constructors take their first operand by value (*donation*): when that
//! handle is the last one to its memory at execution time and the output has its shape,
//! the op writes in place; otherwise it allocates. The result is the same either way.

pub mod cpu;
mod cuda;

use rayon::prelude::*;
use rtx_runtime::{
    BackendCx, Buffer, Cost, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Shape, Tensor,
    TensorSpec,
};

use crate::cpu_util::{Float, PAR_CHUNK, PAR_MIN_LEN};
use crate::kernels::{check_float, cpu_out, float_dispatch};

/// A unary element-wise operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `e^x`.
    Exp,
    /// Natural logarithm (NaN below 0, -inf at 0).
    Log,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Square root (NaN below 0).
    Sqrt,
    /// `|x|`.
    Abs,
    /// `max(x, 0)`; NaN stays NaN (as in PyTorch).
    Relu,
}

/// A binary element-wise operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// The larger of `a` and `b`; NaN if either is NaN (like `torch.maximum`).
    Max,
    /// The smaller of `a` and `b`; NaN if either is NaN (like `torch.minimum`).
    Min,
}

impl UnaryOp {
    /// Applies the op to one f32 value.
    #[inline(always)]
    pub fn apply(self, v: f32) -> f32 {
        match self {
            UnaryOp::Neg => -v,
            UnaryOp::Exp => v.exp(),
            UnaryOp::Log => v.ln(),
            UnaryOp::Sin => v.sin(),
            UnaryOp::Cos => v.cos(),
            UnaryOp::Sqrt => v.sqrt(),
            UnaryOp::Abs => v.abs(),
            UnaryOp::Relu => cpu::relu(v),
        }
    }
}

impl BinaryOp {
    /// Applies the op to one pair of f32 values.
    #[inline(always)]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Max => cpu::nan_max(a, b),
            BinaryOp::Min => cpu::nan_min(a, b),
        }
    }
}

/// A broadcasting binary op (`a op b`), built by [`add`], [`sub`], [`mul`], [`div`],
/// [`maximum`], [`minimum`] and their donating `*_` forms.
pub struct Binary {
    op: BinaryOp,
    a: Tensor,
    b: Tensor,
    in_place: bool,
}

/// A unary op (`op(x)`), built by [`neg`], [`exp`], [`log`], [`sin`], [`cos`], [`sqrt`],
/// [`abs`], [`relu`] and their donating `*_` forms.
pub struct Unary {
    op: UnaryOp,
    x: Tensor,
    in_place: bool,
}

impl Binary {
    /// The operation.
    pub fn kind(&self) -> BinaryOp {
        self.op
    }
    /// Gives the operands back (for instance from a rejected submission).
    pub fn into_inputs(self) -> (Tensor, Tensor) {
        (self.a, self.b)
    }
}

impl Unary {
    /// The operation.
    pub fn kind(&self) -> UnaryOp {
        self.op
    }
    /// Gives the operand back (for instance from a rejected submission).
    pub fn into_input(self) -> Tensor {
        self.x
    }
}

macro_rules! binary_ctor {
    ($name:ident, $name_:ident, $op:ident, $what:literal) => {
        #[doc = concat!("`", $what, "`, element-wise with numpy broadcasting.")]
        ///
        /// # Errors (at submit)
        ///
        /// [`Error::DTypeMismatch`] if the dtypes differ or are not float,
        /// [`Error::ShapeMismatch`] if the shapes do not broadcast, [`Error::InvalidOp`]
        /// for a zero-size result.
        ///
        /// # Examples
        ///
        /// ```
        /// use rtx::Runtime;
        /// let rt = Runtime::cpu(1);
        /// let a = rt.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])?;
        /// let b = rt.upload(&[2.0f32, 4.0, 8.0], [3])?;
        #[doc = concat!("let y = rt.submit(rtx_ops::elementwise::", stringify!($name), "(&a, &b))?.wait()?;")]
        /// assert_eq!(y.dims(), &[2, 3]);
        /// let v = rt.to_vec::<f32>(&y)?.wait()?;
        #[doc = concat!("assert_eq!(v[5], rtx_ops::elementwise::BinaryOp::", stringify!($op), ".apply(6.0, 8.0));")]
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn $name(a: &Tensor, b: &Tensor) -> Binary {
            Binary {
                op: BinaryOp::$op,
                a: a.clone(),
                b: b.clone(),
                in_place: false,
            }
        }

        #[doc = concat!("[`", stringify!($name), "`] donating `a`: writes into `a`'s memory when `a` is")]
        /// the last handle to it and the result has `a`'s shape; allocates otherwise.
        ///
        /// # Examples
        ///
        /// ```
        /// use rtx::Runtime;
        /// let rt = Runtime::cpu(1);
        /// let a = rt.upload(&[1.0f32, 2.0, 3.0], [3])?;
        /// let b = rt.upload(&[4.0f32], [])?;
        #[doc = concat!("let y = rt.submit(rtx_ops::elementwise::", stringify!($name_), "(a, &b))?.wait()?;")]
        /// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?.len(), 3);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn $name_(a: Tensor, b: &Tensor) -> Binary {
            Binary {
                op: BinaryOp::$op,
                a,
                b: b.clone(),
                in_place: true,
            }
        }
    };
}

binary_ctor!(add, add_, Add, "a + b");
binary_ctor!(sub, sub_, Sub, "a - b");
binary_ctor!(mul, mul_, Mul, "a * b");
binary_ctor!(div, div_, Div, "a / b");
binary_ctor!(maximum, maximum_, Max, "max(a, b)");
binary_ctor!(minimum, minimum_, Min, "min(a, b)");

macro_rules! unary_ctor {
    ($name:ident, $name_:ident, $op:ident, $what:literal) => {
        #[doc = concat!("`", $what, "`, element-wise.")]
        ///
        /// # Errors (at submit)
        ///
        /// [`Error::DTypeMismatch`] for a non-float dtype, [`Error::InvalidOp`] for a
        /// zero-size tensor.
        ///
        /// # Examples
        ///
        /// ```
        /// use rtx::Runtime;
        /// let rt = Runtime::cpu(1);
        /// let x = rt.upload(&[0.5f32, -1.5], [2])?;
        #[doc = concat!("let y = rt.submit(rtx_ops::elementwise::", stringify!($name), "(&x))?.wait()?;")]
        /// let v = rt.to_vec::<f32>(&y)?.wait()?;
        #[doc = concat!("assert_eq!(v[0], rtx_ops::elementwise::UnaryOp::", stringify!($op), ".apply(0.5));")]
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn $name(x: &Tensor) -> Unary {
            Unary {
                op: UnaryOp::$op,
                x: x.clone(),
                in_place: false,
            }
        }

        #[doc = concat!("[`", stringify!($name), "`] donating `x`: writes into `x`'s memory when `x` is the")]
        /// last handle to it; allocates otherwise.
        ///
        /// # Examples
        ///
        /// ```
        /// use rtx::Runtime;
        /// let rt = Runtime::cpu(1);
        /// let x = rt.upload(&[0.5f32, -1.5], [2])?;
        #[doc = concat!("let y = rt.submit(rtx_ops::elementwise::", stringify!($name_), "(x))?.wait()?;")]
        /// assert_eq!(y.dims(), &[2]);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn $name_(x: Tensor) -> Unary {
            Unary {
                op: UnaryOp::$op,
                x,
                in_place: true,
            }
        }
    };
}

unary_ctor!(neg, neg_, Neg, "-x");
unary_ctor!(exp, exp_, Exp, "e^x");
unary_ctor!(log, log_, Log, "ln(x)");
unary_ctor!(sin, sin_, Sin, "sin(x)");
unary_ctor!(cos, cos_, Cos, "cos(x)");
unary_ctor!(sqrt, sqrt_, Sqrt, "sqrt(x)");
unary_ctor!(abs, abs_, Abs, "|x|");
unary_ctor!(relu, relu_, Relu, "max(x, 0)");

fn binary_name(op: BinaryOp, in_place: bool) -> &'static str {
    match (op, in_place) {
        (BinaryOp::Add, false) => "add",
        (BinaryOp::Add, true) => "add_",
        (BinaryOp::Sub, false) => "sub",
        (BinaryOp::Sub, true) => "sub_",
        (BinaryOp::Mul, false) => "mul",
        (BinaryOp::Mul, true) => "mul_",
        (BinaryOp::Div, false) => "div",
        (BinaryOp::Div, true) => "div_",
        (BinaryOp::Max, false) => "maximum",
        (BinaryOp::Max, true) => "maximum_",
        (BinaryOp::Min, false) => "minimum",
        (BinaryOp::Min, true) => "minimum_",
    }
}

fn unary_name(op: UnaryOp, in_place: bool) -> &'static str {
    let names = match op {
        UnaryOp::Neg => ["neg", "neg_"],
        UnaryOp::Exp => ["exp", "exp_"],
        UnaryOp::Log => ["log", "log_"],
        UnaryOp::Sin => ["sin", "sin_"],
        UnaryOp::Cos => ["cos", "cos_"],
        UnaryOp::Sqrt => ["sqrt", "sqrt_"],
        UnaryOp::Abs => ["abs", "abs_"],
        UnaryOp::Relu => ["relu", "relu_"],
    };
    names[in_place as usize]
}

/// True when `small` (minus leading 1s) equals the trailing dims of `y`: `small`
/// repeats with period `numel(small)` in `y`'s flat order.
pub(crate) fn is_trailing(small: &[usize], y: &[usize]) -> bool {
    let lead = small.iter().take_while(|&&d| d == 1).count();
    let s = &small[lead..];
    s.len() <= y.len() && y[y.len() - s.len()..] == *s
}

impl Op for Binary {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        binary_name(self.op, self.in_place)
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.a, &self.b]
    }
    fn plan(&self, cx: &PlanCx) -> Result<Plan> {
        let name = self.name();
        let dtype = self.a.dtype();
        check_float(name, dtype)?;
        if self.b.dtype() != dtype {
            return Err(Error::dtype(name, dtype, self.b.dtype()));
        }
        // Same shapes (the common case) need no broadcast, nor its allocation.
        let shape = if self.a.dims() == self.b.dims() {
            self.a.shape().clone()
        } else {
            let dims = cpu::broadcast_shape(self.a.dims(), self.b.dims()).ok_or_else(|| {
                Error::shape(
                    name,
                    self.a.shape(),
                    self.b.shape(),
                    "shapes do not broadcast",
                )
            })?;
            Shape::new(dims)
        };
        let n = shape.numel();
        if n == 0 {
            return Err(Error::invalid(name, format!("zero-size result {shape}")));
        }
        if matches!(cx.device, rtx_runtime::Device::Cuda(_)) {
            cuda::check_rank(name, self.a.dims(), self.b.dims(), shape.dims())?;
        }
        let bytes = (self.a.numel() + self.b.numel() + n) * dtype.size();
        Ok(Plan {
            outputs: vec![TensorSpec::new(shape, dtype)],
            cost: Cost {
                flops: n as f64,
                bytes: bytes as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (name, dtype) = (self.name(), self.a.dtype());
        let y_is_a = cx.output_spec(0).shape.dims() == self.a.dims();
        // Donate before taking input references: a reference keeps the buffer shared.
        let donated = if self.in_place && y_is_a {
            cx.donate(&mut self.a)
        } else {
            None
        };
        crate::kernels::count_donation(&donated);
        let a = match donated {
            Some(_) => None,
            None => Some(cx.input(&self.a)?),
        };
        let b = cx.input(&self.b)?;
        // A shape of up to 2 dims clones without allocating.
        let y_shape = cx.output_spec(0).shape.clone();
        let args = BinaryArgs {
            op: self.op,
            name,
            a_dims: self.a.dims(),
            b_dims: self.b.dims(),
            y_dims: y_shape.dims(),
        };
        let out = match cx.backend() {
            BackendCx::Cpu => float_dispatch!(dtype, name, |T| binary_cpu::<T>(
                &args,
                a.as_deref(),
                donated,
                &b
            )),
            BackendCx::Cuda(scx) => cuda::binary(scx, dtype, &args, a.as_deref(), donated, &b),
        }?;
        cx.set_output(0, out)
    }
    /// Same-shape ops of at most 4096 elements defer their launch into the stream's
    /// batch on CUDA; the others launch their own kernel after the batch (their run
    /// does nothing else to the stream but allocate).
    fn batches_launches(&self) -> bool {
        true
    }
}

/// Expands `$body` once per binary op with `$f` bound to its f32 function, so each op
/// gets a monomorphic loop.
macro_rules! each_binary {
    ($op:expr, |$f:ident| $body:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = |a, b| BinaryOp::Add.apply(a, b);
                $body
            }
            BinaryOp::Sub => {
                let $f = |a, b| BinaryOp::Sub.apply(a, b);
                $body
            }
            BinaryOp::Mul => {
                let $f = |a, b| BinaryOp::Mul.apply(a, b);
                $body
            }
            BinaryOp::Div => {
                let $f = |a, b| BinaryOp::Div.apply(a, b);
                $body
            }
            BinaryOp::Max => {
                let $f = |a, b| BinaryOp::Max.apply(a, b);
                $body
            }
            BinaryOp::Min => {
                let $f = |a, b| BinaryOp::Min.apply(a, b);
                $body
            }
        }
    };
}

/// What a binary launch needs besides the buffers.
pub(crate) struct BinaryArgs<'s> {
    pub(crate) op: BinaryOp,
    pub(crate) name: &'static str,
    pub(crate) a_dims: &'s [usize],
    pub(crate) b_dims: &'s [usize],
    pub(crate) y_dims: &'s [usize],
}

/// The CPU binary op: in place into the donated buffer (which holds `a`) when `b` is
/// full-size or repeats along the trailing dims, else into a new vector.
fn binary_cpu<T: Float + Element>(
    args: &BinaryArgs<'_>,
    a: Option<&Buffer>,
    donated: Option<Buffer>,
    b: &Buffer,
) -> Result<Buffer> {
    let b = b.cpu::<T>()?;
    let n: usize = args.y_dims.iter().product();
    if let Some(mut buf) = donated {
        let y = buf.cpu_mut::<T>()?;
        if b.len() == n || is_trailing(args.b_dims, args.y_dims) {
            each_binary!(args.op, |f| binary_in_place(y, b, f));
            return Ok(buf);
        }
        let mut out = cpu_out::<T>(n);
        cpu::binary(
            args.op,
            y,
            args.a_dims,
            b,
            args.b_dims,
            &mut out,
            args.y_dims,
        );
        return Ok(Buffer::from_vec(out));
    }
    let a = a.expect("`a` is an input unless donated").cpu::<T>()?;
    let mut out = cpu_out::<T>(n);
    cpu::binary(
        args.op,
        a,
        args.a_dims,
        b,
        args.b_dims,
        &mut out,
        args.y_dims,
    );
    Ok(Buffer::from_vec(out))
}

/// `y[i] = f(y[i], b[i % b.len()])`, where `b.len()` divides `y.len()`.
fn binary_in_place<T: Float>(y: &mut [T], b: &[T], f: impl Fn(f32, f32) -> f32 + Sync) {
    let apply = |y: &mut [T], b: &[T]| {
        for (o, z) in y.iter_mut().zip(b) {
            *o = T::from_f32(f(o.to_f32(), z.to_f32()));
        }
    };
    let nb = b.len();
    if y.len() < PAR_MIN_LEN {
        y.chunks_mut(nb).for_each(|y| apply(y, b));
    } else if nb == y.len() {
        y.par_chunks_mut(PAR_CHUNK)
            .zip(b.par_chunks(PAR_CHUNK))
            .for_each(|(y, b)| apply(y, b));
    } else {
        let rows = (PAR_CHUNK / nb).max(1) * nb;
        y.par_chunks_mut(rows)
            .for_each(|y| y.chunks_mut(nb).for_each(|y| apply(y, b)));
    }
}

impl Op for Unary {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        unary_name(self.op, self.in_place)
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let name = self.name();
        let dtype = self.x.dtype();
        check_float(name, dtype)?;
        let n = self.x.numel();
        if n == 0 {
            return Err(Error::invalid(
                name,
                format!("zero-size tensor {}", self.x.shape()),
            ));
        }
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.x.shape().clone(), dtype)],
            cost: Cost {
                flops: n as f64,
                bytes: (2 * n * dtype.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (name, dtype, op) = (self.name(), self.x.dtype(), self.op);
        let donated = if self.in_place {
            cx.donate(&mut self.x)
        } else {
            None
        };
        crate::kernels::count_donation(&donated);
        let x = match donated {
            Some(_) => None,
            None => Some(cx.input(&self.x)?),
        };
        let n = self.x.numel();
        let out = match cx.backend() {
            BackendCx::Cpu => float_dispatch!(dtype, name, |T| unary_cpu::<T>(
                op,
                x.as_deref(),
                donated,
                n
            )),
            BackendCx::Cuda(scx) => cuda::unary(scx, dtype, op, name, x.as_deref(), donated, n),
        }?;
        cx.set_output(0, out)
    }
    /// As [`Binary`]'s: at most 4096 elements defer into the stream's launch batch.
    fn batches_launches(&self) -> bool {
        true
    }
}

fn unary_cpu<T: Float + Element>(
    op: UnaryOp,
    x: Option<&Buffer>,
    donated: Option<Buffer>,
    n: usize,
) -> Result<Buffer> {
    if let Some(mut buf) = donated {
        let y = buf.cpu_mut::<T>()?;
        let apply = |y: &mut [T]| {
            for v in y.iter_mut() {
                *v = T::from_f32(op.apply(v.to_f32()));
            }
        };
        if y.len() < PAR_MIN_LEN {
            apply(y);
        } else {
            y.par_chunks_mut(PAR_CHUNK).for_each(apply);
        }
        return Ok(buf);
    }
    let x = x.expect("`x` is an input unless donated").cpu::<T>()?;
    let mut y = cpu_out::<T>(n);
    cpu::unary(op, x, &mut y);
    Ok(Buffer::from_vec(y))
}
