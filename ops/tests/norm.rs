//! Layer norm on every backend: forward (y, mean, rstd) and backward (dx, dgamma, dbeta)
//! against f64 references on fresh random inputs (odd sizes, poisoned outputs), the
//! backward against central finite differences, and bad input.

mod common;

use common::*;
use rtx_ops::norm::{layer_norm, layer_norm_backward};
use rtx_runtime::{bf16, f16, DType, Element, Error, Runtime};

/// The f64 forward: (y, mean, rstd).
fn forward_ref(x: &[f64], g: &[f64], b: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = g.len();
    let (mut y, mut ms, mut rs) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks(d) {
        let m = row.iter().sum::<f64>() / d as f64;
        let v = row.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / d as f64;
        let r = 1.0 / (v + eps).sqrt();
        y.extend(
            row.iter()
                .zip(g.iter().zip(b))
                .map(|(x, (g, b))| (x - m) * r * g + b),
        );
        ms.push(m);
        rs.push(r);
    }
    (y, ms, rs)
}

/// The f64 backward from the formulas: (dx, dgamma, dbeta).
fn backward_ref(dy: &[f64], x: &[f64], g: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = g.len();
    let (_, ms, rs) = forward_ref(x, g, &vec![0.0; d], eps);
    let (mut dx, mut dg, mut db) = (Vec::new(), vec![0.0; d], vec![0.0; d]);
    for (r, (dyr, xr)) in dy.chunks(d).zip(x.chunks(d)).enumerate() {
        let xh: Vec<f64> = xr.iter().map(|v| (v - ms[r]) * rs[r]).collect();
        let gg: Vec<f64> = dyr.iter().zip(g).map(|(a, b)| a * b).collect();
        let mg = gg.iter().sum::<f64>() / d as f64;
        let mgx = gg.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / d as f64;
        for j in 0..d {
            dx.push(rs[r] * (gg[j] - mg - xh[j] * mgx));
            dg[j] += dyr[j] * xh[j];
            db[j] += dyr[j];
        }
    }
    (dx, dg, db)
}

fn parity<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    let eps = 1e-5;
    for shape in [
        &[1usize, 1][..],
        &[7][..],
        &[3, 5, 33],
        &[257, 768],
        &[4, 5000],
        // Rows of at least 8 KiB on the register path (ln_bwd_pipe on sm_80+, else
        // ln_bwd_fused), several rows per group so that the ring wraps: bf16 / f16 with
        // a partial last vector per group, f32 with two groups per block.
        &[600, 4104],
        &[1100, 2048],
        &[1000, 3],
        // Many short rows: each group of the bulk-copy kernels (layer_norm_bulk) wraps its
        // ring of 12 stages (about 19 rows per group on 132 SMs).
        &[20000, 64],
    ] {
        let d = *shape.last().unwrap();
        let n: usize = shape.iter().product();
        let rows = n / d;
        // A per-row offset, so the mean matters.
        let x = rand_vec::<T>(&mut r, n, -2.0, 3.0);
        let g = rand_vec::<T>(&mut r, d, 0.5, 1.5);
        let b = rand_vec::<T>(&mut r, d, -0.5, 0.5);
        let dy = rand_vec::<T>(&mut r, n, -1.0, 1.0);
        let (tx, tg, tb) = (
            upload(rt, &x, shape),
            upload(rt, &g, &[d]),
            upload(rt, &b, &[d]),
        );
        let (y, mean, rstd) = rt
            .submit(layer_norm(&tx, &tg, &tb, eps as f32))
            .expect("submit")
            .wait()
            .expect("layer_norm");
        assert_eq!(
            (y.dims(), mean.dims(), rstd.dims()),
            (shape, &[rows][..], &[rows][..])
        );
        let (xf, gf, bf) = (f64s(&x), f64s(&g), f64s(&b));
        let (yr, mr, rr) = forward_ref(&xf, &gf, &bf, eps);
        let what = format!("{label} {shape:?} {}", T::DTYPE);
        check::<T>(&download::<T>(rt, &y), &yr, &format!("{what} y"), seed);
        check::<f32>(
            &download::<f32>(rt, &mean),
            &mr,
            &format!("{what} mean"),
            seed,
        );
        check::<f32>(
            &download::<f32>(rt, &rstd),
            &rr,
            &format!("{what} rstd"),
            seed,
        );
        let tdy = upload(rt, &dy, shape);
        let (dx, dg, db) = rt
            .submit(layer_norm_backward(&tdy, &tx, &mean, &rstd, &tg))
            .expect("submit")
            .wait()
            .expect("layer_norm_backward");
        assert_eq!(
            (dx.dims(), dg.dims(), db.dims()),
            (shape, &[d][..], &[d][..])
        );
        let (dxr, dgr, dbr) = backward_ref(&f64s(&dy), &xf, &gf, eps);
        // dx cancels (its row sums are 0): scale by the magnitudes it is made of.
        let scale: Vec<f64> = f64s(&dy)
            .iter()
            .zip(xf.chunks(d).flat_map(|_| gf.iter()))
            .zip(rr.iter().flat_map(|r| std::iter::repeat_n(*r, d)))
            .map(|((a, g), r)| (a * g * r).abs())
            .collect();
        let e = rel_err_scaled(&download::<T>(rt, &dx), &dxr, &scale);
        assert!(e <= tol(T::DTYPE), "{what} dx: {e:e} (seed {seed})");
        check::<T>(
            &download::<T>(rt, &dg),
            &dgr,
            &format!("{what} dgamma"),
            seed,
        );
        check::<T>(
            &download::<T>(rt, &db),
            &dbr,
            &format!("{what} dbeta"),
            seed,
        );
    }
}

