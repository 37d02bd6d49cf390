//! CPU matrix products on the `gemm` crate, and the linear epilogue.
//!
//! Transposes and batch broadcasting are expressed as strides handed to
//! `gemm::gemm`: no operand is copied for f32 and f16 (which `gemm` computes
//! natively); bf16 operands are widened to f32 and the result rounded back.

use ::gemm::Parallelism;
use rayon::prelude::*;

pub use super::Activation;
use crate::cpu_util::{store_f32, to_f32_vec, Float, FloatKind, PAR_CHUNK, PAR_MIN_LEN};

/// Products of at least this many multiply-adds (`m * n * k`) use `gemm`'s rayon
/// parallelism; smaller ones run on the calling thread (`gemm`'s own threshold).
pub const GEMM_PAR_MIN: usize = 48 * 48 * 256;

/// A strided read-only matrix inside a slice: element `(i, j)` is
/// `data[off + i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatRef<'a, U> {
    pub data: &'a [U],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

/// A strided mutable matrix inside a slice, laid out as [`MatRef`].
#[derive(Debug)]
pub(crate) struct MatMut<'a, U> {
    pub data: &'a mut [U],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a, U> MatRef<'a, U> {
    /// A strided view.
    pub fn new(data: &'a [U], off: usize, rs: usize, cs: usize) -> Self {
        MatRef { data, off, rs, cs }
    }
}

impl<'a, U> MatMut<'a, U> {
    /// A strided mutable view.
    pub fn new(data: &'a mut [U], off: usize, rs: usize, cs: usize) -> Self {
        MatMut { data, off, rs, cs }
    }
}

/// Panics unless every element of a `rows × cols` view lies inside `len`.
fn check_view(what: &str, len: usize, off: usize, rs: usize, cs: usize, rows: usize, cols: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    let last = (rows - 1)
        .checked_mul(rs)
        .and_then(|r| (cols - 1).checked_mul(cs).and_then(|c| r.checked_add(c)))
        .and_then(|rc| rc.checked_add(off));
    assert!(
        matches!(last, Some(l) if l < len && l <= isize::MAX as usize),
        "gemm: {what} view {rows}x{cols} (off {off}, strides {rs},{cs}) exceeds its {len} elements"
    );
}

/// The parallelism for one `m × n × k` product.
pub(crate) fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    if m.saturating_mul(n).saturating_mul(k) >= GEMM_PAR_MIN {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// `C = A·B` (or `C += A·B` with `accumulate`), `A` is `m × k`, `B` is `k × n`.
/// `U` must be `f32` or `f16` (the types `gemm` computes natively).
///
/// # Panics
/// If a view reaches outside its slice, or `U` is bf16.
pub(crate) fn gemm_into<U: Float>(
    (m, n, k): (usize, usize, usize),
    c: MatMut<'_, U>,
    a: MatRef<'_, U>,
    b: MatRef<'_, U>,
    accumulate: bool,
    par: Parallelism,
) {
    assert!(U::KIND != FloatKind::Bf16, "gemm has no bf16 kernel");
    check_view("C", c.data.len(), c.off, c.rs, c.cs, m, n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    c.data[c.off + i * c.rs + j * c.cs] = U::from_f32(0.0);
                }
            }
        }
        return;
    }
    check_view("A", a.data.len(), a.off, a.rs, a.cs, m, k);
    check_view("B", b.data.len(), b.off, b.rs, b.cs, k, n);
    let (zero, one) = (U::from_f32(0.0), U::from_f32(1.0));
    // SAFETY: `check_view` proved that every element the three views address lies
    // inside its slice (and that all offsets fit in isize), so the pointers and
    // strides describe valid memory. `c.data` is borrowed mutably and `a.data`,
    // `b.data` shared, so the destination aliases neither input. `U` is f32 or f16
    // (asserted above), which `gemm::gemm` supports; with `read_dst == false` it
    // never reads the destination (which may hold NaN).
    unsafe {
        ::gemm::gemm(
            m,
            n,
            k,
            c.data.as_mut_ptr().add(c.off),
            c.cs as isize,
            c.rs as isize,
            accumulate,
            a.data.as_ptr().add(a.off),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr().add(b.off),
            b.cs as isize,
            b.rs as isize,
            if accumulate { one } else { zero },
            one,
            false,
            false,
            false,
            par,
        );
    }
}

