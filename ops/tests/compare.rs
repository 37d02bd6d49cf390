//! Comparisons, selection and device-side accuracy on every backend: every dtype against
//! the f64 comparison on fresh random inputs with ties and NaN (odd sizes, poisoned
//! outputs), and bad input.

mod common;

use common::*;
use rand::Rng;
use rtx_ops::compare::{eq, gt, lt, where_, CmpOp};
use rtx_runtime::{bf16, f16, DType, Element, Error, Runtime, Tensor};

fn run<O: rtx_runtime::Op<Output = Tensor>>(rt: &Runtime, op: O) -> Tensor {
    match rt.submit(op) {
        Ok(s) => s.wait().expect("op failed"),
        Err(e) => panic!("submit rejected: {}", e.error),
    }
}

/// Few distinct values (ties are common), and NaN now and then for floats.
fn values<T: Element>(r: &mut rand::rngs::StdRng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| {
            if T::DTYPE.is_float() && r.gen_ratio(1, 50) {
                T::from_f64(f64::NAN)
            } else {
                T::from_f64(r.gen_range(0..9) as f64)
            }
        })
        .collect()
}

fn parity<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for shape in [&[1usize][..], &[7], &[33, 1001], &[1_000_003]] {
        let n: usize = shape.iter().product();
        let (a, b) = (values::<T>(&mut r, n), values::<T>(&mut r, n));
        let (ta, tb) = (upload(rt, &a, shape), upload(rt, &b, shape));
        for (op, mk) in [
            (CmpOp::Eq, eq as fn(&Tensor, &Tensor) -> _),
            (CmpOp::Gt, gt),
            (CmpOp::Lt, lt),
        ] {
            let m = run(rt, mk(&ta, &tb));
            assert_eq!((m.dtype(), m.dims()), (DType::U32, shape));
            let got = rt.to_vec::<u32>(&m).unwrap().wait().unwrap();
            for (i, g) in got.iter().enumerate() {
                let (x, z) = (a[i].to_f64(), b[i].to_f64());
                let want = match op {
                    CmpOp::Eq => x == z,
                    CmpOp::Gt => x > z,
                    CmpOp::Lt => x < z,
                } as u32;
                assert_eq!(
                    *g,
                    want,
                    "{label} {op:?} {} {shape:?} at {i} (seed {seed})",
                    T::DTYPE
                );
            }
            // Select with that mask.
            let y = run(rt, where_(&m, &ta, &tb));
            let got_y = rt.to_vec::<T>(&y).unwrap().wait().unwrap();
            for (i, v) in got_y.iter().enumerate() {
                let want = if got[i] != 0 { a[i] } else { b[i] };
                assert!(
                    v.to_f64().to_bits() == want.to_f64().to_bits(),
                    "{label} where_ {} at {i} (seed {seed})",
                    T::DTYPE
                );
            }
        }
    }
}

backend_test!(comparisons_and_where_match_the_reference, |rt, label| {
    parity::<f32>(rt, label);
    parity::<f16>(rt, label);
    parity::<bf16>(rt, label);
    parity::<i32>(rt, label);
    parity::<u32>(rt, label);
});

backend_test!(accuracy_is_computable_on_the_device, |rt, label| {
    let (seed, mut r) = rng();
    let (rows, cols) = (1001usize, 37usize);
    let x = rand_vec::<f32>(&mut r, rows * cols, -1.0, 1.0);
    let labels: Vec<u32> = (0..rows).map(|_| r.gen_range(0..cols as u32)).collect();
    let tx = upload(rt, &x, &[rows, cols]);
    let tl = upload(rt, &labels, &[rows]);
    let pred = run(rt, rtx_ops::argmax_dim(&tx, 1, false));
    let hit = run(rt, eq(&pred, &tl));
    let acc = run(rt, rtx_ops::mean(&run(rt, rtx_ops::cast(&hit, DType::F32))));
    let want = x
        .chunks(cols)
        .zip(&labels)
        .filter(|(row, l)| {
            let best = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            row.iter().position(|v| *v == best).unwrap() as u32 == **l
        })
        .count() as f64
        / rows as f64;
    let got = download::<f32>(rt, &acc)[0];
    assert!(
        (got - want).abs() < 1e-6,
        "{label}: accuracy {got} vs {want} (seed {seed})"
    );
});

backend_test!(bad_input_is_rejected_and_given_back, |rt, label| {
    let a = upload(rt, &[1.0f32, 2.0, 3.0], &[3]);
    let b = upload(rt, &[1.0f32, 2.0], &[2]);
    let e = rt.submit(eq(&a, &b)).unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let (ga, gb) = e.into_op().into_inputs();
    assert!(ga.same_storage(&a) && gb.same_storage(&b));
    let u = upload(rt, &[1u32, 2, 3], &[3]);
    let e = rt.submit(gt(&a, &u)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let e = rt.submit(where_(&a, &a, &a)).unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::DTypeMismatch {
                expected: DType::U32,
                ..
            }
        ),
        "{label}"
    );
    let h = upload(rt, &[f16::from_f32(1.0); 3], &[3]);
    let e = rt.submit(where_(&u, &a, &h)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let u2 = upload(rt, &[1u32, 2], &[2]);
    let e = rt.submit(where_(&u2, &a, &a)).unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    assert!(e.into_op().into_inputs().0.same_storage(&u2));
});
