//! The low-precision copies of the optimizer steps ([`Step::with_copy`]) on every
//! backend: the rounded parameters, written into donated destinations
//! ([`Step::copy_into`]) as into fresh buffers, and bad destinations refused and given
//! back.

// `&[g.clone()]` reads better than `std::slice::from_ref(&g)` in the case tables.
#![allow(clippy::cloned_ref_to_slice_refs)]

mod common;
mod optim_util;

use common::*;
use optim_util::{cfg_adamw, rejected_as, submit, zeros};
use rtx_ops::optim::{self, Sgd, Step};
use rtx_runtime::{bf16, f16, DType, Tensor};

backend_test!(copies_are_the_rounded_parameters, |rt, label| {
    let (_, mut r) = rng();
    let p = rand_vec::<f32>(&mut r, 1001, -1.0, 1.0);
    let g = rand_vec::<f32>(&mut r, 1001, -1.0, 1.0);
    for dt in [DType::BF16, DType::F16] {
        let cfg = Sgd {
            lr: 0.1,
            momentum: 0.5,
            nesterov: false,
            weight_decay: 0.0,
        };
        let op = optim::sgd(
            cfg,
            vec![upload(rt, &p, &[1001])],
            &[upload(rt, &g, &[1001])],
            vec![zeros::<f32>(rt, &[1001])],
        );
        let out = submit(rt, op.with_copy(dt));
        assert_eq!(out.copies.len(), 1);
        assert_eq!(out.copies[0].dtype(), dt);
        let new = rt.to_vec::<f32>(&out.params[0]).unwrap().wait().unwrap();
        let copy = match dt {
            DType::BF16 => download::<bf16>(rt, &out.copies[0]),
            _ => download::<f16>(rt, &out.copies[0]),
        };
        let want: Vec<f64> = new
            .iter()
            .map(|&x| {
                if dt == DType::BF16 {
                    bf16::from_f32(x).to_f64()
                } else {
                    f16::from_f32(x).to_f64()
                }
            })
            .collect();
        assert_eq!(copy, want, "{label} {dt}");
    }
});

backend_test!(copies_into_donated_destinations, |rt, label| {
    // The copies written into `copy_into`'s tensors equal the fresh copies, and a unique
    // destination is donated (its memory reused): poisoned old contents are overwritten.
    let (seed, mut r) = rng();
    let n = 2053;
    let p = rand_vec::<f32>(&mut r, n, -1.0, 1.0);
    let g = rand_vec::<f32>(&mut r, n, -1.0, 1.0);
    for dt in [DType::BF16, DType::F16] {
        let step = |dsts: Option<Tensor>| {
            let op = optim::adamw(
                cfg_adamw(),
                1,
                vec![upload(rt, &p, &[n])],
                &[upload(rt, &g, &[n])],
                vec![zeros::<f32>(rt, &[n])],
                vec![zeros::<f32>(rt, &[n])],
            )
            .with_copy(dt);
            match dsts {
                Some(d) => submit(rt, op.copy_into(vec![d])),
                None => submit(rt, op),
            }
        };
        let fresh = step(None);
        let nan = vec![f32::NAN; n];
        let dst = rt.run(rtx_ops::cast(&upload(rt, &nan, &[n]), dt)).unwrap();
        let before = rtx_ops::donations();
        let into = step(Some(dst));
        let (a, b) = match dt {
            DType::BF16 => (
                download::<bf16>(rt, &fresh.copies[0]),
                download::<bf16>(rt, &into.copies[0]),
            ),
            _ => (
                download::<f16>(rt, &fresh.copies[0]),
                download::<f16>(rt, &into.copies[0]),
            ),
        };
        assert!(
            b.iter().all(|x| x.is_finite()),
            "{label} {dt}: a poisoned element survived"
        );
        assert_eq!(
            a, b,
            "{label} {dt}: copy_into differs from a fresh copy (seed {seed})"
        );
        // p, m, v and the destination (the counter is process-wide; others only add).
        assert!(
            rtx_ops::donations() - before >= 4,
            "{label} {dt} (seed {seed})"
        );
    }
    // Bad destinations are refused at submit and given back.
    let pt = || upload(rt, &p, &[n]);
    let gt = upload(rt, &g, &[n]);
    let half = rt.run(rtx_ops::cast(&pt(), DType::F16)).unwrap();
    let short = rt
        .run(rtx_ops::cast(&upload(rt, &p[..7], &[7]), DType::BF16))
        .unwrap();
    let sgd = Sgd {
        lr: 0.1,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let cases: Vec<(Step, Tensor, &str)> = vec![
        (
            optim::sgd(sgd, vec![pt()], &[gt.clone()], vec![]).copy_into(vec![half.clone()]),
            half.clone(),
            "invalid",
        ),
        (
            optim::sgd(sgd, vec![pt()], &[gt.clone()], vec![])
                .with_copy(DType::BF16)
                .copy_into(vec![half.clone()]),
            half.clone(),
            "dtype",
        ),
        (
            optim::sgd(sgd, vec![pt()], &[gt.clone()], vec![])
                .with_copy(DType::BF16)
                .copy_into(vec![short.clone()]),
            short.clone(),
            "shape",
        ),
        (
            optim::sgd(sgd, vec![pt()], &[gt.clone()], vec![])
                .with_copy(DType::F16)
                .copy_into(vec![half.clone(), half.clone()]),
            half.clone(),
            "invalid",
        ),
    ];
    for (k, (op, dst, kind)) in cases.into_iter().enumerate() {
        let mut op = rejected_as(rt, op, kind, &format!("{label} case {k}"));
        let back = op.take_copy_dsts();
        assert!(
            !back.is_empty() && back.iter().all(|t| t.same_storage(&dst)),
            "{label} case {k}: the destinations were not given back"
        );
    }
});
