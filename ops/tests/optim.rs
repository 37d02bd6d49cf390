//! Optimizer steps on every backend against f64 references written from the formulas
//! (several steps, fresh random inputs, odd sizes), the global norm and clipping,
//! dynamic loss scaling, donation and bad input (the low-precision copies:
//! `optim_copies.rs`).

// `&[g.clone()]` reads better than `std::slice::from_ref(&g)` in the case tables.
#![allow(clippy::cloned_ref_to_slice_refs)]

mod common;
mod optim_util;

use common::*;
use optim_util::{cfg_adamw, rejected_as, submit, zeros};
use rtx_ops::optim::{self, AdamW, Sgd, Step};
use rtx_runtime::{bf16, f16, DType, Element, Runtime, Tensor};

const SHAPES: &[&[usize]] = &[&[1], &[7], &[33, 101], &[100_003]];

/// The f64 AdamW reference, one step on one tensor.
#[allow(clippy::too_many_arguments)]
fn adamw_ref(c: &AdamW, t: f64, mult: f64, p: &mut [f64], g: &[f64], m: &mut [f64], v: &mut [f64]) {
    adamw_ref_mag(c, t, mult, p, g, m, v, None);
}

/// As [`adamw_ref`], also advancing `mag` = (the magnitudes of p's terms, of m's terms):
/// the scale of f32's rounding error in p and m, which does not shrink where the terms
/// cancel (a p or an m that passes near 0: one element alone, as shape [1], gives a
/// relative error by the norm of that element's own size).
#[allow(clippy::too_many_arguments)]
fn adamw_ref_mag(
    c: &AdamW,
    t: f64,
    mult: f64,
    p: &mut [f64],
    g: &[f64],
    m: &mut [f64],
    v: &mut [f64],
    mut mag: Option<(&mut [f64], &mut [f64])>,
) {
    let (lr, b1, b2, eps, wd) = (
        c.lr as f64,
        c.beta1 as f64,
        c.beta2 as f64,
        c.eps as f64,
        c.weight_decay as f64,
    );
    for i in 0..p.len() {
        let g = g[i] * mult;
        p[i] *= 1.0 - lr * wd;
        m[i] = b1 * m[i] + (1.0 - b1) * g;
        v[i] = b2 * v[i] + (1.0 - b2) * g * g;
        let mhat = m[i] / (1.0 - b1.powf(t));
        let vhat = v[i] / (1.0 - b2.powf(t));
        let step = lr * mhat / (vhat.sqrt() + eps);
        p[i] -= step;
        if let Some((pm, mm)) = mag.as_mut() {
            pm[i] = pm[i] * (1.0 - lr * wd) + step.abs();
            mm[i] = b1 * mm[i] + (1.0 - b1) * g.abs();
        }
    }
}

/// The f64 SGD reference (torch.optim.SGD, dampening 0), one step on one tensor.
/// `mag` as in [`adamw_ref_mag`]: the magnitudes of p's and buf's terms.
fn sgd_ref(c: &Sgd, p: &mut [f64], g: &[f64], buf: &mut [f64], mag: (&mut [f64], &mut [f64])) {
    let (lr, mu, wd) = (c.lr as f64, c.momentum as f64, c.weight_decay as f64);
    let (pm, bm) = mag;
    for i in 0..p.len() {
        let ga = g[i].abs() + wd * pm[i];
        let g = g[i] + wd * p[i];
        buf[i] = mu * buf[i] + g;
        bm[i] = mu * bm[i] + ga;
        let (d, da) = if c.nesterov {
            (g + mu * buf[i], ga + mu * bm[i])
        } else {
            (buf[i], bm[i])
        };
        p[i] -= lr * d;
        pm[i] += lr * da;
    }
}

/// Asserts the f32 `got` within `tol(F32)` of `want` by the norm relative to `scale`.
fn check_scaled(rt: &Runtime, got: &Tensor, want: &[f64], scale: &[f64], what: &str, seed: u64) {
    let e = rel_err_scaled(&download::<f32>(rt, got), want, scale);
    assert!(
        e <= tol(DType::F32),
        "{what}: relative error {e:e} > {:e} (seed {seed})",
        tol(DType::F32)
    );
}

