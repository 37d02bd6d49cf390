//! Cross-entropy on every backend: loss, log-sum-exp and gradient against f64 references
//! on fresh random inputs (odd sizes, long rows, poisoned outputs, u32 and i32 labels,
//! ignored rows), the gradient against central finite differences, and bad labels.

mod common;

use common::*;
use rand::Rng;
use rtx_ops::loss::{check_bad_labels, cross_entropy, cross_entropy_backward};
use rtx_runtime::{bf16, f16, BackendKind, DType, Element, Error, Runtime, Tensor};

/// The f64 reference: (mean loss, lse per row, dlogits for `scale`).
fn reference(
    x: &[f64],
    labels: &[i64],
    cols: usize,
    ignore: Option<i64>,
    scale: f64,
) -> (f64, Vec<f64>, Vec<f64>) {
    let mut lse = Vec::new();
    let (mut sum, mut count) = (0.0, 0usize);
    for (r, row) in x.chunks(cols).enumerate() {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        lse.push(l);
        if Some(labels[r]) != ignore {
            sum += l - row[labels[r] as usize];
            count += 1;
        }
    }
    let mut dx = vec![0.0; x.len()];
    for (r, row) in x.chunks(cols).enumerate() {
        if Some(labels[r]) == ignore {
            continue;
        }
        for c in 0..cols {
            let hot = if c as i64 == labels[r] { 1.0 } else { 0.0 };
            dx[r * cols + c] = ((row[c] - lse[r]).exp() - hot) * scale / count as f64;
        }
    }
    (sum / count as f64, lse, dx)
}

fn labels_of(
    r: &mut rand::rngs::StdRng,
    rows: usize,
    cols: usize,
    ignore: Option<i64>,
) -> Vec<i64> {
    (0..rows)
        .map(|i| match ignore {
            // Every third row ignored, but never all of them.
            Some(ig) if i % 3 == 1 => ig,
            _ => r.gen_range(0..cols as i64),
        })
        .collect()
}

fn upload_labels<L: Element>(rt: &Runtime, labels: &[i64]) -> Tensor {
    let v: Vec<L> = labels.iter().map(|&l| L::from_f64(l as f64)).collect();
    upload(rt, &v, &[labels.len()])
}

fn parity<T: Element, L: Element>(rt: &Runtime, label: &str, ignore: Option<i64>) {
    let (seed, mut r) = rng();
    for (rows, cols, spread) in [
        (1usize, 1usize, 1.0),
        (7, 3, 4.0),
        (33, 1001, 8.0),
        (1000, 10, 2.0),
        (3, 50_257, 6.0),
    ] {
        let x = rand_vec::<T>(&mut r, rows * cols, -spread, spread);
        let labels = labels_of(&mut r, rows, cols, ignore);
        let (tx, tl) = (
            upload(rt, &x, &[rows, cols]),
            upload_labels::<L>(rt, &labels),
        );
        let mut op = cross_entropy(&tx, &tl);
        if let Some(i) = ignore {
            op = op.ignore_index(i);
        }
        let out = rt
            .submit(op)
            .expect("submit")
            .wait()
            .expect("cross_entropy");
        assert_eq!((out.loss.dims(), out.lse.dims()), (&[1][..], &[rows][..]));
        let scale = 0.75;
        let mut bop = cross_entropy_backward(&tx, &tl, &out.lse, scale as f32);
        if let Some(i) = ignore {
            bop = bop.ignore_index(i);
        }
        let dx = rt.submit(bop).expect("submit").wait().expect("backward");
        let (loss, lse, dref) = reference(&f64s(&x), &labels, cols, ignore, scale);
        let what = format!(
            "{label} {rows}x{cols} {} labels {} ignore {ignore:?}",
            T::DTYPE,
            L::DTYPE
        );
        // Loss and lse are f32 whatever the logits' dtype: f32 tolerance.
        let e = rel_err(&download::<f32>(rt, &out.loss), &[loss]);
        assert!(e < 1e-5, "{what}: loss {e:e} (seed {seed})");
        let e = rel_err(&download::<f32>(rt, &out.lse), &lse);
        assert!(e < 1e-5, "{what}: lse {e:e} (seed {seed})");
        assert_eq!(download::<u32>(rt, &out.bad_labels), vec![0.0], "{what}");
        check::<T>(
            &download::<T>(rt, &dx),
            &dref,
            &format!("{what}: dlogits"),
            seed,
        );
    }
}

macro_rules! each_dtype_and_label {
    ($rt:expr, $label:expr, $ignore:expr) => {
        parity::<f32, u32>($rt, $label, $ignore);
        parity::<f16, u32>($rt, $label, $ignore);
        parity::<bf16, i32>($rt, $label, $ignore);
        parity::<f32, i32>($rt, $label, $ignore);
    };
}

backend_test!(cross_entropy_matches_f64, |rt, label| {
    each_dtype_and_label!(rt, label, None);
});

backend_test!(ignored_rows_are_left_out, |rt, label| {
    each_dtype_and_label!(rt, label, Some(7));
    parity::<f32, i32>(rt, label, Some(-100));
});

