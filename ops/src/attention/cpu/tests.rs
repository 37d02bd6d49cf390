//! Attention tests: the forward against a naive f64 reference (causal, masks,
//! GQA/MQA, lq != lk, lq = 1, fully masked rows, several query blocks), and the
//! backward against central finite differences of that f64 reference.

use super::*;
use crate::cpu_util::testing::{f64s, poison, rand_vec, rel_err, rel_err_f64, rng, tol};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::Rng;

#[allow(clippy::too_many_arguments)]
fn params(
    b: usize,
    h: usize,
    h_kv: usize,
    lq: usize,
    lk: usize,
    d: usize,
    causal: bool,
    mask: MaskKind,
) -> AttnParams {
    AttnParams {
        b,
        h,
        h_kv,
        lq,
        lk,
        d,
        scale: 1.0 / (d as f32).sqrt(),
        causal,
        mask,
    }
}

/// Scaled, masked f64 scores of query row `i` of flat head `bh`.
fn ref_scores(
    p: &AttnParams,
    q: &[f64],
    k: &[f64],
    mask: Option<&[f64]>,
    bh: usize,
    i: usize,
) -> Vec<f64> {
    let (lq, lk, d) = (p.lq, p.lk, p.d);
    let kvh = (bh / p.h) * p.h_kv + (bh % p.h) / (p.h / p.h_kv);
    (0..lk)
        .map(|j| {
            if p.causal && j > i {
                return f64::NEG_INFINITY;
            }
            let dot: f64 = (0..d)
                .map(|x| q[(bh * lq + i) * d + x] * k[(kvh * lk + j) * d + x])
                .sum();
            let m = match (p.mask, mask) {
                (MaskKind::Broadcast, Some(m)) => m[i * lk + j],
                (MaskKind::Full, Some(m)) => m[(bh * lq + i) * lk + j],
                _ => 0.0,
            };
            p.scale as f64 * dot + m
        })
        .collect()
}

/// Naive f64 forward: (o, lse).
fn ref_forward(
    p: &AttnParams,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>) {
    let (lq, lk, d) = (p.lq, p.lk, p.d);
    let mut o = vec![0f64; p.q_len()];
    let mut lse = vec![0f64; p.lse_len()];
    for bh in 0..p.b * p.h {
        let kvh = (bh / p.h) * p.h_kv + (bh % p.h) / (p.h / p.h_kv);
        for i in 0..lq {
            let s = ref_scores(p, q, k, mask, bh, i);
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY {
                lse[bh * lq + i] = f64::NEG_INFINITY;
                continue;
            }
            let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let l: f64 = w.iter().sum();
            lse[bh * lq + i] = mx + l.ln();
            for x in 0..d {
                o[(bh * lq + i) * d + x] = (0..lk)
                    .map(|j| w[j] * v[(kvh * lk + j) * d + x])
                    .sum::<f64>()
                    / l;
            }
        }
    }
    (o, lse)
}

/// Analytic f64 backward, taking `D_i = dO_i · o_i` from the given `o` (the
/// kernel's stored, possibly rounded, output): `[dq, dk, dv]`.
fn ref_backward(
    p: &AttnParams,
    x: &[Vec<f64>; 3],
    mask: Option<&[f64]>,
    o: &[f64],
    dout: &[f64],
) -> [Vec<f64>; 3] {
    let (q, k, v) = (&x[0], &x[1], &x[2]);
    let (lq, lk, d, sc) = (p.lq, p.lk, p.d, p.scale as f64);
    let (_, lse) = ref_forward(p, q, k, v, mask);
    let mut g = [
        vec![0f64; q.len()],
        vec![0f64; k.len()],
        vec![0f64; v.len()],
    ];
    for bh in 0..p.b * p.h {
        let kvh = (bh / p.h) * p.h_kv + (bh % p.h) / (p.h / p.h_kv);
        for i in 0..lq {
            let l = lse[bh * lq + i];
            if l == f64::NEG_INFINITY {
                continue;
            }
            let (qi, kv0) = ((bh * lq + i) * d, kvh * lk * d);
            let di: f64 = (0..d).map(|t| dout[qi + t] * o[qi + t]).sum();
            for (j, s) in ref_scores(p, q, k, mask, bh, i).into_iter().enumerate() {
                let pij = (s - l).exp();
                let dp: f64 = (0..d).map(|t| dout[qi + t] * v[kv0 + j * d + t]).sum();
                let ds = pij * (dp - di);
                for t in 0..d {
                    g[0][qi + t] += sc * ds * k[kv0 + j * d + t];
                    g[1][kv0 + j * d + t] += sc * ds * q[qi + t];
                    g[2][kv0 + j * d + t] += pij * dout[qi + t];
                }
            }
        }
    }
    g
}

