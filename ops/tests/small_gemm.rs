//! rtx's own kernel for small f16/bf16 `linear` products (`Builder::small_gemm`,
//! `kernels/cuda/small_gemm.cu`): on CUDA, every epilogue, odd row counts, tile tails,
//! stacked and broadcast layers, against f64 with poisoned outputs; the kernel is what
//! ran (its launch counter moves, and stays put with the setting off or for products it
//! does not take); its results are bitwise the same on every stream, and within
//! tolerance of cuBLASLt's; captured products keep cuBLASLt with the default
//! `SmallGemm::Eager` and take the kernel with `SmallGemm::Always` (then a replay is
//! bitwise equal to the eager run).

mod common;
mod linear_ref;

use common::*;
use linear_ref::{act64, ACTS};
use rtx_ops::gemm::{linear, matmul, small_gemm_launches, Activation};
use rtx_runtime::{bf16, f16, Backend, DType, Element, Runtime, SmallGemm, Tensor};

/// The launch counter is process-wide: the tests of this file run one at a time, so that
/// each sees only its own launches.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn cuda(streams: usize, small: SmallGemm) -> Option<Runtime> {
    if !rtx_runtime::cuda::present_for_tests() {
        return None;
    }
    rtx_ops::set_poison_outputs(true);
    Some(
        Runtime::builder()
            .backend(Backend::Cuda(vec![]))
            .streams(streams)
            .small_gemm(small)
            .build()
            .expect("building a CUDA runtime"),
    )
}

/// Whether the environment forces the setting (then the counter checks are skipped).
fn env_forces() -> bool {
    std::env::var_os("RTX_SMALL_GEMM").is_some()
}

/// One layer problem: `layers` weight matrices (0: one `[n, k]` shared by every row),
/// `m` rows per layer.
#[derive(Clone, Copy, Debug)]
struct Shape {
    layers: usize,
    m: usize,
    n: usize,
    k: usize,
}

struct Data<T> {
    x: Vec<T>,
    w: Vec<T>,
    bias: Vec<T>,
    xs: Vec<usize>,
    ws: Vec<usize>,
}

fn data<T: Element>(r: &mut rand::rngs::StdRng, s: Shape) -> Data<T> {
    let l = s.layers.max(1);
    let scale = 1.0 / (s.k as f64).sqrt();
    let x: Vec<T> = rand_vec(r, l * s.m * s.k, -1.0, 1.0);
    let w: Vec<T> = rand_vec(r, s.layers.max(1) * s.n * s.k, -scale, scale);
    let bias: Vec<T> = rand_vec(r, s.n, -0.5, 0.5);
    let (xs, ws) = if s.layers == 0 {
        (vec![s.m, s.k], vec![s.n, s.k])
    } else {
        (vec![l, s.m, s.k], vec![l, s.n, s.k])
    };
    Data { x, w, bias, xs, ws }
}

/// The f64 reference of `act(x·wᵀ + bias)` and its rounding scale (|x|·|w| + |bias|).
fn reference<T: Element>(
    d: &Data<T>,
    s: Shape,
    act: Activation,
    bias: bool,
) -> (Vec<f64>, Vec<f64>) {
    let (x, w, b) = (f64s(&d.x), f64s(&d.w), f64s(&d.bias));
    let l = s.layers.max(1);
    let mut want = Vec::with_capacity(l * s.m * s.n);
    let mut scale = Vec::with_capacity(l * s.m * s.n);
    for layer in 0..l {
        for i in 0..s.m {
            for j in 0..s.n {
                let (mut acc, mut mag) = if bias { (b[j], b[j].abs()) } else { (0.0, 0.0) };
                for q in 0..s.k {
                    let p = x[(layer * s.m + i) * s.k + q] * w[(layer * s.n + j) * s.k + q];
                    acc += p;
                    mag += p.abs();
                }
                want.push(act64(act, acc));
                scale.push(mag);
            }
        }
    }
    (want, scale)
}

fn run_linear<T: Element>(
    rt: &Runtime,
    d: &Data<T>,
    act: Activation,
    bias: bool,
    stream: usize,
) -> Tensor {
    let x = upload(rt, &d.x, &d.xs);
    let w = upload(rt, &d.w, &d.ws);
    let b = bias.then(|| upload(rt, &d.bias, &[d.bias.len()]));
    let s = rt.compute_streams(rt.device())[stream];
    rt.submit_on(s, linear(&x, &w, b.as_ref(), act))
        .map_err(|e| e.error)
        .expect("submit")
        .wait()
        .expect("linear")
}

const SHAPES: [Shape; 9] = [
    Shape {
        layers: 0,
        m: 256,
        n: 256,
        k: 256,
    },
    Shape {
        layers: 0,
        m: 1,
        n: 8,
        k: 8,
    },
    Shape {
        layers: 0,
        m: 7,
        n: 24,
        k: 40,
    },
    Shape {
        layers: 0,
        m: 33,
        n: 72,
        k: 136,
    },
    Shape {
        layers: 0,
        m: 255,
        n: 264,
        k: 248,
    },
    Shape {
        layers: 0,
        m: 512,
        n: 512,
        k: 512,
    },
    Shape {
        layers: 0,
        m: 512,
        n: 128,
        k: 64,
    },
    Shape {
        layers: 3,
        m: 65,
        n: 136,
        k: 96,
    },
    Shape {
        layers: 8,
        m: 64,
        n: 256,
        k: 256,
    },
];