/// Batched `C[i] = op(A[i]) · op(B[i])`.
///
/// `C` is `batch` contiguous row-major `m × n` matrices. `A[i]` starts at
/// `i * a_batch_stride` and is stored `m × k` row-major, or `k × m` when `trans_a`
/// (then `op(A) = Aᵀ`); `B[i]` starts at `i * b_batch_stride` and is stored `k × n`,
/// or `n × k` when `trans_b`. A batch stride of 0 broadcasts that operand to every
/// batch. `k == 0` gives zeros.
///
/// # Examples
/// ```
/// use rtx::ops::gemm::cpu::matmul;
/// // Two batches of A (2x3) times one shared B stored transposed (2x3, i.e. n x k).
/// let a = [1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
/// let b = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
/// let mut c = [0.0f32; 8];
/// matmul(&a, &b, &mut c, 2, 2, 2, 3, false, true, 6, 0);
/// assert_eq!(c, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0, 6.0, 15.0]);
/// ```
#[allow(clippy::too_many_arguments)]
pub fn matmul<T: Float>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    a_batch_stride: usize,
    b_batch_stride: usize,
) {
    debug_assert_eq!(c.len(), batch * m * n);
    let g = Batched {
        batch,
        m,
        n,
        k,
        trans_a,
        trans_b,
        a_bs: a_batch_stride,
        b_bs: b_batch_stride,
    };
    match T::KIND {
        FloatKind::F32 | FloatKind::F16 => g.run(a, b, c),
        FloatKind::Bf16 => {
            let (af, bf) = (to_f32_vec(a), to_f32_vec(b));
            let mut cf = vec![0f32; c.len()];
            g.run(&af, &bf, &mut cf);
            store_f32(&cf, c);
        }
    }
}

/// The shape of a batched product (see [`matmul`]).
#[derive(Clone, Copy, Debug)]
struct Batched {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    a_bs: usize,
    b_bs: usize,
}

impl Batched {
    fn run<U: Float>(self, a: &[U], b: &[U], c: &mut [U]) {
        let Batched { batch, m, n, k, .. } = self;
        if c.is_empty() {
            return;
        }
        let (a_rs, a_cs) = if self.trans_a { (1, m) } else { (k, 1) };
        let (b_rs, b_cs) = if self.trans_b { (1, k) } else { (n, 1) };
        let one = |i: usize, cb: &mut [U], par: Parallelism| {
            gemm_into(
                (m, n, k),
                MatMut::new(cb, 0, n, 1),
                MatRef::new(a, i * self.a_bs, a_rs, a_cs),
                MatRef::new(b, i * self.b_bs, b_rs, b_cs),
                false,
                par,
            )
        };
        let work = m * n * k;
        if batch > 1 && work < GEMM_PAR_MIN && batch * work >= GEMM_PAR_MIN {
            // Many small products: one task per matrix (or per few).
            let min_len = (GEMM_PAR_MIN / work.max(1)).max(1) / 4;
            c.par_chunks_mut(m * n)
                .enumerate()
                .with_min_len(min_len.max(1))
                .for_each(|(i, cb)| one(i, cb, Parallelism::None));
        } else {
            let par = parallelism(m, n, k);
            for (i, cb) in c.chunks_mut(m * n).enumerate() {
                one(i, cb, par);
            }
        }
    }
}

