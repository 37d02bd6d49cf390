//! Optimizers as fused multi-tensor ops: [`sgd`] and [`adamw`] update a whole list of
//! parameters (with their gradients and states) in one op, with gradient clipping by
//! the global norm ([`grad_norm`], read on the device) and dynamic loss scaling (an
//! on-device overflow flag), without a host round trip.
//!
//! - `cpu.rs`: the formulas in f32 (the reference) and the CPU step.
//! - `cuda.rs`: the launches of `kernels/cuda/optim.cu`: one launch per parameter tensor
//!   (all inside the one op, on one stream), plus one overflow check per gradient and
//!   two one-thread launches for the loss-scaling state when it is used.
//! - `step.rs`: the [`Step`] op (validation and dispatch); `norm.rs`: [`GradNorm`].
//!
//! # In place
//!
//! Parameters, states and the loss-scaling state are taken by value and *donated*: when
//! the handle given is the last one to its memory, the op writes the new values there
//! (no allocation, counted by the `donations()` test hook); otherwise it allocates. The
//! updated tensors are the op's outputs, in the order [`StepLayout`] describes.
//!
//! # Mixed precision
//!
//! Parameters and states share one float dtype (f32 for master weights); gradients may
//! be any float dtype (e.g. bf16 gradients of an f32 master). [`Step::with_copy`] adds
//! an f16 or bf16 copy of each updated parameter, written by the same kernel.
//!
//! # Loss scaling
//!
//! The state is an f32 tensor `[scale, good_steps, skipped_steps, overflow]` (start
//! from [`loss_scale_state`]). The gradients given are those of `scale * loss`. The step
//! first clears `overflow` and sets it when some gradient is NaN or infinite; then the
//! update uses `g / scale` (and is a no-op when `overflow` is set); then the state is
//! advanced: on overflow `scale /= 2` and the step counts as skipped (AdamW's bias
//! correction uses `t - skipped_steps`), otherwise after `growth_interval` good steps in a
//! row `scale *= 2`.

pub mod cpu;
mod cuda;
mod norm;
mod step;

use rtx_runtime::{DType, Tensor};

pub use cpu::{Hyper, Rule};
pub use norm::{grad_norm, GradNorm};
pub use step::{Step, StepLayout, StepOutputs};

/// SGD's hyperparameters (as `torch.optim.SGD` with dampening 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// Learning rate (>= 0).
    pub lr: f32,
    /// Momentum (>= 0); 0 keeps no buffer.
    pub momentum: f32,
    /// Nesterov momentum (needs momentum > 0).
    pub nesterov: bool,
    /// L2 weight decay added to the gradient (>= 0).
    pub weight_decay: f32,
}

/// AdamW's hyperparameters (Loshchilov & Hutter, "Decoupled weight decay
/// regularization", ICLR 2019; as `torch.optim.AdamW`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate (>= 0).
    pub lr: f32,
    /// First-moment decay, in [0, 1).
    pub beta1: f32,
    /// Second-moment decay, in [0, 1).
    pub beta2: f32,
    /// Denominator epsilon (> 0).
    pub eps: f32,
    /// Decoupled weight decay (>= 0): `p *= 1 - lr * weight_decay` each step.
    pub weight_decay: f32,
}

impl Default for AdamW {
    /// PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2.
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

/// The initial loss-scaling state for `scale` (upload it as an f32 tensor of shape `[4]`).
pub fn loss_scale_state(scale: f32) -> [f32; 4] {
    [scale, 0.0, 0.0, 0.0]
}

/// One SGD step over `params` with their `grads` and momentum buffers (`momentum` is
/// empty when `cfg.momentum == 0`; start the buffers at zero):
/// `g += wd p; m = mu m + g; p -= lr (nesterov ? g + mu m : m)`.
///
/// Outputs: the new parameters, then the new momentum buffers (see [`StepLayout`]).
///
/// # Errors (at submit)
///
/// [`rtx_runtime::Error::InvalidOp`] for bad hyperparameters or list lengths,
/// [`rtx_runtime::Error::ShapeMismatch`] / [`rtx_runtime::Error::DTypeMismatch`] when a
/// gradient or state does not match its parameter.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// use rtx_ops::optim::{sgd, Sgd};
/// let rt = Runtime::cpu(1);
/// let p = rt.upload(&[1.0f32, 2.0], [2])?;
/// let g = rt.upload(&[0.5f32, -1.0], [2])?;
/// let cfg = Sgd { lr: 0.1, momentum: 0.0, nesterov: false, weight_decay: 0.0 };
/// let out = rt.submit(sgd(cfg, vec![p], &[g], vec![]))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&out[0])?.wait()?, vec![0.95, 2.1]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sgd(cfg: Sgd, params: Vec<Tensor>, grads: &[Tensor], momentum: Vec<Tensor>) -> Step {
    let h = Hyper {
        lr: cfg.lr,
        wd: cfg.weight_decay,
        momentum: cfg.momentum,
        nesterov: cfg.nesterov as i32,
        ..Hyper::default()
    };
    Step::new(Rule::Sgd, h, params, grads, momentum, Vec::new())
}

/// One AdamW step `t` (1 for the first) over `params` with their `grads` and moments
/// `m`, `v` (start them at zero):
/// `p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`.
///
/// Outputs: the new parameters, then the new `m`, then the new `v` (see
/// [`StepLayout`]).
///
/// # Errors (at submit)
///
/// As [`sgd`]; also `t == 0` or `t > 2^24` (t is carried as f32).
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// use rtx_ops::optim::{adamw, AdamW};
/// let rt = Runtime::cpu(1);
/// let p = rt.upload(&[1.0f32, 2.0], [2])?;
/// let g = rt.upload(&[0.5f32, -1.0], [2])?;
/// let (m, v) = (rt.upload(&[0.0f32; 2], [2])?, rt.upload(&[0.0f32; 2], [2])?);
/// let cfg = AdamW { weight_decay: 0.0, lr: 0.1, ..AdamW::default() };
/// let out = rt.submit(adamw(cfg, 1, vec![p], &[g], vec![m], vec![v]))?.wait()?;
/// let p = rt.to_vec::<f32>(&out[0])?.wait()?; // the first step moves each by ~lr
/// assert!((p[0] - 0.9).abs() < 1e-5 && (p[1] - 2.1).abs() < 1e-5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn adamw(
    cfg: AdamW,
    t: u64,
    params: Vec<Tensor>,
    grads: &[Tensor],
    m: Vec<Tensor>,
    v: Vec<Tensor>,
) -> Step {
    let h = Hyper {
        lr: cfg.lr,
        beta1: cfg.beta1,
        beta2: cfg.beta2,
        eps: cfg.eps,
        wd: cfg.weight_decay,
        // Checked at submit: 1 <= t <= 2^24, exact in f32.
        t: t.min(1 << 25) as f32,
        ..Hyper::default()
    };
    Step::new(Rule::AdamW, h, params, grads, m, v)
}

/// Which low-precision copy a step writes.
pub(crate) fn copy_kind(dtype: Option<DType>) -> i32 {
    match dtype {
        Some(DType::F16) => 1,
        Some(DType::BF16) => 2,
        _ => 0,
    }
}