/// Four AdamW steps over all SHAPES at once, f32 master weights, gradients of `G`.
fn adamw_steps<G: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    let cfg = cfg_adamw();
    let mut p64: Vec<Vec<f64>> = Vec::new();
    let (mut params, mut ms, mut vs) = (Vec::new(), Vec::new(), Vec::new());
    for s in SHAPES {
        let p = rand_vec::<f32>(&mut r, s.iter().product(), -1.0, 1.0);
        p64.push(f64s(&p));
        params.push(upload(rt, &p, s));
        ms.push(zeros::<f32>(rt, s));
        vs.push(zeros::<f32>(rt, s));
    }
    let mut m64: Vec<Vec<f64>> = p64.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut v64 = m64.clone();
    let mut pmag: Vec<Vec<f64>> = p64
        .iter()
        .map(|p| p.iter().map(|x| x.abs()).collect())
        .collect();
    let mut mmag = m64.clone();
    for t in 1..=4u64 {
        let grads: Vec<Vec<G>> = SHAPES
            .iter()
            .map(|s| rand_vec::<G>(&mut r, s.iter().product(), -1.0, 1.0))
            .collect();
        let gt: Vec<Tensor> = grads
            .iter()
            .zip(SHAPES)
            .map(|(g, s)| upload(rt, g, s))
            .collect();
        let out = submit(rt, optim::adamw(cfg, t, params, &gt, ms, vs));
        for k in 0..SHAPES.len() {
            adamw_ref_mag(
                &cfg,
                t as f64,
                1.0,
                &mut p64[k],
                &f64s(&grads[k]),
                &mut m64[k],
                &mut v64[k],
                Some((&mut pmag[k], &mut mmag[k])),
            );
        }
        let mut states = out.states.into_iter();
        (params, ms, vs) = (out.params, states.next().unwrap(), states.next().unwrap());
    }
    for k in 0..SHAPES.len() {
        let what = format!("{label} adamw grads {} {:?}", G::DTYPE, SHAPES[k]);
        check_scaled(
            rt,
            &params[k],
            &p64[k],
            &pmag[k],
            &format!("{what} p"),
            seed,
        );
        check_scaled(rt, &ms[k], &m64[k], &mmag[k], &format!("{what} m"), seed);
        check::<f32>(&download::<f32>(rt, &vs[k]), &v64[k], &what, seed);
    }
}

backend_test!(adamw_four_steps_match_f64, |rt, label| {
    adamw_steps::<f32>(rt, label);
    adamw_steps::<bf16>(rt, label);
    adamw_steps::<f16>(rt, label);
});

fn sgd_steps(rt: &Runtime, label: &str, cfg: Sgd) {
    let (seed, mut r) = rng();
    let mut p64: Vec<Vec<f64>> = Vec::new();
    let (mut params, mut bufs) = (Vec::new(), Vec::new());
    for s in SHAPES {
        let p = rand_vec::<f32>(&mut r, s.iter().product(), -1.0, 1.0);
        p64.push(f64s(&p));
        params.push(upload(rt, &p, s));
        if cfg.momentum != 0.0 {
            bufs.push(zeros::<f32>(rt, s));
        }
    }
    let mut b64: Vec<Vec<f64>> = p64.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut pmag: Vec<Vec<f64>> = p64
        .iter()
        .map(|p| p.iter().map(|x| x.abs()).collect())
        .collect();
    let mut bmag = b64.clone();
    for _ in 0..3 {
        let grads: Vec<Vec<f32>> = SHAPES
            .iter()
            .map(|s| rand_vec::<f32>(&mut r, s.iter().product(), -1.0, 1.0))
            .collect();
        let gt: Vec<Tensor> = grads
            .iter()
            .zip(SHAPES)
            .map(|(g, s)| upload(rt, g, s))
            .collect();
        let out = submit(rt, optim::sgd(cfg, params, &gt, bufs));
        for k in 0..SHAPES.len() {
            sgd_ref(
                &cfg,
                &mut p64[k],
                &f64s(&grads[k]),
                &mut b64[k],
                (&mut pmag[k], &mut bmag[k]),
            );
        }
        params = out.params;
        bufs = out.states.into_iter().next().unwrap_or_default();
        assert_eq!(
            bufs.len(),
            if cfg.momentum != 0.0 { SHAPES.len() } else { 0 }
        );
    }
    for k in 0..SHAPES.len() {
        let what = format!("{label} sgd {cfg:?} {:?}", SHAPES[k]);
        check_scaled(
            rt,
            &params[k],
            &p64[k],
            &pmag[k],
            &format!("{what} p"),
            seed,
        );
        if cfg.momentum != 0.0 {
            check_scaled(
                rt,
                &bufs[k],
                &b64[k],
                &bmag[k],
                &format!("{what} buf"),
                seed,
            );
        }
    }
}

