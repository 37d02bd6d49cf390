//! Element-wise ops on every backend: parity with f64 references for each op and dtype,
//! broadcasting, donation (in place) and bad input.

mod common;

use common::*;
use rtx_ops::elementwise::{self as ew, Binary, BinaryOp, Unary, UnaryOp};
use rtx_runtime::{bf16, f16, Element, Error, Runtime, Tensor};

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

fn unary_op(op: UnaryOp, x: &Tensor) -> Unary {
    match op {
        UnaryOp::Neg => ew::neg(x),
        UnaryOp::Exp => ew::exp(x),
        UnaryOp::Log => ew::log(x),
        UnaryOp::Sin => ew::sin(x),
        UnaryOp::Cos => ew::cos(x),
        UnaryOp::Sqrt => ew::sqrt(x),
        UnaryOp::Abs => ew::abs(x),
        UnaryOp::Relu => ew::relu(x),
    }
}

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
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

fn binary_op(op: BinaryOp, a: &Tensor, b: &Tensor) -> Binary {
    match op {
        BinaryOp::Add => ew::add(a, b),
        BinaryOp::Sub => ew::sub(a, b),
        BinaryOp::Mul => ew::mul(a, b),
        BinaryOp::Div => ew::div(a, b),
        BinaryOp::Max => ew::maximum(a, b),
        BinaryOp::Min => ew::minimum(a, b),
    }
}

fn binary_ref(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
    }
}

/// Runs `$f::<T>(args)` for T in f32, f16, bf16.
macro_rules! each_dtype {
    ($f:ident($($arg:expr),*)) => {
        $f::<f32>($($arg),*);
        $f::<f16>($($arg),*);
        $f::<bf16>($($arg),*);
    };
}

fn run<O: rtx_runtime::Op<Output = Tensor>>(rt: &Runtime, op: O) -> Tensor {
    match rt.submit(op) {
        Ok(s) => s.wait().expect("op failed"),
        Err(e) => panic!("submit rejected: {}", e.error),
    }
}

fn unary_parity<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for shape in [&[1][..], &[7], &[1_000_003], &[33, 1001]] {
        let n: usize = shape.iter().product();
        let signed = rand_vec::<T>(&mut r, n, -1.0, 1.0);
        let positive = rand_vec::<T>(&mut r, n, 0.01, 2.0);
        let (ts, tp) = (upload(rt, &signed, shape), upload(rt, &positive, shape));
        for op in UNARY {
            let (x, t) = match op {
                UnaryOp::Log | UnaryOp::Sqrt => (&positive, &tp),
                _ => (&signed, &ts),
            };
            let y = run(rt, unary_op(op, t));
            assert_eq!(y.dims(), shape);
            let want: Vec<f64> = f64s(x).into_iter().map(|v| unary_ref(op, v)).collect();
            check::<T>(
                &download::<T>(rt, &y),
                &want,
                &format!("{label} {op:?} {shape:?}"),
                seed,
            );
        }
    }
}

backend_test!(unary_ops_match_f64, |rt, label| {
    each_dtype!(unary_parity(rt, label));
});

/// Shapes of (a, b): same, odd sizes, trailing rows, scalars, general broadcast.
const SHAPES: &[(&[usize], &[usize])] = &[
    (&[1], &[1]),
    (&[7], &[7]),
    (&[1_000_003], &[1_000_003]),
    (&[33, 1001], &[33, 1001]),
    (&[5, 7], &[7]),
    (&[7], &[5, 7]),
    (&[33, 1001], &[]),
    (&[], &[1001]),
    (&[1_000_003], &[1]),
    (&[5, 1], &[1, 7]),
    (&[33, 1001], &[33, 1]),
    (&[8, 17, 5], &[17, 1]),
    (&[2, 3, 1, 5], &[3, 4, 1]),
    (&[1, 1000, 1], &[70, 1, 3]),
];

/// `n` values with |v| in [0.5, 1.5) and a random sign: safe divisors.
fn divisors<T: Element>(r: &mut rand::rngs::StdRng, n: usize) -> Vec<T> {
    use rand::Rng;
    (0..n)
        .map(|_| {
            let m = r.gen_range(0.5..1.5);
            T::from_f64(if r.gen::<bool>() { m } else { -m })
        })
        .collect()
}

