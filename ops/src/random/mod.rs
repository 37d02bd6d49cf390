//! Device-side random initialization: [`uniform`] and [`normal`] from the Philox4x32-10
//! counter-based generator.
//!
//! - `cpu.rs`: the generator, the maps from its outputs to values, the CPU fill.
//! - `cuda.rs`: the launch of `kernels/cuda/random.cu` (the same arithmetic).
//! - here: the public constructors, validation and backend dispatch.
//!
//! A tensor is a function of `(seed, offset, shape)` only: element `i` (row-major) uses
//! the generator's counter `i / 4`, lane `i % 4`, under the key `seed`, with `offset` in
//! the counter's upper half. So the same call gives the same numbers on the CPU and on
//! CUDA (uniform: bit for bit; normal: Box-Muller in f64 on both, rounded to f32, equal
//! but for a rare last-bit difference of the f64 `log`/`sin`), on any stream, and
//! tensors drawn with one seed and different offsets are independent streams.
//! Nothing is uploaded: the op has no inputs and runs on the runtime's default device
//! (or that of the stream it is pinned to with `submit_on`).

pub mod cpu;
mod cuda;

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Shape,
    Tensor, TensorSpec,
};

pub use cpu::Dist;

use crate::cpu_util::Float;
use crate::kernels::{check_float, cpu_out, float_dispatch};

/// A random tensor, built by [`uniform`] or [`normal`].
pub struct Random {
    dist: Dist,
    shape: Shape,
    dtype: DType,
    seed: u64,
    offset: u64,
}

impl Random {
    /// The distribution.
    pub fn dist(&self) -> Dist {
        self.dist
    }
}

/// A tensor of `shape` and float `dtype` with values uniform in `[lo, hi]`: `lo + (hi -
/// lo) * u` in f32 with `u` in (0, 1) on a grid of 2^-23, rounded once to `dtype` (the
/// rounding may give `lo` or `hi` themselves). `seed` selects the generator's key and
/// `offset` the stream within it: draw several tensors from one seed with offsets 0,
/// 1, 2, ...
///
/// # Errors (at submit)
///
/// [`Error::DTypeMismatch`] for a non-float dtype; [`Error::InvalidOp`] when `lo` or
/// `hi` is not finite, `lo > hi`, or the shape is empty.
///
/// # Examples
///
/// ```
/// use rtx_runtime::{DType, Runtime};
/// let rt = Runtime::cpu(1);
/// let w = rt.submit(rtx_ops::random::uniform([3, 5], DType::F32, -0.1, 0.1, 42, 0))?.wait()?;
/// let v = rt.to_vec::<f32>(&w)?.wait()?;
/// assert!(v.iter().all(|x| (-0.1..=0.1).contains(x)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn uniform(
    shape: impl Into<Shape>,
    dtype: DType,
    lo: f32,
    hi: f32,
    seed: u64,
    offset: u64,
) -> Random {
    Random {
        dist: Dist::Uniform { lo, hi },
        shape: shape.into(),
        dtype,
        seed,
        offset,
    }
}

/// A tensor of `shape` and float `dtype` with normal values `mean + std * z` (f32, then
/// rounded once to `dtype`), `z` standard normal by Box-Muller on pairs of uniforms.
/// `seed` and `offset` as in [`uniform`].
///
/// # Errors (at submit)
///
/// [`Error::DTypeMismatch`] for a non-float dtype; [`Error::InvalidOp`] when `mean` or
/// `std` is not finite, `std < 0`, or the shape is empty.
///
/// # Examples
///
/// ```
/// use rtx_runtime::{DType, Runtime};
/// let rt = Runtime::cpu(1);
/// let w = rt.submit(rtx_ops::random::normal([1000], DType::F32, 1.0, 0.02, 7, 3))?.wait()?;
/// let v = rt.to_vec::<f32>(&w)?.wait()?;
/// let mean = v.iter().sum::<f32>() / 1000.0;
/// assert!((mean - 1.0).abs() < 0.01);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn normal(
    shape: impl Into<Shape>,
    dtype: DType,
    mean: f32,
    std: f32,
    seed: u64,
    offset: u64,
) -> Random {
    Random {
        dist: Dist::Normal { mean, std },
        shape: shape.into(),
        dtype,
        seed,
        offset,
    }
}

impl Op for Random {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        match self.dist {
            Dist::Uniform { .. } => "uniform",
            Dist::Normal { .. } => "normal",
        }
    }
    fn inputs(&self) -> Vec<&Tensor> {
        Vec::new()
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let name = self.name();
        check_float(name, self.dtype)?;
        match self.dist {
            Dist::Uniform { lo, hi } => {
                if !(lo.is_finite() && hi.is_finite() && lo <= hi && (hi - lo).is_finite()) {
                    return Err(Error::invalid(
                        name,
                        format!("bounds [{lo}, {hi}] must be finite with lo <= hi"),
                    ));
                }
            }
            Dist::Normal { mean, std } => {
                if !(mean.is_finite() && std.is_finite() && std >= 0.0) {
                    return Err(Error::invalid(
                        name,
                        format!("mean {mean} and std {std} must be finite, std >= 0"),
                    ));
                }
            }
        }
        let n = self
            .shape
            .checked_numel()
            .ok_or_else(|| Error::invalid(name, format!("shape {} overflows usize", self.shape)))?;
        if n == 0 {
            return Err(Error::invalid(name, format!("empty shape {}", self.shape)));
        }
        let bytes = n
            .checked_mul(self.dtype.size())
            .ok_or_else(|| Error::invalid(name, format!("{n} elements overflow usize bytes")))?;
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.shape.clone(), self.dtype)],
            cost: Cost {
                flops: 40.0 * n as f64,
                bytes: bytes as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let name = self.name();
        let n = self.shape.numel();
        let (dist, seed, offset) = (self.dist, self.seed, self.offset);
        let out = match cx.backend() {
            BackendCx::Cpu => {
                float_dispatch!(self.dtype, name, |T| Ok(fill_cpu::<T>(
                    dist, seed, offset, n
                )))
            }
            BackendCx::Cuda(scx) => cuda::fill(scx, self.dtype, name, dist, seed, offset, n),
        }?;
        cx.set_output(0, out)
    }
}

fn fill_cpu<T: Float + Element>(dist: Dist, seed: u64, offset: u64, n: usize) -> Buffer {
    let mut y = cpu_out::<T>(n);
    cpu::fill(dist, seed, offset, &mut y);
    Buffer::from_vec(y)
}
