//! The experimental cuBLASLt algorithm search of the GEMMs (`Builder::gemm_tune`,
//! `ops/src/gemm/cuda/tune.rs`) on CUDA: a new problem is timed once and every stream,
//! and every later runtime of the process, runs the one choice recorded.

mod common;

use common::*;
use rtx_ops::gemm::matmul;
use rtx_runtime::{bf16, DType, Runtime};

/// The cuBLASLt algorithm search (`Builder::gemm_tune`, experimental and off by default;
/// CUDA only): a new
/// batched problem submitted on every stream at once is timed (the counter moves) and
/// every stream then runs the one recorded choice, bit-equal and within tolerance of
/// f64; again later, and on a second runtime with tuning off, it stays bit-equal (the
/// choice is the process's).
#[test]
fn gemm_tuning_times_a_new_problem_and_every_stream_uses_its_choice() {
    if !rtx_runtime::cuda::present_for_tests() {
        return;
    }
    rtx_ops::set_poison_outputs(true);
    let cuda = |tune: bool| {
        Runtime::builder()
            .backend(rtx_runtime::Backend::Cuda(vec![]))
            .streams(4)
            .gemm_tune(tune)
            .build()
            .expect("building a CUDA runtime")
    };
    // A shape no other test uses (so this test's problem is new to the process).
    let (batch, m, n, k) = (6, 96, 160, 224);
    let (seed, mut r) = rng();
    let a: Vec<bf16> = rand_vec(&mut r, batch * m * k, -1.0, 1.0);
    let b: Vec<bf16> = rand_vec(&mut r, batch * k * n, -1.0, 1.0);
    let (want, scale) = matmul_ref(&a, &b, (batch, m, n, k));
    let on_every_stream = |rt: &Runtime| -> Vec<Vec<f64>> {
        let (ta, tb) = (
            upload(rt, &a, &[batch, m, k]),
            upload(rt, &b, &[batch, k, n]),
        );
        let subs: Vec<_> = rt
            .compute_streams(rt.device())
            .into_iter()
            .map(|s| {
                rt.submit_on(s, matmul(&ta, &tb))
                    .map_err(|e| e.error)
                    .unwrap()
            })
            .collect();
        subs.into_iter()
            .map(|s| download::<bf16>(rt, &s.wait().unwrap()))
            .collect()
    };
    let before = rtx_ops::gemm::gemm_tune_stats().0;
    let tuned = cuda(true);
    let mut outs = on_every_stream(&tuned);
    let searches = rtx_ops::gemm::gemm_tune_stats().0 - before;
    // Nothing is timed under the sanitizer, or with RTX_GEMM_TUNE=0 overriding the builder.
    let tuning_on = std::env::var("RTX_GEMM_TUNE").map_or(true, |v| v == "1");
    if std::env::var_os("RTX_UNDER_SANITIZER").is_none() && tuning_on {
        assert!(searches >= 1, "the new problem was not timed");
    }
    outs.extend(on_every_stream(&tuned));
    drop(tuned);
    outs.extend(on_every_stream(&cuda(false)));
    let tol = tol(DType::BF16);
    for (i, got) in outs.iter().enumerate() {
        let e = rel_err_scaled(got, &want, &scale);
        assert!(
            e <= tol,
            "run {i}: relative error {e:e} > {tol:e} (seed {seed})"
        );
        assert!(
            got.iter()
                .zip(&outs[0])
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "run {i} of {} differs bitwise from the first (seed {seed})",
            outs.len()
        );
    }
}