fn binary_parity<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for (sa, sb) in SHAPES {
        let a = rand_vec::<T>(&mut r, sa.iter().product(), -1.0, 1.0);
        let b = divisors::<T>(&mut r, sb.iter().product());
        let (ta, tb) = (upload(rt, &a, sa), upload(rt, &b, sb));
        let (fa, fb) = (f64s(&a), f64s(&b));
        for op in BINARY {
            let y = run(rt, binary_op(op, &ta, &tb));
            assert_eq!(y.dims(), broadcast(sa, sb), "{label} {op:?} {sa:?} {sb:?}");
            let want = broadcast_ref(&fa, sa, &fb, sb, |x, z| binary_ref(op, x, z));
            let what = format!("{label} {op:?} {sa:?} with {sb:?}");
            check::<T>(&download::<T>(rt, &y), &want, &what, seed);
        }
    }
}

backend_test!(binary_ops_match_f64, |rt, label| {
    each_dtype!(binary_parity(rt, label));
});

backend_test!(max_min_propagate_nan, |rt, label| {
    let a = upload(rt, &[f32::NAN, 1.0, 2.0, f32::NAN], &[4]);
    let b = upload(rt, &[1.0f32, f32::NAN, 1.0, f32::NAN], &[4]);
    for op in [ew::maximum(&a, &b), ew::minimum(&a, &b)] {
        let v = download::<f32>(rt, &run(rt, op));
        assert!(
            v[0].is_nan() && v[1].is_nan() && v[3].is_nan(),
            "{label} {v:?}"
        );
        assert!(v[2] == 2.0 || v[2] == 1.0, "{label} {v:?}");
    }
    let r = download::<f32>(rt, &run(rt, ew::relu(&upload(rt, &[f32::NAN, -1.0], &[2]))));
    assert!(r[0].is_nan() && r[1] == 0.0, "{label} relu {r:?}");
});

fn donation<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    let what = |s: &str| format!("{label} {s} {}", T::DTYPE);
    let (sa, sb) = (&[33usize, 1001][..], &[1001usize][..]);
    let a = rand_vec::<T>(&mut r, 33 * 1001, -1.0, 1.0);
    let b = divisors::<T>(&mut r, 1001);
    let tb = upload(rt, &b, sb);
    let want = |op| broadcast_ref(&f64s(&a), sa, &f64s(&b), sb, |x, z| binary_ref(op, x, z));
    // Unique `a`: may be written in place; the answer is the same.
    for (op, mk) in [
        (BinaryOp::Add, ew::add_ as fn(Tensor, &Tensor) -> Binary),
        (BinaryOp::Mul, ew::mul_),
        (BinaryOp::Sub, ew::sub_),
        (BinaryOp::Div, ew::div_),
    ] {
        let y = run(rt, mk(upload(rt, &a, sa), &tb));
        check::<T>(&download::<T>(rt, &y), &want(op), &what("unique a"), seed);
    }
    // A clone of `a` keeps its old values: the op must allocate.
    let ta = upload(rt, &a, sa);
    let keep = ta.clone();
    let y = run(rt, ew::add_(ta, &tb));
    check::<T>(
        &download::<T>(rt, &y),
        &want(BinaryOp::Add),
        &what("shared a"),
        seed,
    );
    assert_eq!(
        download::<T>(rt, &keep),
        f64s(&a),
        "{}: clone changed",
        what("shared a")
    );
    // The result is larger than `a`: allocate.
    let y = run(rt, ew::add_(upload(rt, &b, sb), &upload(rt, &a, sa)));
    let back = broadcast_ref(&f64s(&b), sb, &f64s(&a), sa, |x, z| x + z);
    check::<T>(&download::<T>(rt, &y), &back, &what("broadcast a"), seed);
    // Unary donation, unique and shared.
    let x = upload(rt, &a, sa);
    let keep = x.clone();
    let y = run(rt, ew::relu_(x));
    let relu: Vec<f64> = f64s(&a).iter().map(|v| v.max(0.0)).collect();
    check::<T>(&download::<T>(rt, &y), &relu, &what("relu_ shared"), seed);
    assert_eq!(
        download::<T>(rt, &keep),
        f64s(&a),
        "{}",
        what("relu_ clone")
    );
    let y = run(rt, ew::exp_(upload(rt, &a, sa)));
    let exp: Vec<f64> = f64s(&a).iter().map(|v| v.exp()).collect();
    check::<T>(&download::<T>(rt, &y), &exp, &what("exp_ unique"), seed);
    // A chain of donations without waiting in between.
    let mut x = upload(rt, &a, sa);
    for _ in 0..5 {
        x = rt
            .submit(ew::add_(x, &tb))
            .unwrap()
            .outputs()
            .unwrap()
            .clone();
    }
    let five = broadcast_ref(&f64s(&a), sa, &f64s(&b), sb, |x, z| x + 5.0 * z);
    check::<T>(&download::<T>(rt, &x), &five, &what("chain"), seed);
}

