//! Attention backward with the saved log-sum-exp (FlashAttention-2's math):
//! `P = exp(S − lse)`, `D_i = rowsum(dO ∘ O)`, `dP = dO·Vᵀ`, `dS = P ∘ (dP − D)`,
//! `dQ = scale · dS·K`, `dK = scale · dSᵀ·Q`, `dV = Pᵀ·dO`.
//!
//! One task per (batch, KV head): it owns that head's dK and dV (summed over the
//! query heads of its group) and the dQ of those query heads, so tasks never
//! share an output.

use rayon::prelude::*;

use super::{scores, AttnParams, Q_BLOCK};
use crate::cpu_util::{store_f32, to_f32_cow, to_f32_vec, Float};
use crate::gemm::cpu::{gemm_into, MatMut, MatRef};
use ::gemm::Parallelism;

/// Inputs of one (batch, KV head) task, all f32 and per head.
struct KvHead<'a> {
    k: &'a [f32],
    v: &'a [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
}

/// Attention backward: fills `dq` (`[b, h, lq, d]`), `dk` and `dv`
/// (`[b, h_kv, lk, d]`) from the forward's inputs, its output `o`, its `lse`, and
/// the output gradient `do_`. The mask gets no gradient.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: Float>(
    p: &AttnParams,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: Option<&[T]>,
    o: &[T],
    do_: &[T],
    lse: &[f32],
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) {
    p.debug_check(mask);
    debug_assert_eq!(
        (q.len(), o.len(), do_.len(), dq.len()),
        (p.q_len(), p.q_len(), p.q_len(), p.q_len())
    );
    debug_assert_eq!(
        (k.len(), v.len(), dk.len(), dv.len()),
        (p.kv_len(), p.kv_len(), p.kv_len(), p.kv_len())
    );
    debug_assert_eq!(lse.len(), p.lse_len());
    let (lq, lk, d, group) = (p.lq, p.lk, p.d, p.group());
    let (head_kv, head_q) = (lk * d, group * lq * d);
    if head_kv == 0 || head_q == 0 {
        dq.fill(T::from_f32(0.0));
        dk.fill(T::from_f32(0.0));
        dv.fill(T::from_f32(0.0));
        return;
    }
    let tasks = p.b * p.h_kv;
    let task = |kvh: usize, dq_g: &mut [T], dk_h: &mut [T], dv_h: &mut [T]| {
        let kf = to_f32_cow(&k[kvh * head_kv..][..head_kv]);
        let vf = to_f32_cow(&v[kvh * head_kv..][..head_kv]);
        let (mut dkf, mut dvf) = (vec![0f32; head_kv], vec![0f32; head_kv]);
        let mut kvh_io = KvHead {
            k: &kf,
            v: &vf,
            dk: &mut dkf,
            dv: &mut dvf,
        };
        let first = (kvh / p.h_kv) * p.h + (kvh % p.h_kv) * group;
        for (gi, dq_head) in dq_g.chunks_mut(lq * d).enumerate() {
            let bh = first + gi;
            let at = bh * lq * d;
            let lse_head = &lse[bh * lq..][..lq];
            let m_head = p.head_mask(mask, bh);
            for (blk, dqb) in dq_head.chunks_mut(Q_BLOCK * d).enumerate() {
                let i0 = blk * Q_BLOCK;
                let rows = dqb.len() / d;
                let block = Block {
                    i0,
                    q: to_f32_vec(&q[at + i0 * d..][..rows * d]),
                    o: to_f32_vec(&o[at + i0 * d..][..rows * d]),
                    do_: to_f32_vec(&do_[at + i0 * d..][..rows * d]),
                    lse: &lse_head[i0..][..rows],
                };
                let par = if tasks < rayon::current_num_threads() {
                    crate::gemm::cpu::parallelism(rows, lk, d)
                } else {
                    Parallelism::None
                };
                block_backward(p, &block, m_head, &mut kvh_io, dqb, par);
            }
        }
        store_f32(&dkf, dk_h);
        store_f32(&dvf, dv_h);
    };
    if p.parallel() {
        dq.par_chunks_mut(head_q)
            .zip(dk.par_chunks_mut(head_kv).zip(dv.par_chunks_mut(head_kv)))
            .enumerate()
            .for_each(|(i, (dq_g, (dk_h, dv_h)))| task(i, dq_g, dk_h, dv_h));
    } else {
        dq.chunks_mut(head_q)
            .zip(dk.chunks_mut(head_kv).zip(dv.chunks_mut(head_kv)))
            .enumerate()
            .for_each(|(i, (dq_g, (dk_h, dv_h)))| task(i, dq_g, dk_h, dv_h));
    }
}

/// One block of query rows of one query head, in f32.
struct Block<'a> {
    i0: usize,
    q: Vec<f32>,
    o: Vec<f32>,
    do_: Vec<f32>,
    lse: &'a [f32],
}

/// Writes the block's dQ rows and adds its share of dK and dV.
fn block_backward<T: Float>(
    p: &AttnParams,
    b: &Block<'_>,
    mask: Option<&[T]>,
    kv: &mut KvHead<'_>,
    dq: &mut [T],
    par: Parallelism,
) {
    let (d, rows) = (p.d, b.lse.len());
    let kmax = p.key_limit(b.i0, rows);
    // P = exp(S − lse), 0 for fully masked rows.
    let mut pm = scores(p, b.i0, &b.q, kv.k, mask, par);
    for (row, &l) in pm.chunks_mut(kmax.max(1)).zip(b.lse) {
        if l == f32::NEG_INFINITY {
            row.fill(0.0);
        } else {
            row.iter_mut().for_each(|s| *s = (*s - l).exp());
        }
    }
    // dP = dO · Vᵀ, then dS = scale · P ∘ (dP − D).
    let mut ds = vec![0f32; rows * kmax];
    let (dom, vt) = (MatRef::new(&b.do_, 0, d, 1), MatRef::new(kv.v, 0, 1, d));
    gemm_into(
        (rows, kmax, d),
        MatMut::new(&mut ds, 0, kmax, 1),
        dom,
        vt,
        false,
        par,
    );
    for r in 0..rows {
        let di: f32 = b.do_[r * d..][..d]
            .iter()
            .zip(&b.o[r * d..][..d])
            .map(|(x, y)| x * y)
            .sum();
        let (dsr, pr) = (&mut ds[r * kmax..][..kmax], &pm[r * kmax..][..kmax]);
        dsr.iter_mut()
            .zip(pr)
            .for_each(|(g, pv)| *g = p.scale * pv * (*g - di));
    }
    // dQ = dS · K
    let mut dqf = vec![0f32; rows * d];
    let (dsm, km) = (MatRef::new(&ds, 0, kmax, 1), MatRef::new(kv.k, 0, d, 1));
    gemm_into(
        (rows, d, kmax),
        MatMut::new(&mut dqf, 0, d, 1),
        dsm,
        km,
        false,
        par,
    );
    store_f32(&dqf, dq);
    // dK[..kmax] += dSᵀ · Q ; dV[..kmax] += Pᵀ · dO
    let dst = MatRef::new(&ds, 0, 1, kmax);
    let qm = MatRef::new(&b.q, 0, d, 1);
    gemm_into(
        (kmax, d, rows),
        MatMut::new(kv.dk, 0, d, 1),
        dst,
        qm,
        true,
        par,
    );
    let pt = MatRef::new(&pm, 0, 1, kmax);
    gemm_into(
        (kmax, d, rows),
        MatMut::new(kv.dv, 0, d, 1),
        pt,
        dom,
        true,
        par,
    );
}
