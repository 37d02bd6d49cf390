//! Shared helpers of the layer tests: host copies, the relative error by the norm,
//! the central finite-difference check of a list of gradients, randomized parameters,
//! and the CUDA runtime when a device is present (`reference.rs`: the f64 models).
#![allow(dead_code)]

pub mod reference;
#[path = "../../../ops/tests/common/shard.rs"]
mod shard;
#[allow(unused_imports)] // not every test file splits its cases
pub use shard::shard;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rtx_runtime::{Backend, Runtime, Tensor};
use rtx_train::Module;

/// The values of `t` as f64 (blocking).
pub fn host(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().expect("download")
}

/// `||got - want|| / ||want||` (NaN if `got` has a NaN).
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    if got.iter().any(|v| v.is_nan()) {
        return f64::NAN;
    }
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Uniform values in `[lo, hi)` from `seed`, rounded to f32 (so host and device see the
/// same numbers).
pub fn rand_vec(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(lo..hi) as f32 as f64).collect()
}

/// Uploads f64 values as f32.
pub fn upload(rt: &Runtime, v: &[f64], dims: &[usize]) -> Tensor {
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    rt.upload(&f, dims.to_vec()).expect("upload")
}

/// Moves every parameter of `m` by uniform `±spread` (from `seed`), so that layer
/// norms' ones and zeros become generic values; returns the new values.
pub fn jitter(rt: &Runtime, m: &mut impl Module, seed: u64, spread: f64) -> Vec<Vec<f64>> {
    let mut out = Vec::new();
    for (i, p) in m.parameters().iter_mut().enumerate() {
        let old = host(p.value());
        let d = rand_vec(
            seed.wrapping_add(i as u64 * 7919),
            old.len(),
            -spread,
            spread,
        );
        let new: Vec<f64> = old
            .iter()
            .zip(&d)
            .map(|(a, b)| (a + b) as f32 as f64)
            .collect();
        p.set_value(upload(rt, &new, p.value().dims()))
            .expect("same shape");
        out.push(new);
    }
    out
}

/// The parameters' values, in `parameters()` order.
pub fn values(m: &mut impl Module) -> Vec<Vec<f64>> {
    m.parameters().iter().map(|p| host(p.value())).collect()
}

/// The parameters' gradients, in `parameters()` order (panics on a missing one).
pub fn grads(m: &mut impl Module) -> Vec<Vec<f64>> {
    m.parameters()
        .iter()
        .map(|p| {
            host(
                p.grad()
                    .unwrap_or_else(|| panic!("{} has no gradient", p.name())),
            )
        })
        .collect()
}

/// Checks each `got[i]` against the central finite differences (step `h`, in f64) of
/// `loss` with respect to `at[i]`: `||got - fd|| / max(||fd||, 1e-2 · the largest
/// ||fd|| of the list)` below `tol`. The floor is for gradients that vanish exactly by
/// symmetry (a bias of the keys shifts every score of a row alike, which the softmax
/// ignores): those are checked against the scale of the others, as f32 rounding noise.
pub fn check_fd(
    what: &str,
    loss: impl Fn(&[Vec<f64>]) -> f64,
    at: &[Vec<f64>],
    got: &[Vec<f64>],
    names: &[String],
    h: f64,
    tol: f64,
) {
    assert_eq!(at.len(), got.len(), "{what}: tensor counts");
    let mut p = at.to_vec();
    let mut fds = Vec::with_capacity(at.len());
    for i in 0..at.len() {
        let fd: Vec<f64> = (0..at[i].len())
            .map(|j| {
                let x = p[i][j];
                p[i][j] = x + h;
                let up = loss(&p);
                p[i][j] = x - h;
                let down = loss(&p);
                p[i][j] = x;
                (up - down) / (2.0 * h)
            })
            .collect();
        fds.push(fd);
    }
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let scale = fds.iter().map(|f| norm(f)).fold(0.0, f64::max);
    for (i, (g, fd)) in got.iter().zip(&fds).enumerate() {
        assert_eq!(g.len(), fd.len(), "{what}: #{i} length");
        assert!(g.iter().all(|v| v.is_finite()), "{what}: #{i} not finite");
        let diff: Vec<f64> = g.iter().zip(fd).map(|(a, b)| a - b).collect();
        let e = norm(&diff) / norm(fd).max(1e-2 * scale).max(1e-300);
        let name = names.get(i).map_or("?", |s| s.as_str());
        assert!(
            e < tol,
            "{what}: {name} (#{i}) gradient error {e:e} (tol {tol:e})"
        );
    }
}

/// `Σ y · r`: the loss whose gradient with respect to `y` is `r`.
pub fn dot(y: &[f64], r: &[f64]) -> f64 {
    y.iter().zip(r).map(|(a, b)| a * b).sum()
}

/// A CUDA runtime with two streams, or `None` without a device (the test skips;
/// `present_for_tests` prints so, and `RTX_REQUIRE_CUDA=1` makes it fail).
pub fn cuda() -> Option<Runtime> {
    if !rtx_runtime::cuda::present_for_tests() {
        return None;
    }
    Some(
        Runtime::builder()
            .backend(Backend::Cuda(vec![]))
            .streams(2)
            .build()
            .expect("CUDA runtime"),
    )
}
