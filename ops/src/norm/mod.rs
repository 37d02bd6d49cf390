//! Layer normalization over the last dim: [`layer_norm`] (saving the row mean and rstd)
//! and [`layer_norm_backward`] (dx, dgamma, dbeta).
//!
//! - `cpu.rs`: the CPU reference (statistics and parameter sums in f64).
//! - `cuda.rs`: the launches of `kernels/cuda/norm.cu`.
//! - here: the public constructors, validation and backend dispatch.
//!
//! `x` is `[.., D]` f32, f16 or bf16 (computed in f32); `gamma` and `beta` are `[D]` of
//! the same dtype. The variance is the biased one (as PyTorch); `rstd = 1 / sqrt(var +
//! eps)`. The parameter gradients are reduced over rows deterministically (per-block
//! partials, then a second pass in a fixed order; no float atomics).

pub mod cpu;
mod cuda;

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Tensor,
    TensorSpec,
};

use crate::cpu_util::Float;
use crate::kernels::{check_float, cpu_out, float_dispatch};

/// Layer norm forward, built by [`layer_norm`]; yields `(y, mean [rows] f32, rstd [rows]
/// f32)`.
pub struct LayerNorm {
    x: Tensor,
    gamma: Tensor,
    beta: Tensor,
    eps: f32,
}

/// Layer norm backward, built by [`layer_norm_backward`]; yields `(dx, dgamma, dbeta)`.
pub struct LayerNormBackward {
    dy: Tensor,
    x: Tensor,
    mean: Tensor,
    rstd: Tensor,
    gamma: Tensor,
}

/// `y = (x - mean) · rstd · gamma + beta` over the last dim of `x`, with each row's mean
/// and `rstd = 1 / sqrt(var + eps)` (f32, `[rows]` where rows is the product of the
/// leading dims), which [`layer_norm_backward`] takes.
///
/// # Errors (at submit)
///
/// [`Error::InvalidDim`] for a scalar `x`, [`Error::ShapeMismatch`] unless `gamma` and
/// `beta` are `[D]`, [`Error::DTypeMismatch`] for a non-float `x` or parameters of
/// another dtype, [`Error::InvalidOp`] for a negative or non-finite `eps`.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[1.0f32, 3.0, -1.0, 1.0], [2, 2])?;
/// let g = rt.upload(&[1.0f32, 1.0], [2])?;
/// let b = rt.upload(&[0.0f32, 0.0], [2])?;
/// let (y, mean, _rstd) = rt.submit(rtx_ops::layer_norm(&x, &g, &b, 0.0))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![-1.0, 1.0, -1.0, 1.0]);
/// assert_eq!(rt.to_vec::<f32>(&mean)?.wait()?, vec![2.0, 0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> LayerNorm {
    LayerNorm {
        x: x.clone(),
        gamma: gamma.clone(),
        beta: beta.clone(),
        eps,
    }
}

/// The gradients of [`layer_norm`]: `dx` (shape and dtype of `x`), `dgamma` and `dbeta`
/// (`[D]`, the dtype of `gamma`), from the upstream `dy` and the forward's saved `mean`
/// and `rstd`.
///
/// # Errors (at submit)
///
/// As [`layer_norm`], and [`Error::ShapeMismatch`] / [`Error::DTypeMismatch`] unless `dy`
/// matches `x` and `mean`, `rstd` are `[rows]` f32.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[1.0f32, 3.0], [1, 2])?;
/// let g = rt.upload(&[1.0f32, 1.0], [2])?;
/// let b = rt.upload(&[0.0f32, 0.0], [2])?;
/// let (_y, mean, rstd) = rt.submit(rtx_ops::layer_norm(&x, &g, &b, 1e-5))?.wait()?;
/// let dy = rt.upload(&[1.0f32, 2.0], [1, 2])?;
/// let (dx, dg, db) = rt.submit(rtx_ops::layer_norm_backward(&dy, &x, &mean, &rstd, &g))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&db)?.wait()?, vec![1.0, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn layer_norm_backward(
    dy: &Tensor,
    x: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    gamma: &Tensor,
) -> LayerNormBackward {
    LayerNormBackward {
        dy: dy.clone(),
        x: x.clone(),
        mean: mean.clone(),
        rstd: rstd.clone(),
        gamma: gamma.clone(),
    }
}

impl LayerNorm {
    /// Gives the inputs back, `(x, gamma, beta)`.
    pub fn into_inputs(self) -> (Tensor, Tensor, Tensor) {
        (self.x, self.gamma, self.beta)
    }
}

impl LayerNormBackward {
    /// Gives the inputs back, `(dy, x, mean, rstd, gamma)`.
    pub fn into_inputs(self) -> (Tensor, Tensor, Tensor, Tensor, Tensor) {
        (self.dy, self.x, self.mean, self.rstd, self.gamma)
    }
}

/// Checks `x [.., D]` and a `[D]` parameter of x's dtype; returns `(rows, D)`.
fn check_x(name: &str, x: &Tensor, params: &[&Tensor]) -> Result<(usize, usize)> {
    let Some(&d) = x.dims().last() else {
        return Err(Error::invalid_dim(name, "a scalar has no last dim"));
    };
    check_float(name, x.dtype())?;
    for p in params {
        if p.dtype() != x.dtype() {
            return Err(Error::dtype(name, x.dtype(), p.dtype()));
        }
        if p.dims() != [d] {
            return Err(Error::shape(
                name,
                x.shape(),
                p.shape(),
                "gamma and beta must be [D], D the last dim of x",
            ));
        }
    }
    let n = x.numel();
    if n == 0 {
        return Err(Error::invalid(name, format!("empty input {}", x.shape())));
    }
    Ok((n / d, d))
}

