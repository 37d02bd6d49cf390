//! Shared test helpers: run one test body on every backend, seeded random inputs, f64
//! references and the relative error by the norm.
//!
//! [`for_each_backend`] runs a case on the CPU backend with 1 and 4 streams and, when
//! a CUDA device is present, on CUDA with 1 and 4 streams. Without a device the CUDA
//! runs print `cuda: skipped (no device)`, unless `RTX_REQUIRE_CUDA=1`, which makes them
//! fail. Every run poisons op outputs (NaN) so an unwritten element fails its check.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rtx_runtime::{Backend, Builder, DType, Element, Runtime, Tensor};

/// Runs `case(rt, label)` on every backend available (see the module docs).
pub fn for_each_backend(mut case: impl FnMut(&Runtime, &str)) {
    rtx_ops::set_poison_outputs(true);
    for streams in [1, 4] {
        let rt = Runtime::cpu(streams);
        case(&rt, &format!("cpu/{streams}"));
    }
    if rtx_runtime::cuda::present_for_tests() {
        for streams in [1, 4] {
            let rt = Runtime::builder()
                .backend(Backend::Cuda(vec![]))
                .streams(streams)
                .build()
                .expect("building a CUDA runtime");
            case(&rt, &format!("cuda/{streams}"));
        }
    }
}

/// Runs `case(rt, label)` on CUDA runtimes of 1 and 4 streams built with `set` (an
/// experimental setting on), when a device is present (see the module docs); the label
/// ends in `tag`.
pub fn for_each_cuda_with(
    set: impl Fn(Builder) -> Builder,
    tag: &str,
    mut case: impl FnMut(&Runtime, &str),
) {
    rtx_ops::set_poison_outputs(true);
    if !rtx_runtime::cuda::present_for_tests() {
        return;
    }
    for streams in [1, 4] {
        let rt = set(Runtime::builder()
            .backend(Backend::Cuda(vec![]))
            .streams(streams))
        .build()
        .expect("building a CUDA runtime");
        case(&rt, &format!("cuda/{streams} {tag}"));
    }
}

mod shard;
#[allow(unused_imports)] // not every test file splits its cases
pub use shard::shard;

/// Defines a `#[test]` that runs `$body` with `$rt: &Runtime` and `$label: &str` on
/// every backend.
#[macro_export]
macro_rules! backend_test {
    ($name:ident, |$rt:ident, $label:ident| $body:block) => {
        #[test]
        fn $name() {
            common::for_each_backend(|$rt, $label| $body);
        }
    };
}

/// A fresh seed and its generator; put the seed in every failure message. `RTX_TEST_SEED`
/// replays a failure's seed.
pub fn rng() -> (u64, StdRng) {
    let seed: u64 = std::env::var("RTX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    (seed, StdRng::seed_from_u64(seed))
}

/// `n` values uniform in `[lo, hi)`, rounded to `T`.
pub fn rand_vec<T: Element>(rng: &mut StdRng, n: usize, lo: f64, hi: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.gen_range(lo..hi))).collect()
}

/// Widens to f64.
pub fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Uploads `data` and returns the tensor.
pub fn upload<T: Element>(rt: &Runtime, data: &[T], shape: &[usize]) -> Tensor {
    rt.upload(data, shape).expect("upload")
}

/// Downloads a tensor as f64.
pub fn download<T: Element>(rt: &Runtime, t: &Tensor) -> Vec<f64> {
    f64s(&rt.to_vec::<T>(t).expect("to_vec").wait().expect("download"))
}

/// ‖out − ref‖ / ‖ref‖ (‖out − ref‖ when ‖ref‖ = 0); NaN when `out` holds NaN where
/// the reference does not, or has the wrong length.
pub fn rel_err(out: &[f64], reference: &[f64]) -> f64 {
    rel_err_scaled(out, reference, reference)
}

/// ‖out − ref‖ / ‖scale‖: the error relative to the norm of the magnitudes the result
/// is made of, for sums that may cancel. For a product A·B, `scale` is |A|·|B| (plus
/// |bias|): rounding errors grow with those magnitudes, not with the result, so a result
/// that cancels to near zero (one output, k terms of both signs) does not turn a
/// correct answer into a large relative error. NaN as [`rel_err`].
pub fn rel_err_scaled(out: &[f64], reference: &[f64], scale: &[f64]) -> f64 {
    if out.len() != reference.len() || scale.len() != reference.len() {
        return f64::NAN;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for ((o, r), s) in out.iter().zip(reference).zip(scale) {
        if o.is_nan() != r.is_nan() {
            return f64::NAN;
        }
        if r.is_nan() {
            continue;
        }
        num += (o - r) * (o - r);
        den += s * s;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Element-wise magnitudes (for the `scale` of [`rel_err_scaled`]).
/// The f64 reference of a batched row-major product `[batch, m, k] · [batch, k, n]`
/// and, per element, the sum of the products' magnitudes (the scale for
/// [`rel_err_scaled`]).
pub fn matmul_ref<T: Element>(
    a: &[T],
    b: &[T],
    (batch, m, n, k): (usize, usize, usize, usize),
) -> (Vec<f64>, Vec<f64>) {
    let (af, bf) = (f64s(a), f64s(b));
    let mut want = vec![0.0; batch * m * n];
    let mut scale = vec![0.0; batch * m * n];
    for p in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut sa) = (0.0, 0.0);
                for q in 0..k {
                    let x = af[(p * m + i) * k + q] * bf[(p * k + q) * n + j];
                    s += x;
                    sa += x.abs();
                }
                want[(p * m + i) * n + j] = s;
                scale[(p * m + i) * n + j] = sa;
            }
        }
    }
    (want, scale)
}

pub fn abs_all(x: &[f64]) -> Vec<f64> {
    x.iter().map(|v| v.abs()).collect()
}

/// The parity tolerance of a dtype: 1e-5 for f32, 1e-2 for f16 and bf16.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

/// Asserts `rel_err(out, reference) <= tol(T)`, naming the case and the seed.
pub fn check<T: Element>(out: &[f64], reference: &[f64], what: &str, seed: u64) {
    let e = rel_err(out, reference);
    assert!(
        e <= tol(T::DTYPE),
        "{what} {}: relative error {e:e} > {:e} (seed {seed})",
        T::DTYPE,
        tol(T::DTYPE)
    );
}

/// Row-major strides of `shape` broadcast into `y` (0 on broadcast dims).
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

/// The numpy broadcast of two shapes (panics when incompatible).
pub fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    let pad = |s: &[usize], i: usize| {
        let off = n - s.len();
        if i < off {
            1
        } else {
            s[i - off]
        }
    };
    (0..n)
        .map(|i| match (pad(a, i), pad(b, i)) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            (x, y) => panic!("{a:?} and {b:?} do not broadcast ({x} vs {y})"),
        })
        .collect()
}

/// `f(a, b)` with numpy broadcasting, by explicit multi-indices (the reference).
pub fn broadcast_ref(
    a: &[f64],
    sa: &[usize],
    b: &[f64],
    sb: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let y = broadcast(sa, sb);
    let (ta, tb) = (bcast_strides(sa, &y), bcast_strides(sb, &y));
    let n: usize = y.iter().product();
    (0..n)
        .map(|mut flat| {
            let (mut ia, mut ib) = (0, 0);
            for d in (0..y.len()).rev() {
                let c = flat % y[d];
                flat /= y[d];
                ia += c * ta[d];
                ib += c * tb[d];
            }
            f(a[ia], b[ib])
        })
        .collect()
}
