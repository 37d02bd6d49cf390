//! f64 references shared by `linear_backward.rs`: the activations and their
//! derivatives, `x·wᵀ + b`, a stack of layers, its loss `Σ g ⊙ y` and the central
//! finite differences of that loss.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rtx_ops::gemm::Activation;
use rtx_runtime::Element;

use crate::common::rand_vec;

pub const ACTS: [Activation; 3] = [Activation::None, Activation::Relu, Activation::Gelu];

pub fn act64(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::Gelu => {
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh();
            0.5 * x * (1.0 + t)
        }
    }
}

pub fn dact64(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => 1.0,
        Activation::Relu => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::Gelu => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let t = (k * (x + 0.044715 * x.powi(3))).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)
        }
    }
}

/// The scale of [`dact64`]'s rounding error in f32: the sum of the absolute values of
/// its terms expanded, `0.5 + 0.5 t + c - c t²` for GELU (t = tanh(u), c = x u'(x) / 2),
/// the bound of an f32 evaluation's error in units of its epsilon. Where the terms cancel
/// (|x| large: 1 + t and 1 - t² vanish) the derivative is small but its f32 error is not,
/// so a scale of |dact64| would ask for more than f32 can give.
pub fn dact_mag64(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Gelu => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let t = (k * (x + 0.044715 * x.powi(3))).tanh();
            let c = (0.5 * x * k * (1.0 + 3.0 * 0.044715 * x * x)).abs();
            0.5 + 0.5 * t.abs() + c + c * t * t
        }
        other => dact64(other, x).abs(),
    }
}

/// `x · wᵀ + b` in f64: x `[rows, inp]`, w `[out, inp]`, b `[out]`.
pub fn pre64(
    x: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
    rows: usize,
    inp: usize,
    out: usize,
) -> Vec<f64> {
    let mut y = vec![0f64; rows * out];
    for r in 0..rows {
        for o in 0..out {
            let mut s = b.map_or(0.0, |b| b[o]);
            for i in 0..inp {
                s += x[r * inp + i] * w[o * inp + i];
            }
            y[r * out + o] = s;
        }
    }
    y
}

// ---- gradients against finite differences (CPU) ----------------------------------------

/// One layer's inputs in f64 (the values of the rounded `T` inputs).
pub struct Layer {
    pub w: Vec<f64>,
    pub b: Option<Vec<f64>>,
    pub act: Activation,
    pub inp: usize,
    pub out: usize,
}

impl Layer {
    pub fn forward(&self, x: &[f64], rows: usize) -> (Vec<f64>, Vec<f64>) {
        let pre = pre64(x, &self.w, self.b.as_deref(), rows, self.inp, self.out);
        let y = pre.iter().map(|&v| act64(self.act, v)).collect();
        (pre, y)
    }
}

/// `Σ g ⊙ (layers applied to x)` in f64.
pub fn loss(layers: &[Layer], x: &[f64], g: &[f64], rows: usize) -> f64 {
    let mut h = x.to_vec();
    for l in layers {
        h = l.forward(&h, rows).1;
    }
    h.iter().zip(g).map(|(a, b)| a * b).sum()
}

/// Central differences of `loss` with respect to every element of the parameter
/// `which` picks (0: x; then per layer w, b).
pub fn fd(
    layers: &mut [Layer],
    x: &mut [f64],
    g: &[f64],
    rows: usize,
    which: (usize, usize),
) -> Vec<f64> {
    let h = 1e-4;
    let len = match which {
        (0, _) => x.len(),
        (1, l) => layers[l].w.len(),
        (_, l) => layers[l].b.as_ref().unwrap().len(),
    };
    (0..len)
        .map(|i| {
            let at = |d: f64, layers: &mut [Layer], x: &mut [f64]| match which {
                (0, _) => x[i] += d,
                (1, l) => layers[l].w[i] += d,
                (_, l) => layers[l].b.as_mut().unwrap()[i] += d,
            };
            at(h, layers, x);
            let lp = loss(layers, x, g, rows);
            at(-2.0 * h, layers, x);
            let lm = loss(layers, x, g, rows);
            at(h, layers, x);
            (lp - lm) / (2.0 * h)
        })
        .collect()
}

/// Random `T` values in f64, away from ReLU's kink: regenerated until every
/// pre-activation of a ReLU layer is at least 0.05 from 0 (so that ±h never crosses it).
pub fn rand_t<T: Element>(r: &mut StdRng, n: usize) -> Vec<T> {
    rand_vec(r, n, -1.0, 1.0)
}

pub fn kinks_clear(layers: &[Layer], x: &[f64], rows: usize) -> bool {
    let mut h = x.to_vec();
    for l in layers {
        let (pre, y) = l.forward(&h, rows);
        if l.act == Activation::Relu && pre.iter().any(|v| v.abs() < 0.05) {
            return false;
        }
        h = y;
    }
    true
}

pub fn to_t<T: Element>(v: &[f64]) -> Vec<T> {
    v.iter().map(|&x| T::from_f64(x)).collect()
}