backend_test!(donation_reuses_only_unique_memory, |rt, label| {
    each_dtype!(donation(rt, label));
});

// A chain of in-place adds on one stream, submitted without waiting: each operand is the
// previous op's output, whose producer is still running on CUDA (64 MiB per add, far
// slower on the device than a submit). The producer's own keep-alive does not count
// against donation (`runtime/src/storage.rs`, rule 3), so on CUDA no step allocates:
// the block caches see no request after the first op.
backend_test!(chain_donates_while_the_producer_runs, |rt, label| {
    let (seed, mut r) = rng();
    let n = (1usize << 24) + 3;
    let steps = 12;
    let a = rand_vec::<f32>(&mut r, n, -1.0, 1.0);
    let b = rand_vec::<f32>(&mut r, n, -1.0, 1.0);
    let tb = upload(rt, &b, &[n]);
    let s = rt.compute_streams(rt.device())[0];
    // The first step may allocate (its operand is an upload): count from after it.
    let mut x = rt
        .submit_on(s, ew::add_(upload(rt, &a, &[n]), &tb))
        .unwrap()
        .wait()
        .unwrap();
    rt.reset_stats();
    for _ in 1..steps {
        x = rt
            .submit_on(s, ew::add_(x, &tb))
            .unwrap()
            .into_outputs()
            .unwrap();
    }
    // Every step has run on the stream's actor once its marker completes; the download
    // comes after the count.
    rt.mark(s).unwrap().wait().unwrap();
    let st = rt.stats().block_cache;
    let got = download::<f32>(rt, &x);
    if label.starts_with("cuda") {
        assert_eq!(
            st.hits + st.misses,
            0,
            "{label}: the chain allocated ({st:?}): a step did not write in place"
        );
    }
    let want: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| x as f64 + steps as f64 * y as f64)
        .collect();
    check::<f32>(&got, &want, &format!("{label} chain"), seed);
});

/// A unique, computed input is written in place on the CPU backend (deterministic there:
/// an uploaded tensor has no pending producer). On CUDA,
/// `chain_donates_while_the_producer_runs` counts the allocations instead.
#[test]
fn cpu_donation_writes_in_place() {
    let rt = Runtime::cpu(1);
    let a = upload(&rt, &[1.0f32, 2.0, 3.0], &[3]);
    let b = upload(&rt, &[10.0f32], &[]);
    let before = rtx_ops::donations();
    let y = run(&rt, ew::add_(a, &b));
    assert_eq!(download::<f32>(&rt, &y), vec![11.0, 12.0, 13.0]);
    let y = run(&rt, ew::relu_(y));
    // (The counter is process-wide: other tests running at once only add to it.)
    assert!(
        rtx_ops::donations() - before >= 2,
        "both ops should write in place"
    );
    // Shared: the op allocates and the clone keeps its values.
    let keep = y.clone();
    let z = run(&rt, ew::mul_(y, &b));
    assert_eq!(download::<f32>(&rt, &keep), vec![11.0, 12.0, 13.0]);
    assert_eq!(download::<f32>(&rt, &z), vec![110.0, 120.0, 130.0]);
}

