//! CPU softmax over the last dimension.

use rayon::prelude::*;

use crate::cpu_util::{Float, PAR_CHUNK, PAR_MIN_LEN};

/// `y[r, :] = softmax(x[r, :])` for a row-major `[rows, cols]` tensor.
///
/// Numerically stable: the row max is subtracted before `exp`, each exponential is
/// computed once (kept in f32) and the sum is accumulated in f64. A row that is
/// all `-inf` gives NaN, like PyTorch; a NaN in a row makes the whole row NaN.
pub fn softmax_last<T: Float>(x: &[T], rows: usize, cols: usize, y: &mut [T]) {
    debug_assert_eq!(x.len(), rows * cols);
    debug_assert_eq!(y.len(), rows * cols);
    if rows == 0 || cols == 0 {
        return;
    }
    let kernel = |x: &[T], y: &mut [T]| {
        let mut e = vec![0f32; cols];
        for (xr, yr) in x.chunks(cols).zip(y.chunks_mut(cols)) {
            softmax_row(xr, yr, &mut e);
        }
    };
    if x.len() < PAR_MIN_LEN {
        kernel(x, y);
    } else {
        let chunk = (PAR_CHUNK / cols).max(1) * cols;
        y.par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk))
            .for_each(|(y, x)| kernel(x, y));
    }
}

/// One row; `e` is an f32 scratch of the row's length.
fn softmax_row<T: Float>(x: &[T], y: &mut [T], e: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, v| {
        let v = v.to_f32();
        if v.is_nan() || v > m {
            v
        } else {
            m
        }
    });
    for (ei, v) in e.iter_mut().zip(x) {
        *ei = (v.to_f32() - max).exp();
    }
    // Eight f64 lanes: no serial dependency chain through one accumulator.
    let mut lanes = [0f64; 8];
    let mut chunks = e.chunks_exact(8);
    for c in &mut chunks {
        lanes.iter_mut().zip(c).for_each(|(l, v)| *l += *v as f64);
    }
    let tail: f64 = chunks.remainder().iter().map(|v| *v as f64).sum();
    let sum = lanes.iter().sum::<f64>() + tail;
    let inv = (1.0 / sum) as f32;
    for (o, ei) in y.iter_mut().zip(e.iter()) {
        *o = T::from_f32(ei * inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_util::testing::{f64s, poison, rand_vec, rel_err, rng, tol};
    use half::{bf16, f16};

    fn check<T: Float>(rows: usize, cols: usize, spread: f32) {
        let (seed, mut r) = rng();
        let x: Vec<T> = rand_vec::<T>(&mut r, rows * cols)
            .into_iter()
            .map(|v| T::from_f32(v.to_f32() * spread))
            .collect();
        let mut y = poison::<T>(rows * cols);
        softmax_last(&x, rows, cols, &mut y);
        let xf = f64s(&x);
        let mut want = Vec::with_capacity(rows * cols);
        for row in xf.chunks(cols) {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            want.extend(row.iter().map(|v| (v - m).exp() / s));
        }
        let e = rel_err(&y, &want);
        assert!(
            e < tol::<T>(),
            "{rows}x{cols} {:?} err {e} seed {seed}",
            T::KIND
        );
    }

    const CASES: &[(usize, usize, f32)] = &[
        (1, 1, 1.0),
        (1, 7, 1.0),
        (7, 1000, 10.0),
        (1000, 3, 1.0),
        (3, 100_003, 1.0),
        (257, 1024, 80.0),
    ];

    #[test]
    fn softmax_f32() {
        for &(r, c, s) in CASES {
            check::<f32>(r, c, s);
        }
    }
    #[test]
    fn softmax_f16() {
        for &(r, c, s) in CASES {
            check::<f16>(r, c, s);
        }
    }
    #[test]
    fn softmax_bf16() {
        for &(r, c, s) in CASES {
            check::<bf16>(r, c, s);
        }
    }

    #[test]
    fn large_and_infinite_inputs() {
        let x = [
            1000.0f32,
            1000.0,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            0.0,
        ];
        let mut y = [f32::NAN; 6];
        softmax_last(&x, 2, 3, &mut y);
        assert_eq!(&y[..3], &[0.5, 0.5, 0.0]);
        assert_eq!(&y[3..], &[0.0, 0.0, 1.0]);
        let mut y = [0f32; 2];
        softmax_last(&[f32::NEG_INFINITY; 2], 1, 2, &mut y);
        assert!(y[0].is_nan() && y[1].is_nan());
    }
}
