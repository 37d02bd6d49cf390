//! Eager launch batching on CUDA (`Settings::launch_batching`,
//! `runtime/src/driver/batch.rs`): small element-wise ops queued behind each other on a
//! stream run as one batched launch. The results must be bitwise those of the ops'
//! own kernels, in stream order, whatever else is interleaved with them: ops that do not
//! batch (reductions), same-kind ops too large to batch or of another layout
//! (broadcast), ops reading from another stream, and in-place ops.

mod common;

use common::*;
use rtx_ops::elementwise as ew;
use rtx_runtime::{bf16, f16, Backend, Element, Runtime, StreamId, Tensor};

/// One chain per length; lengths around the batching bound (4096 elements) and odd ones.
const LENS: [usize; 6] = [1, 37, 1000, 4096, 4097, 6000];
/// Steps per chain (each a cycle of `step` below).
const STEPS: usize = 90;

fn pin(rt: &Runtime, s: StreamId, op: impl rtx_runtime::Op<Output = Tensor>) -> Tensor {
    let name = op.name();
    rt.submit_on(s, op)
        .unwrap_or_else(|e| panic!("{name}: {}", e.error))
        .into_outputs()
        .expect("one output")
}

/// Step `k` of a chain over `y` (all eight unary and six binary ops, bounded values:
/// `c` in [-1, 1], `d` in [1, 2]), with a reduction and a broadcast every 16 steps. The
/// chain moves to another stream every 7 steps (`streams` > 1), so that some inputs
/// come from another stream.
fn step(rt: &Runtime, k: usize, j: usize, y: Tensor, c: &Tensor, d: &Tensor) -> Tensor {
    let streams = rt.compute_streams(rt.device());
    let s = streams[(j + k / 7) % streams.len()];
    match k % 16 {
        0 => pin(rt, s, ew::sin(&y)),
        1 => pin(rt, s, ew::add(&y, c)),
        2 => pin(rt, s, ew::mul_(y, c)), // in place when the chain holds the only handle
        3 => pin(rt, s, ew::abs(&y)),
        4 => pin(rt, s, ew::sqrt_(y)),
        5 => pin(rt, s, ew::add(&y, d)),
        6 => pin(rt, s, ew::log(&y)),
        7 => pin(rt, s, ew::neg(&y)),
        8 => pin(rt, s, ew::exp(&y)),
        9 => pin(rt, s, ew::cos(&y)),
        10 => pin(rt, s, ew::sub(&y, c)),
        11 => pin(rt, s, ew::relu_(y)),
        12 => pin(rt, s, ew::maximum(&y, c)),
        13 => pin(rt, s, ew::minimum(&y, d)),
        14 => pin(rt, s, ew::div(&y, d)),
        _ => {
            // A reduction (never batched) and a broadcast subtraction (an op that may
            // batch, launched on its own: another layout).
            let m = pin(rt, s, rtx_ops::reduce::mean(&y));
            pin(rt, s, ew::sub(&y, &m))
        }
    }
}

/// Runs every chain, submitted step by step across the chains without waiting, and
/// downloads the results.
fn chains<T: Element>(rt: &Runtime, ys: &[Vec<T>], cs: &[Vec<T>], ds: &[Vec<T>]) -> Vec<Vec<T>> {
    let up = |h: &Vec<T>| rt.upload(h, [h.len()]).expect("upload");
    let c: Vec<Tensor> = cs.iter().map(up).collect();
    let d: Vec<Tensor> = ds.iter().map(up).collect();
    let mut y: Vec<Tensor> = ys.iter().map(up).collect();
    for k in 0..STEPS {
        for j in 0..y.len() {
            let cur = std::mem::replace(&mut y[j], c[j].clone());
            y[j] = step(rt, k, j, cur, &c[j], &d[j]);
        }
    }
    y.iter()
        .map(|t| t.to_vec::<T>().expect("the chain completes"))
        .collect()
}

fn cuda(streams: usize, batching: bool) -> Runtime {
    Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(streams)
        .launch_batching(batching)
        .build()
        .expect("building a CUDA runtime")
}

