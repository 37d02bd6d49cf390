//! Small GEMMs planned for a share of the device (`Builder::gemm_sm_share`, cuBLASLt's
//! `SM_COUNT_TARGET`): the setting resolves to the stream count when 0, and on CUDA the
//! products planned that way (small and large, on every stream at once) stay within
//! tolerance of f64.

mod common;

use common::*;
use rtx_ops::gemm::matmul;
use rtx_runtime::{bf16, Backend, DType, Runtime};

#[test]
fn a_zero_share_resolves_to_the_compute_streams_per_device() {
    if std::env::var_os("RTX_GEMM_SM_SHARE").is_some() {
        return; // the environment overrides the builder
    }
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(3)
        .gemm_sm_share(0)
        .build()
        .unwrap();
    assert_eq!(rt.settings().gemm_sm_share, 3);
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(5)
        .build()
        .unwrap();
    assert_eq!(
        rt.settings().gemm_sm_share,
        5,
        "the default is the stream count"
    );
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(5)
        .gemm_sm_share(1)
        .build()
        .unwrap();
    assert_eq!(
        rt.settings().gemm_sm_share,
        1,
        "1 plans for the whole device"
    );
}

#[test]
fn products_planned_for_a_share_of_the_device_match_f64() {
    if !rtx_runtime::cuda::present_for_tests() {
        return;
    }
    rtx_ops::set_poison_outputs(true);
    let rt = Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(8)
        .build()
        .expect("building a CUDA runtime");
    if std::env::var_os("RTX_GEMM_SM_SHARE").is_none() {
        assert_eq!(rt.settings().gemm_sm_share, 8);
    }
    let (seed, mut r) = rng();
    // 256³ is small (planned for 1/8 of the device), 1024 x 1024 x 256 is not.
    for (m, n, k) in [(256, 256, 256), (200, 72, 136), (1024, 1024, 256)] {
        let a: Vec<bf16> = rand_vec(&mut r, m * k, -1.0, 1.0);
        let b: Vec<bf16> = rand_vec(&mut r, k * n, -1.0, 1.0);
        let (want, scale) = matmul_ref(&a, &b, (1, m, n, k));
        let (ta, tb) = (upload(&rt, &a, &[m, k]), upload(&rt, &b, &[k, n]));
        let subs: Vec<_> = rt
            .compute_streams(rt.device())
            .into_iter()
            .map(|s| {
                rt.submit_on(s, matmul(&ta, &tb))
                    .map_err(|e| e.error)
                    .unwrap()
            })
            .collect();
        for (i, s) in subs.into_iter().enumerate() {
            let got = download::<bf16>(&rt, &s.wait().unwrap());
            let e = rel_err_scaled(&got, &want, &scale);
            let tol = tol(DType::BF16);
            assert!(
                e <= tol,
                "{m}x{n}x{k} on stream {i}: relative error {e:e} > {tol:e} (seed {seed})"
            );
        }
    }
}
