//! Dtype conversion and constant tensors: [`cast`], [`fill`], [`zeros`], [`ones`].
//!
//! - `cpu.rs`: the CPU loops (the reference).
//! - `cuda.rs`: the launches of `kernels/cuda/convert.cu`.
//! - here: the public constructors, validation and backend dispatch.
//!
//! [`cast`] converts f32, f16, bf16, i32 or u32 to f32, f16 or bf16 through f32 (integers
//! round to the nearest f32, then to the target once; f32 to f16/bf16 rounds to nearest
//! even, overflow gives ±inf). [`fill`] makes a tensor of one value for any dtype; it has
//! no inputs, so it runs on the stream it is pinned to (`submit_on`) or on the runtime's
//! default device.

pub mod cpu;
mod cuda;

use crate::kernels::any_dispatch;
use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Shape,
    Tensor, TensorSpec,
};

/// A dtype conversion, built by [`cast`].
pub struct Cast {
    x: Tensor,
    to: DType,
}

impl Cast {
    /// The target dtype.
    pub fn to(&self) -> DType {
        self.to
    }
    /// Gives the input back (for instance from a rejected submission).
    pub fn into_input(self) -> Tensor {
        self.x
    }
}

/// `x` converted to `dtype` (f32, f16 or bf16), element by element, through f32.
/// Casting to the same dtype copies.
///
/// # Errors (at submit)
///
/// [`Error::DTypeMismatch`] when `dtype` is an integer type, [`Error::InvalidOp`] for a
/// zero-size input.
///
/// # Examples
///
/// ```
/// use rtx_runtime::{DType, Runtime};
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[0.5f32, -1.5, 65536.0], [3])?;
/// let y = rt.submit(rtx_ops::cast(&x, DType::BF16))?.wait()?;
/// assert_eq!(y.dtype(), DType::BF16);
/// let back = rt.submit(rtx_ops::cast(&y, DType::F32))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&back)?.wait()?, vec![0.5, -1.5, 65536.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn cast(x: &Tensor, dtype: DType) -> Cast {
    Cast {
        x: x.clone(),
        to: dtype,
    }
}

impl Op for Cast {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "cast"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        if !self.to.is_float() {
            return Err(Error::dtype("cast", DType::F32, self.to));
        }
        let n = self.x.numel();
        if n == 0 {
            return Err(Error::invalid(
                "cast",
                format!("zero-size tensor {}", self.x.shape()),
            ));
        }
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.x.shape().clone(), self.to)],
            cost: Cost {
                flops: n as f64,
                bytes: (n * (self.x.dtype().size() + self.to.size())) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (from, to) = (self.x.dtype(), self.to);
        let x = cx.input(&self.x)?;
        let out = match cx.backend() {
            BackendCx::Cpu => any_dispatch!(from, |A| cast_cpu_from::<A>(&x, to)),
            BackendCx::Cuda(scx) => cuda::cast(scx, &x, from, to),
        }?;
        cx.set_output(0, out)
    }
}

fn cast_cpu_from<A: Element>(x: &Buffer, to: DType) -> Result<Buffer> {
    let x = x.cpu::<A>()?;
    Ok(match to {
        DType::F32 => Buffer::from_vec(cpu::cast::<A, f32>(x)),
        DType::F16 => Buffer::from_vec(cpu::cast::<A, half::f16>(x)),
        DType::BF16 => Buffer::from_vec(cpu::cast::<A, half::bf16>(x)),
        other => return Err(Error::dtype("cast", DType::F32, other)),
    })
}

/// A constant tensor, built by [`fill`], [`zeros`] and [`ones`].
pub struct Fill {
    shape: Shape,
    dtype: DType,
    value: f64,
}

/// A tensor of `shape` and `dtype` with every element `value` (rounded to `dtype` once;
/// for i32 and u32 it must be an integer in range). No inputs: it runs on the stream it
/// is pinned to with `submit_on`, else on the default device.
///
/// # Errors (at submit)
///
/// [`Error::InvalidOp`] for a zero-size shape, or an integer dtype with a value that is
/// not an integer in its range.
///
/// # Examples
///
/// ```
/// use rtx_runtime::{DType, Runtime};
/// let rt = Runtime::cpu(1);
/// let y = rt.submit(rtx_ops::fill([2, 3], DType::F16, 0.25))?.wait()?;
/// assert_eq!(rt.to_vec::<half::f16>(&y)?.wait()?, vec![half::f16::from_f32(0.25); 6]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn fill(shape: impl Into<Shape>, dtype: DType, value: f64) -> Fill {
    Fill {
        shape: shape.into(),
        dtype,
        value,
    }
}

/// [`fill`] with 0.
pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Fill {
    fill(shape, dtype, 0.0)
}

/// [`fill`] with 1.
pub fn ones(shape: impl Into<Shape>, dtype: DType) -> Fill {
    fill(shape, dtype, 1.0)
}

impl Fill {
    /// The bit pattern of the value in the dtype, widened to 32 bits.
    fn bits(&self) -> Result<u32> {
        let v = self.value;
        let int_ok = |lo: f64, hi: f64| v.fract() == 0.0 && v >= lo && v <= hi;
        Ok(match self.dtype {
            DType::F32 => (v as f32).to_bits(),
            DType::F16 => half::f16::from_f64(v).to_bits() as u32,
            DType::BF16 => <half::bf16 as rtx_runtime::Element>::from_f64(v).to_bits() as u32,
            DType::I32 if int_ok(i32::MIN as f64, i32::MAX as f64) => (v as i32) as u32,
            DType::U32 if int_ok(0.0, u32::MAX as f64) => v as u32,
            d => {
                return Err(Error::invalid(
                    "fill",
                    format!("{v} is not an integer in the range of {d}"),
                ))
            }
        })
    }
}

impl Op for Fill {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "fill"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        Vec::new()
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        self.bits()?;
        let n = self
            .shape
            .checked_numel()
            .ok_or_else(|| Error::invalid_dim("fill", format!("{} overflows usize", self.shape)))?;
        if n == 0 {
            return Err(Error::invalid(
                "fill",
                format!("zero-size shape {}", self.shape),
            ));
        }
        n.checked_mul(self.dtype.size())
            .ok_or_else(|| Error::invalid_dim("fill", format!("{} bytes overflow", self.shape)))?;
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.shape.clone(), self.dtype)],
            cost: Cost {
                flops: 0.0,
                bytes: (n * self.dtype.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (n, dtype, bits) = (self.shape.numel(), self.dtype, self.bits()?);
        let out = match cx.backend() {
            BackendCx::Cpu => {
                any_dispatch!(dtype, |T| Ok(Buffer::from_vec(vec![
                    T::from_f64(self.value);
                    n
                ])))
            }
            BackendCx::Cuda(scx) => cuda::fill(scx, dtype, n, bits),
        }?;
        cx.set_output(0, out)
    }
}
