//! Embedding forward and backward on every backend: gather exactly, scatter-add against
//! an f64 reference (with repeated and unused rows), determinism, out-of-range ids and
//! bad input.

mod common;

use common::*;
use rand::Rng;
use rtx_ops::embedding::{embedding, embedding_backward};
use rtx_runtime::{bf16, f16, BackendKind, DType, Element, Error, Runtime, Tensor};

fn ids_tensor(rt: &Runtime, ids: &[i64], shape: &[usize], dt: DType) -> Tensor {
    match dt {
        DType::I32 => upload(
            rt,
            &ids.iter().map(|&v| v as i32).collect::<Vec<_>>(),
            shape,
        ),
        _ => upload(
            rt,
            &ids.iter().map(|&v| v as u32).collect::<Vec<_>>(),
            shape,
        ),
    }
}

fn forward_case<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    for (v, d, shape) in [
        (1001usize, 37usize, vec![513usize]),
        (7, 1, vec![3, 171]),
        (50, 768, vec![65]),
    ] {
        let n: usize = shape.iter().product();
        let table = rand_vec::<T>(&mut r, v * d, -1.0, 1.0);
        let ids: Vec<i64> = (0..n).map(|_| r.gen_range(0..v as i64)).collect();
        for dt in [DType::U32, DType::I32] {
            let op = embedding(
                &upload(rt, &table, &[v, d]),
                &ids_tensor(rt, &ids, &shape, dt),
            );
            let (y, bad) = rt.submit(op).unwrap().wait().unwrap();
            let mut want_dims = shape.clone();
            want_dims.push(d);
            assert_eq!(y.dims(), &want_dims[..]);
            let want: Vec<f64> = ids
                .iter()
                .flat_map(|&id| f64s(&table[id as usize * d..(id as usize + 1) * d]))
                .collect();
            assert_eq!(
                download::<T>(rt, &y),
                want,
                "{label} {} {dt} V {v} D {d} (seed {seed})",
                T::DTYPE
            );
            assert_eq!(download::<u32>(rt, &bad), vec![0.0], "{label}");
        }
    }
}

backend_test!(forward_gathers_rows, |rt, label| {
    forward_case::<f32>(rt, label);
    forward_case::<f16>(rt, label);
    forward_case::<bf16>(rt, label);
});

fn backward_case<T: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    // Few rows (every row hit many times), many rows (most unused), odd D, and skewed ids
    // as in text (low ids frequent: heavy buckets in neighbouring rows, spread over
    // blocks on CUDA).
    for (v, d, n, skewed) in [
        (17usize, 33usize, 1000usize, false),
        (5000, 7, 301, false),
        (3, 768, 2049, false),
        (3000, 256, 6000, true),
        // The one-launch backward's most ids, then past it on CUDA (more than 16384 ids;
        // more than 4096 rows per block): the five-launch one.
        (3000, 32, 16384, true),
        (2000, 64, 17000, true),
        (600_000, 2, 50, false),
    ] {
        let dy = rand_vec::<T>(&mut r, n * d, -1.0, 1.0);
        let ids: Vec<i64> = (0..n)
            .map(|_| {
                if skewed {
                    let u: f64 = r.gen_range(0.0..1.0);
                    ((v as f64 * u.powi(6)) as i64).min(v as i64 - 1)
                } else {
                    r.gen_range(0..v as i64)
                }
            })
            .collect();
        let mut want = vec![0f64; v * d];
        for (i, &id) in ids.iter().enumerate() {
            for k in 0..d {
                want[id as usize * d + k] += dy[i * d + k].to_f64();
            }
        }
        for dt in [DType::I32, DType::U32] {
            let (tdy, tids) = (upload(rt, &dy, &[n, d]), ids_tensor(rt, &ids, &[n], dt));
            let (g, bad) = rt
                .submit(embedding_backward(&tdy, &tids, v))
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(g.dims(), &[v, d]);
            let got = download::<T>(rt, &g);
            let what = format!("{label} {} {dt} V {v} D {d} N {n}", T::DTYPE);
            // Sums of up to ~n / v terms: the error is relative to the sum of magnitudes.
            let mut scale = vec![0f64; v * d];
            for (i, &id) in ids.iter().enumerate() {
                for k in 0..d {
                    scale[id as usize * d + k] += dy[i * d + k].to_f64().abs();
                }
            }
            let e = rel_err_scaled(&got, &want, &scale);
            assert!(e <= tol(T::DTYPE), "{what}: error {e:e} (seed {seed})");
            assert_eq!(download::<u32>(rt, &bad), vec![0.0]);
            // Deterministic: a second run is bit-identical.
            let (g2, _) = rt
                .submit(embedding_backward(&tdy, &tids, v))
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(download::<T>(rt, &g2), got, "{what}: not deterministic");
        }
    }
}

