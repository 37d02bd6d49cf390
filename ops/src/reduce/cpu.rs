//! CPU reductions over all elements or over one dimension.
//!
//! A tensor reduced over `dim` is viewed as `[outer, r, inner]` ([`split_dims`]).
//! Values are accumulated in f64 (exact for max/min, accurate for sum, mean and
//! prod); max and min propagate NaN like PyTorch. Arg-reductions return `u32`
//! indices: ties give the smallest index, and a NaN counts as larger than
//! everything for argmax and smaller than everything for argmin (the first NaN wins).

use rayon::prelude::*;

pub use super::{ArgReduceOp, ReduceOp};
use crate::cpu_util::{Float, PAR_CHUNK, PAR_MIN_LEN};

/// Shape `[outer, r, inner]` of `shape` viewed around `dim`:
/// `(prod(shape[..dim]), shape[dim], prod(shape[dim+1..]))`.
pub fn split_dims(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    debug_assert!(dim < shape.len());
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// The shape after reducing `dim`: that dim set to 1 with `keepdim`, removed otherwise.
pub fn reduced_shape(shape: &[usize], dim: usize, keepdim: bool) -> Vec<usize> {
    debug_assert!(dim < shape.len());
    let mut out = shape.to_vec();
    if keepdim {
        out[dim] = 1;
    } else {
        out.remove(dim);
    }
    out
}

/// Expands `$body` once per op with `$init` (the identity) and `$f` (the f64
/// combine function) bound, so every op gets its own monomorphic loop.
macro_rules! with_combine {
    ($op:expr, |$init:ident, $f:ident| $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Mean => {
                let ($init, $f) = (0.0f64, |a: f64, b: f64| a + b);
                $body
            }
            ReduceOp::Prod => {
                let ($init, $f) = (1.0f64, |a: f64, b: f64| a * b);
                $body
            }
            ReduceOp::Max => {
                let ($init, $f) = (f64::NEG_INFINITY, nan_max64);
                $body
            }
            ReduceOp::Min => {
                let ($init, $f) = (f64::INFINITY, nan_min64);
                $body
            }
        }
    };
}

/// The result of `op` for `count` accumulated elements.
#[inline]
fn finish(op: ReduceOp, acc: f64, count: usize) -> f64 {
    if op == ReduceOp::Mean {
        acc / count as f64
    } else {
        acc
    }
}

#[inline(always)]
fn nan_max64(a: f64, b: f64) -> f64 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

