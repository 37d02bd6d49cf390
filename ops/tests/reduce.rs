//! Reductions and softmax on every backend: parity with f64 references for each op and
//! dtype, over all elements and along each dim, and bad input.

mod common;

use common::*;
use rand::rngs::StdRng;
use rtx_ops::reduce::{self as red, ArgReduceOp, Reduce, ReduceKind, ReduceOp};
use rtx_ops::softmax::softmax;
use rtx_runtime::{bf16, f16, DType, Element, Error, Runtime, Tensor};

const VALUE_OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Mean,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Prod,
];
const ARG_OPS: [ArgReduceOp; 2] = [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin];

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

/// Inputs suited to `op` over rows of `r` elements: a nonzero mean for sums (small
/// enough that f16 sums stay finite), values near 1 for products (so they neither
/// vanish nor blow up).
fn inputs<T: Element>(rng: &mut StdRng, op: ReduceOp, n: usize, r: usize) -> Vec<T> {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            let bias = (1e4 / r as f64).min(0.25);
            rand_vec(rng, n, bias - 1.0, bias + 1.0)
        }
        ReduceOp::Prod => {
            let spread = (1.0 / (r as f64).sqrt()).min(0.5);
            rand_vec(rng, n, 1.0 - spread, 1.0 + spread)
        }
        ReduceOp::Max | ReduceOp::Min => rand_vec(rng, n, -1.0, 1.0),
    }
}

fn fold_ref(op: ReduceOp, x: impl Iterator<Item = f64>) -> f64 {
    let (mut acc, mut count) = (
        match op {
            ReduceOp::Prod => 1.0,
            ReduceOp::Max => f64::NEG_INFINITY,
            ReduceOp::Min => f64::INFINITY,
            _ => 0.0,
        },
        0usize,
    );
    for v in x {
        count += 1;
        acc = match op {
            ReduceOp::Sum | ReduceOp::Mean => acc + v,
            ReduceOp::Prod => acc * v,
            ReduceOp::Max => acc.max(v),
            ReduceOp::Min => acc.min(v),
        };
    }
    if op == ReduceOp::Mean {
        acc / count as f64
    } else {
        acc
    }
}

/// The first index of the best value (the documented tie rule).
fn arg_ref(op: ArgReduceOp, x: impl Iterator<Item = f64>) -> f64 {
    let mut best: Option<(usize, f64)> = None;
    for (i, v) in x.enumerate() {
        let better = match (best, op) {
            (None, _) => true,
            (Some((_, b)), ArgReduceOp::ArgMax) => v > b,
            (Some((_, b)), ArgReduceOp::ArgMin) => v < b,
        };
        if better {
            best = Some((i, v));
        }
    }
    best.expect("non-empty").0 as f64
}

/// The reduction of `x` (shape `dims`) along `dim`, in f64, for every output element.
fn dim_ref(
    x: &[f64],
    dims: &[usize],
    dim: usize,
    f: impl Fn(&mut dyn Iterator<Item = f64>) -> f64,
) -> Vec<f64> {
    let outer: usize = dims[..dim].iter().product();
    let inner: usize = dims[dim + 1..].iter().product();
    let r = dims[dim];
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut it = (0..r).map(|k| x[(o * r + k) * inner + i]);
            out.push(f(&mut it));
        }
    }
    out
}

fn value_op(op: ReduceOp, x: &Tensor, dim: Option<(usize, bool)>) -> Reduce {
    Reduce::new(
        ReduceKind::Value(op),
        x,
        dim.map(|d| d.0),
        dim.is_some_and(|d| d.1),
    )
}

fn arg_op(op: ArgReduceOp, x: &Tensor, dim: Option<(usize, bool)>) -> Reduce {
    Reduce::new(
        ReduceKind::Arg(op),
        x,
        dim.map(|d| d.0),
        dim.is_some_and(|d| d.1),
    )
}

