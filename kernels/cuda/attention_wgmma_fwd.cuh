// attention_wgmma_fwd.cuh — the pieces the two Hopper forwards share: attention_wgmma.cu
// (flash_fwd_wgmma_*: every thread loads tiles with cp.async) and attention_tma.cu
// (flash_fwd_tma_d128_*: a producer warpgroup loads them with bulk tensor copies). Their
// tile configuration, the per-tile steps of one consumer warpgroup (S = Q K^T, O += P V, the
// masked online softmax, the O rescale and P packing), the softmax's per-thread constants,
// the epilogue and the one-way warpgroup turns (ORDER). Shared-memory layout and
// descriptors: the top of attention_wgmma.cu. Include it only from sm_90a programs.
#pragma once

#include "attention_common.cuh"
#include "wgmma.cuh"


template <int D_, int BC_, int NWG_, bool PIPE_, bool ORDER_, int MINB_>
struct WgFwdCfg {
    static constexpr int D = D_;
    static constexpr int BC = BC_;                     // keys per K/V tile
    static constexpr int NWG = NWG_;                   // consumer warpgroups
    static constexpr bool PIPE = PIPE_;                // S_j overlapped with P_{j-1} V_{j-1}
    static constexpr bool ORDER = ORDER_;              // warpgroups issue their GEMMs in turn
    static constexpr int MINB = MINB_;                 // blocks per SM (__launch_bounds__)
    static constexpr int NTHREADS = 128 * NWG;
    static constexpr int BR = 64 * NWG;                // query rows per block
    static constexpr int KSTAGES = 2;
    static constexpr int VSTAGES = PIPE ? 3 : 2;
    static constexpr int Q_BYTES = BR * D * 2;
    static constexpr int KV_BYTES = BC * D * 2;        // one K or V tile
    static constexpr int SMEM_BYTES = 1024 + Q_BYTES + (KSTAGES + VSTAGES) * KV_BYTES;
    static_assert(D == 64 || D == 128, "head dim");
    static_assert(BC == 64 || BC == 128, "key tile");
    static_assert(NWG >= 1 && NWG <= 3, "warpgroups");
    static_assert(SMEM_BYTES <= 232448, "shared memory per block");
};

// -------------------------------------------------------------------------------------
// Per-tile steps of one warpgroup
// -------------------------------------------------------------------------------------
// S (+)= Q K^T for one K tile: KSTEPS wgmmas m64nBCk16, both operands K-major in smem. The
// first one overwrites S (scale-d = 0). q_desc / kd: descriptors of the warpgroup's Q rows and
// of the K stage (panel 0, column 0).
template <typename Tr, typename Cfg>
__device__ __forceinline__ void wg_issue_s(float (&s)[Cfg::BC / 2], unsigned long long q_desc,
                                           unsigned long long kd) {
#pragma unroll
    for (int kk = 0; kk < Cfg::D / 16; ++kk) {
        const unsigned qoff = (kk >> 2) * (Cfg::BR * 128) + (kk & 3) * 32;
        const unsigned koff = (kk >> 2) * (Cfg::BC * 128) + (kk & 3) * 32;
        Wgmma<Tr, Cfg::BC>::ss(s, wg_desc_add(q_desc, qoff), wg_desc_add(kd, koff), kk > 0 ? 1 : 0);
    }
}

// O += P V for one V tile: BC/16 wgmmas m64nDk16, A = P from registers (k-step kk = registers
// 4 kk .. 4 kk + 3), B = V N-major in smem (16 keys = 2048 bytes per k-step).
template <typename Tr, typename Cfg>
__device__ __forceinline__ void wg_issue_pv(float (&o)[Cfg::D / 2], const unsigned (&pf)[Cfg::BC / 4],
                                            unsigned long long vd) {
#pragma unroll
    for (int kk = 0; kk < Cfg::BC / 16; ++kk) {
        const unsigned a[4] = {pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3]};
        Wgmma<Tr, Cfg::D>::rs(o, a, wg_desc_add(vd, kk * 2048));
    }
}

// What the softmax of a tile needs besides the scores (per thread, constant over the tiles).
template <typename T>
struct WgRows {
    int qrow;            // the thread's rows: qrow (r = 0) and qrow + 8 (r = 1)
    int row0;            // first row of the warpgroup
    int t;               // column pair 2t, 2t+1 of each 8-column group
    int Lq, Lk, causal;
    float sl2;           // scale * log2(e)
    float inv_scale;
    const T* mask;       // nullable; + mask_base + row * mask_stride_q + col
    long long mask_base;
    long long mask_stride_q;
};