// The backward against central finite differences of the f64 mean loss.
backend_test!(gradient_matches_finite_differences, |rt, label| {
    let (seed, mut r) = rng();
    let (rows, cols) = (5usize, 7usize);
    let x = rand_vec::<f32>(&mut r, rows * cols, -3.0, 3.0);
    let labels = labels_of(&mut r, rows, cols, Some(-1));
    let (tx, tl) = (
        upload(rt, &x, &[rows, cols]),
        upload_labels::<i32>(rt, &labels),
    );
    let out = rt
        .submit(cross_entropy(&tx, &tl).ignore_index(-1))
        .unwrap()
        .wait()
        .unwrap();
    let dx = rt
        .submit(cross_entropy_backward(&tx, &tl, &out.lse, 2.0).ignore_index(-1))
        .unwrap()
        .wait()
        .unwrap();
    let xf = f64s(&x);
    let h = 1e-5;
    let fd: Vec<f64> = (0..xf.len())
        .map(|i| {
            let (mut p, mut m) = (xf.clone(), xf.clone());
            p[i] += h;
            m[i] -= h;
            let lp = reference(&p, &labels, cols, Some(-1), 1.0).0;
            let lm = reference(&m, &labels, cols, Some(-1), 1.0).0;
            2.0 * (lp - lm) / (2.0 * h)
        })
        .collect();
    let e = rel_err(&download::<f32>(rt, &dx), &fd);
    assert!(
        e < 1e-5,
        "{label}: vs finite differences {e:e} (seed {seed})"
    );
});

backend_test!(out_of_range_labels_are_reported, |rt, label| {
    let x = upload(rt, &[0.5f32, -0.5, 1.0, 0.0, 2.0, 1.0], &[3, 2]);
    for bad in [vec![0u32, 2, 1], vec![0, 1, u32::MAX]] {
        let tl = upload(rt, &bad, &[3]);
        let sub = rt.submit(cross_entropy(&x, &tl)).expect("submit");
        match rt.backend() {
            BackendKind::Cpu => {
                let e = sub.wait().unwrap_err();
                assert!(matches!(e, Error::InvalidOp { .. }), "{label}: {e}");
                let lse = upload(rt, &[0.0f32; 3], &[3]);
                let e = rt
                    .submit(cross_entropy_backward(&x, &tl, &lse, 1.0))
                    .unwrap()
                    .wait()
                    .unwrap_err();
                assert!(matches!(e, Error::InvalidOp { .. }), "{label}: {e}");
            }
            BackendKind::Cuda => {
                let out = sub.wait().expect("the op completes; the flag reports");
                assert!(download::<f32>(rt, &out.loss)[0].is_nan(), "{label}");
                assert_eq!(download::<u32>(rt, &out.bad_labels), vec![1.0], "{label}");
                let e = check_bad_labels(rt, &out.bad_labels).unwrap_err();
                assert!(matches!(e, Error::InvalidOp { .. }), "{label}: {e}");
                let dx = rt
                    .submit(cross_entropy_backward(&x, &tl, &out.lse, 1.0))
                    .unwrap();
                let dx = download::<f32>(rt, &dx.wait().unwrap());
                let bad_row = if bad[1] == 2 { 1 } else { 2 };
                for (i, v) in dx.iter().enumerate() {
                    assert_eq!(v.is_nan(), i / 2 == bad_row, "{label}: {dx:?}");
                }
            }
        }
    }
    // Valid labels pass the check.
    let tl = upload(rt, &[1u32, 0, 1], &[3]);
    let out = rt.submit(cross_entropy(&x, &tl)).unwrap().wait().unwrap();
    check_bad_labels(rt, &out.bad_labels).expect("all labels valid");
});

backend_test!(bad_input_is_rejected_and_given_back, |rt, label| {
    let x = upload(rt, &[0.5f32; 6], &[3, 2]);
    let l = upload(rt, &[0u32; 2], &[2]);
    let e = rt.submit(cross_entropy(&x, &l)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidDim { .. }),
        "{label}: {}",
        e.error
    );
    let (gx, gl) = e.into_op().into_inputs();
    assert!(gx.same_storage(&x) && gl.same_storage(&l));
    let lf = upload(rt, &[0.0f32; 3], &[3]);
    let e = rt.submit(cross_entropy(&x, &lf)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let x1 = upload(rt, &[0.5f32; 6], &[6]);
    let e = rt.submit(cross_entropy(&x1, &l)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidDim { .. }),
        "{label}: {}",
        e.error
    );
    let l3 = upload(rt, &[0u32; 3], &[3]);
    let lse_bad = upload(rt, &[0.0f32; 2], &[2]);
    let e = rt
        .submit(cross_entropy_backward(&x, &l3, &lse_bad, 1.0))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let lse_h = upload(rt, &[f16::from_f32(0.0); 3], &[3]);
    let e = rt
        .submit(cross_entropy_backward(&x, &l3, &lse_h, 1.0))
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::DTypeMismatch {
                expected: DType::F32,
                ..
            }
        ),
        "{label}"
    );
    assert_eq!(e.into_op().into_inputs().2.dims(), &[3]);
});
