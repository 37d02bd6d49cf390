// attention_wgmma_bwd.cuh — the per-step pieces the two Hopper backward main kernels share:
// attention_wgmma_bwd.cu (flash_bwd_wgmma_*: every thread loads tiles with cp.async) and
// attention_tma_bwd.cu (flash_bwd_tma_*: a producer warpgroup loads them with bulk tensor copies).
// One consumer warpgroup owns 64 keys (rows krow, krow + 8 of its thread) and walks query steps of
// BR = 64 rows; layouts and descriptors are those documented at the top of attention_wgmma_bwd.cu.
// The callers keep the wgmma fences, commits and waits around these (their order is what differs
// between the kernels). Include it only from sm_90a programs, after attention_tma.cuh.
#pragma once

#include "attention_common.cuh"
#include "wgmma.cuh"

// S^T = K_w Q^T and dP^T = V_w dO^T as two committed wgmma groups of D/16 m64nBRk16 each (BR = 64,
// or 128 for the TMA backward's D = 64 variant). k_a, v_a: the warpgroup's K and V rows (A,
// K-major); st_kmaj: Q / dO stage 0 as B (K-major); st_off: the step's stage; q_bytes: dO's offset
// from Q in a stage.
template <typename Tr, int D, int BC, int BR>
__device__ __forceinline__ void wgb_issue_sdp(float (&s)[BR / 2], float (&dp)[BR / 2], unsigned long long k_a,
                                              unsigned long long v_a, unsigned long long st_kmaj, unsigned st_off,
                                              unsigned q_bytes) {
    typedef Wgmma<Tr, BR> MS;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const unsigned aoff = (kk >> 2) * (BC * 128) + (kk & 3) * 32;
        const unsigned boff = st_off + (kk >> 2) * (BR * 128) + (kk & 3) * 32;
        MS::template ss<0, 0>(s, wg_desc_add(k_a, aoff), wg_desc_add(st_kmaj, boff), kk > 0 ? 1 : 0);
    }
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const unsigned aoff = (kk >> 2) * (BC * 128) + (kk & 3) * 32;
        const unsigned boff = st_off + q_bytes + (kk >> 2) * (BR * 128) + (kk & 3) * 32;
        MS::template ss<0, 0>(dp, wg_desc_add(v_a, aoff), wg_desc_add(st_kmaj, boff), kk > 0 ? 1 : 0);
    }
    wg_commit();
}

// What the masked exponentials of a step need besides S^T (per thread, per step).
template <typename T>
struct WgbMask {
    int krow, mm0, t;   // the thread's first key, the step's first query row, its column pair
    int Lq, Lk, causal;
    const T* mask;      // nullable; + base + qrow * stride_q + key
    bool has_mask;      // mask != nullptr
    long long base, stride_q;
};

// The lse pair of the thread's query columns nt * 8 + 2 t, + 1 of a step (s_lse: the step's lse in
// shared memory), scaled by log2(e); a fully masked row (lse = -inf) gives +inf, so every P of
// it is 0. wgb_probs reads these, or takes them loaded earlier (lpre).
__device__ __forceinline__ float2 wgb_lse_pair(const float* s_lse, int nt, int t) {
    const float2 lv = *reinterpret_cast<const float2*>(s_lse + nt * 8 + 2 * t);
    return make_float2((lv.x == attn_neg_inf()) ? attn_pos_inf() : lv.x * ATTN_LOG2E,
                       (lv.y == attn_neg_inf()) ? attn_pos_inf() : lv.y * ATTN_LOG2E);
}

// P^T = 2^(S^T scale log2e + mask log2e - lse log2e) in place (rows = keys krow + 8r, columns =
// queries mm0 + 8nt + 2t + c; masked entries 0; rows with lse = -inf all 0). need_mask: the step
// has a query past Lq, a key past Lk, the causal diagonal or an additive mask; SPLIT: a step
// without takes a copy of the loop without the per-element tests (the same values).
template <typename Tr, int BR, bool SPLIT>
__device__ __forceinline__ void wgb_probs(float (&s)[BR / 2], const float* s_lse, float sl2, bool need_mask,
                                          const WgbMask<typename Tr::T>& m, const float2* lpre = nullptr) {
    const int t = m.t;
    if (SPLIT && !need_mask) {
#pragma unroll
        for (int nt = 0; nt < BR / 8; ++nt) {
            const float2 lp = lpre ? lpre[nt] : wgb_lse_pair(s_lse, nt, t);
            const float l0 = lp.x, l1 = lp.y;
#pragma unroll
            for (int e = 0; e < 4; ++e) s[4 * nt + e] = fast_exp2(fmaf(s[4 * nt + e], sl2, -((e & 1) ? l1 : l0)));
        }
        return;
    }
#pragma unroll
    for (int nt = 0; nt < BR / 8; ++nt) {
        const int qc = nt * 8 + 2 * t;
        const float2 lp = lpre ? lpre[nt] : wgb_lse_pair(s_lse, nt, t);
        const float l0 = lp.x, l1 = lp.y;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float x = fmaf(s[4 * nt + e], sl2, -((e & 1) ? l1 : l0));
            if (need_mask) {
                const int key = m.krow + ((e >> 1) << 3);
                const int qrow = m.mm0 + qc + (e & 1);
                if (qrow >= m.Lq || key >= m.Lk || (m.causal && key > qrow)) {
                    x = attn_neg_inf();
                } else if (m.has_mask) {
                    x += Tr::to_float(m.mask[m.base + (long long)qrow * m.stride_q + key]) * ATTN_LOG2E;
                }
            }
            s[4 * nt + e] = fast_exp2(x);
        }
    }
}

