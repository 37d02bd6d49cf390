//! CPU cross-entropy (the reference of `kernels/cuda/loss.cu`): per row, the log-sum-exp
//! with the max subtracted (exponentials in f32, sums in f64), the loss `lse - x[label]`,
//! and the gradient `(softmax - one_hot) · scale / count`.

use rayon::prelude::*;

use crate::cpu_util::{Float, PAR_CHUNK, PAR_MIN_LEN};

/// A label element: u32 or i32.
pub trait Label: Copy + Send + Sync + 'static {
    /// The label as a signed 64-bit integer.
    fn to_i64(self) -> i64;
}

impl Label for u32 {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
}

impl Label for i32 {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
}

/// How the labels of a batch sort: counted rows, and the first out-of-range label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabelCheck {
    /// Rows whose label is not the ignore index.
    pub counted: usize,
    /// `(row, label)` of the first label that is neither ignored nor in `0..cols`.
    pub first_bad: Option<(usize, i64)>,
}

/// Classifies `labels` against `cols` classes and the optional ignore index.
pub fn check_labels<L: Label>(labels: &[L], cols: usize, ignore: Option<i64>) -> LabelCheck {
    let mut counted = 0;
    let mut first_bad = None;
    for (r, l) in labels.iter().enumerate() {
        let l = l.to_i64();
        if Some(l) == ignore {
            continue;
        }
        counted += 1;
        if first_bad.is_none() && (l < 0 || l >= cols as i64) {
            first_bad = Some((r, l));
        }
    }
    LabelCheck { counted, first_bad }
}

/// The log-sum-exp of one row (f32 exponentials, f64 sum); NaN if the row holds NaN,
/// `-inf` if it is all `-inf`.
pub fn row_lse<T: Float>(x: &[T]) -> f64 {
    let m = x.iter().fold(f32::NEG_INFINITY, |m, v| {
        let v = v.to_f32();
        if v.is_nan() || v > m {
            v
        } else {
            m
        }
    });
    if m.is_nan() {
        return f64::NAN;
    }
    if m == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let s: f64 = x.iter().map(|v| (v.to_f32() - m).exp() as f64).sum();
    m as f64 + s.ln()
}

/// Forward over `[rows, cols]` logits with valid labels (see [`check_labels`]): writes
/// each row's log-sum-exp into `lse` and returns the mean loss over the counted rows (NaN
/// when no row counts).
pub fn forward<T: Float, L: Label>(
    x: &[T],
    labels: &[L],
    cols: usize,
    ignore: Option<i64>,
    lse: &mut [f32],
) -> f64 {
    let rows = labels.len();
    debug_assert_eq!(x.len(), rows * cols);
    let row_loss = |(r, (xr, out)): (usize, (&[T], &mut f32))| -> (f64, usize) {
        let l = row_lse(xr);
        *out = l as f32;
        let label = labels[r].to_i64();
        if Some(label) == ignore {
            (0.0, 0)
        } else {
            (l - xr[label as usize].to_f64(), 1)
        }
    };
    let (sum, count) = if x.len() < PAR_MIN_LEN {
        x.chunks(cols)
            .zip(lse.iter_mut())
            .enumerate()
            .map(row_loss)
            .fold((0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    } else {
        // Fixed row groups combined in order: the result does not depend on scheduling.
        let group = (PAR_CHUNK / cols).max(1);
        let parts: Vec<(f64, usize)> = x
            .par_chunks(group * cols)
            .zip(lse.par_chunks_mut(group))
            .enumerate()
            .map(|(g, (xg, lg))| {
                xg.chunks(cols)
                    .zip(lg.iter_mut())
                    .enumerate()
                    .map(|(i, p)| row_loss((g * group + i, p)))
                    .fold((0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
            })
            .collect();
        parts
            .into_iter()
            .fold((0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    sum / count as f64
}

/// Backward: `dx[r, c] = (exp(x[r, c] - lse[r]) - [c == label[r]]) · scale / count` for
/// counted rows, 0 for ignored rows. Labels must be valid.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Float, L: Label>(
    x: &[T],
    labels: &[L],
    lse: &[f32],
    cols: usize,
    ignore: Option<i64>,
    scale: f32,
    count: usize,
    dx: &mut [T],
) {
    let g = scale / count as f32;
    let row = |r: usize, xr: &[T], dr: &mut [T]| {
        let label = labels[r].to_i64();
        if Some(label) == ignore {
            dr.iter_mut().for_each(|o| *o = T::from_f32(0.0));
            return;
        }
        let l = lse[r];
        for (c, (o, v)) in dr.iter_mut().zip(xr).enumerate() {
            let p = (v.to_f32() - l).exp();
            let hot = if c as i64 == label { 1.0 } else { 0.0 };
            *o = T::from_f32((p - hot) * g);
        }
    };
    if x.len() < PAR_MIN_LEN {
        for (r, (xr, dr)) in x.chunks(cols).zip(dx.chunks_mut(cols)).enumerate() {
            row(r, xr, dr);
        }
    } else {
        dx.par_chunks_mut(cols)
            .zip(x.par_chunks(cols))
            .enumerate()
            .with_min_len((PAR_CHUNK / cols).max(1))
            .for_each(|(r, (dr, xr))| row(r, xr, dr));
    }
}
