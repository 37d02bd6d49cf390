//! Activations, their backward ops and the scalar maps on every backend: parity with f64
//! references on fresh random inputs (odd sizes, poisoned outputs), gradients against
//! central finite differences of the f64 forward, donation and bad input.

mod common;

use common::*;
use rtx_ops::activation::{self as act, Grad, GradOp, Map, MapOp};
use rtx_runtime::{bf16, f16, Element, Error, Runtime, Tensor};

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

const MAPS: [MapOp; 6] = [
    MapOp::Tanh,
    MapOp::Sigmoid,
    MapOp::Gelu,
    MapOp::Silu,
    MapOp::AddScalar(0.75),
    MapOp::MulScalar(-1.25),
];

fn map_op(op: MapOp, x: &Tensor) -> Map {
    match op {
        MapOp::Tanh => act::tanh(x),
        MapOp::Sigmoid => act::sigmoid(x),
        MapOp::Gelu => act::gelu(x),
        MapOp::Silu => act::silu(x),
        MapOp::AddScalar(s) => act::add_scalar(x, s),
        MapOp::MulScalar(s) => act::mul_scalar(x, s),
    }
}

/// The f64 forward.
fn map_ref(op: MapOp, x: f64) -> f64 {
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    match op {
        MapOp::Tanh => x.tanh(),
        MapOp::Sigmoid => sig(x),
        MapOp::Gelu => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
        MapOp::Silu => x * sig(x),
        MapOp::AddScalar(s) => x + s as f64,
        MapOp::MulScalar(s) => x * s as f64,
    }
}

const SHAPES: [&[usize]; 4] = [&[1], &[7], &[1_000_003], &[33, 1001]];

fn map_parity<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for shape in SHAPES {
        let n: usize = shape.iter().product();
        let x = rand_vec::<T>(&mut r, n, -4.0, 4.0);
        let t = upload(rt, &x, shape);
        for op in MAPS {
            let y = run(rt, map_op(op, &t));
            assert_eq!(y.dims(), shape);
            let want: Vec<f64> = f64s(&x).into_iter().map(|v| map_ref(op, v)).collect();
            let what = format!("{label} {op:?} {shape:?}");
            let got = download::<T>(rt, &y);
            if op == MapOp::Gelu {
                // gelu(x) = x/2 (1 + tanh u) cancels for negative x (1 + tanh u -> 0): in
                // f32 its error is relative to the terms, about |x|/2, not to the
                // result. Measure it so (a single element near x = -4 would otherwise
                // fail a correct kernel).
                let scale: Vec<f64> = want
                    .iter()
                    .zip(f64s(&x))
                    .map(|(w, x)| w.abs() + 0.5 * x.abs())
                    .collect();
                let e = rel_err_scaled(&got, &want, &scale);
                assert!(e <= tol(T::DTYPE), "{what}: error {e:e} (seed {seed})");
            } else {
                check::<T>(&got, &want, &what, seed);
            }
        }
    }
}

backend_test!(maps_match_f64, |rt, label| {
    each_dtype!(map_parity(rt, label));
});

const GRADS: [GradOp; 5] = [
    GradOp::Relu,
    GradOp::Gelu,
    GradOp::Silu,
    GradOp::Tanh,
    GradOp::Sigmoid,
];

fn grad_op(op: GradOp, dy: &Tensor, v: &Tensor) -> Grad {
    match op {
        GradOp::Relu => act::relu_backward(dy, v),
        GradOp::Gelu => act::gelu_backward(dy, v),
        GradOp::Silu => act::silu_backward(dy, v),
        GradOp::Tanh => act::tanh_backward(dy, v),
        GradOp::Sigmoid => act::sigmoid_backward(dy, v),
    }
}

/// The f64 forward whose derivative `op` is, as a function of the forward input.
fn forward_of(op: GradOp, x: f64) -> f64 {
    match op {
        GradOp::Relu => x.max(0.0),
        GradOp::Gelu => map_ref(MapOp::Gelu, x),
        GradOp::Silu => map_ref(MapOp::Silu, x),
        GradOp::Tanh => x.tanh(),
        GradOp::Sigmoid => map_ref(MapOp::Sigmoid, x),
    }
}