backend_test!(sgd_three_steps_match_f64, |rt, label| {
    for (momentum, nesterov, weight_decay) in
        [(0.0, false, 0.0), (0.9, false, 0.01), (0.8, true, 0.05)]
    {
        let cfg = Sgd {
            lr: 0.05,
            momentum,
            nesterov,
            weight_decay,
        };
        sgd_steps(rt, label, cfg);
    }
});

/// f16 / bf16 parameters and states: one step against the f64 formula on the rounded
/// inputs (the stored result is rounded once).
fn low_precision_step<P: Element>(rt: &Runtime, label: &str) {
    let (seed, mut r) = rng();
    let s = &[33usize, 101][..];
    let n = 33 * 101;
    let cfg = cfg_adamw();
    let p = rand_vec::<P>(&mut r, n, -1.0, 1.0);
    let g = rand_vec::<P>(&mut r, n, -1.0, 1.0);
    let m = rand_vec::<P>(&mut r, n, -0.1, 0.1);
    let v = rand_vec::<P>(&mut r, n, 0.0, 0.1);
    let (mut p64, mut m64, mut v64) = (f64s(&p), f64s(&m), f64s(&v));
    let out = submit(
        rt,
        optim::adamw(
            cfg,
            3,
            vec![upload(rt, &p, s)],
            &[upload(rt, &g, s)],
            vec![upload(rt, &m, s)],
            vec![upload(rt, &v, s)],
        ),
    );
    adamw_ref(&cfg, 3.0, 1.0, &mut p64, &f64s(&g), &mut m64, &mut v64);
    let what = format!("{label} adamw {}", P::DTYPE);
    check::<P>(&download::<P>(rt, &out.params[0]), &p64, &what, seed);
    check::<P>(&download::<P>(rt, &out.states[0][0]), &m64, &what, seed);
    check::<P>(&download::<P>(rt, &out.states[1][0]), &v64, &what, seed);
}

backend_test!(low_precision_parameters, |rt, label| {
    low_precision_step::<bf16>(rt, label);
    low_precision_step::<f16>(rt, label);
});

