//! Layout ops on every backend and dtype: permute/transpose, narrow and concat against
//! references by explicit multi-indices, negative dims, and bad input.

mod common;

use common::*;
use rand::seq::SliceRandom;
use rtx_ops::layout::{self, LayoutOp};
use rtx_runtime::{bf16, f16, Element, Error, Runtime, Tensor};

fn run(rt: &Runtime, op: LayoutOp) -> Tensor {
    match rt.submit(op) {
        Ok(s) => s.wait().expect("op failed"),
        Err(e) => panic!("submit rejected: {}", e.error),
    }
}

/// Random values of any dtype (integers in [-1000, 1000) or [0, 2000)).
fn values<T: Element>(r: &mut rand::rngs::StdRng, n: usize) -> Vec<T> {
    let lo = if T::DTYPE == rtx_runtime::DType::U32 {
        0.0
    } else {
        -1000.0
    };
    rand_vec::<T>(r, n, lo, lo + 2000.0)
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        c[k] = i % dims[k];
        i /= dims[k];
    }
    c
}

fn ravel(c: &[usize], dims: &[usize]) -> usize {
    c.iter().zip(dims).fold(0, |acc, (c, d)| acc * d + c)
}

fn permute_case<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    let cases: Vec<(Vec<usize>, Vec<isize>)> = vec![
        (vec![2, 5, 3, 7], vec![0, 2, 1, 3]),
        (vec![33, 1001], vec![1, 0]),
        (vec![1_000_003], vec![-1]),
        (vec![3, 1, 4, 5, 2], vec![4, 2, 0, -4, 3]),
        (vec![4, 6, 1, 9, 2, 3], {
            let mut p: Vec<isize> = (0..6).collect();
            p.shuffle(&mut r);
            p
        }),
    ];
    for (dims, perm) in cases {
        let n: usize = dims.iter().product();
        let x = values::<T>(&mut r, n);
        let y = run(rt, layout::permute(&upload(rt, &x, &dims), &perm));
        let p: Vec<usize> = perm
            .iter()
            .map(|&d| {
                if d < 0 {
                    (d + dims.len() as isize) as usize
                } else {
                    d as usize
                }
            })
            .collect();
        let ydims: Vec<usize> = p.iter().map(|&d| dims[d]).collect();
        assert_eq!(y.dims(), &ydims[..], "{label}");
        let want: Vec<f64> = (0..n)
            .map(|i| {
                let c = unravel(i, &ydims);
                let mut xc = vec![0; dims.len()];
                for (k, &d) in p.iter().enumerate() {
                    xc[d] = c[k];
                }
                x[ravel(&xc, &dims)].to_f64()
            })
            .collect();
        assert_eq!(
            download::<T>(rt, &y),
            want,
            "{label} {} {dims:?} {perm:?} (seed {seed})",
            T::DTYPE
        );
    }
    // transpose is the swap permutation.
    let x = values::<T>(&mut r, 2 * 3 * 4);
    let t = upload(rt, &x, &[2, 3, 4]);
    let a = download::<T>(rt, &run(rt, layout::transpose(&t, 0, -1)));
    let b = download::<T>(rt, &run(rt, layout::permute(&t, &[2, 1, 0])));
    assert_eq!(a, b, "{label}");
}

fn narrow_concat_case<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for dims in [
        vec![7usize],
        vec![33, 101],
        vec![3, 17, 5],
        vec![2, 3, 4, 1001],
    ] {
        let n: usize = dims.iter().product();
        let x = values::<T>(&mut r, n);
        let tx = upload(rt, &x, &dims);
        for d in 0..dims.len() {
            let size = dims[d];
            // Split dim d into up to three pieces (one from a negative dim), check each,
            // then join them back.
            let cuts = [0, size / 3, (2 * size) / 3 + 1, size];
            let mut pieces = Vec::new();
            for w in cuts.windows(2) {
                let (start, len) = (w[0].min(size), w[1].min(size) - w[0].min(size));
                if len == 0 {
                    continue;
                }
                let dim = if pieces.len() == 1 {
                    d as isize - dims.len() as isize
                } else {
                    d as isize
                };
                let y = run(rt, layout::narrow(&tx, dim, start, len));
                let mut ydims = dims.clone();
                ydims[d] = len;
                assert_eq!(y.dims(), &ydims[..], "{label}");
                let want: Vec<f64> = (0..ydims.iter().product())
                    .map(|i| {
                        let mut c = unravel(i, &ydims);
                        c[d] += start;
                        x[ravel(&c, &dims)].to_f64()
                    })
                    .collect();
                let what = format!(
                    "{label} {} narrow {dims:?} dim {d} [{start}, +{len}) (seed {seed})",
                    T::DTYPE
                );
                assert_eq!(download::<T>(rt, &y), want, "{what}");
                pieces.push(y);
            }
            let back = run(rt, layout::concat(&pieces, d as isize));
            assert_eq!(back.dims(), &dims[..]);
            assert_eq!(
                download::<T>(rt, &back),
                f64s(&x),
                "{label} {} concat {dims:?} dim {d}",
                T::DTYPE
            );
        }
    }
}