// Masks the scores of the tile of keys n0 .. n0+BC-1 (Lk tail, causal, additive mask), updates
// the running max m_r and turns s into P = 2^(s*sl2 - m*sl2) in place; alpha = the factor for
// the old O and l, rsum = this thread's part of the row sums of P. As attention_fwd.cuh.
// HAS_MASK = false: a kernel for calls without an additive mask (w.mask is ignored): without the
// mask's loads, which the front end gathers at the top of a tile, its consumers need fewer
// registers.
template <typename Tr, int BC, bool HAS_MASK = true>
__device__ __forceinline__ void wg_softmax(float (&s)[BC / 2], float (&m_r)[2], float (&alpha)[2],
                                           float (&rsum)[2], const WgRows<typename Tr::T>& w, int n0) {
    const bool need_mask =
        (n0 + BC > w.Lk) || (w.causal && n0 + BC - 1 > w.row0) || (HAS_MASK && w.mask != nullptr);
    if (need_mask) {
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = w.qrow + ((e >> 1) << 3);
                const int col = n0 + nt * 8 + 2 * w.t + (e & 1);
                float x = s[4 * nt + e];
                if (col >= w.Lk || (w.causal && col > row)) {
                    x = attn_neg_inf();
                } else if (HAS_MASK && w.mask != nullptr && row < w.Lq) {
                    // scores stay unscaled: add mask/scale so scale*x = scale*qk + mask
                    x += Tr::to_float(w.mask[w.mask_base + (long long)row * w.mask_stride_q + col]) *
                         w.inv_scale;
                }
                s[4 * nt + e] = x;
            }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float mx = m_r[r];
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]));
        // the 4 threads t = 0..3 of a row group hold the row's columns
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // old max -inf: nothing accumulated yet (l = 0, O = 0), any finite alpha works
        alpha[r] = (m_r[r] == attn_neg_inf()) ? 0.f : fast_exp2((m_r[r] - mx) * w.sl2);
        m_r[r] = mx;
        // whole row masked so far: use 0 as the reference so 2^(-inf - 0) = 0, not NaN
        const float msc = (mx == attn_neg_inf()) ? 0.f : mx * w.sl2;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
            const float p0 = fast_exp2(fmaf(s[4 * nt + 2 * r], w.sl2, -msc));
            const float p1 = fast_exp2(fmaf(s[4 * nt + 2 * r + 1], w.sl2, -msc));
            s[4 * nt + 2 * r] = p0;
            s[4 * nt + 2 * r + 1] = p1;
            sum += p0 + p1;
        }
        rsum[r] = sum;
    }
}

// O *= alpha, l = l * alpha + rsum, and P (in s) packed to T pairs: accumulator pairs (2i, 2i+1)
// are exactly the registers of the m64k16 A fragment layout (k-step kk = pf[4 kk .. 4 kk + 3]).
template <typename Tr, int D, int BC>
__device__ __forceinline__ void wg_rescale_pack(float (&o)[D / 2], unsigned (&pf)[BC / 4],
                                                float (&l_r)[2], const float (&s)[BC / 2],
                                                const float (&alpha)[2], const float (&rsum)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_r[r] = l_r[r] * alpha[r] + rsum[r];
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn) {
            o[4 * dn + 2 * r] *= alpha[r];
            o[4 * dn + 2 * r + 1] *= alpha[r];
        }
    }
#pragma unroll
    for (int i = 0; i < BC / 4; ++i) pf[i] = Tr::pack(s[2 * i], s[2 * i + 1]);
}

// The softmax's per-thread constants for the rows row0 + rw and row0 + rw + 8 of a
// warpgroup starting at query row row0 (rw: the thread's row within the warpgroup's 64),
// columns 2t, 2t + 1 of each 8-column group; (b, h) the block's batch and head.
template <typename T>
__device__ __forceinline__ WgRows<T> wg_rows(const FlashParams& p, int b, int h, int Lq, int Lk, int row0, int rw,
                                              int t) {
    WgRows<T> w;
    w.qrow = row0 + rw;
    w.row0 = row0;
    w.t = t;
    w.Lq = Lq;
    w.Lk = Lk;
    w.causal = p.causal;
    w.sl2 = p.scale * ATTN_LOG2E;
    w.inv_scale = 1.f / p.scale;
    w.mask = static_cast<const T*>(p.mask);
    w.mask_base = (long long)b * p.mask_stride_b + (long long)h * p.mask_stride_h;
    w.mask_stride_q = p.mask_stride_q;
    return w;
}

// The epilogue of a warpgroup: O /= l and lse = m * scale + ln(l) for the thread's rows of
// w (l == 0, a fully masked row: O = 0, lse = -inf); l_r, m_r as the steps above keep them.
template <typename Tr, int D>
__device__ __forceinline__ void wg_store_o(const FlashParams& p, int b, int h, const WgRows<typename Tr::T>& w,
                                           const float (&o)[D / 2], const float (&l_r)[2],
                                           const float (&m_r)[2]) {
    typedef typename Tr::T T;
    T* og = static_cast<T*>(p.o) + (long long)(b * p.H + h) * w.Lq * D;
    float* lse = static_cast<float*>(p.lse) + (long long)(b * p.H + h) * w.Lq;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = l_r[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = (l > 0.f) ? 1.f / l : 0.f;
        const int row = w.qrow + 8 * r;
        if (row < w.Lq) {
            T* orow = og + (long long)row * D;
#pragma unroll
            for (int dn = 0; dn < D / 8; ++dn) {
                *reinterpret_cast<unsigned*>(orow + dn * 8 + 2 * w.t) =
                    Tr::pack(o[4 * dn + 2 * r] * inv, o[4 * dn + 2 * r + 1] * inv);
            }
            if (w.t == 0) lse[row] = (l > 0.f) ? m_r[r] * p.scale + logf(l) : attn_neg_inf();
        }
    }
}

// ORDER: in every iteration warpgroup w > 0 issues its first GEMMs only after warpgroup w - 1
// has issued its own (named barrier w: 128 arrivals of w - 1, 128 waits of w), so that the
// tensor cores finish one warpgroup's S while the next one's is still queued, and the
// softmaxes of the warpgroups are staggered instead of competing for the exp units. Each
// warpgroup calls both once per iteration, whether it computes or not.
template <typename Cfg>
__device__ __forceinline__ void wg_turn_wait(int wg) {
    if (Cfg::ORDER && wg > 0) named_bar_sync(wg, 256);
}
template <typename Cfg>
__device__ __forceinline__ void wg_turn_pass(int wg) {
    if (Cfg::ORDER && wg + 1 < Cfg::NWG) named_bar_arrive(wg + 1, 256);
}
