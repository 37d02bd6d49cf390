//! The TMA backward main kernel (the setting `attn_bwd_tma`, on by default) against the f64
//! reference and, bitwise, against the wgmma backward.

use crate::cases::*;
use crate::common::{download, for_each_cuda_with, rand_vec, rng, upload};
use rtx_runtime::{bf16, f16, DType, Runtime, Tensor};

/// Whether `rt` has a compute capability 9.0 device, where the TMA kernels run (elsewhere
/// their fallbacks do).
fn hopper(rt: &Runtime) -> bool {
    rt.info()
        .devices
        .iter()
        .any(|d| d.compute_capability == Some((9, 0)))
}

/// The TMA backward main kernel (the setting `attn_bwd_tma`, on by default; compute
/// capability 9.0, elsewhere the setting changes nothing): the grids above (D 64 and 128),
/// GQA and MQA, lengths off its query steps (64 rows at D = 128, 128 at D = 64) and
/// 128-key blocks, Lq ≠ Lk, 4097 × 4097,
/// fully masked rows; CUDA only.
#[test]
fn tma_backward_parity_cuda() {
    for_each_cuda_with(
        |b| b.attn_bwd_tma(true),
        "tma-bwd",
        |rt, label| {
            assert!(rt.settings().attn_bwd_tma);
            let launched = rtx_ops::attention::tma_backward_launches();

            for dims in [
                (1, 2, 2, 1, 1),
                (1, 2, 2, 17, 17),
                (2, 4, 2, 77, 200),
                (1, 4, 1, 33, 65),
                (1, 2, 2, 1, 1000),
                (1, 2, 2, 1000, 17),
                (1, 2, 2, 1000, 1000),
            ] {
                run_all(rt, label, &grid(dtypes(rt), dims));
            }
            let long = first_whole(label, false, grid(dtypes(rt), (1, 2, 2, 4097, 4097)));
            run_all(rt, label, &long);
            for (&dtype, d) in dtypes(rt).iter().flat_map(|t| [(t, 64), (t, 128)]) {
                let c = Case {
                    dtype,
                    b: 1,
                    h: 2,
                    h_kv: 1,
                    lq: 130,
                    lk: 200,
                    d,
                    causal: false,
                    mask: Mask::Full,
                    scale: None,
                };
                match dtype {
                    DType::F16 => fully_masked_t::<f16>(rt, label, &c),
                    _ => fully_masked_t::<bf16>(rt, label, &c),
                }
            }
            // On compute capability 9.0 the TMA kernel itself ran (not its fallback after
            // a failed load or refused tensor maps).
            if hopper(rt) {
                assert!(
                    rtx_ops::attention::tma_backward_launches() > launched,
                    "{label}: flash_bwd_tma never launched"
                );
            }
        },
    );
}

/// The TMA backward's dK and dV are bitwise those of the wgmma backward at D = 128 (the
/// same GEMMs in the same order; dq differs only in the order its f32 reductions land),
/// and repeat bit for bit at D = 128 and 64 (where no other kernel takes 128-row steps, so
/// the first run is the reference): a race on a stage or a dS^T buffer would show here.
/// CUDA only.
#[test]
fn tma_backward_matches_wgmma_bitwise_cuda() {
    for_each_cuda_with(
        |b| b.attn_bwd_tma(true),
        "tma-bwd",
        |tma, label| {
            // (RTX_ATTN_BWD_TMA=1 in the environment would turn the TMA kernel on here too.)
            let base = rtx_runtime::Runtime::builder()
                .backend(rtx_runtime::Backend::Cuda(vec![]))
                .streams(1)
                .attn_bwd_tma(false)
                .build()
                .expect("a CUDA runtime");
            let cases = [
                (2, 4, 2, 1000, 1000, false),
                (2, 4, 2, 1000, 1000, true),
                (1, 4, 1, 777, 300, false),
            ];
            let cases = [128, 64].into_iter().flat_map(|d| {
                cases.map(|(b, h, h_kv, lq, lk, causal)| (b, h, h_kv, lq, lk, causal, d))
            });
            for (b, h, h_kv, lq, lk, causal, d) in cases {
                let c = Case {
                    dtype: DType::BF16,
                    b,
                    h,
                    h_kv,
                    lq,
                    lk,
                    d,
                    causal,
                    mask: Mask::None,
                    scale: None,
                };
                let (_seed, mut r) = rng();
                let q: Vec<bf16> = rand_vec(&mut r, c.q_dims().iter().product(), -2.0, 2.0);
                let k: Vec<bf16> = rand_vec(&mut r, c.kv_dims().iter().product(), -2.0, 2.0);
                let v: Vec<bf16> = rand_vec(&mut r, c.kv_dims().iter().product(), -2.0, 2.0);
                let g: Vec<bf16> = rand_vec(&mut r, c.q_dims().iter().product(), -1.0, 1.0);
                let grads = |rt: &Runtime| {
                    let (tq, tk, tv) = (
                        upload(rt, &q, &c.q_dims()),
                        upload(rt, &k, &c.kv_dims()),
                        upload(rt, &v, &c.kv_dims()),
                    );
                    let tg = upload(rt, &g, &c.q_dims());
                    let (_, _, _, dk, dv) = submit_both(rt, &c, &tq, &tk, &tv, None, &tg);
                    let bits = |t: &Tensor| {
                        download::<bf16>(rt, t)
                            .iter()
                            .map(|x| x.to_bits())
                            .collect::<Vec<u64>>()
                    };
                    (bits(&dk), bits(&dv))
                };
                let (want, whose) = if d == 128 {
                    (grads(&base), "the wgmma backward's")
                } else {
                    (grads(tma), "its first run's")
                };
                for rep in 0..3 {
                    let got = grads(tma);
                    assert!(
                        got.0 == want.0 && got.1 == want.1,
                        "{label} {c:?} run {rep}: dk or dv differs from {whose} bits"
                    );
                }
            }
        },
    );
}

