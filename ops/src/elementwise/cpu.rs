//! CPU element-wise kernels: unary maps and binary ops with numpy broadcasting.
//!
//! Small tensors run serially on the caller's thread (a 16-element add does no
//! allocation and no dispatch); large ones are split into `PAR_CHUNK`-element
//! rayon tasks.

use rayon::prelude::*;

pub use super::{BinaryOp, UnaryOp};
use crate::cpu_util::{Float, PAR_CHUNK, PAR_MIN_LEN};

#[inline(always)]
pub(crate) fn relu(v: f32) -> f32 {
    // `v < 0` is false for NaN, so NaN passes through.
    if v < 0.0 {
        0.0
    } else {
        v
    }
}

/// NaN-propagating maximum.
#[inline(always)]
pub(crate) fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

/// NaN-propagating minimum.
#[inline(always)]
pub(crate) fn nan_min(a: f32, b: f32) -> f32 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// `y[i] = op(x[i])`. `x` and `y` have the same length.
pub fn unary<T: Float>(op: UnaryOp, x: &[T], y: &mut [T]) {
    debug_assert_eq!(x.len(), y.len());
    match op {
        UnaryOp::Neg => map1(x, y, |v| -v),
        UnaryOp::Exp => map1(x, y, f32::exp),
        UnaryOp::Log => map1(x, y, f32::ln),
        UnaryOp::Sin => map1(x, y, f32::sin),
        UnaryOp::Cos => map1(x, y, f32::cos),
        UnaryOp::Sqrt => map1(x, y, f32::sqrt),
        UnaryOp::Abs => map1(x, y, f32::abs),
        UnaryOp::Relu => map1(x, y, relu),
    }
}

fn map1<T: Float, F: Fn(f32) -> f32 + Sync>(x: &[T], y: &mut [T], f: F) {
    let kernel = |x: &[T], y: &mut [T]| {
        for (o, v) in y.iter_mut().zip(x) {
            *o = T::from_f32(f(v.to_f32()));
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

/// The numpy broadcast of two shapes: right-aligned, each pair of dims equal or
/// one of them 1. `None` when they are incompatible.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = match (da, db) {
            _ if da == db => da,
            (1, d) | (d, 1) => d,
            _ => return None,
        };
    }
    Some(out)
}

/// `y = op(a, b)` with numpy broadcasting: `y_shape` must be
/// `broadcast_shape(a_shape, b_shape)`; all three are row-major contiguous.
///
/// # Examples
/// ```
/// use rtx::ops::elementwise::cpu::{binary, broadcast_shape, BinaryOp};
/// let (a, b) = ([1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [10.0f32, 20.0]);
/// let y_shape = broadcast_shape(&[3, 1, 2], &[2]).unwrap(); // [3, 1, 2]
/// let mut y = [0.0f32; 6];
/// binary(BinaryOp::Add, &a, &[3, 1, 2], &b, &[2], &mut y, &y_shape);
/// assert_eq!(y, [11.0, 22.0, 13.0, 24.0, 15.0, 26.0]);
/// ```
pub fn binary<T: Float>(
    op: BinaryOp,
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    y: &mut [T],
    y_shape: &[usize],
) {
    let sh = Shapes {
        a: a_shape,
        b: b_shape,
        y: y_shape,
    };
    match op {
        BinaryOp::Add => binary_with(a, b, y, sh, |a, b| a + b),
        BinaryOp::Sub => binary_with(a, b, y, sh, |a, b| a - b),
        BinaryOp::Mul => binary_with(a, b, y, sh, |a, b| a * b),
        BinaryOp::Div => binary_with(a, b, y, sh, |a, b| a / b),
        BinaryOp::Max => binary_with(a, b, y, sh, nan_max),
        BinaryOp::Min => binary_with(a, b, y, sh, nan_min),
    }
}

#[derive(Clone, Copy)]
struct Shapes<'s> {
    a: &'s [usize],
    b: &'s [usize],
    y: &'s [usize],
}