backend_test!(bad_input_is_rejected_and_given_back, |rt, label| {
    let a = upload(rt, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = upload(rt, &[1.0f32, 2.0, 3.0, 4.0], &[4]);
    let e = rt.submit(ew::add(&a, &b)).unwrap_err();
    match &e.error {
        Error::ShapeMismatch { lhs, rhs, .. } => {
            assert_eq!((lhs.dims(), rhs.dims()), (&[2, 3][..], &[4][..]), "{label}")
        }
        other => panic!("{label}: expected a shape mismatch, got {other}"),
    }
    let (ga, gb) = e.into_op().into_inputs();
    assert!(ga.same_storage(&a) && gb.same_storage(&b), "{label}");

    // A donated operand comes back intact.
    let e = rt.submit(ew::mul_(a.clone(), &b)).unwrap_err();
    let (ga, _) = e.into_op().into_inputs();
    assert_eq!(download::<f32>(rt, &ga), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);

    let h = upload(rt, &[f16::from_f32(1.0); 3], &[3]);
    let e = rt.submit(ew::add(&a, &h)).unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::DTypeMismatch {
                expected: rtx_runtime::DType::F32,
                got: rtx_runtime::DType::F16,
                ..
            }
        ),
        "{label}: {}",
        e.error
    );
    assert!(e.into_op().into_inputs().1.same_storage(&h));

    let u = upload(rt, &[1u32, 2], &[2]);
    let e = rt.submit(ew::relu(&u)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    assert!(e.into_op().into_input().same_storage(&u));

    // Zero-size tensors are rejected where they would be made, on every backend.
    let e = rt.upload::<f32>(&[], [0, 3]).unwrap_err();
    assert!(matches!(e, Error::InvalidOp { .. }), "{label}: {e}");
});

/// The chain of [`programmatic_launch_equals_plain_launch`]: `STEPS` dependent
/// element-wise steps `sin(y·c + b)`, a GEMM, `STEPS` more. Submitted without waiting,
/// so each kernel is launched while the ones before it may still run.
fn pdl_chain(
    rt: &Runtime,
    y: &Tensor,
    c: &Tensor,
    b: &Tensor,
    w: &Tensor,
) -> rtx_runtime::Result<Tensor> {
    const STEPS: usize = 12;
    let mut y = y.clone();
    for half in 0..2 {
        for _ in 0..STEPS {
            let m = rt.run(ew::mul(&y, c))?;
            let a = rt.run(ew::add(&m, b))?;
            y = rt.run(ew::sin(&a))?;
        }
        if half == 0 {
            y = rt.run(rtx_ops::matmul(&y, w))?;
        }
    }
    Ok(y)
}

fn pdl_chain_ref(y: &[f64], c: &[f64], b: &[f64], w: &[f64], n: usize) -> Vec<f64> {
    let steps = |y: &mut Vec<f64>| {
        for _ in 0..12 {
            for (i, v) in y.iter_mut().enumerate() {
                *v = (*v * c[i] + b[i]).sin();
            }
        }
    };
    let mut y = y.to_vec();
    steps(&mut y);
    let mut h = vec![0.0; n * n];
    for i in 0..n {
        for k in 0..n {
            let a = y[i * n + k];
            for j in 0..n {
                h[i * n + j] += a * w[k * n + j];
            }
        }
    }
    steps(&mut h);
    h
}