const FWD: &str = "layer_norm";
const BWD: &str = "layer_norm_backward";

impl Op for LayerNorm {
    type Output = (Tensor, Tensor, Tensor);
    fn name(&self) -> &'static str {
        FWD
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x, &self.gamma, &self.beta]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let (rows, d) = check_x(FWD, &self.x, &[&self.gamma, &self.beta])?;
        if !(self.eps >= 0.0 && self.eps.is_finite()) {
            return Err(Error::invalid(
                FWD,
                format!("eps {} must be finite and >= 0", self.eps),
            ));
        }
        let n = rows * d;
        Ok(Plan {
            outputs: vec![
                TensorSpec::new(self.x.shape().clone(), self.x.dtype()),
                TensorSpec::new([rows], DType::F32),
                TensorSpec::new([rows], DType::F32),
            ],
            cost: Cost {
                flops: 8.0 * n as f64,
                bytes: (2 * n * self.x.dtype().size() + 8 * rows) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (dtype, eps) = (self.x.dtype(), self.eps);
        let d = *self.x.dims().last().expect("rank checked at submit");
        let rows = self.x.numel() / d;
        let x = cx.input(&self.x)?;
        let g = cx.input(&self.gamma)?;
        let b = cx.input(&self.beta)?;
        let [y, mean, rstd] = match cx.backend() {
            BackendCx::Cpu => float_dispatch!(dtype, FWD, |T| forward_cpu::<T>(&x, &g, &b, d, eps)),
            BackendCx::Cuda(scx) => cuda::forward(scx, dtype, &x, &g, &b, rows, d, eps),
        }?;
        cx.set_output(0, y)?;
        cx.set_output(1, mean)?;
        cx.set_output(2, rstd)
    }
}

fn forward_cpu<T: Float + Element>(
    x: &Buffer,
    g: &Buffer,
    b: &Buffer,
    d: usize,
    eps: f32,
) -> Result<[Buffer; 3]> {
    let x = x.cpu::<T>()?;
    let rows = x.len() / d;
    let mut y = cpu_out::<T>(x.len());
    let (mut mean, mut rstd) = (cpu_out::<f32>(rows), cpu_out::<f32>(rows));
    cpu::forward(
        x,
        g.cpu::<T>()?,
        b.cpu::<T>()?,
        d,
        eps,
        &mut y,
        &mut mean,
        &mut rstd,
    );
    Ok([
        Buffer::from_vec(y),
        Buffer::from_vec(mean),
        Buffer::from_vec(rstd),
    ])
}

impl Op for LayerNormBackward {
    type Output = (Tensor, Tensor, Tensor);
    fn name(&self) -> &'static str {
        BWD
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.dy, &self.x, &self.mean, &self.rstd, &self.gamma]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let (rows, d) = check_x(BWD, &self.x, &[&self.gamma])?;
        if self.dy.dtype() != self.x.dtype() {
            return Err(Error::dtype(BWD, self.x.dtype(), self.dy.dtype()));
        }
        if self.dy.dims() != self.x.dims() {
            return Err(Error::shape(
                BWD,
                self.x.shape(),
                self.dy.shape(),
                "dy must have x's shape",
            ));
        }
        for s in [&self.mean, &self.rstd] {
            if s.dtype() != DType::F32 {
                return Err(Error::dtype(BWD, DType::F32, s.dtype()));
            }
            if s.dims() != [rows] {
                return Err(Error::shape(
                    BWD,
                    self.x.shape(),
                    s.shape(),
                    "mean and rstd must be [rows], as the forward gives them",
                ));
            }
        }
        let n = rows * d;
        let spec = TensorSpec::new([d], self.gamma.dtype());
        Ok(Plan {
            outputs: vec![
                TensorSpec::new(self.x.shape().clone(), self.x.dtype()),
                spec.clone(),
                spec,
            ],
            cost: Cost {
                flops: 12.0 * n as f64,
                bytes: (5 * n * self.x.dtype().size() + 8 * rows) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let dtype = self.x.dtype();
        let d = *self.x.dims().last().expect("rank checked at submit");
        let rows = self.x.numel() / d;
        let dy = cx.input(&self.dy)?;
        let x = cx.input(&self.x)?;
        let mean = cx.input(&self.mean)?;
        let rstd = cx.input(&self.rstd)?;
        let g = cx.input(&self.gamma)?;
        let [dx, dg, db] = match cx.backend() {
            BackendCx::Cpu => float_dispatch!(dtype, BWD, |T| backward_cpu::<T>(
                &dy, &x, &mean, &rstd, &g, d
            )),
            BackendCx::Cuda(scx) => cuda::backward(scx, dtype, &dy, &x, &mean, &rstd, &g, rows, d),
        }?;
        cx.set_output(0, dx)?;
        cx.set_output(1, dg)?;
        cx.set_output(2, db)
    }
}

fn backward_cpu<T: Float + Element>(
    dy: &Buffer,
    x: &Buffer,
    mean: &Buffer,
    rstd: &Buffer,
    g: &Buffer,
    d: usize,
) -> Result<[Buffer; 3]> {
    let x = x.cpu::<T>()?;
    let mut dx = cpu_out::<T>(x.len());
    let (mut dg, mut db) = (cpu_out::<T>(d), cpu_out::<T>(d));
    cpu::backward(
        dy.cpu::<T>()?,
        x,
        mean.cpu::<f32>()?,
        rstd.cpu::<f32>()?,
        g.cpu::<T>()?,
        d,
        &mut dx,
        &mut dg,
        &mut db,
    );
    Ok([
        Buffer::from_vec(dx),
        Buffer::from_vec(dg),
        Buffer::from_vec(db),
    ])
}