/// `dy · f'(x)` by central finite differences of the f64 forward.
fn fd_grad(op: GradOp, dy: f64, x: f64) -> f64 {
    let h = 1e-5;
    dy * (forward_of(op, x + h) - forward_of(op, x - h)) / (2.0 * h)
}

/// Forward inputs kept at least 0.01 away from 0 (relu's kink) and their values.
fn kinkless<T: Element>(r: &mut rand::rngs::StdRng, n: usize) -> Vec<T> {
    rand_vec::<T>(r, n, -4.0, 4.0)
        .into_iter()
        .map(|v| {
            let v = v.to_f64();
            T::from_f64(if v.abs() < 0.01 {
                v + 0.02f64.copysign(v)
            } else {
                v
            })
        })
        .collect()
}

fn grad_parity<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for shape in SHAPES {
        let n: usize = shape.iter().product();
        let x = kinkless::<T>(&mut r, n);
        let dy = rand_vec::<T>(&mut r, n, -1.0, 1.0);
        let (tx, tdy) = (upload(rt, &x, shape), upload(rt, &dy, shape));
        for op in GRADS {
            // tanh and sigmoid take the saved forward output, rounded to T as a forward
            // op of that dtype would have stored it.
            let v = match op {
                GradOp::Tanh => run(rt, act::tanh(&tx)),
                GradOp::Sigmoid => run(rt, act::sigmoid(&tx)),
                _ => tx.clone(),
            };
            let dx = run(rt, grad_op(op, &tdy, &v));
            assert_eq!(dx.dims(), shape);
            let got = download::<T>(rt, &dx);
            let what = format!("{label} {op:?} {shape:?}");
            let want: Vec<f64> = match op {
                // From the rounded saved output the FD reference of x is off by the
                // rounding of y: compare with the f64 formula in y instead, and check
                // the formula against finite differences separately (f32 below).
                GradOp::Tanh | GradOp::Sigmoid => {
                    let y = download::<T>(rt, &v);
                    let d = |y: f64| {
                        if op == GradOp::Tanh {
                            1.0 - y * y
                        } else {
                            y * (1.0 - y)
                        }
                    };
                    f64s(&dy).iter().zip(&y).map(|(g, y)| g * d(*y)).collect()
                }
                _ => f64s(&dy)
                    .iter()
                    .zip(f64s(&x))
                    .map(|(g, x)| fd_grad(op, *g, x))
                    .collect(),
            };
            // `1 - y²` and `y (1 - y)` cancel near saturation: measure the error against
            // the magnitudes they are made of, |dy| (1 + y²) and |dy| (|y| + y²) (for the
            // other ops the scale is the reference itself).
            let scale: Vec<f64> = match op {
                GradOp::Tanh | GradOp::Sigmoid => {
                    let y = download::<T>(rt, &v);
                    f64s(&dy)
                        .iter()
                        .zip(&y)
                        .map(|(g, y)| {
                            let m = if op == GradOp::Tanh { 1.0 } else { y.abs() };
                            g.abs() * (m + y * y)
                        })
                        .collect()
                }
                // gelu' and silu' cross zero (near x = -0.75 and -1.28), where the
                // relative error of a correct result is unbounded: measure against
                // |dy| (1 + |f'(x)|) = |dy| + |want|, as for tanh and sigmoid above.
                _ => want
                    .iter()
                    .zip(f64s(&dy))
                    .map(|(w, g)| w.abs() + g.abs())
                    .collect(),
            };
            let e = rel_err_scaled(&got, &want, &scale);
            assert!(e <= tol(T::DTYPE), "{what}: error {e:e} (seed {seed})");
            if T::DTYPE == rtx_runtime::DType::F32 {
                let fd: Vec<f64> = f64s(&dy)
                    .iter()
                    .zip(f64s(&x))
                    .map(|(g, x)| fd_grad(op, *g, x))
                    .collect();
                // From a rounded y, tanh and sigmoid are off by y's rounding (~6e-8
                // absolute, times 2|y|): the scaled error covers that too.
                let e = rel_err_scaled(&got, &fd, &scale);
                assert!(
                    e < 1e-5,
                    "{what}: vs finite differences {e:e} (seed {seed})"
                );
            }
        }
    }
}

