//! Softmax over the last dimension.
//!
//! - `cpu.rs`: the CPU kernel (exponentials in f32, sums in f64).
//! - `cuda.rs`: the launch of `kernels/cuda/softmax.cu`.
//! - here: the public constructor, validation and backend dispatch.

pub mod cpu;
mod cuda;

use rtx_runtime::{
    BackendCx, Buffer, Cost, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Tensor, TensorSpec,
};

use crate::cpu_util::Float;
use crate::kernels::{check_float, cpu_out, float_dispatch};

/// Softmax of `x` along its last dimension, built by [`softmax`].
pub struct Softmax {
    x: Tensor,
}

impl Softmax {
    /// Gives the input back (for instance from a rejected submission).
    pub fn into_input(self) -> Tensor {
        self.x
    }
}

/// `softmax(x)` along the last dim: `exp(x - max) / sum(exp(x - max))` per row, computed
/// stably in f32 (f16 and bf16 round once at the end). A row holding NaN, or only
/// `-inf`, gives NaN (as PyTorch).
///
/// # Errors (at submit)
///
/// [`Error::InvalidDim`] for a scalar (no last dim), [`Error::DTypeMismatch`] for a
/// non-float input, [`Error::InvalidOp`] for an empty one.
///
/// # Examples
///
/// ```
/// use rtx::Runtime;
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[0.0f32, 0.0, 1.0, 1.0], [2, 2])?;
/// let y = rt.submit(rtx::ops::softmax::softmax(&x))?.wait()?;
/// let v = rt.to_vec::<f32>(&y)?.wait()?;
/// assert!(v.iter().all(|p| (p - 0.5).abs() < 1e-6));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn softmax(x: &Tensor) -> Softmax {
    Softmax { x: x.clone() }
}

const NAME: &str = "softmax";

impl Op for Softmax {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        NAME
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let dtype = self.x.dtype();
        if self.x.rank() == 0 {
            return Err(Error::invalid_dim(NAME, "a scalar has no last dim"));
        }
        check_float(NAME, dtype)?;
        let n = self.x.numel();
        if n == 0 {
            return Err(Error::invalid(
                NAME,
                format!("empty input {}", self.x.shape()),
            ));
        }
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.x.shape().clone(), dtype)],
            cost: Cost {
                flops: 5.0 * n as f64,
                bytes: (2 * n * dtype.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let dtype = self.x.dtype();
        let cols = *self.x.dims().last().expect("rank checked at submit");
        let rows = self.x.numel() / cols;
        let x = cx.input(&self.x)?;
        let out = match cx.backend() {
            BackendCx::Cpu => float_dispatch!(dtype, NAME, |T| softmax_cpu::<T>(&x, rows, cols)),
            BackendCx::Cuda(scx) => cuda::softmax(scx, dtype, &x, rows, cols),
        }?;
        cx.set_output(0, out)
    }
}

fn softmax_cpu<T: Float + Element>(x: &Buffer, rows: usize, cols: usize) -> Result<Buffer> {
    let x = x.cpu::<T>()?;
    let mut y = cpu_out::<T>(rows * cols);
    cpu::softmax_last(x, rows, cols, &mut y);
    Ok(Buffer::from_vec(y))
}
