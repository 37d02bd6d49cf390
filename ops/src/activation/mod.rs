//! Activations as standalone ops, their backward ops, and the scalar maps.
//!
//! - `cpu.rs`: the f32 formulas and the CPU loops (the reference).
//! - `cuda.rs`: the launches of `kernels/cuda/activation.cu`.
//! - here: the public constructors, validation (`plan`) and backend dispatch (`run`).
//!
//! Forward maps ([`Map`]): [`tanh`], [`sigmoid`], [`gelu`] (tanh form, the formula of
//! [`crate::Activation::Gelu`]), [`silu`], [`add_scalar`] and [`mul_scalar`] (learning
//! rates, loss scaling). Backward ops ([`Grad`]) take the upstream gradient `dy` and the
//! saved forward input `x` ([`relu_backward`], [`gelu_backward`], [`silu_backward`]) or the
//! saved forward output `y` ([`tanh_backward`], [`sigmoid_backward`]), of the same shape and
//! dtype, and give `dx = dy · f'`.
//!
//! Dtypes: f32, f16 and bf16; f16 and bf16 compute in f32 and round once. Zero-size tensors
//! are rejected with [`Error::InvalidOp`]. The `*_` constructors donate their first
//! operand (`x`, or `dy` for a backward op): when that handle is the last one to its memory
//! at execution time the op writes in place; otherwise it allocates. The result is the same
//! either way.

pub mod cpu;
mod cuda;

use rtx_runtime::{
    BackendCx, Buffer, Cost, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Tensor, TensorSpec,
};

pub use cpu::{GradOp, MapOp};

use crate::cpu_util::Float;
use crate::kernels::{check_float, count_donation, cpu_out, float_dispatch};

/// A forward element-wise map `y = op(x)`, built by [`tanh`], [`sigmoid`], [`gelu`],
/// [`silu`], [`add_scalar`], [`mul_scalar`] and their donating `*_` forms.
pub struct Map {
    op: MapOp,
    x: Tensor,
    in_place: bool,
}

impl Map {
    /// The operation.
    pub fn kind(&self) -> MapOp {
        self.op
    }
    /// Gives the operand back (for instance from a rejected submission).
    pub fn into_input(self) -> Tensor {
        self.x
    }
}

/// A backward map `dx = dy · f'(v)`, built by [`relu_backward`], [`gelu_backward`],
/// [`silu_backward`], [`tanh_backward`], [`sigmoid_backward`] and their `*_` forms.
pub struct Grad {
    op: GradOp,
    dy: Tensor,
    v: Tensor,
    in_place: bool,
}

impl Grad {
    /// The operation.
    pub fn kind(&self) -> GradOp {
        self.op
    }
    /// Gives the operands back, `(dy, v)` (for instance from a rejected submission).
    pub fn into_inputs(self) -> (Tensor, Tensor) {
        (self.dy, self.v)
    }
}

macro_rules! map_ctor {
    ($name:ident, $name_:ident, $op:expr, $what:literal) => {
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
        /// use rtx_runtime::Runtime;
        /// let rt = Runtime::cpu(1);
        /// let x = rt.upload(&[0.5f32, -1.5], [2])?;
        #[doc = concat!("let y = rt.submit(rtx_ops::activation::", stringify!($name), "(&x))?.wait()?;")]
        /// assert_eq!(y.dims(), &[2]);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn $name(x: &Tensor) -> Map {
            Map {
                op: $op,
                x: x.clone(),
                in_place: false,
            }
        }

        #[doc = concat!("[`", stringify!($name), "`] donating `x`: writes into `x`'s memory when `x` is the")]
        /// last handle to it; allocates otherwise.
        pub fn $name_(x: Tensor) -> Map {
            Map {
                op: $op,
                x,
                in_place: true,
            }
        }
    };
}

map_ctor!(tanh, tanh_, MapOp::Tanh, "tanh(x)");
map_ctor!(sigmoid, sigmoid_, MapOp::Sigmoid, "1 / (1 + e^-x)");
map_ctor!(
    gelu,
    gelu_,
    MapOp::Gelu,
    "0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))"
);
map_ctor!(silu, silu_, MapOp::Silu, "x · sigmoid(x)");

