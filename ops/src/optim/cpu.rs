//! The optimizers' formulas in f32 (the reference that `kernels/cuda/optim.cu` mirrors)
//! and the CPU step over one tensor.

use crate::cpu_util::Float;

/// The hyperparameters as one step sees them; mirrors `struct Hyper` of `optim.cu`
/// (`repr(C)`, 40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Hyper {
    /// Learning rate.
    pub lr: f32,
    /// AdamW's beta1.
    pub beta1: f32,
    /// AdamW's beta2.
    pub beta2: f32,
    /// AdamW's epsilon.
    pub eps: f32,
    /// Weight decay (decoupled for AdamW, L2 for SGD).
    pub wd: f32,
    /// SGD's momentum (0: no buffer).
    pub momentum: f32,
    /// AdamW's step count (1 for the first step), as f32.
    pub t: f32,
    /// Clipping threshold of the global gradient norm (used when a norm is given).
    pub max_norm: f32,
    /// SGD: Nesterov momentum when non-zero.
    pub nesterov: i32,
    /// 0: no low-precision copy, 1: f16, 2: bf16.
    pub copy_kind: i32,
}

/// The on-device controls a step reads: the loss-scaling state `[scale, good steps,
/// skipped steps, overflow]` and the global gradient norm.
#[derive(Clone, Copy, Debug, Default)]
pub struct Controls {
    /// The loss-scaling state, if any (after the overflow check of this step).
    pub scaler: Option<[f32; 4]>,
    /// The global norm of the (scaled) gradients, if clipping.
    pub norm: Option<f32>,
}

/// The gradient multiplier, whether the step is skipped, and the number of skipped
/// steps (see `optim.cu`).
pub fn grad_mult(h: &Hyper, c: &Controls) -> (f32, bool, f32) {
    let (mut mult, mut skip, mut skipped) = (1.0f32, false, 0.0f32);
    if let Some(s) = c.scaler {
        mult = 1.0 / s[0];
        skip = s[3] != 0.0;
        skipped = s[2];
    }
    if let Some(norm) = c.norm {
        let coef = h.max_norm / (norm * mult + 1e-6);
        mult *= coef.min(1.0);
    }
    (mult, skip, skipped)
}

/// Which update rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// AdamW; two states (m, v).
    AdamW,
    /// SGD; one state (the momentum buffer) when momentum is non-zero.
    Sgd,
}

/// One element's AdamW constants, from the hyperparameters and the skipped steps.
#[derive(Clone, Copy, Debug)]
struct AdamW {
    decay: f32,
    step: f32,
    bc2_sqrt: f32,
}

impl AdamW {
    fn new(h: &Hyper, skipped: f32) -> Self {
        let t = h.t - skipped;
        AdamW {
            decay: 1.0 - h.lr * h.wd,
            step: h.lr / (1.0 - h.beta1.powf(t)),
            bc2_sqrt: (1.0 - h.beta2.powf(t)).sqrt(),
        }
    }
    #[inline]
    fn apply(&self, h: &Hyper, p: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
        *p *= self.decay;
        *m = h.beta1 * *m + (1.0 - h.beta1) * g;
        *v = h.beta2 * *v + (1.0 - h.beta2) * (g * g);
        let den = v.sqrt() / self.bc2_sqrt + h.eps;
        *p -= self.step * (*m / den);
    }
}

#[inline]
fn sgd(h: &Hyper, p: &mut f32, g: f32, m: Option<&mut f32>) {
    let g = g + h.wd * *p;
    let d = match m {
        Some(m) => {
            *m = h.momentum * *m + g;
            if h.nesterov != 0 {
                g + h.momentum * *m
            } else {
                *m
            }
        }
        None => g,
    };
    *p -= h.lr * d;
}

/// The step on one tensor, in place: `p` the parameter, `g` its gradient, `m` and `v`
/// the states (`m` absent for SGD without momentum, `v` for SGD), `copy` the
/// low-precision copy to write (f32 values, rounded by the caller).
#[allow(clippy::too_many_arguments)]
pub fn step<P: Float, G: Float>(
    rule: Rule,
    h: &Hyper,
    c: &Controls,
    p: &mut [P],
    g: &[G],
    mut m: Option<&mut [P]>,
    mut v: Option<&mut [P]>,
    mut copy: Option<&mut [f32]>,
) {
    let (mult, skip, skipped) = grad_mult(h, c);
    let adam = AdamW::new(h, skipped);
    for i in 0..p.len() {
        let mut pi = p[i].to_f32();
        if !skip {
            let gi = g[i].to_f32() * mult;
            let mut mi = m.as_ref().map_or(0.0, |m| m[i].to_f32());
            match rule {
                Rule::AdamW => {
                    let (m, v) = (m.as_mut().expect("m"), v.as_mut().expect("v"));
                    let mut vi = v[i].to_f32();
                    adam.apply(h, &mut pi, gi, &mut mi, &mut vi);
                    m[i] = P::from_f32(mi);
                    v[i] = P::from_f32(vi);
                }
                Rule::Sgd => match m.as_mut() {
                    Some(m) => {
                        sgd(h, &mut pi, gi, Some(&mut mi));
                        m[i] = P::from_f32(mi);
                    }
                    None => sgd(h, &mut pi, gi, None),
                },
            }
            p[i] = P::from_f32(pi);
        }
        if let Some(cp) = copy.as_mut() {
            cp[i] = p[i].to_f32();
        }
    }
}

/// Whether some element of `g` is NaN or infinite.
pub fn nonfinite<G: Float>(g: &[G]) -> bool {
    g.iter().any(|v| !v.to_f32().is_finite())
}

/// The sum of squares of `x`, in f64.
pub fn sumsq<T: Float>(x: &[T]) -> f64 {
    x.iter().map(|v| v.to_f64() * v.to_f64()).sum()
}

/// The loss-scaling state after a step: on overflow the scale halves and the step
/// counts as skipped, otherwise the good-step count grows and at `growth_interval` the
/// scale doubles.
pub fn scaler_end(s: &mut [f32; 4], growth_interval: f32) {
    if s[3] != 0.0 {
        s[0] *= 0.5;
        s[1] = 0.0;
        s[2] += 1.0;
    } else {
        s[1] += 1.0;
        if s[1] >= growth_interval {
            s[0] *= 2.0;
            s[1] = 0.0;
        }
    }
}