/// Like `check`, but a product of `r` f32 factors accumulated in f32 (the CUDA kernels;
/// PyTorch does the same) legitimately drifts: factors near 1 round with a bias, and an
/// exact f32 simulation of the kernel's order over 1,000,003 factors in [0.999, 1.001]
/// gives 6.3e-4 against the f64 product. So products allow 1e-9 per factor (f32 only;
/// f16/bf16 keep their 1e-2).
fn check_reduce<T: Element>(
    op: ReduceOp,
    r: usize,
    out: &[f64],
    want: &[f64],
    what: &str,
    seed: u64,
) {
    if op == ReduceOp::Prod && T::DTYPE == rtx_runtime::DType::F32 {
        let e = rel_err(out, want);
        let tol = (1e-9 * r as f64).max(1e-5);
        assert!(
            e <= tol,
            "{what}: relative error {e:e} > {tol:e} (seed {seed})"
        );
    } else {
        check::<T>(out, want, what, seed);
    }
}

fn full_parity<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for shape in [&[1][..], &[7], &[1_000_003], &[33, 1001], &[]] {
        let n: usize = shape.iter().product();
        for op in VALUE_OPS {
            let x = inputs::<T>(&mut r, op, n, n);
            let y = run(rt, value_op(op, &upload(rt, &x, shape), None));
            assert_eq!((y.dims(), y.dtype()), (&[][..], T::DTYPE), "{label} {op:?}");
            let want = fold_ref(op, f64s(&x).into_iter());
            let what = format!("{label} {op:?} all of {shape:?}");
            check_reduce::<T>(op, n, &download::<T>(rt, &y), &[want], &what, seed);
        }
        let x = rand_vec::<T>(&mut r, n, -1.0, 1.0);
        let t = upload(rt, &x, shape);
        for op in ARG_OPS {
            let y = run(rt, arg_op(op, &t, None));
            assert_eq!(
                (y.dims(), y.dtype()),
                (&[][..], DType::U32),
                "{label} {op:?}"
            );
            let want = arg_ref(op, f64s(&x).into_iter());
            let got = download::<u32>(rt, &y);
            assert_eq!(
                got,
                [want],
                "{label} {op:?} {} of {shape:?} (seed {seed})",
                T::DTYPE
            );
        }
    }
}

backend_test!(full_reductions_match_f64, |rt, label| {
    each_dtype!(full_parity(rt, label));
});

const DIM_SHAPES: &[&[usize]] = &[&[33, 1001], &[8, 17, 5], &[1_000_003], &[1, 7], &[4, 1, 3]];

fn dim_parity<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for &shape in DIM_SHAPES {
        let n: usize = shape.iter().product();
        for dim in 0..shape.len() {
            for keepdim in [false, true] {
                let mut out_dims = shape.to_vec();
                if keepdim {
                    out_dims[dim] = 1;
                } else {
                    out_dims.remove(dim);
                }
                let what = |op: &dyn std::fmt::Debug| {
                    format!("{label} {op:?} {shape:?} dim {dim} keepdim {keepdim}")
                };
                for op in VALUE_OPS {
                    let x = inputs::<T>(&mut r, op, n, shape[dim]);
                    let y = run(
                        rt,
                        value_op(op, &upload(rt, &x, shape), Some((dim, keepdim))),
                    );
                    assert_eq!(y.dims(), out_dims, "{}", what(&op));
                    let want = dim_ref(&f64s(&x), shape, dim, |it| fold_ref(op, it));
                    check_reduce::<T>(
                        op,
                        shape[dim],
                        &download::<T>(rt, &y),
                        &want,
                        &what(&op),
                        seed,
                    );
                }
                let x = rand_vec::<T>(&mut r, n, -1.0, 1.0);
                let t = upload(rt, &x, shape);
                for op in ARG_OPS {
                    let y = run(rt, arg_op(op, &t, Some((dim, keepdim))));
                    assert_eq!((y.dims(), y.dtype()), (&out_dims[..], DType::U32));
                    let want = dim_ref(&f64s(&x), shape, dim, |it| arg_ref(op, it));
                    let got = download::<u32>(rt, &y);
                    assert!(
                        got == want,
                        "{} {}: index differs (seed {seed})",
                        what(&op),
                        T::DTYPE
                    );
                }
            }
        }
    }
}