backend_test!(permute_matches_multi_index_reference, |rt, label| {
    permute_case::<f32>(rt, label);
    permute_case::<f16>(rt, label);
    permute_case::<bf16>(rt, label);
    permute_case::<i32>(rt, label);
    permute_case::<u32>(rt, label);
});

backend_test!(narrow_and_concat_round_trip, |rt, label| {
    narrow_concat_case::<f32>(rt, label);
    narrow_concat_case::<bf16>(rt, label);
    narrow_concat_case::<i32>(rt, label);
    narrow_concat_case::<u32>(rt, label);
    narrow_concat_case::<f16>(rt, label);
});

backend_test!(concat_of_unequal_parts, |rt, label| {
    let (seed, mut r) = rng();
    let a = values::<f32>(&mut r, 5 * 3);
    let b = values::<f32>(&mut r, 5);
    let c = values::<f32>(&mut r, 5 * 7);
    let y = run(
        rt,
        layout::concat(
            &[
                upload(rt, &a, &[5, 3]),
                upload(rt, &b, &[5, 1]),
                upload(rt, &c, &[5, 7]),
            ],
            -1,
        ),
    );
    assert_eq!(y.dims(), &[5, 11]);
    let mut want = Vec::new();
    for i in 0..5 {
        want.extend(f64s(&a[i * 3..i * 3 + 3]));
        want.extend(f64s(&b[i..i + 1]));
        want.extend(f64s(&c[i * 7..i * 7 + 7]));
    }
    assert_eq!(download::<f32>(rt, &y), want, "{label} (seed {seed})");
});

backend_test!(bad_layouts_are_rejected_and_given_back, |rt, label| {
    let x = upload(rt, &[1.0f32; 24], &[2, 3, 4]);
    let h = upload(rt, &[f16::ZERO; 24], &[2, 3, 4]);
    let y = upload(rt, &[1.0f32; 10], &[2, 5]);
    let cases: Vec<(LayoutOp, &str)> = vec![
        (layout::permute(&x, &[0, 1]), "dim"),
        (layout::permute(&x, &[0, 1, 1]), "dim"),
        (layout::permute(&x, &[0, 1, 3]), "dim"),
        (layout::transpose(&x, 0, -4), "dim"),
        (layout::narrow(&x, 3, 0, 1), "dim"),
        (layout::narrow(&x, 1, 2, 2), "dim"),
        (layout::narrow(&x, -1, 0, 0), "dim"),
        (layout::narrow(&x, 0, usize::MAX, 2), "dim"),
        (layout::concat(&[], 0), "invalid"),
        (layout::concat(&[x.clone(), h.clone()], 0), "dtype"),
        (layout::concat(&[x.clone(), y.clone()], 0), "shape"),
        (layout::concat(std::slice::from_ref(&x), 3), "dim"),
    ];
    for (k, (op, kind)) in cases.into_iter().enumerate() {
        let e = rt.submit(op).unwrap_err();
        let ok = match kind {
            "dim" => matches!(e.error, Error::InvalidDim { .. }),
            "dtype" => matches!(e.error, Error::DTypeMismatch { .. }),
            "shape" => matches!(e.error, Error::ShapeMismatch { .. }),
            _ => matches!(e.error, Error::InvalidOp { .. }),
        };
        assert!(ok, "{label} case {k}: want {kind}, got {}", e.error);
        let back = e.into_op().into_inputs();
        assert!(back
            .iter()
            .all(|t| t.same_storage(&x) || t.same_storage(&h) || t.same_storage(&y)));
    }
});