/// `c[r, j] = act(c[r, j] + bias[j])` over the rows of a row-major `[rows, n]`
/// matrix (`bias`, when given, has `n` elements).
pub fn linear_epilogue<T: Float>(c: &mut [T], bias: Option<&[T]>, n: usize, act: Activation) {
    debug_assert!(n > 0);
    debug_assert_eq!(c.len() % n, 0);
    debug_assert!(bias.iter().all(|b| b.len() == n));
    if bias.is_none() && act == Activation::None {
        return;
    }
    let rows_kernel = |c: &mut [T]| match bias {
        Some(bias) => {
            for row in c.chunks_mut(n) {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v = T::from_f32(act.apply(v.to_f32() + b.to_f32()));
                }
            }
        }
        None => c
            .iter_mut()
            .for_each(|v| *v = T::from_f32(act.apply(v.to_f32()))),
    };
    if c.len() < PAR_MIN_LEN {
        rows_kernel(c);
    } else {
        let chunk = (PAR_CHUNK / n).max(1) * n;
        c.par_chunks_mut(chunk).for_each(rows_kernel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_util::testing::{f64s, poison, rand_vec, rel_err, rng, tol};
    use half::{bf16, f16};

    #[derive(Clone, Copy, Debug)]
    struct Case {
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
        ta: bool,
        tb: bool,
        a_bcast: bool,
        b_bcast: bool,
    }

    fn reference(cs: Case, a: &[f64], b: &[f64]) -> Vec<f64> {
        let Case {
            batch,
            m,
            n,
            k,
            ta,
            tb,
            ..
        } = cs;
        let a_bs = if cs.a_bcast { 0 } else { m * k };
        let b_bs = if cs.b_bcast { 0 } else { k * n };
        let mut c = vec![0f64; batch * m * n];
        for bi in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0f64;
                    for p in 0..k {
                        let av = a[bi * a_bs + if ta { p * m + i } else { i * k + p }];
                        let bv = b[bi * b_bs + if tb { j * k + p } else { p * n + j }];
                        s += av * bv;
                    }
                    c[(bi * m + i) * n + j] = s;
                }
            }
        }
        c
    }

    fn check<T: Float>(cs: Case) {
        let (seed, mut r) = rng();
        let Case { batch, m, n, k, .. } = cs;
        let a: Vec<T> = rand_vec(&mut r, if cs.a_bcast { 1 } else { batch } * m * k);
        let b: Vec<T> = rand_vec(&mut r, if cs.b_bcast { 1 } else { batch } * k * n);
        let mut c = poison::<T>(batch * m * n);
        let a_bs = if cs.a_bcast { 0 } else { m * k };
        let b_bs = if cs.b_bcast { 0 } else { k * n };
        matmul(&a, &b, &mut c, batch, m, n, k, cs.ta, cs.tb, a_bs, b_bs);
        let want = reference(cs, &f64s(&a), &f64s(&b));
        let e = rel_err(&c, &want);
        assert!(e < tol::<T>(), "{cs:?} {:?} err {e} seed {seed}", T::KIND);
    }

    fn cases() -> Vec<Case> {
        let mut v = Vec::new();
        let shapes = [
            (1, 1, 1, 1),
            (1, 7, 5, 3),
            (3, 17, 33, 65),
            (1, 200, 300, 150),
            (64, 8, 9, 10),
            (2, 257, 129, 300),
        ];
        for &(batch, m, n, k) in &shapes {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                for (a_bcast, b_bcast) in [(false, false), (true, false), (false, true)] {
                    v.push(Case {
                        batch,
                        m,
                        n,
                        k,
                        ta,
                        tb,
                        a_bcast,
                        b_bcast,
                    });
                }
            }
        }
        v
    }

    #[test]
    fn matmul_f32() {
        for c in cases() {
            check::<f32>(c);
        }
    }
    #[test]
    fn matmul_f16() {
        for c in cases() {
            check::<f16>(c);
        }
    }
    #[test]
    fn matmul_bf16() {
        for c in cases() {
            check::<bf16>(c);
        }
    }

    #[test]
    fn k_zero_gives_zeros() {
        let mut c = poison::<f32>(6);
        matmul::<f32>(&[], &[], &mut c, 1, 2, 3, 0, false, false, 0, 0);
        assert_eq!(c, vec![0.0; 6]);
    }

    fn ref_act(act: Activation, x: f64) -> f64 {
        match act {
            Activation::None => x,
            Activation::Relu => x.max(0.0),
            Activation::Gelu => {
                let t = ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh();
                0.5 * x * (1.0 + t)
            }
        }
    }

    fn check_epilogue<T: Float>(rows: usize, n: usize) {
        let (seed, mut r) = rng();
        for act in [Activation::None, Activation::Relu, Activation::Gelu] {
            for with_bias in [false, true] {
                let c0: Vec<T> = rand_vec::<T>(&mut r, rows * n)
                    .into_iter()
                    .map(|v| T::from_f32(v.to_f32() * 3.0))
                    .collect();
                let bias: Vec<T> = rand_vec(&mut r, n);
                let mut c = c0.clone();
                linear_epilogue(&mut c, with_bias.then_some(&bias[..]), n, act);
                let (cf, bf) = (f64s(&c0), f64s(&bias));
                let want: Vec<f64> = (0..rows * n)
                    .map(|i| ref_act(act, cf[i] + if with_bias { bf[i % n] } else { 0.0 }))
                    .collect();
                let e = rel_err(&c, &want);
                assert!(
                    e < tol::<T>(),
                    "{act:?} bias {with_bias} {rows}x{n} err {e} seed {seed}"
                );
            }
        }
    }

    #[test]
    fn epilogue() {
        // (A single element makes "relative error" a ratio of two roundings near a zero of
        // the activation; start at a few.)
        for (rows, n) in [(2, 3), (7, 13), (1000, 301)] {
            check_epilogue::<f32>(rows, n);
            check_epilogue::<f16>(rows, n);
            check_epilogue::<bf16>(rows, n);
        }
    }
}
