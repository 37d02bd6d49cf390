//! GEMM on every backend: parity with an f64 reference (odd sizes, transposes,
//! batches, broadcast, TF32 opt-in), the linear epilogues, bit-identical results on
//! 4 concurrent streams, and bad input.
//!
//! Tolerances (relative error by the norm, against f64 computed from the rounded
//! inputs): f32 1e-5 up to K = 256, growing as sqrt(K/256) beyond: with f32
//! accumulation the error of a length-K dot product of random terms grows like
//! eps·sqrt(K) (about 1e-6 at K = 256, so ≥10x margin at every K); TF32 2e-3 (inputs
//! rounded to 10 mantissa bits, unit roundoff 4.9e-4); f16 and bf16 1e-2.

mod common;

use common::*;
use rand::seq::SliceRandom;
use rtx_ops::gemm::{gemm_lt_fallbacks, gemm_plan_cache_stats, linear, matmul, Activation};
use rtx_runtime::{bf16, f16, BackendKind, DType, Element, Error, Runtime, Tensor};

const SIZES: [usize; 5] = [1, 7, 33, 129, 257];

/// One product: sizes, transposes and which side (if any) is broadcast.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: &'static [usize],
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    a_bcast: bool,
    b_bcast: bool,
}

impl Case {
    fn plain(m: usize, n: usize, k: usize, ta: bool, tb: bool) -> Case {
        Case {
            batch: &[],
            m,
            n,
            k,
            ta,
            tb,
            a_bcast: false,
            b_bcast: false,
        }
    }
    fn a_shape(&self) -> Vec<usize> {
        let mut s = if self.a_bcast {
            vec![]
        } else {
            self.batch.to_vec()
        };
        s.extend(if self.ta {
            [self.k, self.m]
        } else {
            [self.m, self.k]
        });
        s
    }
    fn b_shape(&self) -> Vec<usize> {
        let mut s = if self.b_bcast {
            vec![]
        } else {
            self.batch.to_vec()
        };
        s.extend(if self.tb {
            [self.n, self.k]
        } else {
            [self.k, self.n]
        });
        s
    }
    fn nbatch(&self) -> usize {
        self.batch.iter().product()
    }
}

/// The f64 reference of `case` on row-major `a`, `b`.
fn reference(c: &Case, a: &[f64], b: &[f64]) -> Vec<f64> {
    let (m, n, k) = (c.m, c.n, c.k);
    let a_bs = if c.a_bcast { 0 } else { m * k };
    let b_bs = if c.b_bcast { 0 } else { k * n };
    let mut out = vec![0f64; c.nbatch() * m * n];
    for bi in 0..c.nbatch() {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for p in 0..k {
                    let av = a[bi * a_bs + if c.ta { p * m + i } else { i * k + p }];
                    let bv = b[bi * b_bs + if c.tb { j * k + p } else { p * n + j }];
                    s += av * bv;
                }
                out[(bi * m + i) * n + j] = s;
            }
        }
    }
    out
}

fn f32_tol(k: usize) -> f64 {
    1e-5 * (k as f64 / 256.0).sqrt().max(1.0)
}

fn tol_for<T: Element>(k: usize, tf32: bool) -> f64 {
    match T::DTYPE {
        DType::F32 if tf32 => 2e-3,
        DType::F32 => f32_tol(k),
        _ => 1e-2,
    }
}

fn run(rt: &Runtime, op: impl rtx_runtime::Op<Output = Tensor>) -> Tensor {
    match rt.submit(op) {
        Ok(s) => s.wait().expect("op failed"),
        Err(e) => panic!("submit rejected: {}", e.error),
    }
}

fn check_case<T: Element>(rt: &Runtime, label: &str, c: &Case, tf32: bool) {
    let (seed, mut r) = rng();
    let (sa, sb) = (c.a_shape(), c.b_shape());
    let a: Vec<T> = rand_vec(&mut r, sa.iter().product(), -1.0, 1.0);
    let b: Vec<T> = rand_vec(&mut r, sb.iter().product(), -1.0, 1.0);
    let mut op = matmul(&upload(rt, &a, &sa), &upload(rt, &b, &sb));
    if c.ta {
        op = op.trans_a();
    }
    if c.tb {
        op = op.trans_b();
    }
    if tf32 {
        op = op.tf32();
    }
    let y = run(rt, op);
    let mut want_shape = c.batch.to_vec();
    want_shape.extend([c.m, c.n]);
    assert_eq!(y.dims(), &want_shape[..], "{label} {c:?}");
    let got = download::<T>(rt, &y);
    let (a, b) = (f64s(&a), f64s(&b));
    let want = reference(c, &a, &b);
    let scale = reference(c, &abs_all(&a), &abs_all(&b));
    let e = rel_err_scaled(&got, &want, &scale);
    let tol = tol_for::<T>(c.k, tf32);
    assert!(
        e <= tol,
        "{label} {} tf32={tf32} {c:?}: relative error {e:e} > {tol:e} (seed {seed})",
        T::DTYPE
    );
}