/// A random additive mask with some `-inf` entries and one fully masked row.
fn make_mask<T: Float>(r: &mut StdRng, p: &AttnParams) -> Option<Vec<T>> {
    if p.mask == MaskKind::None {
        return None;
    }
    let mut m: Vec<T> = rand_vec(r, p.mask_len());
    for v in m.iter_mut() {
        if r.gen_bool(0.2) {
            *v = T::from_f32(f32::NEG_INFINITY);
        }
    }
    let row = p.lq / 2;
    m[row * p.lk..][..p.lk].fill(T::from_f32(f32::NEG_INFINITY));
    Some(m)
}

/// Compares lse: same `-inf` positions, finite values by relative error.
fn check_lse(lse: &[f32], want: &[f64], tolerance: f64, what: &str) {
    let (mut got_f, mut want_f) = (Vec::new(), Vec::new());
    for (g, w) in lse.iter().zip(want) {
        if *w == f64::NEG_INFINITY {
            assert_eq!(*g, f32::NEG_INFINITY, "{what}: lse should be -inf");
        } else {
            got_f.push(*g);
            want_f.push(*w);
        }
    }
    let e = rel_err(&got_f, &want_f);
    assert!(e < tolerance, "{what}: lse err {e}");
}

fn check_forward<T: Float>(p: &AttnParams) {
    let (seed, mut r) = rng();
    let q: Vec<T> = rand_vec(&mut r, p.q_len());
    let k: Vec<T> = rand_vec(&mut r, p.kv_len());
    let v: Vec<T> = rand_vec(&mut r, p.kv_len());
    let mask = make_mask::<T>(&mut r, p);
    let mut o = poison::<T>(p.q_len());
    let mut lse = vec![f32::NAN; p.lse_len()];
    attention_forward(p, &q, &k, &v, mask.as_deref(), &mut o, &mut lse);
    let mf = mask.as_deref().map(f64s);
    let (want_o, want_lse) = ref_forward(p, &f64s(&q), &f64s(&k), &f64s(&v), mf.as_deref());
    let what = format!("{p:?} {:?} seed {seed}", T::KIND);
    let e = rel_err(&o, &want_o);
    assert!(e < tol::<T>(), "{what}: o err {e}");
    // lse is f32 whatever T is; its inputs were rounded to T in both computations.
    check_lse(&lse, &want_lse, 1e-5, &what);
}

fn forward_cases() -> Vec<AttnParams> {
    vec![
        params(1, 1, 1, 1, 1, 1, false, MaskKind::None),
        params(2, 3, 3, 5, 7, 8, false, MaskKind::None),
        params(1, 2, 2, 9, 9, 16, true, MaskKind::None),
        params(1, 2, 1, 5, 11, 8, true, MaskKind::None), // lq < lk, causal
        params(1, 2, 2, 12, 5, 4, true, MaskKind::None), // lq > lk, causal
        params(2, 4, 2, 1, 33, 16, false, MaskKind::Broadcast), // lq = 1, GQA
        params(2, 4, 1, 7, 10, 8, true, MaskKind::Full), // MQA, full mask, causal
        params(1, 2, 2, 130, 70, 32, true, MaskKind::Broadcast), // three query blocks
        params(2, 8, 2, 100, 300, 64, false, MaskKind::Full), // parallel paths
        params(1, 2, 1, 3, 0, 4, false, MaskKind::None), // no keys at all
    ]
}

#[test]
fn forward_f32() {
    forward_cases().iter().for_each(check_forward::<f32>);
}
#[test]
fn forward_f16() {
    forward_cases().iter().for_each(check_forward::<f16>);
}
#[test]
fn forward_bf16() {
    forward_cases().iter().for_each(check_forward::<bf16>);
}

/// The loss `Σ dO ∘ O(q, k, v)` in f64.
fn loss(
    p: &AttnParams,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: Option<&[f64]>,
    dout: &[f64],
) -> f64 {
    let (o, _) = ref_forward(p, q, k, v, mask);
    o.iter().zip(dout).map(|(a, b)| a * b).sum()
}

/// Central finite differences of [`loss`] with respect to input `which` (0 q, 1 k, 2 v).
fn fd_grad(
    p: &AttnParams,
    inputs: &[Vec<f64>; 3],
    mask: Option<&[f64]>,
    dout: &[f64],
    which: usize,
) -> Vec<f64> {
    let eps = 1e-5;
    let mut x = inputs.clone();
    (0..inputs[which].len())
        .map(|i| {
            let x0 = x[which][i];
            x[which][i] = x0 + eps;
            let up = loss(p, &x[0], &x[1], &x[2], mask, dout);
            x[which][i] = x0 - eps;
            let down = loss(p, &x[0], &x[1], &x[2], mask, dout);
            x[which][i] = x0;
            (up - down) / (2.0 * eps)
        })
        .collect()
}