fn parity<T: Element>(rt: &Runtime) {
    let (seed, mut r) = rng();
    for s in SHAPES {
        let d = data::<T>(&mut r, s);
        for act in ACTS {
            for bias in [false, true] {
                let before = small_gemm_launches();
                let y = run_linear(rt, &d, act, bias, 0);
                let (want, scale) = reference(&d, s, act, bias);
                let e = rel_err_scaled(&download::<T>(rt, &y), &want, &scale);
                let tol = tol(T::DTYPE);
                assert!(
                    e <= tol,
                    "{} {s:?} {act:?} bias={bias}: relative error {e:e} > {tol:e} (seed {seed})",
                    T::DTYPE
                );
                if !env_forces() {
                    assert!(
                        small_gemm_launches() > before,
                        "{} {s:?}: the small-GEMM kernel did not run",
                        T::DTYPE
                    );
                }
            }
        }
    }
}

#[test]
fn small_products_match_f64_with_every_epilogue() {
    let _serial = serial();
    let Some(rt) = cuda(2, SmallGemm::Eager) else {
        return;
    };
    parity::<bf16>(&rt);
    parity::<f16>(&rt);
}

#[test]
fn products_it_does_not_take_go_to_cublaslt() {
    let _serial = serial();
    let Some(rt) = cuda(1, SmallGemm::Eager) else {
        return;
    };
    if env_forces() {
        return;
    }
    let (seed, mut r) = rng();
    // k not a multiple of 8; n not a multiple of 8; above 512³ multiply-adds; f32; a
    // plain matmul (b not transposed).
    let cases: [(Shape, DType); 4] = [
        (
            Shape {
                layers: 0,
                m: 64,
                n: 64,
                k: 36,
            },
            DType::BF16,
        ),
        (
            Shape {
                layers: 0,
                m: 64,
                n: 60,
                k: 64,
            },
            DType::BF16,
        ),
        (
            Shape {
                layers: 0,
                m: 1024,
                n: 512,
                k: 512,
            },
            DType::F16,
        ),
        (
            Shape {
                layers: 0,
                m: 64,
                n: 64,
                k: 64,
            },
            DType::F32,
        ),
    ];
    for (s, dt) in cases {
        let before = small_gemm_launches();
        let e = match dt {
            DType::BF16 => one_case::<bf16>(&rt, &mut r, s),
            DType::F16 => one_case::<f16>(&rt, &mut r, s),
            _ => one_case::<f32>(&rt, &mut r, s),
        };
        assert!(
            e <= tol(dt),
            "{dt} {s:?}: relative error {e:e} (seed {seed})"
        );
        assert_eq!(
            small_gemm_launches(),
            before,
            "{dt} {s:?} took the small kernel"
        );
    }
    let a: Vec<bf16> = rand_vec(&mut r, 64 * 64, -1.0, 1.0);
    let before = small_gemm_launches();
    let t = upload(&rt, &a, &[64, 64]);
    let y = rt
        .submit(matmul(&t, &t))
        .map_err(|e| e.error)
        .unwrap()
        .wait()
        .unwrap();
    let (want, scale) = matmul_ref(&a, &a, (1, 64, 64, 64));
    let e = rel_err_scaled(&download::<bf16>(&rt, &y), &want, &scale);
    assert!(e <= tol(DType::BF16), "matmul: {e:e} (seed {seed})");
    assert_eq!(
        small_gemm_launches(),
        before,
        "a plain matmul took the small kernel"
    );
}

fn one_case<T: Element>(rt: &Runtime, r: &mut rand::rngs::StdRng, s: Shape) -> f64 {
    let d = data::<T>(r, s);
    let y = run_linear(rt, &d, Activation::Relu, true, 0);
    let (want, scale) = reference(&d, s, Activation::Relu, true);
    rel_err_scaled(&download::<T>(rt, &y), &want, &scale)
}

#[test]
fn the_setting_off_runs_cublaslt_within_tolerance_of_the_kernel() {
    let _serial = serial();
    let (Some(on), Some(off)) = (cuda(1, SmallGemm::Eager), cuda(1, SmallGemm::Off)) else {
        return;
    };
    let (seed, mut r) = rng();
    let s = Shape {
        layers: 0,
        m: 200,
        n: 256,
        k: 128,
    };
    let d = data::<bf16>(&mut r, s);
    let ours = download::<bf16>(&on, &run_linear(&on, &d, Activation::Gelu, true, 0));
    let before = small_gemm_launches();
    let lt = download::<bf16>(&off, &run_linear(&off, &d, Activation::Gelu, true, 0));
    if !env_forces() {
        assert_eq!(small_gemm_launches(), before, "setting off: the kernel ran");
    }
    let (want, scale) = reference(&d, s, Activation::Gelu, true);
    for (name, got) in [("small kernel", &ours), ("cuBLASLt", &lt)] {
        let e = rel_err_scaled(got, &want, &scale);
        assert!(e <= tol(DType::BF16), "{name}: {e:e} (seed {seed})");
    }
    let e = rel_err_scaled(&ours, &lt, &scale);
    assert!(
        e <= tol(DType::BF16),
        "kernel against cuBLASLt: {e:e} (seed {seed})"
    );
}

