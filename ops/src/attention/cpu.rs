//! CPU scaled dot-product attention, the f32-accumulating reference.
//!
//! Shapes (row-major): q and o `[b, h, lq, d]`; k and v `[b, h_kv, lk, d]`, where
//! query head `i` reads KV head `i / (h / h_kv)` (grouped-query attention; `h_kv`
//! divides `h`); lse `[b, h, lq]` (f32).
//!
//! Scores are `s_ij = scale · q_i·k_j + mask_ij`, where the mask is **additive**
//! (use `-inf` to forbid a pair) and either [`MaskKind::Broadcast`] `[lq, lk]`
//! (shared by every batch and head) or [`MaskKind::Full`] `[b, h, lq, lk]`.
//! With `causal`, query `i` may attend key `j` only when `j <= i`: the
//! **top-left** alignment of PyTorch's `is_causal` (not FlashAttention-2's
//! bottom-right alignment when `lq != lk`). Rows `i >= lk` therefore see all keys.
//!
//! `o_i = Σ_j softmax(s_i)_j v_j` and `lse_i = ln Σ_j exp(s_ij)` (natural log). A
//! row whose keys are all masked gives `o_i = 0` and `lse_i = -inf`, and a zero
//! gradient in the backward pass.
//!
//! The work is split per (batch, head) and per block of [`Q_BLOCK`] query rows;
//! each block computes its scores with one GEMM, its softmax in f32, and `P·V`
//! with another GEMM. With `causal`, a block skips the keys no row of it can see.

mod backward;
#[cfg(test)]
mod tests;

pub use backward::attention_backward;

pub use super::{AttnParams, MaskKind};
use crate::cpu_util::{for_chunk_pairs, store_f32, to_f32_cow, to_f32_vec, Float};
use crate::gemm::cpu::{gemm_into, MatMut, MatRef, GEMM_PAR_MIN};
use ::gemm::Parallelism;

/// Query rows per block.
pub const Q_BLOCK: usize = 64;

impl AttnParams {
    /// Query heads per KV head.
    fn group(&self) -> usize {
        self.h / self.h_kv
    }

    /// The KV head (flat over `[b, h_kv]`) read by flat query head `bh`.
    fn kv_head(&self, bh: usize) -> usize {
        (bh / self.h) * self.h_kv + (bh % self.h) / self.group()
    }

    /// The `[lq, lk]` mask of flat query head `bh`.
    fn head_mask<'m, T>(&self, mask: Option<&'m [T]>, bh: usize) -> Option<&'m [T]> {
        let plane = self.lq * self.lk;
        match (self.mask, mask) {
            (MaskKind::Broadcast, Some(m)) => Some(&m[..plane]),
            (MaskKind::Full, Some(m)) => Some(&m[bh * plane..][..plane]),
            _ => None,
        }
    }

    /// Keys visible to any of the query rows `i0 .. i0 + rows`.
    fn key_limit(&self, i0: usize, rows: usize) -> usize {
        if self.causal {
            self.lk.min(i0 + rows)
        } else {
            self.lk
        }
    }

    fn debug_check<T>(&self, mask: Option<&[T]>) {
        debug_assert!(self.h_kv > 0);
        debug_assert_eq!(self.h % self.h_kv, 0);
        debug_assert!(self.d > 0);
        debug_assert_eq!(mask.map_or(0, |m| m.len()), self.mask_len());
    }

    /// Whether the (b, h) tasks alone fill the thread pool; otherwise the GEMMs
    /// inside a task may use rayon themselves.
    fn gemm_par(&self, tasks: usize, m: usize, n: usize, k: usize) -> Parallelism {
        if tasks < rayon::current_num_threads() && m * n * k >= GEMM_PAR_MIN {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        }
    }

    /// Whether the whole call is large enough to spread over rayon.
    fn parallel(&self) -> bool {
        self.b * self.h * self.lq * self.lk * self.d >= GEMM_PAR_MIN
    }
}