backend_test!(gradients_match_finite_differences, |rt, label| {
    each_dtype!(grad_parity(rt, label));
});

fn donation<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    let n = 4099;
    let x = kinkless::<T>(&mut r, n);
    let dy = rand_vec::<T>(&mut r, n, -1.0, 1.0);
    let tx = upload(rt, &x, &[n]);
    // Unique x: may be written in place; the answer is the same.
    let y = run(rt, act::gelu_(upload(rt, &x, &[n])));
    let want: Vec<f64> = f64s(&x).iter().map(|v| map_ref(MapOp::Gelu, *v)).collect();
    check::<T>(
        &download::<T>(rt, &y),
        &want,
        &format!("{label} gelu_"),
        seed,
    );
    let y = run(rt, act::mul_scalar_(upload(rt, &x, &[n]), 3.0));
    let want: Vec<f64> = f64s(&x).iter().map(|v| 3.0 * v).collect();
    check::<T>(
        &download::<T>(rt, &y),
        &want,
        &format!("{label} mul_scalar_"),
        seed,
    );
    // Shared dy: the op allocates and the clone keeps its values.
    let tdy = upload(rt, &dy, &[n]);
    let keep = tdy.clone();
    let dx = run(rt, act::silu_backward_(tdy, &tx));
    let want: Vec<f64> = f64s(&dy)
        .iter()
        .zip(f64s(&x))
        .map(|(g, x)| fd_grad(GradOp::Silu, *g, x))
        .collect();
    check::<T>(
        &download::<T>(rt, &dx),
        &want,
        &format!("{label} silu_backward_"),
        seed,
    );
    assert_eq!(
        download::<T>(rt, &keep),
        f64s(&dy),
        "{label}: clone changed"
    );
    // Unique dy.
    let dx = run(rt, act::relu_backward_(upload(rt, &dy, &[n]), &tx));
    let want: Vec<f64> = f64s(&dy)
        .iter()
        .zip(f64s(&x))
        .map(|(g, x)| if x > 0.0 { *g } else { 0.0 })
        .collect();
    check::<T>(
        &download::<T>(rt, &dx),
        &want,
        &format!("{label} relu_backward_"),
        seed,
    );
}

backend_test!(donation_gives_the_same_answer, |rt, label| {
    each_dtype!(donation(rt, label));
});

#[test]
fn cpu_donation_writes_in_place() {
    let rt = Runtime::cpu(1);
    let before = rtx_ops::donations();
    let y = run(
        &rt,
        act::add_scalar_(upload(&rt, &[1.0f32, 2.0], &[2]), 1.0),
    );
    let x = upload(&rt, &[1.0f32, -1.0], &[2]);
    let dx = run(&rt, act::relu_backward_(y, &x));
    assert_eq!(download::<f32>(&rt, &dx), vec![2.0, 0.0]);
    assert!(
        rtx_ops::donations() - before >= 2,
        "both ops should write in place"
    );
}

backend_test!(bad_input_is_rejected_and_given_back, |rt, label| {
    let a = upload(rt, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = upload(rt, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let e = rt.submit(act::gelu_backward(&a, &b)).unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let (ga, gb) = e.into_op().into_inputs();
    assert!(ga.same_storage(&a) && gb.same_storage(&b), "{label}");
    let h = upload(rt, &[f16::from_f32(1.0); 6], &[2, 3]);
    let e = rt.submit(act::silu_backward(&a, &h)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let u = upload(rt, &[1u32, 2], &[2]);
    let e = rt.submit(act::tanh(&u)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    assert!(e.into_op().into_input().same_storage(&u));
    // A donated operand comes back intact.
    let e = rt.submit(act::relu_backward_(a.clone(), &b)).unwrap_err();
    let (ga, _) = e.into_op().into_inputs();
    assert_eq!(download::<f32>(rt, &ga), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
});
