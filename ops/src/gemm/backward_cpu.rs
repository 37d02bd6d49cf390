//! The CPU implementation (and reference) of `linear_train` and `linear_backward`:
//! operands widened to f32, products on the `gemm` crate in f32, the activation and its
//! derivative on the f32 values, one rounding to the storage type per output.

use rayon::prelude::*;

use super::cpu;
use super::Activation;
use crate::cpu_util::{store_f32, to_f32_cow, Float, PAR_MIN_LEN};
use crate::kernels::cpu_out;

/// The derivative of `act` at `z` (the pre-activation). ReLU: 1 where `z > 0`, else 0
/// (0 at the kink, as PyTorch). GELU: the derivative of the tanh form that
/// [`Activation::apply`] computes.
#[inline]
pub fn activation_grad(act: Activation, z: f32) -> f32 {
    match act {
        Activation::None => 1.0,
        Activation::Relu => {
            if z > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::Gelu => {
            const K: f32 = 0.797_884_6; // sqrt(2/pi)
            const A: f32 = 0.044_715;
            let z2 = z * z;
            let t = (K * (z + A * z2 * z)).tanh();
            0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * K * (1.0 + 3.0 * A * z2)
        }
    }
}

/// The sizes of one linear layer: `rows` (the flattened leading dims of `x`),
/// `inp` (in_features) and `out` (out_features).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LinearSizes {
    pub rows: usize,
    pub inp: usize,
    pub out: usize,
}

/// `pre = x · wᵀ + bias` in f32 (`[rows, out]`).
fn pre_f32<T: Float>(s: LinearSizes, x: &[T], w: &[T], bias: Option<&[T]>) -> Vec<f32> {
    let (x, w) = (to_f32_cow(x), to_f32_cow(w));
    let mut pre = vec![0f32; s.rows * s.out];
    cpu::matmul(&x, &w, &mut pre, 1, s.rows, s.out, s.inp, false, true, 0, 0);
    if let Some(b) = bias {
        let b = to_f32_cow(b);
        cpu::linear_epilogue(&mut pre, Some(&b), s.out, Activation::None);
    }
    pre
}

/// Rounds an f32 buffer into a fresh (poisoned when testing) output of `T`.
fn store_out<T: Float>(v: &[f32]) -> Vec<T> {
    let mut out = cpu_out::<T>(v.len());
    store_f32(v, &mut out);
    out
}

/// `linear_train` on the CPU: `(y, pre)` with `y = act(pre)`, `pre = x · wᵀ + bias`;
/// `pre` only when `act` is not `None` (then `y` is the pre-activation itself).
pub(crate) fn linear_train<T: Float>(
    s: LinearSizes,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    act: Activation,
) -> (Vec<T>, Option<Vec<T>>) {
    let pre = pre_f32(s, x, w, bias);
    if act == Activation::None {
        return (store_out(&pre), None);
    }
    // y from the f32 pre-activation (as the fused epilogue computes it), not from its
    // rounding.
    let y32: Vec<f32> = pre.iter().map(|&v| act.apply(v)).collect();
    (store_out(&y32), Some(store_out(&pre)))
}

/// `g[i] *= act'(pre[i])` over a whole buffer.
fn mul_derivative<T: Float>(g: &mut [f32], pre: &[T], act: Activation) {
    if act == Activation::None {
        return;
    }
    let f = |(g, p): (&mut f32, &T)| *g *= activation_grad(act, p.to_f32());
    if g.len() < PAR_MIN_LEN {
        g.iter_mut().zip(pre).for_each(f);
    } else {
        g.par_iter_mut().zip(pre.par_iter()).for_each(f);
    }
}

/// What `linear_backward` computes on the CPU.
pub(crate) struct BackwardCpu<'a, T> {
    pub sizes: LinearSizes,
    /// `[rows, out]`: the gradient of the layer's output.
    pub dy: &'a [T],
    /// `[rows, in]`.
    pub x: &'a [T],
    /// `[out, in]`.
    pub w: &'a [T],
    /// `[rows, out]`, the saved pre-activation (`None` when `act` is `None`).
    pub pre: Option<&'a [T]>,
    pub act: Activation,
    /// The input's own activation and pre-activation (`[rows, in]`): `dx` becomes the
    /// gradient of that pre-activation.
    pub input_act: Option<(Activation, &'a [T])>,
    pub has_bias: bool,
}

/// The gradients `(dx, dw, db)`.
pub(crate) type Grads<T> = (Vec<T>, Vec<T>, Option<Vec<T>>);

impl<T: Float> BackwardCpu<'_, T> {
    /// `dz = dy ⊙ act'(pre)`, `dx = dz · w` (`⊙ act_in'(pre_in)`), `dw = dzᵀ · x`,
    /// `db = Σ_rows dz`; all in f32 (db accumulated in f64).
    pub fn run(&self) -> Grads<T> {
        let LinearSizes { rows, inp, out } = self.sizes;
        let mut dz = to_f32_cow(self.dy).into_owned();
        if let Some(pre) = self.pre {
            mul_derivative(&mut dz, pre, self.act);
        }
        let (x, w) = (to_f32_cow(self.x), to_f32_cow(self.w));
        let mut dx = vec![0f32; rows * inp];
        cpu::matmul(&dz, &w, &mut dx, 1, rows, inp, out, false, false, 0, 0);
        if let Some((act_in, pre_in)) = self.input_act {
            mul_derivative(&mut dx, pre_in, act_in);
        }
        let mut dw = vec![0f32; out * inp];
        cpu::matmul(&dz, &x, &mut dw, 1, out, inp, rows, true, false, 0, 0);
        let db = self.has_bias.then(|| {
            let mut acc = vec![0f64; out];
            for row in dz.chunks(out) {
                for (a, v) in acc.iter_mut().zip(row) {
                    *a += *v as f64;
                }
            }
            let mut db = cpu_out::<T>(out);
            for (d, a) in db.iter_mut().zip(acc) {
                *d = T::from_f64(a);
            }
            db
        });
        (store_out(&dx), store_out(&dw), db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GELU derivative matches a central difference of `Activation::apply` in f64
    /// terms (the f32 function's own rounding bounds the agreement).
    #[test]
    fn gelu_derivative_matches_a_central_difference() {
        let gelu = |x: f64| {
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh();
            0.5 * x * (1.0 + t)
        };
        for i in -40..=40 {
            let z = i as f64 * 0.137;
            let h = 1e-5;
            let fd = (gelu(z + h) - gelu(z - h)) / (2.0 * h);
            let got = activation_grad(Activation::Gelu, z as f32) as f64;
            assert!((got - fd).abs() < 1e-5, "z {z}: {got} vs {fd}");
        }
        assert_eq!(activation_grad(Activation::Relu, 0.5), 1.0);
        assert_eq!(activation_grad(Activation::Relu, -0.5), 0.0);
        assert_eq!(activation_grad(Activation::Relu, 0.0), 0.0);
    }
}