/// The TMA forward (compute capability 9.0): calls without a mask run its build without
/// the mask's loads (`flash_fwd_tma_nm_*`: D = 64 with 3 consumer warpgroups, D = 128),
/// calls with one the masked build (D = 128; the wgmma forward at D = 64); all against the
/// f64 reference over the grid (every mask kind, causal and not, lengths off the 128- and
/// 192-row and 128-key tiles, GQA). CUDA only.
#[test]
fn tma_forward_masked_and_maskless_cuda() {
    for_each_cuda_with(
        |b| b.attn_wgmma(true),
        "tma-fwd",
        |rt, label| {
            let (masked, maskless) = rtx_ops::attention::tma_forward_launches();
            for dims in [(1, 2, 2, 17, 17), (2, 4, 2, 77, 200), (1, 2, 2, 1000, 1000)] {
                run_all(rt, label, &grid(dtypes(rt), dims));
            }
            if hopper(rt) {
                let (m, nm) = rtx_ops::attention::tma_forward_launches();
                assert!(
                    m > masked,
                    "{label}: flash_fwd_tma never launched for a masked call"
                );
                assert!(nm > maskless, "{label}: flash_fwd_tma_nm never launched");
            }
        },
    );
}

/// The TMA forward's persistent grid (calls of up to 4096 keys: at most one block per SM,
/// the blocks claiming work tiles from the launch's counters, the K / V ring and the
/// consumers' turns running on from one tile to the next): shapes with more work tiles
/// than the H100's and H200's 132 SMs (3 × 8 heads × 1000 rows: 192 tiles of 128 rows at
/// D = 128, 144 of 192 at D = 64), so that some blocks take two, with and without a mask,
/// GQA, causal and not, against the f64 reference; then twelve launches of one call in a
/// row, bit for bit the same (the counters start every launch at 0). CUDA only.
#[test]
fn tma_forward_persistent_grid_cuda() {
    for_each_cuda_with(
        |b| b.attn_wgmma(true),
        "tma-fwd-persistent",
        |rt, label| {
            let (masked, maskless) = rtx_ops::attention::tma_forward_launches();
            let dt = dtypes(rt);
            let mut cases = Vec::new();
            for (i, (d, causal, mask)) in [
                (128, false, Mask::None),
                (128, false, Mask::Plane),
                (64, false, Mask::None),
                (64, false, Mask::Full),
                (128, true, Mask::None),
            ]
            .into_iter()
            .enumerate()
            {
                cases.push(Case {
                    dtype: dt[i % dt.len()],
                    b: 3,
                    h: 8,
                    h_kv: 2,
                    lq: 1000,
                    lk: 1000,
                    d,
                    causal,
                    mask,
                    scale: None,
                });
            }
            run_all(rt, label, &cases);
            // Launch after launch: the work-tile counters come back to 0 each time (a claim
            // left over would make the next launch skip tiles, leaving their rows as the
            // allocator found them), so twelve forwards of one call give the first's bits.
            for (d, causal) in [(128, false), (64, false), (128, true)] {
                let (seed, mut r) = rng();
                let dims = [3, 8, 1000, d];
                let n: usize = dims.iter().product();
                let [q, k, v] =
                    [(); 3].map(|_| upload(rt, &rand_vec::<bf16>(&mut r, n, -2.0, 2.0), &dims));
                let mut first: Option<Vec<f64>> = None;
                for i in 0..12 {
                    let (o, _lse) = rt
                        .submit(rtx_ops::attention::attention(&q, &k, &v).causal(causal))
                        .expect("submit attention")
                        .wait()
                        .expect("attention");
                    let got = download::<bf16>(rt, &o);
                    match &first {
                        None => first = Some(got),
                        Some(want) => assert!(
                            got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{label} D={d} causal={causal} (seed {seed}): launch {i} differs from the first"
                        ),
                    }
                }
            }
            if hopper(rt) {
                let (m, nm) = rtx_ops::attention::tma_forward_launches();
                assert!(m > masked, "{label}: flash_fwd_tma never launched");
                assert!(
                    nm >= maskless + 3,
                    "{label}: flash_fwd_tma_nm launched {} times, not 3",
                    nm - maskless
                );
            }
        },
    );
}