/// Random (m, n, k) from SIZES for each transpose combination, plus the extremes.
fn plain_cases(per_combo: usize) -> Vec<Case> {
    let (_, mut r) = rng();
    let mut v = Vec::new();
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        v.push(Case::plain(1, 1, 1, ta, tb));
        v.push(Case::plain(257, 129, 257, ta, tb));
        for _ in 0..per_combo {
            let pick = |r: &mut _| *SIZES.choose(r).unwrap();
            v.push(Case::plain(
                pick(&mut r),
                pick(&mut r),
                pick(&mut r),
                ta,
                tb,
            ));
        }
    }
    v
}

backend_test!(matmul_matches_f64_odd_sizes_and_transposes, |rt, label| {
    for c in plain_cases(4) {
        check_case::<f32>(rt, label, &c, false);
        check_case::<f16>(rt, label, &c, false);
        check_case::<bf16>(rt, label, &c, false);
    }
});

backend_test!(matmul_tf32_is_opt_in_and_within_2e3, |rt, label| {
    for c in [
        Case::plain(129, 257, 257, false, false),
        Case::plain(33, 7, 129, true, true),
    ] {
        check_case::<f32>(rt, label, &c, true);
        check_case::<f32>(rt, label, &c, false);
    }
});

fn batched_cases() -> Vec<Case> {
    let mut v = Vec::new();
    let shapes: [(&'static [usize], usize, usize, usize); 3] =
        [(&[3], 33, 7, 129), (&[2, 3], 7, 33, 1), (&[4], 129, 65, 33)];
    for (batch, m, n, k) in shapes {
        for (ta, tb) in [(false, false), (true, true), (false, true)] {
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

backend_test!(matmul_batched_and_broadcast, |rt, label| {
    for c in batched_cases() {
        check_case::<f32>(rt, label, &c, false);
        check_case::<f16>(rt, label, &c, false);
        check_case::<bf16>(rt, label, &c, false);
    }
});

fn act_ref(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::Gelu => {
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh();
            0.5 * x * (1.0 + t)
        }
    }
}

/// `linear` with `x` `[lead.., k]` and `w` `[n, k]`, or with `stacked` a `w` of
/// `[lead[0], n, k]` (one layer per leading index, `x` 3-D), against f64.
fn linear_case<T: Element>(
    rt: &Runtime,
    label: &str,
    lead: &[usize],
    k: usize,
    n: usize,
    stacked: bool,
) {
    let (seed, mut r) = rng();
    let rows: usize = lead.iter().product();
    let layers = if stacked { lead[0] } else { 1 };
    let m = rows / layers;
    let mut xs = lead.to_vec();
    xs.push(k);
    let ws: Vec<usize> = if stacked {
        vec![layers, n, k]
    } else {
        vec![n, k]
    };
    let x: Vec<T> = rand_vec(&mut r, rows * k, -1.0, 1.0);
    let w: Vec<T> = rand_vec(&mut r, layers * n * k, -1.0, 1.0);
    let bias: Vec<T> = rand_vec(&mut r, n, -1.0, 1.0);
    let c = Case::plain(m, n, k, false, true);
    let (xf, wf) = (f64s(&x), f64s(&w));
    // Layer by layer: each is a plain product of its own x rows and w.
    let per_layer = |x: &[f64], w: &[f64]| -> Vec<f64> {
        (0..layers)
            .flat_map(|l| reference(&c, &x[l * m * k..][..m * k], &w[l * n * k..][..n * k]))
            .collect()
    };
    let prod = per_layer(&xf, &wf);
    let mag = per_layer(&abs_all(&xf), &abs_all(&wf));
    for act in [Activation::None, Activation::Relu, Activation::Gelu] {
        for with_bias in [false, true] {
            let bt = with_bias.then(|| upload(rt, &bias, &[n]));
            let y = run(
                rt,
                linear(&upload(rt, &x, &xs), &upload(rt, &w, &ws), bt.as_ref(), act),
            );
            let mut ys = lead.to_vec();
            ys.push(n);
            assert_eq!(y.dims(), &ys[..]);
            let bf = f64s(&bias);
            let want: Vec<f64> = (0..rows * n)
                .map(|i| act_ref(act, prod[i] + if with_bias { bf[i % n] } else { 0.0 }))
                .collect();
            // The activations' slopes are at most 1.13 (GELU), so |X|·|W| + |bias|
            // bounds the result's rounding as it does the product's.
            let scale: Vec<f64> = (0..rows * n)
                .map(|i| mag[i] + if with_bias { bf[i % n].abs() } else { 0.0 })
                .collect();
            let e = rel_err_scaled(&download::<T>(rt, &y), &want, &scale);
            let tol = tol_for::<T>(k, false);
            assert!(
                e <= tol,
                "{label} {} linear {lead:?}x{k}->{n} stacked={stacked} {act:?} bias={with_bias}: error {e:e} > {tol:e} (seed {seed})",
                T::DTYPE
            );
        }
    }
}

backend_test!(linear_with_each_epilogue, |rt, label| {
    // Each case has at least 33 outputs: the relative error by the norm of a single
    // output is meaningless when the bias cancels the product.
    let cases = [
        (&[2usize, 5][..], 33, 7),
        (&[129][..], 257, 33),
        (&[1][..], 1, 33),
        (&[33][..], 7, 1),
    ];
    for (lead, k, n) in cases {
        linear_case::<f32>(rt, label, lead, k, n, false);
        linear_case::<f16>(rt, label, lead, k, n, false);
        linear_case::<bf16>(rt, label, lead, k, n, false);
    }
});

backend_test!(stacked_linear_with_each_epilogue, |rt, label| {
    // Layers × rows × in -> out: odd sizes, one row per layer, and the 8-chain's shape.
    let cases = [
        (&[3usize, 11][..], 33, 7),
        (&[2, 1][..], 129, 33),
        (&[5, 33][..], 7, 65),
        (&[8, 256][..], 256, 256),
    ];
    for (lead, k, n) in cases {
        linear_case::<f32>(rt, label, lead, k, n, true);
        linear_case::<f16>(rt, label, lead, k, n, true);
        linear_case::<bf16>(rt, label, lead, k, n, true);
    }
});

/// 16 independent products of varied shapes and dtypes, as tensors on `rt`.
fn sixteen_products(rt: &Runtime, seed: u64) -> Vec<(DType, Tensor, Tensor, bool)> {
    use rand::SeedableRng;
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..16)
        .map(|i| {
            let (m, n, k) = (SIZES[i % 5], SIZES[(i + 2) % 5], SIZES[(i + 4) % 5].max(33));
            let tb = i % 3 == 0;
            let bs = if tb { [n, k] } else { [k, n] };
            match i % 3 {
                0 => {
                    let a: Vec<f32> = rand_vec(&mut r, m * k, -1.0, 1.0);
                    let b: Vec<f32> = rand_vec(&mut r, k * n, -1.0, 1.0);
                    (DType::F32, upload(rt, &a, &[m, k]), upload(rt, &b, &bs), tb)
                }
                1 => {
                    let a: Vec<f16> = rand_vec(&mut r, m * k, -1.0, 1.0);
                    let b: Vec<f16> = rand_vec(&mut r, k * n, -1.0, 1.0);
                    (DType::F16, upload(rt, &a, &[m, k]), upload(rt, &b, &bs), tb)
                }
                _ => {
                    let a: Vec<bf16> = rand_vec(&mut r, m * k, -1.0, 1.0);
                    let b: Vec<bf16> = rand_vec(&mut r, k * n, -1.0, 1.0);
                    (
                        DType::BF16,
                        upload(rt, &a, &[m, k]),
                        upload(rt, &b, &bs),
                        tb,
                    )
                }
            }
        })
        .collect()
}

/// Raw bits of a tensor, for bit-exact comparison.
fn bits(rt: &Runtime, dt: DType, t: &Tensor) -> Vec<u32> {
    match dt {
        DType::F32 => rt
            .to_vec::<f32>(t)
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        DType::F16 => rt
            .to_vec::<f16>(t)
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .map(|v| v.to_bits() as u32)
            .collect(),
        _ => rt
            .to_vec::<bf16>(t)
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .map(|v| v.to_bits() as u32)
            .collect(),
    }
}

backend_test!(
    gemms_on_four_streams_match_one_stream_bit_exactly,
    |rt, label| {
        let streams = rt.compute_streams(rt.device());
        let seed: u64 = rand::random();
        let products = sixteen_products(rt, seed);
        let submit_all = |pick: &dyn Fn(usize) -> usize| -> Vec<Tensor> {
            let subs: Vec<_> = products
                .iter()
                .enumerate()
                .map(|(i, (_, a, b, tb))| {
                    let op = if *tb {
                        matmul(a, b).trans_b()
                    } else {
                        matmul(a, b)
                    };
                    rt.submit_on(streams[pick(i)], op)
                        .map_err(|e| e.error)
                        .unwrap()
                })
                .collect();
            subs.into_iter().map(|s| s.wait().unwrap()).collect()
        };
        let one = submit_all(&|_| 0);
        let spread = submit_all(&|i| i % streams.len());
        for (i, ((dt, ..), (x, y))) in products.iter().zip(one.iter().zip(&spread)).enumerate() {
            assert_eq!(
                bits(rt, *dt, x),
                bits(rt, *dt, y),
                "{label}: product {i} ({dt}) differs between 1 stream and {} streams (seed {seed})",
                streams.len()
            );
        }
    }
);

/// One larger product (beyond the odd sizes above), submitted on every stream at once,
/// so the streams build their plans concurrently: every stream's result must be
/// bit-equal, and each must match the f64 reference.
fn large_case<T: Element>(
    rt: &Runtime,
    label: &str,
    (m, n, k): (usize, usize, usize),
    tb: bool,
    tf32: bool,
) {
    let streams = rt.compute_streams(rt.device());
    let (seed, mut r) = rng();
    let c = Case::plain(m, n, k, false, tb);
    let (sa, sb) = (c.a_shape(), c.b_shape());
    let a: Vec<T> = rand_vec(&mut r, m * k, -1.0, 1.0);
    let b: Vec<T> = rand_vec(&mut r, k * n, -1.0, 1.0);
    let (ta, tbt) = (upload(rt, &a, &sa), upload(rt, &b, &sb));
    let subs: Vec<_> = streams
        .iter()
        .map(|&s| {
            let mut op = matmul(&ta, &tbt);
            if tb {
                op = op.trans_b();
            }
            if tf32 {
                op = op.tf32();
            }
            rt.submit_on(s, op).map_err(|e| e.error).unwrap()
        })
        .collect();
    let outs: Vec<Vec<f64>> = subs
        .into_iter()
        .map(|s| download::<T>(rt, &s.wait().unwrap()))
        .collect();
    let (a, b) = (f64s(&a), f64s(&b));
    let want = reference(&c, &a, &b);
    let scale = reference(&c, &abs_all(&a), &abs_all(&b));
    let tol = tol_for::<T>(k, tf32);
    for (i, got) in outs.iter().enumerate() {
        let e = rel_err_scaled(got, &want, &scale);
        assert!(
            e <= tol,
            "{label} {} {m}x{n}x{k} tb={tb} stream {i}: relative error {e:e} > {tol:e} (seed {seed})",
            T::DTYPE
        );
        let same = got
            .iter()
            .zip(&outs[0])
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same,
            "{label} {} {m}x{n}x{k}: stream {i} differs from stream 0 (seed {seed})",
            T::DTYPE
        );
    }
}

backend_test!(
    large_gemms_agree_across_streams_and_with_the_reference,
    |rt, label| {
        large_case::<bf16>(rt, label, (512, 512, 512), false, false);
        large_case::<f16>(rt, label, (640, 384, 1024), true, false);
        large_case::<f32>(rt, label, (512, 1024, 256), false, true);
    }
);

backend_test!(plan_cache_hits_on_repeat, |rt, label| {
    if rt.backend() != BackendKind::Cuda {
        return;
    }
    let s0 = rt.compute_streams(rt.device())[0];
    let a = upload(rt, &[1.0f32; 33 * 7], &[33, 7]);
    let b = upload(rt, &[1.0f32; 7 * 5], &[7, 5]);
    let once = || {
        rt.submit_on(s0, matmul(&a, &b))
            .map_err(|e| e.error)
            .unwrap()
            .wait()
            .unwrap()
    };
    once();
    let (hits, misses) = gemm_plan_cache_stats();
    once();
    once();
    let (hits2, misses2) = gemm_plan_cache_stats();
    // Other tests run concurrently, so only lower bounds hold.
    assert!(hits2 >= hits + 2, "{label}: hits {hits} -> {hits2}");
    assert!(misses2 >= misses, "{label}: misses {misses} -> {misses2}");
    eprintln!(
        "{label}: GEMM plans on the cuBLAS fallback: {}",
        gemm_lt_fallbacks()
    );
});

backend_test!(
    bad_input_is_rejected_with_typed_errors_and_given_back,
    |rt, label| {
        let t = |d: &[usize]| upload(rt, &vec![0.5f32; d.iter().product()], d);
        let expect_shape =
            |e: &Error| assert!(matches!(e, Error::ShapeMismatch { .. }), "{label}: {e}");
        // rank < 2
        let (a, b) = (t(&[4]), t(&[4, 3]));
        let e = rt.submit(matmul(&a, &b)).unwrap_err();
        expect_shape(&e.error);
        let (ga, gb) = e.into_op().into_inputs();
        assert!(ga.same_storage(&a) && gb.same_storage(&b));
        // inner dims
        let e = rt.submit(matmul(&t(&[3, 4]), &t(&[5, 6]))).unwrap_err();
        expect_shape(&e.error);
        assert!(
            e.error.to_string().contains("[3, 4]") && e.error.to_string().contains("[5, 6]"),
            "{}",
            e.error
        );
        // inner dims after a transpose
        let e = rt
            .submit(matmul(&t(&[3, 4]), &t(&[3, 5])).trans_b())
            .unwrap_err();
        expect_shape(&e.error);
        // batch mismatch
        let e = rt
            .submit(matmul(&t(&[2, 3, 4]), &t(&[3, 4, 5])))
            .unwrap_err();
        expect_shape(&e.error);
        // dtype mismatch
        let h = upload(rt, &[f16::ONE; 20], &[4, 5]);
        let e = rt.submit(matmul(&t(&[3, 4]), &h)).unwrap_err();
        assert!(
            matches!(e.error, Error::DTypeMismatch { .. }),
            "{label}: {}",
            e.error
        );
        assert!(e.into_op().into_inputs().1.same_storage(&h));
        // unsupported dtype
        let ints = upload(rt, &[1i32; 12], &[3, 4]);
        let e = rt.submit(matmul(&ints, &ints)).unwrap_err();
        assert!(
            matches!(e.error, Error::DTypeMismatch { .. }),
            "{label}: {}",
            e.error
        );
        // linear: bias length, in_features, dtype
        let bias = t(&[4]);
        let e = rt
            .submit(linear(
                &t(&[2, 8]),
                &t(&[5, 8]),
                Some(&bias),
                Activation::Relu,
            ))
            .unwrap_err();
        expect_shape(&e.error);
        assert!(e.into_op().into_inputs().2.unwrap().same_storage(&bias));
        let e = rt
            .submit(linear(&t(&[2, 8]), &t(&[5, 7]), None, Activation::None))
            .unwrap_err();
        expect_shape(&e.error);
        // stacked linear: the layers of x and w differ; a bias per layer
        let (xs, ws) = (t(&[3, 2, 8]), t(&[4, 5, 8]));
        let e = rt
            .submit(linear(&xs, &ws, None, Activation::Relu))
            .unwrap_err();
        expect_shape(&e.error);
        assert!(e.error.to_string().contains("stacked"), "{}", e.error);
        let (gx, gw, _) = e.into_op().into_inputs();
        assert!(gx.same_storage(&xs) && gw.same_storage(&ws));
        let e = rt
            .submit(linear(
                &t(&[4, 2, 8]),
                &ws,
                Some(&t(&[4, 5])),
                Activation::None,
            ))
            .unwrap_err();
        expect_shape(&e.error);
        let hb = upload(rt, &[f16::ONE; 5], &[5]);
        let e = rt
            .submit(linear(
                &t(&[2, 8]),
                &t(&[5, 8]),
                Some(&hb),
                Activation::Gelu,
            ))
            .unwrap_err();
        assert!(
            matches!(e.error, Error::DTypeMismatch { .. }),
            "{label}: {}",
            e.error
        );
    }
);