fn check_backward<T: Float>(p: &AttnParams) {
    let (seed, mut r) = rng();
    let q: Vec<T> = rand_vec(&mut r, p.q_len());
    let k: Vec<T> = rand_vec(&mut r, p.kv_len());
    let v: Vec<T> = rand_vec(&mut r, p.kv_len());
    let dout: Vec<T> = rand_vec(&mut r, p.q_len());
    let mask = make_mask::<T>(&mut r, p);
    let mut o = poison::<T>(p.q_len());
    let mut lse = vec![f32::NAN; p.lse_len()];
    attention_forward(p, &q, &k, &v, mask.as_deref(), &mut o, &mut lse);
    let (mut dq, mut dk, mut dv) = (
        poison::<T>(p.q_len()),
        poison::<T>(p.kv_len()),
        poison::<T>(p.kv_len()),
    );
    attention_backward(
        p,
        &q,
        &k,
        &v,
        mask.as_deref(),
        &o,
        &dout,
        &lse,
        &mut dq,
        &mut dk,
        &mut dv,
    );
    let inputs = [f64s(&q), f64s(&k), f64s(&v)];
    let mf = mask.as_deref().map(f64s);
    let df = f64s(&dout);
    let (exact_o, _) = ref_forward(p, &inputs[0], &inputs[1], &inputs[2], mf.as_deref());
    // The analytic reference with the exact O must match finite differences.
    let exact = ref_backward(p, &inputs, mf.as_deref(), &exact_o, &df);
    // With the kernel's stored O, it is the kernel's own math in f64: for bf16 and f16,
    // the rounding of O (2^-9, 2^-11) feeds D = rowsum(dO∘O), and dP − D cancels, so
    // finite differences of the exact function are out of their reach (f16 missed 1e-2
    // for about 1 seed in 200: 0.0107 with seed 16165062110441095252, lq 3, lk 6, d 2,
    // causal). The chain holds without them: the kernel against this reference, the
    // exact reference against finite differences.
    let stored = ref_backward(p, &inputs, mf.as_deref(), &f64s(&o), &df);
    for (which, got) in [(0, &dq), (1, &dk), (2, &dv)] {
        let name = ["dq", "dk", "dv"][which];
        let fd = fd_grad(p, &inputs, mf.as_deref(), &df, which);
        let e = rel_err_f64(&exact[which], &fd);
        assert!(
            e < 1e-7,
            "{p:?} reference {name} vs finite differences err {e} seed {seed}"
        );
        let e = rel_err(got, &stored[which]);
        assert!(
            e < tol::<T>(),
            "{p:?} {:?} {name} err {e} seed {seed}",
            T::KIND
        );
        if T::KIND == crate::cpu_util::FloatKind::F32 {
            let e = rel_err(got, &fd);
            assert!(
                e < tol::<T>(),
                "{p:?} {:?} {name} vs finite differences err {e} seed {seed}",
                T::KIND
            );
        }
    }
}

fn backward_cases() -> Vec<AttnParams> {
    vec![
        params(1, 2, 1, 3, 4, 3, true, MaskKind::Broadcast), // GQA, causal, mask, masked row
        params(1, 2, 2, 4, 3, 2, false, MaskKind::Full),
        params(2, 2, 1, 1, 5, 4, false, MaskKind::None), // lq = 1
        params(1, 1, 1, 5, 3, 2, true, MaskKind::None),  // lq > lk, causal
        params(1, 2, 1, 3, 6, 2, true, MaskKind::None),  // lq < lk, causal
        params(1, 1, 1, 70, 6, 2, true, MaskKind::Broadcast), // two query blocks
    ]
}

#[test]
fn backward_f32() {
    backward_cases().iter().for_each(check_backward::<f32>);
}
#[test]
fn backward_f16() {
    backward_cases().iter().for_each(check_backward::<f16>);
}
#[test]
fn backward_bf16() {
    backward_cases().iter().for_each(check_backward::<bf16>);
}

#[test]
fn fully_masked_rows_are_zero() {
    let p = params(1, 1, 1, 2, 3, 2, false, MaskKind::Broadcast);
    let inf = f32::NEG_INFINITY;
    let mask = [0.0, inf, 0.0, inf, inf, inf];
    let (q, k, v) = (
        [0.5f32, -1.0, 0.25, 2.0],
        [1.0f32, 0.5, -0.5, 1.0, 0.3, 0.3],
        [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0],
    );
    let mut o = [f32::NAN; 4];
    let mut lse = [f32::NAN; 2];
    attention_forward(&p, &q, &k, &v, Some(&mask), &mut o, &mut lse);
    assert_eq!(&o[2..], &[0.0, 0.0]);
    assert_eq!(lse[1], f32::NEG_INFINITY);
    assert!(lse[0].is_finite() && o[0].is_finite());
    let (mut dq, mut dk, mut dv) = ([f32::NAN; 4], [f32::NAN; 6], [f32::NAN; 6]);
    let dout = [1.0f32, -1.0, 0.5, 0.5];
    attention_backward(
        &p,
        &q,
        &k,
        &v,
        Some(&mask),
        &o,
        &dout,
        &lse,
        &mut dq,
        &mut dk,
        &mut dv,
    );
    assert_eq!(&dq[2..], &[0.0, 0.0]);
    assert!(dk.iter().chain(&dv).all(|x| x.is_finite()));
}