backend_test!(layer_norm_matches_f64, |rt, label| {
    parity::<f32>(rt, label);
    parity::<f16>(rt, label);
    parity::<bf16>(rt, label);
});

/// The bulk-copy kernels (the experimental setting `layer_norm_bulk`; CUDA of compute
/// capability 9.0 and newer, else the same kernels as above): the same cases against f64.
#[test]
fn bulk_layer_norm_matches_f64() {
    for_each_cuda_with(
        |b| b.layer_norm_bulk(true),
        "bulk",
        |rt, label| {
            assert!(rt.settings().layer_norm_bulk);
            parity::<f32>(rt, label);
            parity::<f16>(rt, label);
            parity::<bf16>(rt, label);
        },
    );
}

// The backward against central finite differences of L = sum(w · y) in f64.
backend_test!(backward_matches_finite_differences, |rt, label| {
    let (seed, mut r) = rng();
    let (rows, d, eps) = (3usize, 6usize, 1e-5);
    let x = rand_vec::<f32>(&mut r, rows * d, -2.0, 2.0);
    let g = rand_vec::<f32>(&mut r, d, 0.5, 1.5);
    let b = rand_vec::<f32>(&mut r, d, -0.5, 0.5);
    let w = rand_vec::<f32>(&mut r, rows * d, -1.0, 1.0);
    let (xf, gf, bf, wf) = (f64s(&x), f64s(&g), f64s(&b), f64s(&w));
    let loss = |x: &[f64], g: &[f64], b: &[f64]| -> f64 {
        forward_ref(x, g, b, eps)
            .0
            .iter()
            .zip(&wf)
            .map(|(y, w)| y * w)
            .sum()
    };
    let h = 1e-6;
    let fd = |v: &[f64], f: &dyn Fn(&[f64]) -> f64| -> Vec<f64> {
        (0..v.len())
            .map(|i| {
                let (mut p, mut m) = (v.to_vec(), v.to_vec());
                p[i] += h;
                m[i] -= h;
                (f(&p) - f(&m)) / (2.0 * h)
            })
            .collect()
    };
    let fdx = fd(&xf, &|v| loss(v, &gf, &bf));
    let fdg = fd(&gf, &|v| loss(&xf, v, &bf));
    let fdb = fd(&bf, &|v| loss(&xf, &gf, v));
    let (tx, tg, tb) = (
        upload(rt, &x, &[rows, d]),
        upload(rt, &g, &[d]),
        upload(rt, &b, &[d]),
    );
    let (_, mean, rstd) = rt
        .submit(layer_norm(&tx, &tg, &tb, eps as f32))
        .unwrap()
        .wait()
        .unwrap();
    let tw = upload(rt, &w, &[rows, d]);
    let (dx, dg, db) = rt
        .submit(layer_norm_backward(&tw, &tx, &mean, &rstd, &tg))
        .unwrap()
        .wait()
        .unwrap();
    for (got, want, what) in [
        (&dx, &fdx, "dx"),
        (&dg, &fdg, "dgamma"),
        (&db, &fdb, "dbeta"),
    ] {
        let e = rel_err(&download::<f32>(rt, got), want);
        assert!(
            e < 1e-4,
            "{label} {what} vs finite differences {e:e} (seed {seed})"
        );
    }
});

backend_test!(bad_input_is_rejected_and_given_back, |rt, label| {
    let x = upload(rt, &[1.0f32; 6], &[2, 3]);
    let g = upload(rt, &[1.0f32; 3], &[3]);
    let g2 = upload(rt, &[1.0f32; 2], &[2]);
    let e = rt.submit(layer_norm(&x, &g2, &g, 1e-5)).unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let (gx, gg, gb) = e.into_op().into_inputs();
    assert!(gx.same_storage(&x) && gg.same_storage(&g2) && gb.same_storage(&g));
    let gh = upload(rt, &[f16::from_f32(1.0); 3], &[3]);
    let e = rt.submit(layer_norm(&x, &gh, &g, 1e-5)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let e = rt.submit(layer_norm(&x, &g, &g, f32::NAN)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidOp { .. }),
        "{label}: {}",
        e.error
    );
    let s = upload(rt, &[1.0f32], &[]);
    let e = rt.submit(layer_norm(&s, &g, &g, 1e-5)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidDim { .. }),
        "{label}: {}",
        e.error
    );
    let m = upload(rt, &[0.0f32; 3], &[3]);
    let e = rt
        .submit(layer_norm_backward(&x, &x, &m, &m, &g))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let mu = upload(rt, &[0u32; 2], &[2]);
    let e = rt
        .submit(layer_norm_backward(&x, &x, &mu, &mu, &g))
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
});