backend_test!(backward_scatter_adds_deterministically, |rt, label| {
    backward_case::<f32>(rt, label);
    backward_case::<bf16>(rt, label);
    backward_case::<f16>(rt, label);
});

fn out_of_range_case(rt: &Runtime, label: &str) {
    let table = upload(rt, &[1.0f32; 4 * 3], &[4, 3]);
    let ids = upload(rt, &[0i32, 4, -1, 3], &[4]);
    let dy = upload(rt, &[1.0f32; 4 * 3], &[4, 3]);
    let fwd = rt.submit(embedding(&table, &ids)).unwrap().wait();
    let bwd = rt.submit(embedding_backward(&dy, &ids, 4)).unwrap().wait();
    match rt.backend() {
        BackendKind::Cpu => {
            for r in [fwd.map(|_| ()), bwd.map(|_| ())] {
                let e = r.unwrap_err();
                assert!(matches!(e, Error::InvalidOp { .. }), "{label}: {e}");
                assert!(e.to_string().contains("out of range"), "{label}: {e}");
            }
        }
        _ => {
            // Never read out of bounds: the bad rows are zeros (or left out) and counted.
            let (y, bad) = fwd.unwrap();
            assert_eq!(download::<u32>(rt, &bad), vec![2.0], "{label}");
            let y = download::<f32>(rt, &y);
            assert_eq!(&y[3..9], &[0.0; 6], "{label}");
            assert_eq!(&y[..3], &[1.0; 3], "{label}");
            let (g, bad) = bwd.unwrap();
            assert_eq!(download::<u32>(rt, &bad), vec![2.0], "{label}");
            let g = download::<f32>(rt, &g);
            assert_eq!(
                g,
                [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0],
                "{label}"
            );
        }
    }
}

backend_test!(out_of_range_ids, |rt, label| {
    out_of_range_case(rt, label);
});

/// The five-launch backward (the setting `embedding_one_launch` off; the tests above run
/// the default, one launch where it applies; CUDA only): the same cases against f64,
/// deterministic, invalid ids counted and skipped.
#[test]
fn five_launch_backward_scatter_adds_deterministically() {
    for_each_cuda_with(
        |b| b.embedding_one_launch(false),
        "five-launch",
        |rt, label| {
            backward_case::<f32>(rt, label);
            backward_case::<bf16>(rt, label);
            backward_case::<f16>(rt, label);
            out_of_range_case(rt, label);
        },
    );
}

backend_test!(bad_embeddings_are_rejected_and_given_back, |rt, label| {
    let table = upload(rt, &[1.0f32; 12], &[4, 3]);
    let flat = upload(rt, &[1.0f32; 12], &[12]);
    let ids = upload(rt, &[0u32, 1], &[2]);
    let fids = upload(rt, &[0.0f32, 1.0], &[2]);
    let dy = upload(rt, &[1.0f32; 6], &[2, 3]);
    let dy_bad = upload(rt, &[1.0f32; 6], &[3, 2]);
    let e = rt.submit(embedding(&flat, &ids)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidDim { .. }),
        "{label}: {}",
        e.error
    );
    let e = rt.submit(embedding(&table, &fids)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let (t, i) = e.into_op().into_inputs();
    assert!(t.same_storage(&table) && i.same_storage(&fids));
    let e = rt.submit(embedding(&ids, &ids)).unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::InvalidDim { .. } | Error::DTypeMismatch { .. }
        ),
        "{label}"
    );
    let e = rt.submit(embedding_backward(&dy_bad, &ids, 4)).unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let e = rt.submit(embedding_backward(&dy, &ids, 0)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidOp { .. }),
        "{label}: {}",
        e.error
    );
    let (g, i) = e.into_op().into_inputs();
    assert!(g.same_storage(&dy) && i.same_storage(&ids));
    let e = rt.submit(embedding_backward(&dy, &fids, 4)).unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
});