/// `x + s`, element-wise (`s` is applied in f32).
///
/// # Errors (at submit)
///
/// [`Error::DTypeMismatch`] for a non-float dtype, [`Error::InvalidOp`] for a zero-size
/// tensor.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[0.5f32, -1.5], [2])?;
/// let y = rt.submit(rtx_ops::add_scalar(&x, 1.0))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![1.5, -0.5]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn add_scalar(x: &Tensor, s: f32) -> Map {
    Map {
        op: MapOp::AddScalar(s),
        x: x.clone(),
        in_place: false,
    }
}

/// [`add_scalar`] donating `x` (in place when `x` is the last handle to its memory).
pub fn add_scalar_(x: Tensor, s: f32) -> Map {
    Map {
        op: MapOp::AddScalar(s),
        x,
        in_place: true,
    }
}

/// `x · s`, element-wise (`s` is applied in f32).
///
/// # Errors (at submit)
///
/// [`Error::DTypeMismatch`] for a non-float dtype, [`Error::InvalidOp`] for a zero-size
/// tensor.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[0.5f32, -1.5], [2])?;
/// let y = rt.submit(rtx_ops::mul_scalar(&x, 2.0))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![1.0, -3.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn mul_scalar(x: &Tensor, s: f32) -> Map {
    Map {
        op: MapOp::MulScalar(s),
        x: x.clone(),
        in_place: false,
    }
}

/// [`mul_scalar`] donating `x` (in place when `x` is the last handle to its memory).
pub fn mul_scalar_(x: Tensor, s: f32) -> Map {
    Map {
        op: MapOp::MulScalar(s),
        x,
        in_place: true,
    }
}

macro_rules! grad_ctor {
    ($name:ident, $name_:ident, $op:ident, $v:ident, $what:literal) => {
        #[doc = concat!("The gradient through ", $what, ": `dx = dy · f'`, from the upstream")]
        #[doc = concat!("gradient `dy` and the saved forward `", stringify!($v), "` (same shape and dtype).")]
        ///
        /// # Errors (at submit)
        ///
        /// [`Error::DTypeMismatch`] for a non-float or mismatched dtype,
        /// [`Error::ShapeMismatch`] when the shapes differ, [`Error::InvalidOp`] for a
        /// zero-size tensor.
        ///
        /// # Examples
        ///
        /// ```
        /// use rtx_runtime::Runtime;
        /// let rt = Runtime::cpu(1);
        /// let dy = rt.upload(&[1.0f32, 1.0], [2])?;
        /// let v = rt.upload(&[0.5f32, -0.5], [2])?;
        #[doc = concat!("let dx = rt.submit(rtx_ops::activation::", stringify!($name), "(&dy, &v))?.wait()?;")]
        /// assert_eq!(dx.dims(), &[2]);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn $name(dy: &Tensor, $v: &Tensor) -> Grad {
            Grad {
                op: GradOp::$op,
                dy: dy.clone(),
                v: $v.clone(),
                in_place: false,
            }
        }

        #[doc = concat!("[`", stringify!($name), "`] donating `dy`: writes into `dy`'s memory when `dy`")]
        /// is the last handle to it; allocates otherwise.
        pub fn $name_(dy: Tensor, $v: &Tensor) -> Grad {
            Grad {
                op: GradOp::$op,
                dy,
                v: $v.clone(),
                in_place: true,
            }
        }
    };
}

grad_ctor!(relu_backward, relu_backward_, Relu, x, "relu");
grad_ctor!(gelu_backward, gelu_backward_, Gelu, x, "gelu (tanh form)");
grad_ctor!(silu_backward, silu_backward_, Silu, x, "silu");
grad_ctor!(tanh_backward, tanh_backward_, Tanh, y, "tanh");
grad_ctor!(sigmoid_backward, sigmoid_backward_, Sigmoid, y, "sigmoid");

fn map_name(op: MapOp, in_place: bool) -> &'static str {
    let names = match op {
        MapOp::Tanh => ["tanh", "tanh_"],
        MapOp::Sigmoid => ["sigmoid", "sigmoid_"],
        MapOp::Gelu => ["gelu", "gelu_"],
        MapOp::Silu => ["silu", "silu_"],
        MapOp::AddScalar(_) => ["add_scalar", "add_scalar_"],
        MapOp::MulScalar(_) => ["mul_scalar", "mul_scalar_"],
    };
    names[in_place as usize]
}