#[inline(always)]
fn nan_min64(a: f64, b: f64) -> f64 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// Folds a contiguous slice with 8 independent accumulators (lets the compiler
/// vectorize and shortens the rounding chains of sums).
#[inline]
fn fold<T: Float>(x: &[T], init: f64, f: impl Fn(f64, f64) -> f64) -> f64 {
    let mut lanes = [init; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = f(*l, v.to_f64());
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(init, |a, v| f(a, v.to_f64()));
    let l = lanes;
    let pairs = [f(l[0], l[4]), f(l[1], l[5]), f(l[2], l[6]), f(l[3], l[7])];
    f(f(f(pairs[0], pairs[2]), f(pairs[1], pairs[3])), tail)
}

/// Reduces all of `x` to one value.
///
/// # Examples
/// ```
/// use half::bf16;
/// use rtx::ops::reduce::cpu::{reduce_all, ReduceOp};
/// let x: Vec<bf16> = [1.0f32, 2.0, 3.0, 6.0].iter().map(|&v| bf16::from_f32(v)).collect();
/// assert_eq!(reduce_all(ReduceOp::Mean, &x).to_f32(), 3.0);
/// ```
pub fn reduce_all<T: Float>(op: ReduceOp, x: &[T]) -> T {
    let total = with_combine!(op, |init, f| {
        if x.len() < PAR_MIN_LEN {
            fold(x, init, f)
        } else {
            // Fixed chunks combined in order: the result does not depend on scheduling.
            let parts: Vec<f64> = x.par_chunks(PAR_CHUNK).map(|c| fold(c, init, f)).collect();
            parts.into_iter().fold(init, f)
        }
    });
    T::from_f64(finish(op, total, x.len()))
}

/// Best (value, index) of a contiguous slice for `op`, `None` when empty. A NaN
/// returns at once: nothing later can beat it.
#[inline]
fn arg_best<T: Float>(op: ArgReduceOp, x: &[T]) -> Option<(f32, usize)> {
    let mut it = x.iter().map(|v| v.to_f32()).enumerate();
    let (mut bi, mut bv) = it.next()?;
    if bv.is_nan() {
        return Some((bv, bi));
    }
    for (i, v) in it {
        if v.is_nan() {
            return Some((v, i));
        }
        if better(op, v, bv) {
            (bv, bi) = (v, i);
        }
    }
    Some((bv, bi))
}

/// Whether `v` strictly beats `best` (ties keep the earlier index).
#[inline(always)]
fn better(op: ArgReduceOp, v: f32, best: f32) -> bool {
    match op {
        ArgReduceOp::ArgMax => v > best,
        ArgReduceOp::ArgMin => v < best,
    }
}

/// Index of the max/min element of `x` (0 for an empty `x`).
pub fn argreduce_all<T: Float>(op: ArgReduceOp, x: &[T]) -> u32 {
    debug_assert!(x.len() <= u32::MAX as usize + 1);
    let best = if x.len() < PAR_MIN_LEN {
        arg_best(op, x)
    } else {
        let parts: Vec<(f32, usize)> = x
            .par_chunks(PAR_CHUNK)
            .enumerate()
            .map(|(c, xs)| {
                let (v, i) = arg_best(op, xs).expect("chunks are non-empty");
                (v, c * PAR_CHUNK + i)
            })
            .collect();
        let mut best = parts[0];
        for &(v, i) in &parts[1..] {
            if best.0.is_nan() {
                break;
            }
            if v.is_nan() || better(op, v, best.0) {
                best = (v, i);
            }
        }
        Some(best)
    };
    best.map_or(0, |(_, i)| i as u32)
}

/// Columns of `inner` handled by one task when reducing a strided dim.
const COL_BLOCK: usize = 512;

/// Runs `task(o, col0, y_block)` over `y` viewed as `[outer, inner]`, split into
/// column blocks of at most [`COL_BLOCK`]; in parallel when `work` is large.
fn for_blocks<Y: Send>(
    y: &mut [Y],
    inner: usize,
    work: usize,
    task: impl Fn(usize, usize, &mut [Y]) + Sync,
) {
    if work < PAR_MIN_LEN {
        for (o, yo) in y.chunks_mut(inner).enumerate() {
            for (b, yb) in yo.chunks_mut(COL_BLOCK).enumerate() {
                task(o, b * COL_BLOCK, yb);
            }
        }
    } else {
        y.par_chunks_mut(inner).enumerate().for_each(|(o, yo)| {
            yo.par_chunks_mut(COL_BLOCK)
                .enumerate()
                .for_each(|(b, yb)| task(o, b * COL_BLOCK, yb));
        });
    }
}

/// Reduces `x`, viewed as `[outer, r, inner]`, over `r` into `y` (`outer * inner`).
pub fn reduce_dim<T: Float>(
    op: ReduceOp,
    x: &[T],
    outer: usize,
    r: usize,
    inner: usize,
    y: &mut [T],
) {
    debug_assert_eq!(x.len(), outer * r * inner);
    debug_assert_eq!(y.len(), outer * inner);
    if y.is_empty() {
        return;
    }
    with_combine!(op, |init, f| {
        if r == 0 {
            y.fill(T::from_f64(finish(op, init, 0)));
        } else if inner == 1 {
            let row =
                |(yo, xo): (&mut T, &[T])| *yo = T::from_f64(finish(op, fold(xo, init, f), r));
            if x.len() < PAR_MIN_LEN {
                y.iter_mut().zip(x.chunks(r)).for_each(row);
            } else {
                let min_rows = (PAR_CHUNK / r).max(1);
                y.par_iter_mut()
                    .zip(x.par_chunks(r))
                    .with_min_len(min_rows)
                    .for_each(row);
            }
        } else {
            for_blocks(y, inner, x.len(), |o, c0, yb| {
                let mut lanes = [init; COL_BLOCK];
                let lanes = &mut lanes[..yb.len()];
                let (base, w) = (o * r * inner + c0, yb.len());
                let row = |k: usize| &x[base + k * inner..][..w];
                // Four rows per sweep: four memory streams in flight, and a quarter
                // of the accumulator loads and stores. Same order as row by row.
                let mut k = 0;
                while k + 4 <= r {
                    let (x0, x1, x2, x3) = (row(k), row(k + 1), row(k + 2), row(k + 3));
                    for (j, l) in lanes.iter_mut().enumerate() {
                        let a = f(f(*l, x0[j].to_f64()), x1[j].to_f64());
                        *l = f(f(a, x2[j].to_f64()), x3[j].to_f64());
                    }
                    k += 4;
                }
                for k in k..r {
                    for (l, v) in lanes.iter_mut().zip(row(k)) {
                        *l = f(*l, v.to_f64());
                    }
                }
                for (out, l) in yb.iter_mut().zip(lanes.iter()) {
                    *out = T::from_f64(finish(op, *l, r));
                }
            });
        }
    })
}

/// Arg-reduces `x`, viewed as `[outer, r, inner]`, over `r` into `y`
/// (`outer * inner` indices in `0..r`; 0 when `r` is 0).
pub fn argreduce_dim<T: Float>(
    op: ArgReduceOp,
    x: &[T],
    outer: usize,
    r: usize,
    inner: usize,
    y: &mut [u32],
) {
    debug_assert_eq!(x.len(), outer * r * inner);
    debug_assert_eq!(y.len(), outer * inner);
    if y.is_empty() {
        return;
    }
    if r == 0 {
        y.fill(0);
        return;
    }
    let row = |(yo, xo): (&mut u32, &[T])| *yo = arg_best(op, xo).map_or(0, |b| b.1 as u32);
    if inner == 1 {
        if x.len() < PAR_MIN_LEN {
            y.iter_mut().zip(x.chunks(r)).for_each(row);
        } else {
            let min_rows = (PAR_CHUNK / r).max(1);
            y.par_iter_mut()
                .zip(x.par_chunks(r))
                .with_min_len(min_rows)
                .for_each(row);
        }
        return;
    }
    for_blocks(y, inner, x.len(), |o, c0, yb| {
        let base = o * r * inner + c0;
        let mut best = [0f32; COL_BLOCK];
        let best = &mut best[..yb.len()];
        for (b, v) in best.iter_mut().zip(&x[base..]) {
            *b = v.to_f32();
        }
        yb.fill(0);
        for k in 1..r {
            let xs = &x[base + k * inner..][..yb.len()];
            for ((b, i), v) in best.iter_mut().zip(yb.iter_mut()).zip(xs) {
                let v = v.to_f32();
                if !b.is_nan() && (v.is_nan() || better(op, v, *b)) {
                    (*b, *i) = (v, k as u32);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_util::testing::{f64s, poison, rand_vec, rel_err, rng, tol};
    use half::{bf16, f16};

    const OPS: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
    ];

    fn ref_reduce(op: ReduceOp, x: impl Iterator<Item = f64> + Clone) -> f64 {
        let n = x.clone().count() as f64;
        match op {
            ReduceOp::Sum => x.sum(),
            ReduceOp::Mean => x.sum::<f64>() / n,
            ReduceOp::Max => x.fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => x.fold(f64::INFINITY, f64::min),
            ReduceOp::Prod => x.product(),
        }
    }

    fn ref_arg(op: ArgReduceOp, x: impl Iterator<Item = f64>) -> u32 {
        let mut best: Option<(f64, u32)> = None;
        for (i, v) in x.enumerate() {
            let take = match best {
                None => true,
                Some((b, _)) => match op {
                    ArgReduceOp::ArgMax => v > b,
                    ArgReduceOp::ArgMin => v < b,
                },
            };
            if take {
                best = Some((v, i as u32));
            }
        }
        best.unwrap().1
    }

    /// Random values; for prod, values near ±1 so the product neither under- nor overflows.
    fn inputs<T: Float>(r: &mut rand::rngs::StdRng, op: ReduceOp, n: usize) -> Vec<T> {
        let x: Vec<T> = rand_vec(r, n);
        if op == ReduceOp::Mean {
            // Around 1, not 0: the mean of a million values of either sign is near 0,
            // and a relative error of a result near 0 measures the cancellation, not the
            // reduction (a CI run saw 2% for an f16 mean of 1,000,003 values). (A sum
            // around 1 would overflow f16; a sum of either sign grows like sqrt(n).)
            return x
                .into_iter()
                .map(|v| T::from_f32(1.0 + 0.5 * v.to_f32()))
                .collect();
        }
        if op != ReduceOp::Prod {
            return x;
        }
        let s = 1.0 / (n as f32).sqrt().max(1.0);
        x.into_iter()
            .map(|v| T::from_f32(1.0 + v.to_f32() * s))
            .collect()
    }

    fn check_all<T: Float>() {
        let (seed, mut r) = rng();
        for n in [1, 7, 1000, 1_000_003] {
            for op in OPS {
                let x: Vec<T> = inputs(&mut r, op, n);
                let got = reduce_all(op, &x);
                let want = ref_reduce(op, f64s(&x).into_iter());
                let e = rel_err(&[got], &[want]);
                assert!(
                    e < tol::<T>(),
                    "{op:?} n={n} {:?} err {e} seed {seed}",
                    T::KIND
                );
            }
            for op in [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin] {
                // Few distinct values so that ties happen.
                let x: Vec<T> = (0..n)
                    .map(|_| T::from_f32(rand::Rng::gen_range(&mut r, 0..50) as f32))
                    .collect();
                let want = ref_arg(op, f64s(&x).into_iter());
                assert_eq!(argreduce_all(op, &x), want, "{op:?} n={n} seed {seed}");
            }
        }
    }

    #[test]
    fn all_f32() {
        check_all::<f32>();
    }
    #[test]
    fn all_f16() {
        check_all::<f16>();
    }
    #[test]
    fn all_bf16() {
        check_all::<bf16>();
    }

    fn check_dim<T: Float>(shape: &[usize], dim: usize) {
        let (seed, mut r) = rng();
        let (outer, rr, inner) = split_dims(shape, dim);
        let n = outer * rr * inner;
        for op in OPS {
            let x: Vec<T> = inputs(&mut r, op, n);
            let xf = f64s(&x);
            let mut y = poison::<T>(outer * inner);
            reduce_dim(op, &x, outer, rr, inner, &mut y);
            let want: Vec<f64> = (0..outer * inner)
                .map(|oi| {
                    let (o, i) = (oi / inner, oi % inner);
                    ref_reduce(op, (0..rr).map(|k| xf[(o * rr + k) * inner + i]))
                })
                .collect();
            let e = rel_err(&y, &want);
            assert!(
                e < tol::<T>(),
                "{op:?} {shape:?} dim {dim} {:?} err {e} seed {seed}",
                T::KIND
            );
        }
        for op in [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin] {
            let x: Vec<T> = (0..n)
                .map(|_| T::from_f32(rand::Rng::gen_range(&mut r, 0..9) as f32))
                .collect();
            let xf = f64s(&x);
            let mut y = vec![u32::MAX; outer * inner];
            argreduce_dim(op, &x, outer, rr, inner, &mut y);
            for (oi, &got) in y.iter().enumerate() {
                let (o, i) = (oi / inner, oi % inner);
                let want = ref_arg(op, (0..rr).map(|k| xf[(o * rr + k) * inner + i]));
                assert_eq!(got, want, "{op:?} {shape:?} dim {dim} at {oi} seed {seed}");
            }
        }
    }

    const DIM_CASES: &[(&[usize], usize)] = &[
        (&[1], 0),
        (&[7], 0),
        (&[3, 7], 1),
        (&[3, 7], 0),
        (&[5, 1000, 7], 1),
        (&[1000, 1001], 0),
        (&[1000, 1001], 1),
        (&[1, 1_000_003], 1),
        (&[1_000_003, 1], 0),
        (&[2, 3, 1, 1300], 1),
        (&[4, 1, 9], 1),
    ];

    #[test]
    fn dim_f32() {
        for (s, d) in DIM_CASES {
            check_dim::<f32>(s, *d);
        }
    }
    #[test]
    fn dim_f16() {
        for (s, d) in DIM_CASES {
            check_dim::<f16>(s, *d);
        }
    }
    #[test]
    fn dim_bf16() {
        for (s, d) in DIM_CASES {
            check_dim::<bf16>(s, *d);
        }
    }

    #[test]
    fn nan_semantics() {
        let x = [1.0f32, f32::NAN, 3.0, f32::NAN];
        assert!(reduce_all(ReduceOp::Max, &x).is_nan());
        assert!(reduce_all(ReduceOp::Min, &x).is_nan());
        assert_eq!(argreduce_all(ArgReduceOp::ArgMax, &x), 1);
        assert_eq!(argreduce_all(ArgReduceOp::ArgMin, &x), 1);
        let mut big = vec![0.5f32; 300_000];
        big[200_000] = f32::NAN;
        big[250_000] = f32::NAN;
        big[7] = 9.0;
        assert_eq!(argreduce_all(ArgReduceOp::ArgMax, &big), 200_000);
        assert!(reduce_all(ReduceOp::Max, &big).is_nan());
        // Column-wise: [[1, 5], [NaN, 2], [7, NaN]] over dim 0.
        let x = [1.0f32, 5.0, f32::NAN, 2.0, 7.0, f32::NAN];
        let mut y = [0u32; 2];
        argreduce_dim(ArgReduceOp::ArgMax, &x, 1, 3, 2, &mut y);
        assert_eq!(y, [1, 2]);
        argreduce_dim(ArgReduceOp::ArgMin, &x, 1, 3, 2, &mut y);
        assert_eq!(y, [1, 2]);
        let mut m = [0f32; 2];
        reduce_dim(ReduceOp::Max, &x, 1, 3, 2, &mut m);
        assert!(m[0].is_nan() && m[1].is_nan());
    }

    #[test]
    fn shapes_and_empty() {
        assert_eq!(split_dims(&[2, 3, 4, 5], 2), (6, 4, 5));
        assert_eq!(reduced_shape(&[2, 3, 4], 1, true), vec![2, 1, 4]);
        assert_eq!(reduced_shape(&[2, 3, 4], 1, false), vec![2, 4]);
        assert_eq!(reduce_all::<f32>(ReduceOp::Sum, &[]), 0.0);
        assert_eq!(reduce_all::<f32>(ReduceOp::Prod, &[]), 1.0);
        assert!(reduce_all::<f32>(ReduceOp::Mean, &[]).is_nan());
        let mut y = [f32::NAN; 3];
        reduce_dim(ReduceOp::Sum, &[], 3, 0, 1, &mut y);
        assert_eq!(y, [0.0; 3]);
    }
}