/// Programmatic dependent launch (`Builder::programmatic_launch`, on by default; it
/// applies to element-wise kernels captured into graphs on compute capability 9.0+): a
/// chain of dependent element-wise kernels around a cuBLAS GEMM, on 1 and 4 streams,
/// eager and captured in a graph, is bitwise equal between runtimes with it on and off,
/// and within tolerance of an f64 reference. A kernel that touched memory before its
/// predecessor finished would read stale (or NaN-poisoned) values and differ.
#[test]
fn programmatic_launch_equals_plain_launch() {
    if !rtx_runtime::cuda::present_for_tests() {
        return;
    }
    rtx_ops::set_poison_outputs(true);
    const N: usize = 512;
    let (seed, mut g) = rng();
    let y_h: Vec<f32> = rand_vec(&mut g, N * N, -1.0, 1.0);
    let c_h: Vec<f32> = rand_vec(&mut g, N * N, -1.0, 1.0);
    let b_h: Vec<f32> = rand_vec(&mut g, N * N, -1.0, 1.0);
    let bound = 1.0 / (N as f64).sqrt();
    let w_h: Vec<f32> = rand_vec(&mut g, N * N, -bound, bound);
    let reference = pdl_chain_ref(&f64s(&y_h), &f64s(&c_h), &f64s(&b_h), &f64s(&w_h), N);
    for streams in [1, 4] {
        let mut results: Vec<Vec<f32>> = Vec::new();
        for pdl in [false, true] {
            let label = format!("cuda/{streams} programmatic={pdl}");
            let rt = Runtime::builder()
                .backend(rtx_runtime::Backend::Cuda(vec![]))
                .streams(streams)
                .programmatic_launch(pdl)
                .build()
                .expect("building a CUDA runtime");
            let up = |h: &[f32]| rt.upload(h, [N, N]).unwrap();
            let (y, c, b, w) = (up(&y_h), up(&c_h), up(&b_h), up(&w_h));
            for round in 0..3 {
                let got = pdl_chain(&rt, &y, &c, &b, &w)
                    .and_then(|t| t.to_vec::<f32>())
                    .unwrap_or_else(|e| panic!("{label}: round {round}: {e}"));
                check::<f32>(&f64s(&got), &reference, &label, seed);
                results.push(got);
            }
            let mut graph = rt
                .capture(|cx| {
                    let y = cx.input(&y)?;
                    let mut v = y.clone();
                    for half in 0..2 {
                        for _ in 0..12 {
                            let m = cx.submit(ew::mul(&v, &c))?;
                            let a = cx.submit(ew::add(&m, &b))?;
                            v = cx.submit(ew::sin(&a))?;
                        }
                        if half == 0 {
                            v = cx.submit(rtx_ops::matmul(&v, &w))?;
                        }
                    }
                    cx.output(&v)?;
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{label}: capture failed: {e}"));
            for launch in 0..3 {
                let got = graph
                    .launch(&[&y])
                    .and_then(|mut o| o.to_vec::<f32>(0))
                    .unwrap_or_else(|e| panic!("{label}: launch {launch}: {e}"));
                results.push(got);
            }
        }
        let first = &results[0];
        for (i, r) in results.iter().enumerate() {
            assert!(
                r.iter().zip(first).all(|(a, b)| a.to_bits() == b.to_bits()),
                "cuda/{streams}: result {i} of {} differs bitwise from the first plain run (seed {seed})",
                results.len()
            );
        }
    }
}

// exp on every one of the 65,536 f16 inputs (NaNs, infinities and subnormals included)
// gives the exact exp rounded to f16, bit for bit (NaN for NaN). On sm_90 the CUDA kernel
// takes its packed f16 path for this (`ExpF16` in `kernels/cuda/elementwise.cu`, which
// corrects the two inputs that the f32 `ex2.approx` misrounds), so this test fails if a
// correction is missing or wrong. The second run, of 65,533 inputs, ends in the kernel's
// element-by-element tail (5 elements).
backend_test!(exp_f16_every_input_is_correctly_rounded, |rt, label| {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    for skip in [0usize, 3] {
        let x = &all[skip..];
        let out = run(rt, ew::exp(&upload(rt, x, &[x.len()])));
        let y: Vec<f16> = rt
            .to_vec::<f16>(&out)
            .expect("to_vec")
            .wait()
            .expect("download");
        assert_eq!(y.len(), x.len());
        let wrong: Vec<String> = x
            .iter()
            .zip(&y)
            .filter_map(|(a, b)| {
                let want = f16::from_f64(a.to_f64().exp());
                let right = if want.is_nan() {
                    b.is_nan()
                } else {
                    want.to_bits() == b.to_bits()
                };
                (!right).then(|| {
                    format!(
                        "{:#06x} -> {:#06x} (want {:#06x})",
                        a.to_bits(),
                        b.to_bits(),
                        want.to_bits()
                    )
                })
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{label}: exp of {} of {} f16 inputs is not the exact value rounded: {}",
            wrong.len(),
            x.len(),
            wrong.iter().take(8).cloned().collect::<Vec<_>>().join(", ")
        );
    }
});