/// One query block's scores: `s[r, j] = scale · q_{i0+r}·k_j + mask`, with
/// `-inf` where causality forbids `j`. `s` is `[rows, kmax]`, holding `q·k` on entry.
fn finish_scores<T: Float>(
    p: &AttnParams,
    i0: usize,
    mask: Option<&[T]>,
    s: &mut [f32],
    kmax: usize,
) {
    if kmax == 0 {
        return;
    }
    for (r, row) in s.chunks_mut(kmax).enumerate() {
        let i = i0 + r;
        row.iter_mut().for_each(|v| *v *= p.scale);
        if let Some(m) = mask {
            let mrow = &m[i * p.lk..][..kmax];
            row.iter_mut().zip(mrow).for_each(|(v, m)| *v += m.to_f32());
        }
        if p.causal && i + 1 < kmax {
            row[i + 1..].fill(f32::NEG_INFINITY);
        }
    }
}

/// `s = q_block · kᵀ` for query rows `i0 .. i0 + rows` (q and k of one head,
/// in f32), then [`finish_scores`]. Returns `[rows, kmax]` scores.
fn scores<T: Float>(
    p: &AttnParams,
    i0: usize,
    qb: &[f32],
    k: &[f32],
    mask: Option<&[T]>,
    par: Parallelism,
) -> Vec<f32> {
    let rows = qb.len() / p.d;
    let kmax = p.key_limit(i0, rows);
    let mut s = vec![0f32; rows * kmax];
    let a = MatRef::new(qb, 0, p.d, 1);
    let kt = MatRef::new(k, 0, 1, p.d);
    gemm_into(
        (rows, kmax, p.d),
        MatMut::new(&mut s, 0, kmax, 1),
        a,
        kt,
        false,
        par,
    );
    finish_scores(p, i0, mask, &mut s, kmax);
    s
}

/// Attention forward: fills `o` (`[b, h, lq, d]`) and `lse` (`[b, h, lq]`).
/// `mask` is given exactly when `p.mask` is not [`MaskKind::None`].
#[allow(clippy::too_many_arguments)]
pub fn attention_forward<T: Float>(
    p: &AttnParams,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: Option<&[T]>,
    o: &mut [T],
    lse: &mut [f32],
) {
    p.debug_check(mask);
    debug_assert_eq!(
        (q.len(), o.len(), lse.len()),
        (p.q_len(), p.q_len(), p.lse_len())
    );
    debug_assert_eq!((k.len(), v.len()), (p.kv_len(), p.kv_len()));
    let (lq, lk, d) = (p.lq, p.lk, p.d);
    if lse.is_empty() {
        return;
    }
    let par = p.parallel();
    let tasks = p.b * p.h * lq.div_ceil(Q_BLOCK);
    for_chunk_pairs(o, lq * d, lse, lq, par, |bh, o_head, lse_head| {
        let kvh = p.kv_head(bh);
        let kf = to_f32_cow(&k[kvh * lk * d..][..lk * d]);
        let vf = to_f32_cow(&v[kvh * lk * d..][..lk * d]);
        let q_head = &q[bh * lq * d..][..lq * d];
        let m_head = p.head_mask(mask, bh);
        for_chunk_pairs(
            o_head,
            Q_BLOCK * d,
            lse_head,
            Q_BLOCK,
            par,
            |blk, ob, lb| {
                let i0 = blk * Q_BLOCK;
                let qb = to_f32_vec(&q_head[i0 * d..][..lb.len() * d]);
                let gpar = p.gemm_par(tasks, lb.len(), lk, d);
                let mut s = scores(p, i0, &qb, &kf, m_head, gpar);
                let kmax = p.key_limit(i0, lb.len());
                for (row, l) in s.chunks_mut(kmax.max(1)).zip(lb.iter_mut()) {
                    *l = softmax_in_place(row);
                }
                if kmax == 0 {
                    lb.fill(f32::NEG_INFINITY);
                }
                let mut of = vec![0f32; ob.len()];
                let pm = MatRef::new(&s, 0, kmax, 1);
                let vm = MatRef::new(&vf, 0, d, 1);
                gemm_into(
                    (lb.len(), d, kmax),
                    MatMut::new(&mut of, 0, d, 1),
                    pm,
                    vm,
                    false,
                    gpar,
                );
                store_f32(&of, ob);
            },
        );
    });
}

/// Turns a row of scores into probabilities and returns its log-sum-exp; a row
/// with no finite score becomes zeros and returns `-inf`.
fn softmax_in_place(row: &mut [f32]) -> f32 {
    let max = row.iter().fold(
        f32::NEG_INFINITY,
        |m, &v| if v.is_nan() || v > m { v } else { m },
    );
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return f32::NEG_INFINITY;
    }
    let mut sum = 0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
    max + (sum.ln() as f32)
}