fn binary_with<T: Float, F: Fn(f32, f32) -> f32 + Sync>(
    a: &[T],
    b: &[T],
    y: &mut [T],
    sh: Shapes<'_>,
    f: F,
) {
    debug_assert_eq!(broadcast_shape(sh.a, sh.b).as_deref(), Some(sh.y));
    debug_assert_eq!(y.len(), sh.y.iter().product::<usize>());
    let n = y.len();
    if n == 0 {
        return;
    }
    // An operand with as many elements as `y` has `y`'s layout (its dims are each
    // 1 or `y`'s, and their product matches).
    if a.len() == n && b.len() == n {
        par_rows(y, 1, |start, y| zip_same(&a[start..], &b[start..], y, &f));
    } else if a.len() == n && is_trailing(sh.b, sh.y) {
        // `b` repeats with period `b.len()` (a scalar is the period-1 case).
        let period = b.len();
        par_rows(y, period, |start, y| {
            for (y, a) in y.chunks_mut(period).zip(a[start..].chunks(period)) {
                for ((o, x), z) in y.iter_mut().zip(a).zip(b) {
                    *o = T::from_f32(f(x.to_f32(), z.to_f32()));
                }
            }
        });
    } else if b.len() == n && is_trailing(sh.a, sh.y) {
        let period = a.len();
        par_rows(y, period, |start, y| {
            for (y, b) in y.chunks_mut(period).zip(b[start..].chunks(period)) {
                for ((o, x), z) in y.iter_mut().zip(a).zip(b) {
                    *o = T::from_f32(f(x.to_f32(), z.to_f32()));
                }
            }
        });
    } else {
        strided(a, b, y, sh, &f);
    }
}

fn zip_same<T: Float>(a: &[T], b: &[T], y: &mut [T], f: &impl Fn(f32, f32) -> f32) {
    for ((o, x), z) in y.iter_mut().zip(a).zip(b) {
        *o = T::from_f32(f(x.to_f32(), z.to_f32()));
    }
}

/// True when `small` (minus leading 1s) equals the trailing dims of `y`.
fn is_trailing(small: &[usize], y: &[usize]) -> bool {
    let lead = small.iter().take_while(|&&d| d == 1).count();
    let s = &small[lead..];
    s.len() <= y.len() && y[y.len() - s.len()..] == *s
}

/// Runs `kernel(first_element_index, chunk)` over `y` split into chunks that are
/// multiples of `row` elements: serially when small, with rayon otherwise.
fn par_rows<T: Float>(y: &mut [T], row: usize, kernel: impl Fn(usize, &mut [T]) + Sync) {
    if y.len() < PAR_MIN_LEN {
        kernel(0, y);
        return;
    }
    let chunk = (PAR_CHUNK / row).max(1) * row;
    y.par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(i, y)| kernel(i * chunk, y));
}

/// One coalesced dimension of the general case: its size and each operand's stride.
#[derive(Clone, Copy, Debug)]
struct Dim {
    size: usize,
    sa: usize,
    sb: usize,
}

/// Broadcast strides of `shape` within `y_shape` (0 where broadcast), merged so
/// that adjacent dims that are contiguous in both operands become one. Dims of
/// size 1 are dropped; the innermost dim comes last.
fn coalesced_dims(a: &[usize], b: &[usize], y: &[usize]) -> Vec<Dim> {
    let sa = bcast_strides(a, y);
    let sb = bcast_strides(b, y);
    let mut dims: Vec<Dim> = Vec::with_capacity(y.len());
    for i in (0..y.len()).rev() {
        if y[i] == 1 {
            continue;
        }
        let d = Dim {
            size: y[i],
            sa: sa[i],
            sb: sb[i],
        };
        match dims.last_mut() {
            Some(inner) if d.sa == inner.sa * inner.size && d.sb == inner.sb * inner.size => {
                inner.size *= d.size;
            }
            _ => dims.push(d),
        }
    }
    if dims.is_empty() {
        dims.push(Dim {
            size: 1,
            sa: 0,
            sb: 0,
        });
    }
    dims.reverse();
    dims
}

fn bcast_strides(shape: &[usize], y: &[usize]) -> Vec<usize> {
    let off = y.len() - shape.len();
    let mut strides = vec![0; y.len()];
    let mut s = 1;
    for i in (0..shape.len()).rev() {
        strides[off + i] = if shape[i] == 1 { 0 } else { s };
        s *= shape[i];
    }
    strides
}