fn grad_name(op: GradOp, in_place: bool) -> &'static str {
    let names = match op {
        GradOp::Relu => ["relu_backward", "relu_backward_"],
        GradOp::Gelu => ["gelu_backward", "gelu_backward_"],
        GradOp::Silu => ["silu_backward", "silu_backward_"],
        GradOp::Tanh => ["tanh_backward", "tanh_backward_"],
        GradOp::Sigmoid => ["sigmoid_backward", "sigmoid_backward_"],
    };
    names[in_place as usize]
}

/// The plan of a same-shape element-wise op over `n` elements of `x`'s shape.
fn same_shape_plan(name: &str, x: &Tensor, reads: usize) -> Result<Plan> {
    let dtype = x.dtype();
    check_float(name, dtype)?;
    let n = x.numel();
    if n == 0 {
        return Err(Error::invalid(
            name,
            format!("zero-size tensor {}", x.shape()),
        ));
    }
    Ok(Plan {
        outputs: vec![TensorSpec::new(x.shape().clone(), dtype)],
        cost: Cost {
            flops: 8.0 * n as f64,
            bytes: ((reads + 1) * n * dtype.size()) as f64,
        },
    })
}

impl Op for Map {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        map_name(self.op, self.in_place)
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        same_shape_plan(self.name(), &self.x, 1)
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (name, dtype, op) = (self.name(), self.x.dtype(), self.op);
        // Donate before taking input references: a reference keeps the buffer shared.
        let donated = if self.in_place {
            cx.donate(&mut self.x)
        } else {
            None
        };
        count_donation(&donated);
        let x = match donated {
            Some(_) => None,
            None => Some(cx.input(&self.x)?),
        };
        let n = self.x.numel();
        let out = match cx.backend() {
            BackendCx::Cpu => {
                float_dispatch!(dtype, name, |T| map_cpu::<T>(op, x.as_deref(), donated, n))
            }
            BackendCx::Cuda(scx) => cuda::map(scx, dtype, op, name, x.as_deref(), donated, n),
        }?;
        cx.set_output(0, out)
    }
}

fn map_cpu<T: Float + Element>(
    op: MapOp,
    x: Option<&Buffer>,
    donated: Option<Buffer>,
    n: usize,
) -> Result<Buffer> {
    if let Some(mut buf) = donated {
        cpu::map_in_place(op, buf.cpu_mut::<T>()?);
        return Ok(buf);
    }
    let x = x.expect("`x` is an input unless donated").cpu::<T>()?;
    let mut y = cpu_out::<T>(n);
    cpu::map(op, x, &mut y);
    Ok(Buffer::from_vec(y))
}

impl Op for Grad {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        grad_name(self.op, self.in_place)
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.dy, &self.v]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let name = self.name();
        let plan = same_shape_plan(name, &self.dy, 2)?;
        if self.v.dtype() != self.dy.dtype() {
            return Err(Error::dtype(name, self.dy.dtype(), self.v.dtype()));
        }
        if self.v.dims() != self.dy.dims() {
            return Err(Error::shape(
                name,
                self.dy.shape(),
                self.v.shape(),
                "dy and the saved forward tensor must have the same shape",
            ));
        }
        Ok(plan)
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (name, dtype, op) = (self.name(), self.dy.dtype(), self.op);
        let donated = if self.in_place {
            cx.donate(&mut self.dy)
        } else {
            None
        };
        count_donation(&donated);
        let dy = match donated {
            Some(_) => None,
            None => Some(cx.input(&self.dy)?),
        };
        let v = cx.input(&self.v)?;
        let n = self.v.numel();
        let out = match cx.backend() {
            BackendCx::Cpu => float_dispatch!(dtype, name, |T| grad_cpu::<T>(
                op,
                dy.as_deref(),
                donated,
                &v,
                n
            )),
            BackendCx::Cuda(scx) => cuda::grad(scx, dtype, op, name, dy.as_deref(), donated, &v, n),
        }?;
        cx.set_output(0, out)
    }
}

fn grad_cpu<T: Float + Element>(
    op: GradOp,
    dy: Option<&Buffer>,
    donated: Option<Buffer>,
    v: &Buffer,
    n: usize,
) -> Result<Buffer> {
    let v = v.cpu::<T>()?;
    if let Some(mut buf) = donated {
        cpu::grad_in_place(op, buf.cpu_mut::<T>()?, v);
        return Ok(buf);
    }
    let dy = dy.expect("`dy` is an input unless donated").cpu::<T>()?;
    let mut dx = cpu_out::<T>(n);
    cpu::grad(op, dy, v, &mut dx);
    Ok(Buffer::from_vec(dx))
}
