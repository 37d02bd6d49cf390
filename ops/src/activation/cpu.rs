//! CPU kernels of the activation family: the f32 formulas (shared with the CUDA kernels of
//! `kernels/cuda/activation.cu`, which use the same expressions) and the slice loops.
//!
//! Small tensors run serially; large ones are split into `PAR_CHUNK`-element rayon
//! tasks, as the element-wise family does.

use rayon::prelude::*;

use crate::cpu_util::{Float, PAR_CHUNK, PAR_MIN_LEN};

/// `sqrt(2 / π)`, the constant of the tanh form of GELU.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh form of GELU.
const GELU_C: f32 = 0.044_715;

/// A forward map `y = f(x)` of the activation family.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MapOp {
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// GELU, tanh form: `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))` — the formula of
    /// [`crate::Activation::Gelu`] (PyTorch's `gelu(approximate="tanh")`).
    Gelu,
    /// `x · sigmoid(x)` (SiLU, swish).
    Silu,
    /// `x + s`.
    AddScalar(f32),
    /// `x · s`.
    MulScalar(f32),
}

/// A backward map `dx = dy · f'(v)` of the activation family, where `v` is the forward
/// input `x` or, for [`GradOp::Tanh`] and [`GradOp::Sigmoid`], the forward output `y`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GradOp {
    /// `dy` where `x > 0`, else 0 (as PyTorch's `threshold_backward`); `v` is `x`.
    Relu,
    /// The derivative of the tanh form of GELU; `v` is `x`.
    Gelu,
    /// `dy · s (1 + x (1 - s))`, `s = sigmoid(x)`; `v` is `x`.
    Silu,
    /// `dy · (1 - y²)`; `v` is the forward output `y = tanh(x)`.
    Tanh,
    /// `dy · y (1 - y)`; `v` is the forward output `y = sigmoid(x)`.
    Sigmoid,
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl MapOp {
    /// Applies the op to one f32 value.
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            MapOp::Tanh => x.tanh(),
            MapOp::Sigmoid => sigmoid(x),
            MapOp::Gelu => 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh()),
            MapOp::Silu => x * sigmoid(x),
            MapOp::AddScalar(s) => x + s,
            MapOp::MulScalar(s) => x * s,
        }
    }
}

impl GradOp {
    /// `dy · f'(v)` for one pair of f32 values.
    #[inline(always)]
    pub fn apply(self, dy: f32, v: f32) -> f32 {
        match self {
            GradOp::Relu => {
                if v > 0.0 {
                    dy
                } else {
                    0.0
                }
            }
            GradOp::Gelu => {
                let x2 = v * v;
                let t = (SQRT_2_OVER_PI * (v + GELU_C * x2 * v)).tanh();
                let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x2);
                dy * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du)
            }
            GradOp::Silu => {
                let s = sigmoid(v);
                dy * s * (1.0 + v * (1.0 - s))
            }
            GradOp::Tanh => dy * (1.0 - v * v),
            GradOp::Sigmoid => dy * v * (1.0 - v),
        }
    }
}

/// `y[i] = op(x[i])`; `x` and `y` have the same length.
pub fn map<T: Float>(op: MapOp, x: &[T], y: &mut [T]) {
    debug_assert_eq!(x.len(), y.len());
    let kernel = |x: &[T], y: &mut [T]| {
        for (o, v) in y.iter_mut().zip(x) {
            *o = T::from_f32(op.apply(v.to_f32()));
        }
    };
    if y.len() < PAR_MIN_LEN {
        kernel(x, y);
    } else {
        y.par_chunks_mut(PAR_CHUNK)
            .zip(x.par_chunks(PAR_CHUNK))
            .for_each(|(y, x)| kernel(x, y));
    }
}

/// `y[i] = op(y[i])` in place.
pub fn map_in_place<T: Float>(op: MapOp, y: &mut [T]) {
    let kernel = |y: &mut [T]| {
        for o in y.iter_mut() {
            *o = T::from_f32(op.apply(o.to_f32()));
        }
    };
    if y.len() < PAR_MIN_LEN {
        kernel(y);
    } else {
        y.par_chunks_mut(PAR_CHUNK).for_each(kernel);
    }
}

/// `dx[i] = op(dy[i], v[i])`; all three have the same length.
pub fn grad<T: Float>(op: GradOp, dy: &[T], v: &[T], dx: &mut [T]) {
    debug_assert!(dy.len() == dx.len() && v.len() == dx.len());
    let kernel = |dy: &[T], v: &[T], dx: &mut [T]| {
        for ((o, g), z) in dx.iter_mut().zip(dy).zip(v) {
            *o = T::from_f32(op.apply(g.to_f32(), z.to_f32()));
        }
    };
    if dx.len() < PAR_MIN_LEN {
        kernel(dy, v, dx);
    } else {
        dx.par_chunks_mut(PAR_CHUNK)
            .zip(dy.par_chunks(PAR_CHUNK).zip(v.par_chunks(PAR_CHUNK)))
            .for_each(|(dx, (dy, v))| kernel(dy, v, dx));
    }
}

/// `dx[i] = op(dx[i], v[i])` in place (`dx` holds `dy` on entry).
pub fn grad_in_place<T: Float>(op: GradOp, dx: &mut [T], v: &[T]) {
    debug_assert_eq!(v.len(), dx.len());
    let kernel = |dx: &mut [T], v: &[T]| {
        for (o, z) in dx.iter_mut().zip(v) {
            *o = T::from_f32(op.apply(o.to_f32(), z.to_f32()));
        }
    };
    if dx.len() < PAR_MIN_LEN {
        kernel(dx, v);
    } else {
        dx.par_chunks_mut(PAR_CHUNK)
            .zip(v.par_chunks(PAR_CHUNK))
            .for_each(|(dx, v)| kernel(dx, v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_the_gemm_epilogue() {
        for i in -400..400 {
            let x = i as f32 / 50.0;
            assert_eq!(
                MapOp::Gelu.apply(x),
                crate::Activation::Gelu.apply(x),
                "x={x}"
            );
        }
    }

    #[test]
    fn relu_backward_edges() {
        assert_eq!(GradOp::Relu.apply(3.0, 0.0), 0.0);
        assert_eq!(GradOp::Relu.apply(3.0, f32::NAN), 0.0);
        assert_eq!(GradOp::Relu.apply(3.0, 1e-30), 3.0);
        assert_eq!(GradOp::Relu.apply(3.0, -1.0), 0.0);
    }

    #[test]
    fn saturated_inputs_stay_finite() {
        for x in [-100.0f32, -30.0, 30.0, 100.0] {
            for op in [MapOp::Sigmoid, MapOp::Silu, MapOp::Gelu, MapOp::Tanh] {
                assert!(op.apply(x).is_finite(), "{op:?}({x})");
            }
            for op in [GradOp::Gelu, GradOp::Silu] {
                assert!(op.apply(1.0, x).is_finite(), "{op:?}'({x})");
            }
        }
    }
}