backend_test!(grad_norm_and_clipping, |rt, label| {
    let (seed, mut r) = rng();
    let grads: Vec<Vec<bf16>> = SHAPES
        .iter()
        .map(|s| rand_vec::<bf16>(&mut r, s.iter().product(), -1.0, 1.0))
        .collect();
    let gt: Vec<Tensor> = grads
        .iter()
        .zip(SHAPES)
        .map(|(g, s)| upload(rt, g, s))
        .collect();
    let norm = rt.submit(optim::grad_norm(&gt)).unwrap().wait().unwrap();
    assert_eq!(norm.dims(), &[1]);
    let want: f64 = grads
        .iter()
        .flat_map(|g| f64s(g))
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt();
    check::<f32>(
        &download::<f32>(rt, &norm),
        &[want],
        &format!("{label} norm"),
        seed,
    );
    // Clip to a tenth of the norm: every gradient is scaled by max_norm / (norm + 1e-6).
    let max_norm = (want / 10.0) as f32;
    let coef = max_norm as f64 / (want + 1e-6);
    let cfg = Sgd {
        lr: 0.5,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let ps: Vec<Vec<f32>> = SHAPES
        .iter()
        .map(|s| rand_vec(&mut r, s.iter().product(), -1.0, 1.0))
        .collect();
    let pt: Vec<Tensor> = ps
        .iter()
        .zip(SHAPES)
        .map(|(p, s)| upload(rt, p, s))
        .collect();
    let out = submit(
        rt,
        optim::sgd(cfg, pt, &gt, vec![]).clip_grad_norm(&norm, max_norm),
    );
    for k in 0..SHAPES.len() {
        let want: Vec<f64> = f64s(&ps[k])
            .iter()
            .zip(f64s(&grads[k]))
            .map(|(p, g)| p - 0.5 * coef * g)
            .collect();
        check::<f32>(
            &download::<f32>(rt, &out.params[k]),
            &want,
            &format!("{label} clipped {k}"),
            seed,
        );
    }
    // A norm below max_norm leaves the gradients alone.
    let pt: Vec<Tensor> = ps
        .iter()
        .zip(SHAPES)
        .map(|(p, s)| upload(rt, p, s))
        .collect();
    let out = submit(
        rt,
        optim::sgd(cfg, pt, &gt, vec![]).clip_grad_norm(&norm, 2.0 * want as f32),
    );
    let plain: Vec<f64> = f64s(&ps[1])
        .iter()
        .zip(f64s(&grads[1]))
        .map(|(p, g)| p - 0.5 * g)
        .collect();
    check::<f32>(
        &download::<f32>(rt, &out.params[1]),
        &plain,
        &format!("{label} unclipped"),
        seed,
    );
});

backend_test!(loss_scaling_skips_overflow_and_grows, |rt, label| {
    let (seed, mut r) = rng();
    let s = &[7usize, 13][..];
    let n = 91;
    let cfg = cfg_adamw();
    let p0 = rand_vec::<f32>(&mut r, n, -1.0, 1.0);
    let mut p64 = f64s(&p0);
    let (mut m64, mut v64) = (vec![0.0; n], vec![0.0; n]);
    let mut params = vec![upload(rt, &p0, s)];
    let (mut m, mut v) = (vec![zeros::<f32>(rt, s)], vec![zeros::<f32>(rt, s)]);
    let mut state = upload(rt, &optim::loss_scale_state(1024.0), &[4]);
    let mut scale = 1024.0f64;
    let mut skipped = 0.0;
    // Steps 1, 2 good (the scale doubles after 2), 3 overflows, 4 good.
    for t in 1..=4u64 {
        let g = rand_vec::<f16>(&mut r, n, -1.0, 1.0);
        let mut scaled: Vec<f16> = g
            .iter()
            .map(|x| f16::from_f64(x.to_f64() * scale))
            .collect();
        if t == 3 {
            scaled[17] = f16::INFINITY;
        }
        let out = submit(
            rt,
            optim::adamw(cfg, t, params, &[upload(rt, &scaled, s)], m, v).loss_scaling(state, 2),
        );
        let st = download::<f32>(rt, out.scaler.as_ref().unwrap());
        if t == 3 {
            assert_eq!(
                download::<f32>(rt, &out.params[0]),
                p64,
                "{label}: the overflowed step is a no-op"
            );
            scale /= 2.0;
            skipped += 1.0;
            assert_eq!(st, vec![scale, 0.0, skipped, 1.0], "{label}");
        } else {
            adamw_ref(
                &cfg,
                t as f64 - skipped,
                1.0 / scale,
                &mut p64,
                &f64s(&scaled),
                &mut m64,
                &mut v64,
            );
            if t == 2 {
                scale *= 2.0;
            }
            let good = if t == 1 || t == 4 { 1.0 } else { 0.0 };
            assert_eq!(st, vec![scale, good, skipped, 0.0], "{label} step {t}");
        }
        let what = format!("{label} scaled step {t}");
        check::<f32>(&download::<f32>(rt, &out.params[0]), &p64, &what, seed);
        let mut states = out.states.into_iter();
        (params, m, v) = (out.params, states.next().unwrap(), states.next().unwrap());
        p64 = download::<f32>(rt, &params[0]);
        state = out.scaler.unwrap();
    }
});

/// On the CPU backend a unique parameter is updated in place (an uploaded tensor has no
/// pending producer, so the handle is the last one for sure).
#[test]
fn unique_parameters_and_states_are_donated() {
    let rt = Runtime::cpu(1);
    let (seed, mut r) = rng();
    let p = rand_vec::<f32>(&mut r, 4099, -1.0, 1.0);
    let g = upload(&rt, &rand_vec::<f32>(&mut r, 4099, -1.0, 1.0), &[4099]);
    let state = upload(&rt, &optim::loss_scale_state(1.0), &[4]);
    let before = rtx_ops::donations();
    let op = optim::adamw(
        cfg_adamw(),
        1,
        vec![upload(&rt, &p, &[4099])],
        &[g.clone()],
        vec![zeros::<f32>(&rt, &[4099])],
        vec![zeros::<f32>(&rt, &[4099])],
    );
    let out = submit(&rt, op.loss_scaling(state, 100));
    // p, m, v and the state: 4 donations (the counter is process-wide; others only add).
    assert!(rtx_ops::donations() - before >= 4, "seed {seed}");
    // A parameter with another handle is not written: its clone keeps the old values.
    let keep = out.params[0].clone();
    let old = download::<f32>(&rt, &keep);
    let mut states = out.states.into_iter();
    let op = optim::adamw(
        cfg_adamw(),
        2,
        out.params,
        &[g],
        states.next().unwrap(),
        states.next().unwrap(),
    );
    let again = submit(&rt, op);
    assert_eq!(download::<f32>(&rt, &keep), old);
    assert_ne!(download::<f32>(&rt, &again.params[0]), old);
}

backend_test!(bad_steps_are_rejected_and_given_back, |rt, label| {
    let p = upload(rt, &[1.0f32; 6], &[2, 3]);
    let g = upload(rt, &[1.0f32; 6], &[2, 3]);
    let g_bad = upload(rt, &[1.0f32; 6], &[3, 2]);
    let z = || zeros::<f32>(rt, &[2, 3]);
    let sgd = |momentum, nesterov| Sgd {
        lr: 0.1,
        momentum,
        nesterov,
        weight_decay: 0.0,
    };
    let cases: Vec<(Step, &str)> = vec![
        (
            optim::sgd(sgd(0.0, false), vec![p.clone()], &[g_bad.clone()], vec![]),
            "shape",
        ),
        (
            optim::sgd(sgd(0.0, false), vec![p.clone()], &[], vec![]),
            "invalid",
        ),
        (
            optim::sgd(sgd(0.9, false), vec![p.clone()], &[g.clone()], vec![]),
            "invalid",
        ),
        (
            optim::sgd(sgd(0.0, true), vec![p.clone()], &[g.clone()], vec![]),
            "invalid",
        ),
        (optim::sgd(sgd(0.0, false), vec![], &[], vec![]), "invalid"),
        (
            optim::adamw(
                cfg_adamw(),
                0,
                vec![p.clone()],
                &[g.clone()],
                vec![z()],
                vec![z()],
            ),
            "invalid",
        ),
        (
            optim::adamw(
                AdamW {
                    beta1: 1.0,
                    ..cfg_adamw()
                },
                1,
                vec![p.clone()],
                &[g.clone()],
                vec![z()],
                vec![z()],
            ),
            "invalid",
        ),
        (
            optim::adamw(
                cfg_adamw(),
                1,
                vec![p.clone()],
                &[g.clone()],
                vec![upload(rt, &[f16::ZERO; 6], &[2, 3])],
                vec![z()],
            ),
            "dtype",
        ),
        (
            optim::adamw(
                cfg_adamw(),
                1,
                vec![p.clone()],
                &[upload(rt, &[1u32; 6], &[2, 3])],
                vec![z()],
                vec![z()],
            ),
            "dtype",
        ),
        (
            optim::sgd(sgd(0.0, false), vec![p.clone()], &[g.clone()], vec![])
                .with_copy(DType::F32),
            "dtype",
        ),
        (
            optim::sgd(sgd(0.0, false), vec![p.clone()], &[g.clone()], vec![])
                .clip_grad_norm(&g, 1.0),
            "invalid",
        ),
        (
            optim::sgd(sgd(0.0, false), vec![p.clone()], &[g.clone()], vec![])
                .loss_scaling(upload(rt, &[1.0f32; 3], &[3]), 10),
            "invalid",
        ),
    ];
    for (k, (op, kind)) in cases.into_iter().enumerate() {
        let op = rejected_as(rt, op, kind, &format!("{label} case {k}"));
        let (ps, _, _, _) = op.into_tensors();
        assert!(ps.iter().all(|t| t.same_storage(&p)), "{label} case {k}");
    }
    assert_eq!(
        download::<f32>(rt, &p),
        vec![1.0; 6],
        "{label}: nothing ran"
    );
});