#[test]
fn results_are_bitwise_equal_on_every_stream() {
    let _serial = serial();
    let (Some(eight), Some(one)) = (cuda(8, SmallGemm::Eager), cuda(1, SmallGemm::Eager)) else {
        return;
    };
    let (seed, mut r) = rng();
    let s = SHAPES[0];
    let d = data::<bf16>(&mut r, s);
    let base = download::<bf16>(&one, &run_linear(&one, &d, Activation::Relu, true, 0));
    for stream in [0, 3, 7] {
        let got = download::<bf16>(
            &eight,
            &run_linear(&eight, &d, Activation::Relu, true, stream),
        );
        assert!(
            got.iter()
                .zip(&base)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "stream {stream} differs from the one-stream runtime (seed {seed})"
        );
    }
}

/// Captures `relu(x·wᵀ + b)` on `rt` and replays it on fresh inputs against the same op
/// run eagerly on `eager` (a runtime of the same stream count); returns the kernel
/// launches the capture made (its eager warm-up included) and, per replay, whether it
/// was bitwise equal to the eager run and its error against it (scaled as the parity).
fn replay_against_eager(
    rt: &Runtime,
    eager: &Runtime,
    r: &mut rand::rngs::StdRng,
) -> (u64, Vec<(bool, f64)>) {
    let s = SHAPES[0];
    let d = data::<bf16>(r, s);
    let w = upload(rt, &d.w, &d.ws);
    let b = upload(rt, &d.bias, &[s.n]);
    let x0 = upload(rt, &d.x, &d.xs);
    let before = small_gemm_launches();
    let mut graph = rt
        .capture(|c| {
            let x = c.input(&x0)?;
            let y = c.submit(linear(&x, &w, Some(&b), Activation::Relu))?;
            c.output(&y)?;
            Ok(())
        })
        .expect("capture");
    let captured = small_gemm_launches() - before;
    let mut out = Vec::new();
    for _ in 0..4 {
        // A fresh input; the weight and bias stay the captured ones.
        let fresh = data::<bf16>(r, s);
        let d2 = Data {
            x: fresh.x,
            w: d.w.clone(),
            bias: d.bias.clone(),
            xs: d.xs.clone(),
            ws: d.ws.clone(),
        };
        let x = upload(rt, &d2.x, &d2.xs);
        let got: Vec<bf16> = graph.launch(&[&x]).unwrap().to_vec::<bf16>(0).unwrap();
        let want = download::<bf16>(eager, &run_linear(eager, &d2, Activation::Relu, true, 0));
        let (_, scale) = reference(&d2, s, Activation::Relu, true);
        let got = f64s(&got);
        let e = rel_err_scaled(&got, &want, &scale);
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        out.push((same, e));
    }
    (captured, out)
}

#[test]
fn always_captures_the_kernel_and_replays_bitwise_equal_to_eager() {
    let _serial = serial();
    let Some(rt) = cuda(8, SmallGemm::Always) else {
        return;
    };
    let (seed, mut r) = rng();
    let (captured, replays) = replay_against_eager(&rt, &rt, &mut r);
    if !env_forces() {
        assert!(captured >= 1, "the capture did not run the kernel");
    }
    for (i, (same, e)) in replays.into_iter().enumerate() {
        assert!(same, "replay {i} differs from eager ({e:e}, seed {seed})");
    }
}

/// With the default, the capture's warm-up runs the kernel eagerly and the graph records
/// cuBLASLt: the replay is bitwise what a runtime with the setting off computes eagerly
/// (the same plan: same stream count, so the same SM share), and within tolerance of
/// the kernel's eager result. The capture finds cuBLASLt's state (handle, workspace)
/// although only the kernel ran before it.
#[test]
fn eager_mode_captures_cublaslt_within_tolerance_of_eager() {
    let _serial = serial();
    let (Some(rt), Some(off)) = (cuda(8, SmallGemm::Eager), cuda(8, SmallGemm::Off)) else {
        return;
    };
    if env_forces() {
        return;
    }
    let (seed, mut r) = rng();
    let mut r2 = r.clone();
    for (i, (same, e)) in replay_against_eager(&rt, &off, &mut r)
        .1
        .into_iter()
        .enumerate()
    {
        assert!(
            same,
            "replay {i} differs from cuBLASLt run eagerly ({e:e}, seed {seed})"
        );
    }
    for (i, (_, e)) in replay_against_eager(&rt, &rt, &mut r2)
        .1
        .into_iter()
        .enumerate()
    {
        assert!(
            e <= tol(DType::BF16),
            "replay {i}: {e:e} from the kernel's eager result (seed {seed})"
        );
    }
}