// Packs pairs of f32 into the 16-bit A fragments of an RS wgmma.
template <typename Tr, int N>
__device__ __forceinline__ void wgb_pack(unsigned (&f)[N], const float (&x)[2 * N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = Tr::pack(x[2 * i], x[2 * i + 1]);
}

// acc[64 keys x N] += frag (64 keys x BR queries, registers) B: BR/16 m64nNk16 RS wgmmas, B
// MN-major from b (16 query rows = 2048 bytes per k-step). No fence and no commit.
template <typename Tr, int N, int BR>
__device__ __forceinline__ void wgb_issue_rs(float (&acc)[N / 2], const unsigned (&frag)[BR / 4], unsigned long long b) {
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
        const unsigned a[4] = {frag[4 * kk], frag[4 * kk + 1], frag[4 * kk + 2], frag[4 * kk + 3]};
        Wgmma<Tr, N>::rs(acc, a, wg_desc_add(b, kk * 2048));
    }
}

// Stores the packed dS^T fragments df into the dS^T tile at ds_ptr (layout: wgb_ds below).
template <int BR, int BC>
__device__ __forceinline__ void wgb_store_ds(const unsigned (&df)[BR / 4], unsigned char* ds_ptr, int row0, int g,
                                             int t) {
#pragma unroll
    for (int nt = 0; nt < BR / 8; ++nt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 8 * r;
            *reinterpret_cast<unsigned*>(ds_ptr + (nt >> 3) * (BC * 128) + row * 128 + (((nt & 7) ^ g) << 4) + 4 * t) =
                df[2 * nt + r];
        }
    }
}

// dS^T = P^T o (dP^T - dsum) in dp, packed into df, and stored into the dS^T tile at ds_ptr
// ([key][query], 128-byte rows, 16-byte chunk nt of row r at nt ^ (r & 7); BR = 128: two such
// panels of BC rows, queries 0-63 and 64-127); row0: the thread's first key relative to the tile.
template <typename Tr, int BR, int BC = 128>
__device__ __forceinline__ void wgb_ds(float (&dp)[BR / 2], const float (&s)[BR / 2], unsigned (&df)[BR / 4],
                                       const float* s_dsum, unsigned char* ds_ptr, int row0, int g, int t,
                                       const float2* dpre = nullptr) {
#pragma unroll
    for (int nt = 0; nt < BR / 8; ++nt) {
        const float2 dsv = dpre ? dpre[nt] : *reinterpret_cast<const float2*>(s_dsum + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[4 * nt + e] = s[4 * nt + e] * (dp[4 * nt + e] - ((e & 1) ? dsv.y : dsv.x));
    }
    wgb_pack<Tr, BR / 4>(df, dp);
    wgb_store_ds<BR, BC>(df, ds_ptr, row0, g, t);
}

// dQ[64 queries x 64 columns] = dS K over BC keys: BC/16 m64n64k16 SS wgmmas, A = dS (the dS^T
// tile read MN-major, ds_a), B = K's columns (MN-major, k_b). No fence and no commit.
template <typename Tr, int BC>
__device__ __forceinline__ void wgb_issue_dq(float (&dq)[32], unsigned long long ds_a, unsigned long long k_b) {
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
        Wgmma<Tr, 64>::template ss<1, 1>(dq, wg_desc_add(ds_a, kk * 2048), wg_desc_add(k_b, kk * 2048), kk > 0 ? 1 : 0);
    }
}

// The warp's 16 rows x 64 columns of dQ (from column col0) -> the staging tile (sdq / s_dq: its
// generic and shared addresses, rows of ld floats), then lane l < 16 reduces row 16 warp + l (256
// contiguous bytes) into dq_accum row row_base + 16 warp + l, from column col0, with one bulk op
// (rows at or past Lq skipped; mm0: the step's first row). The caller has waited for this tile's
// previous bulk reads.
template <int D>
__device__ __forceinline__ void wgb_reduce_dq(const float (&dq)[32], float* sdq, unsigned s_dq, int ld, int col0,
                                              float* dq_accum, long long row_base, int mm0, int Lq, int warp, int lane,
                                              int g, int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float* rowp = sdq + (warp * 16 + g + 8 * r) * ld + col0 + 2 * t;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
            *reinterpret_cast<float2*>(rowp + nt * 8) = make_float2(dq[4 * nt + 2 * r], dq[4 * nt + 2 * r + 1]);
    }
    fence_proxy_async_smem();
    __syncwarp();
    const int ql = warp * 16 + lane;
    if (lane < 16 && mm0 + ql < Lq) {
        bulk_red_add_f32(dq_accum + (row_base + ql) * D + col0, s_dq + (ql * ld + col0) * 4, 64 * 4);
    }
    if (lane < 16) bulk_commit();
}

// dK = scale * acc and dV of the thread's keys (rows row0, row0 + 8 of the block's tile at dkg /
// dvg, the block's first key n0), keys at or past Lk not stored.
template <typename Tr, int D>
__device__ __forceinline__ void wgb_store_dkdv(const float (&dk)[D / 2], const float (&dv)[D / 2], typename Tr::T* dkg,
                                               typename Tr::T* dvg, float scale, int row0, int n0, int Lk, int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int kl = row0 + 8 * r;
        if (n0 + kl < Lk) {
#pragma unroll
            for (int dn = 0; dn < D / 8; ++dn) {
                *reinterpret_cast<unsigned*>(dkg + (long long)kl * D + dn * 8 + 2 * t) =
                    Tr::pack(dk[4 * dn + 2 * r] * scale, dk[4 * dn + 2 * r + 1] * scale);
                *reinterpret_cast<unsigned*>(dvg + (long long)kl * D + dn * 8 + 2 * t) =
                    Tr::pack(dv[4 * dn + 2 * r], dv[4 * dn + 2 * r + 1]);
            }
        }
    }
}