/// The general broadcast: rows of the innermost coalesced dim, outer dims walked
/// by an odometer.
fn strided<T: Float>(
    a: &[T],
    b: &[T],
    y: &mut [T],
    sh: Shapes<'_>,
    f: &(impl Fn(f32, f32) -> f32 + Sync),
) {
    let dims = coalesced_dims(sh.a, sh.b, sh.y);
    let (outer, last) = dims.split_at(dims.len() - 1);
    let last = last[0];
    par_rows(y, last.size, |start, y| {
        // Multi-index of the chunk's first row over the outer dims.
        let mut idx = vec![0usize; outer.len()];
        let mut rem = start / last.size;
        for (k, d) in outer.iter().enumerate().rev() {
            idx[k] = rem % d.size;
            rem /= d.size;
        }
        for y in y.chunks_mut(last.size) {
            let oa: usize = outer.iter().zip(&idx).map(|(d, i)| d.sa * i).sum();
            let ob: usize = outer.iter().zip(&idx).map(|(d, i)| d.sb * i).sum();
            for (j, o) in y.iter_mut().enumerate() {
                let x = a[oa + j * last.sa].to_f32();
                let z = b[ob + j * last.sb].to_f32();
                *o = T::from_f32(f(x, z));
            }
            for k in (0..outer.len()).rev() {
                idx[k] += 1;
                if idx[k] < outer[k].size {
                    break;
                }
                idx[k] = 0;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_util::testing::{f64s, poison, rand_vec, rel_err, rng, tol};
    use half::{bf16, f16};

    fn ref_unary(op: UnaryOp, x: f64) -> f64 {
        match op {
            UnaryOp::Neg => -x,
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Abs => x.abs(),
            UnaryOp::Relu => x.max(0.0),
        }
    }

    fn ref_binary(op: BinaryOp, a: f64, b: f64) -> f64 {
        match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
        }
    }

    const UNARY: [UnaryOp; 8] = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Sqrt,
        UnaryOp::Abs,
        UnaryOp::Relu,
    ];
    const BINARY: [BinaryOp; 6] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
    ];

    fn check_unary<T: Float>() {
        let (seed, mut r) = rng();
        for n in [1, 7, 1000, 1_000_003] {
            for op in UNARY {
                let mut x: Vec<T> = rand_vec(&mut r, n);
                if matches!(op, UnaryOp::Log | UnaryOp::Sqrt) {
                    x.iter_mut()
                        .for_each(|v| *v = T::from_f32(v.to_f32().abs() + 0.01));
                }
                let mut y = poison::<T>(n);
                unary(op, &x, &mut y);
                let want: Vec<f64> = f64s(&x).into_iter().map(|v| ref_unary(op, v)).collect();
                let e = rel_err(&y, &want);
                assert!(
                    e < tol::<T>(),
                    "{op:?} n={n} {:?} err {e} seed {seed}",
                    T::KIND
                );
            }
        }
    }

    #[test]
    fn unary_f32() {
        check_unary::<f32>();
    }
    #[test]
    fn unary_f16() {
        check_unary::<f16>();
    }
    #[test]
    fn unary_bf16() {
        check_unary::<bf16>();
    }

    /// Naive broadcast reference by explicit multi-index arithmetic.
    fn ref_bcast(op: BinaryOp, a: &[f64], sa: &[usize], b: &[f64], sb: &[usize]) -> Vec<f64> {
        let ys = broadcast_shape(sa, sb).unwrap();
        let n: usize = ys.iter().product();
        let index = |shape: &[usize], idx: &[usize]| {
            let off = idx.len() - shape.len();
            shape.iter().enumerate().fold(0, |acc, (i, &d)| {
                acc * d + if d == 1 { 0 } else { idx[off + i] }
            })
        };
        (0..n)
            .map(|mut flat| {
                let mut idx = vec![0; ys.len()];
                for k in (0..ys.len()).rev() {
                    idx[k] = flat % ys[k];
                    flat /= ys[k];
                }
                ref_binary(op, a[index(sa, &idx)], b[index(sb, &idx)])
            })
            .collect()
    }

    fn check_binary<T: Float>(sa: &[usize], sb: &[usize]) {
        let (seed, mut r) = rng();
        let ys = broadcast_shape(sa, sb).unwrap();
        let (na, nb): (usize, usize) = (sa.iter().product(), sb.iter().product());
        let a: Vec<T> = rand_vec(&mut r, na);
        // Keep |b| away from 0 so division stays well conditioned.
        let b: Vec<T> = rand_vec::<T>(&mut r, nb)
            .into_iter()
            .map(|v| {
                let v = v.to_f32();
                T::from_f32(if v.abs() < 0.1 {
                    v.signum() * 0.1 + v
                } else {
                    v
                })
            })
            .collect();
        for op in BINARY {
            let mut y = poison::<T>(ys.iter().product());
            binary(op, &a, sa, &b, sb, &mut y, &ys);
            let want = ref_bcast(op, &f64s(&a), sa, &f64s(&b), sb);
            let e = rel_err(&y, &want);
            assert!(
                e < tol::<T>(),
                "{op:?} {sa:?}x{sb:?} {:?} err {e} seed {seed}",
                T::KIND
            );
        }
    }

    const CASES: &[(&[usize], &[usize])] = &[
        (&[1], &[1]),
        (&[7], &[7]),
        (&[1000], &[1000]),
        (&[1_000_003], &[1_000_003]),
        (&[1_000_003], &[1]),
        (&[1], &[1000]),
        (&[3, 5, 7], &[]),
        (&[9, 1000], &[1000]),
        (&[300, 1001], &[1, 1001]),
        (&[1001], &[300, 1001]),
        (&[3, 1, 5], &[4, 1]),
        (&[2, 3, 1, 5], &[3, 4, 1]),
        (&[7, 1], &[1, 9]),
        (&[300, 1], &[1, 1000]),
        (&[1, 1000, 1], &[70, 1, 3]),
        (&[64, 33, 40], &[64, 1, 40]),
        (&[2, 1, 3], &[2, 5, 3]),
    ];

    #[test]
    fn binary_f32() {
        for (a, b) in CASES {
            check_binary::<f32>(a, b);
        }
    }
    #[test]
    fn binary_f16() {
        for (a, b) in CASES {
            check_binary::<f16>(a, b);
        }
    }
    #[test]
    fn binary_bf16() {
        for (a, b) in CASES {
            check_binary::<bf16>(a, b);
        }
    }

    #[test]
    fn broadcast_shapes() {
        assert_eq!(broadcast_shape(&[3, 1, 5], &[4, 1]), Some(vec![3, 4, 5]));
        assert_eq!(broadcast_shape(&[], &[2, 3]), Some(vec![2, 3]));
        assert_eq!(broadcast_shape(&[2, 0], &[1]), Some(vec![2, 0]));
        assert_eq!(broadcast_shape(&[2, 3], &[3, 2]), None);
        assert_eq!(broadcast_shape(&[0], &[2]), None);
    }

    #[test]
    fn nan_semantics() {
        let a = [f32::NAN, 1.0, 2.0, f32::NAN];
        let b = [1.0, f32::NAN, 1.0, f32::NAN];
        for op in [BinaryOp::Max, BinaryOp::Min] {
            let mut y = [0f32; 4];
            binary(op, &a, &[4], &b, &[4], &mut y, &[4]);
            assert!(
                y[0].is_nan() && y[1].is_nan() && y[3].is_nan(),
                "{op:?} {y:?}"
            );
            assert_eq!(y[2], if op == BinaryOp::Max { 2.0 } else { 1.0 });
        }
        let mut y = [0f32; 3];
        unary(UnaryOp::Relu, &[f32::NAN, -1.0, 2.0], &mut y);
        assert!(y[0].is_nan() && y[1] == 0.0 && y[2] == 2.0);
    }

    #[test]
    fn empty_is_noop() {
        let mut y: [f32; 0] = [];
        binary(
            BinaryOp::Add,
            &[],
            &[0, 3],
            &[1.0, 2.0, 3.0],
            &[3],
            &mut y,
            &[0, 3],
        );
        unary(UnaryOp::Exp, &[], &mut y);
    }
}
