//! Cast and fill on every backend: every dtype pair against the value rounded once from
//! f32 (exact expectations), odd sizes, poisoned outputs, ops without inputs on pinned
//! streams, and bad input.

mod common;

use common::*;
use rtx_runtime::{bf16, f16, DType, Element, Error, Runtime, Tensor};

fn run<O: rtx_runtime::Op<Output = Tensor>>(rt: &Runtime, op: O) -> Tensor {
    match rt.submit(op) {
        Ok(s) => s.wait().expect("op failed"),
        Err(e) => panic!("submit rejected: {}", e.error),
    }
}

/// Values of `A` (integers for i32/u32, spread over several binades for floats), within
/// the range of f16 when `small`.
fn values<A: Element>(r: &mut rand::rngs::StdRng, n: usize, small: bool) -> Vec<A> {
    use rand::Rng;
    let (int, exp) = if small {
        (30_000, 15)
    } else {
        (20_000_000, 17)
    };
    (0..n)
        .map(|_| match A::DTYPE {
            DType::I32 => A::from_f64(r.gen_range(-int..int) as f64),
            DType::U32 => A::from_f64(r.gen_range(0..2 * int) as f64),
            _ => A::from_f64(r.gen_range(-1.0f64..1.0) * 2f64.powi(r.gen_range(-12..exp))),
        })
        .collect()
}

fn cast_to<A: Element, B: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for n in [1usize, 7, 1_000_003] {
        let x = values::<A>(&mut r, n, B::DTYPE == DType::F16 || A::DTYPE == DType::F16);
        let y = run(rt, rtx_ops::cast(&upload(rt, &x, &[n]), B::DTYPE));
        assert_eq!((y.dtype(), y.dims()), (B::DTYPE, &[n][..]));
        let got = rt.to_vec::<B>(&y).unwrap().wait().unwrap();
        for (i, (g, v)) in got.iter().zip(&x).enumerate() {
            let want = B::from_f64(v.to_f64() as f32 as f64);
            assert!(
                g.to_f64() == want.to_f64(),
                "{label} cast {}->{} n={n} at {i}: {v:?} gave {g:?}, want {want:?} (seed {seed})",
                A::DTYPE,
                B::DTYPE
            );
        }
        // And within the target's precision of the exact value.
        let e = rel_err(&f64s(&got), &f64s(&x));
        assert!(
            e <= tol(B::DTYPE).max(tol(A::DTYPE)),
            "{label} {e:e} (seed {seed})"
        );
    }
}

fn cast_from<A: Element>(rt: &Runtime, label: &str) {
    cast_to::<A, f32>(rt, label);
    cast_to::<A, f16>(rt, label);
    cast_to::<A, bf16>(rt, label);
}

backend_test!(casts_round_once_through_f32, |rt, label| {
    cast_from::<f32>(rt, label);
    cast_from::<f16>(rt, label);
    cast_from::<bf16>(rt, label);
    cast_from::<i32>(rt, label);
    cast_from::<u32>(rt, label);
});

fn fill_check<T: Element>(rt: &Runtime, label: &str, value: f64) {
    for (shape, stream) in [
        (&[1usize][..], 0usize),
        (&[7, 3][..], 1),
        (&[1_000_003][..], 3),
    ] {
        let streams = rt.compute_streams(rt.device());
        let s = streams[stream % streams.len()];
        let y = rt
            .submit_on(s, rtx_ops::fill(shape, T::DTYPE, value))
            .expect("submit")
            .wait()
            .expect("fill");
        assert_eq!((y.dtype(), y.dims()), (T::DTYPE, shape));
        let got = rt.to_vec::<T>(&y).unwrap().wait().unwrap();
        let want = T::from_f64(value);
        assert!(
            got.iter().all(|v| *v == want),
            "{label} fill {} {value}",
            T::DTYPE
        );
    }
}

backend_test!(fill_writes_every_element, |rt, label| {
    fill_check::<f32>(rt, label, -0.1);
    fill_check::<f16>(rt, label, 0.1);
    fill_check::<bf16>(rt, label, 3.0);
    fill_check::<i32>(rt, label, -7.0);
    fill_check::<u32>(rt, label, 4_000_000_000.0);
    let z = run(rt, rtx_ops::zeros([5, 3], DType::BF16));
    assert_eq!(download::<bf16>(rt, &z), vec![0.0; 15], "{label}");
    let o = run(rt, rtx_ops::ones([1001], DType::F32));
    assert_eq!(download::<f32>(rt, &o), vec![1.0; 1001], "{label}");
});

backend_test!(bad_input_is_rejected_and_given_back, |rt, label| {
    let x = upload(rt, &[1.0f32, 2.0], &[2]);
    let e = rt.submit(rtx_ops::cast(&x, DType::U32)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    assert!(e.into_op().into_input().same_storage(&x));
    for (dtype, v) in [(DType::U32, -1.0), (DType::I32, 0.5), (DType::U32, 5e9)] {
        let e = rt.submit(rtx_ops::fill([3], dtype, v)).unwrap_err();
        assert!(
            matches!(e.error, Error::InvalidOp { .. }),
            "{label}: {}",
            e.error
        );
    }
    let e = rt.submit(rtx_ops::zeros([3, 0], DType::F32)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidOp { .. }),
        "{label}: {}",
        e.error
    );
    let e = rt
        .submit(rtx_ops::zeros([usize::MAX, 3], DType::F32))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidDim { .. }),
        "{label}: {}",
        e.error
    );
});