fn batched_equals_single<T: Element>(seed: u64, g: &mut rand::rngs::StdRng) {
    let ys: Vec<Vec<T>> = LENS.iter().map(|&n| rand_vec(g, n, -2.0, 2.0)).collect();
    let cs: Vec<Vec<T>> = LENS.iter().map(|&n| rand_vec(g, n, -1.0, 1.0)).collect();
    let ds: Vec<Vec<T>> = LENS.iter().map(|&n| rand_vec(g, n, 1.0, 2.0)).collect();
    // The CPU backend's kernels: the same ops, rounded to T at each step as on CUDA.
    let cpu = chains(&Runtime::cpu(1), &ys, &cs, &ds);
    for streams in [1, 4] {
        let mut results = Vec::new();
        for batching in [false, true] {
            let label = format!("{:?} cuda/{streams} batching={batching}", T::DTYPE);
            let rt = cuda(streams, batching);
            for round in 0..2 {
                let got = chains(&rt, &ys, &cs, &ds);
                for (i, (g, want)) in got.iter().zip(&cpu).enumerate() {
                    // 90 dependent steps, each rounded to T on both backends (whose f32
                    // exp, log, sin, cos differ by an ulp or two): 5× one op's tolerance.
                    let e = rel_err(&f64s(g), &f64s(want));
                    assert!(
                        e <= 5.0 * tol(T::DTYPE),
                        "{label} round {round} length {}: relative error {e:e} against \
                         the CPU backend (seed {seed})",
                        LENS[i]
                    );
                }
                results.push((label.clone(), got));
            }
            let b = rt.stats().launch_batches;
            if batching {
                // At least one launch carried two ops or more.
                assert!(b.ops > b.launches, "{label}: no launch was batched ({b:?})");
                eprintln!(
                    "{label}: {} ops in {} batch launches ({:.1} per launch)",
                    b.ops,
                    b.launches,
                    b.ops as f64 / b.launches as f64
                );
            } else {
                assert_eq!((b.launches, b.ops), (0, 0), "{label}: batched while off");
            }
        }
        let (first_label, first) = &results[0];
        for (label, r) in &results[1..] {
            for (i, (a, b)) in r.iter().zip(first).enumerate() {
                let same = a
                    .iter()
                    .zip(b)
                    .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits());
                assert!(
                    same,
                    "{label}: length {} differs bitwise from {first_label} (seed {seed})",
                    LENS[i]
                );
            }
        }
    }
}

/// Chains of small element-wise ops, interleaved across lengths and streams with ops
/// that do not batch, are bitwise equal with batching on and off (and within tolerance
/// of the CPU backend), on 1 and 4 streams; with it on, launches were batched.
#[test]
fn batched_launches_equal_single_launches() {
    if !rtx_runtime::cuda::present_for_tests() {
        return;
    }
    rtx_ops::set_poison_outputs(true);
    let (seed, mut g) = rng();
    batched_equals_single::<f32>(seed, &mut g);
    batched_equals_single::<f16>(seed, &mut g);
    batched_equals_single::<bf16>(seed, &mut g);
}

/// Products chained per (rows, width) case: y ← act(y · w_sᵀ + b_s).
const GEMM_CASES: [(usize, usize); 3] = [(64, 256), (200, 136), (2048, 256)];
const GEMM_STEPS: usize = 24;

/// Step `k` of a product chain: `linear` with the step's weights (relu, gelu and none in
/// turn), an element-wise add (another batch kernel) every 6 steps and a reduction (no
/// batching) every 8; the chain moves to another stream every 5 steps.
fn gemm_step(rt: &Runtime, k: usize, j: usize, y: Tensor, w: &[Tensor], b: &[Tensor]) -> Tensor {
    use rtx_ops::gemm::{linear, Activation};
    let streams = rt.compute_streams(rt.device());
    let s = streams[(j + k / 5) % streams.len()];
    let act = [Activation::Relu, Activation::Gelu, Activation::None][k % 3];
    let y = pin(
        rt,
        s,
        linear(&y, &w[k % w.len()], Some(&b[k % b.len()]), act),
    );
    if k % 6 == 5 {
        let z = pin(rt, s, ew::sin(&y));
        return pin(rt, s, ew::add(&y, &z));
    }
    if k % 8 == 7 {
        let m = pin(rt, s, rtx_ops::reduce::mean(&y));
        return pin(rt, s, ew::sub(&y, &m));
    }
    y
}

/// The product chains' inputs for one case: two chains' x (submitted one after the
/// other, so that products of one shape queue together), 3 weights and biases.
struct GemmCase<T> {
    xs: Vec<Vec<T>>,
    w: Vec<Vec<T>>,
    b: Vec<Vec<T>>,
}