backend_test!(dim_reductions_match_f64, |rt, label| {
    each_dtype!(dim_parity(rt, label));
});

backend_test!(nan_and_ties, |rt, label| {
    let x = upload(rt, &[1.0f32, 3.0, f32::NAN, 3.0, f32::NAN], &[5]);
    for op in [red::max(&x), red::min(&x), red::sum(&x)] {
        assert!(download::<f32>(rt, &run(rt, op))[0].is_nan(), "{label}");
    }
    // The first NaN wins for both.
    assert_eq!(
        download::<u32>(rt, &run(rt, red::argmax(&x))),
        [2.0],
        "{label}"
    );
    assert_eq!(
        download::<u32>(rt, &run(rt, red::argmin(&x))),
        [2.0],
        "{label}"
    );
    let t = upload(rt, &[2.0f32, 5.0, 5.0, 1.0, 1.0, 0.5], &[2, 3]);
    assert_eq!(
        download::<u32>(rt, &run(rt, red::argmax_dim(&t, 1, false))),
        [1.0, 0.0]
    );
    assert_eq!(
        download::<u32>(rt, &run(rt, red::argmin(&t))),
        [5.0],
        "{label}"
    );
});

fn softmax_ref(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            row.iter().map(move |v| (v - m).exp() / s)
        })
        .collect()
}

fn softmax_parity<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for shape in [
        &[33, 1001][..],
        &[4, 8192],
        &[7],
        &[1000, 7],
        &[2, 3, 20000],
        &[5, 1],
    ] {
        let n: usize = shape.iter().product();
        let x = rand_vec::<T>(&mut r, n, -4.0, 4.0);
        let y = run(rt, softmax(&upload(rt, &x, shape)));
        assert_eq!(y.dims(), shape, "{label}");
        let want = softmax_ref(&f64s(&x), *shape.last().unwrap());
        check::<T>(
            &download::<T>(rt, &y),
            &want,
            &format!("{label} softmax {shape:?}"),
            seed,
        );
    }
}

backend_test!(softmax_matches_f64, |rt, label| {
    each_dtype!(softmax_parity(rt, label));
});

backend_test!(bad_input_is_rejected_and_given_back, |rt, label| {
    let x = upload(rt, &[1.0f32; 6], &[2, 3]);
    let e = rt.submit(red::sum_dim(&x, 2, false)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidDim { .. }),
        "{label}: {}",
        e.error
    );
    let op = e.into_op();
    assert_eq!(op.dim(), Some(2));
    assert!(op.into_input().same_storage(&x), "{label}");
    let e = rt.submit(red::argmax_dim(&x, 7, true)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidDim { .. }),
        "{label}: {}",
        e.error
    );

    let s = upload(rt, &[2.0f32], &[]);
    let e = rt.submit(red::mean_dim(&s, 0, false)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidDim { .. }),
        "{label}: {}",
        e.error
    );
    let e = rt.submit(softmax(&s)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidDim { .. }),
        "{label}: {}",
        e.error
    );
    assert!(e.into_op().into_input().same_storage(&s));
    assert_eq!(
        download::<f32>(rt, &run(rt, red::sum(&s))),
        [2.0],
        "{label}"
    );

    let u = upload(rt, &[1u32, 2], &[2]);
    let e = rt.submit(red::max(&u)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let e = rt.submit(softmax(&u)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );

    if let Ok(z) = rt.upload::<f32>(&[], [3, 0]) {
        for op in [
            red::sum(&z),
            red::mean(&z),
            red::argmax(&z),
            red::max_dim(&z, 0, false),
        ] {
            let e = rt.submit(op).unwrap_err();
            assert!(
                matches!(e.error, Error::InvalidOp { .. }),
                "{label}: {}",
                e.error
            );
        }
        let e = rt.submit(softmax(&z)).unwrap_err();
        assert!(
            matches!(e.error, Error::InvalidOp { .. }),
            "{label}: {}",
            e.error
        );
    }
});