fn gemm_chains<T: Element>(rt: &Runtime, cases: &[GemmCase<T>]) -> Vec<Vec<T>> {
    let mut ys = Vec::new();
    let mut ws = Vec::new();
    let mut bs = Vec::new();
    for (c, &(m, d)) in cases.iter().zip(&GEMM_CASES) {
        ys.push(
            c.xs.iter()
                .map(|x| rt.upload(x, [m, d]).expect("upload"))
                .collect::<Vec<_>>(),
        );
        ws.push(
            c.w.iter()
                .map(|w| rt.upload(w, [d, d]).expect("upload"))
                .collect::<Vec<_>>(),
        );
        bs.push(
            c.b.iter()
                .map(|b| rt.upload(b, [d]).expect("upload"))
                .collect::<Vec<_>>(),
        );
    }
    for k in 0..GEMM_STEPS {
        for j in 0..ys.len() {
            for y in ys[j].iter_mut() {
                let cur = std::mem::replace(y, bs[j][0].clone());
                *y = gemm_step(rt, k, j, cur, &ws[j], &bs[j]);
            }
        }
    }
    ys.iter()
        .flatten()
        .map(|t| t.to_vec::<T>().expect("the chain completes"))
        .collect()
}

fn gemm_batched_equals_single<T: Element>(seed: u64, g: &mut rand::rngs::StdRng) {
    let cases: Vec<GemmCase<T>> = GEMM_CASES
        .iter()
        .map(|&(m, d)| {
            // He-scaled weights keep the chain's magnitude about level through relu.
            let s = (2.0 / d as f64).sqrt();
            GemmCase {
                xs: (0..2).map(|_| rand_vec(g, m * d, -1.0, 1.0)).collect(),
                w: (0..3).map(|_| rand_vec(g, d * d, -s, s)).collect(),
                b: (0..3).map(|_| rand_vec(g, d, -0.1, 0.1)).collect(),
            }
        })
        .collect();
    let cpu = gemm_chains(&Runtime::cpu(1), &cases);
    for streams in [1, 4] {
        let mut results = Vec::new();
        for batching in [false, true] {
            let label = format!("{:?} products cuda/{streams} batching={batching}", T::DTYPE);
            let rt = cuda(streams, batching);
            for round in 0..2 {
                let got = gemm_chains(&rt, &cases);
                for (i, (g, want)) in got.iter().zip(&cpu).enumerate() {
                    // 24 chained products, each rounded to T (the CPU sums in another
                    // order): 5× one op's tolerance.
                    let e = rel_err(&f64s(g), &f64s(want));
                    assert!(
                        e <= 5.0 * tol(T::DTYPE),
                        "{label} round {round} case {:?}: relative error {e:e} against the \
                         CPU backend (seed {seed})",
                        GEMM_CASES[i / 2]
                    );
                }
                results.push((label.clone(), got));
            }
            let b = rt.stats().launch_batches;
            if batching {
                assert!(b.ops > b.launches, "{label}: no launch was batched ({b:?})");
                eprintln!(
                    "{label}: {} ops in {} batch launches ({:.1} per launch)",
                    b.ops,
                    b.launches,
                    b.ops as f64 / b.launches as f64
                );
            } else {
                assert_eq!((b.launches, b.ops), (0, 0), "{label}: batched while off");
            }
        }
        let (first_label, first) = &results[0];
        for (label, r) in &results[1..] {
            for (i, (a, b)) in r.iter().zip(first).enumerate() {
                let same = a
                    .iter()
                    .zip(b)
                    .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits());
                assert!(
                    same,
                    "{label}: case {:?} differs bitwise from {first_label} (seed {seed})",
                    GEMM_CASES[i / 2]
                );
            }
        }
    }
}

/// Chains of small f16/bf16 products (rtx's small-GEMM kernel, batched in a cooperative
/// launch with a grid barrier between steps), with tails in m and n, more tiles than
/// the batch's blocks (2048 rows), element-wise ops and reductions in between and
/// stream changes, are bitwise equal with batching on and off.
#[test]
fn batched_products_equal_single_launches() {
    if !rtx_runtime::cuda::present_for_tests() {
        return;
    }
    rtx_ops::set_poison_outputs(true);
    let (seed, mut g) = rng();
    gemm_batched_equals_single::<f16>(seed, &mut g);
    gemm_batched_equals_single::<bf16>(seed, &mut g);
}
