// attention_fwd.cuh — FlashAttention-2 forward: one block per (query block of BR rows,
// head, batch); each warp owns MT m-tiles of 16 query rows end to end (S, P, O accumulators
// and the running max / sum live in that warp's registers; Q fragments too when QREG, else
// they are re-read from the Q tile in smem), K/V tiles of BC keys stream through a
// STAGES-deep cp.async ring in shared memory. With MT = 2 every K/V fragment read from
// shared memory feeds two MMAs (half the ldmatrix traffic per FLOP of MT = 1).
//
// Per K/V tile j (keys n0 = j*BC ..), per warp:
//   S   = Q K^T            mma m16n8k16, A = Q fragments (registers), B = K tile via ldmatrix
//   S  -> masked           only on tiles that need it (Lk tail, causal diagonal, additive mask)
//   m   = max(m, rowmax S) online softmax in the raw score unit; exponent base 2 with
//   P   = 2^(S*scale*log2e - m*scale*log2e), l = l*alpha + rowsum P, O *= alpha
//   O  += P V              A = P re-packed from the S accumulators, B = V via ldmatrix.trans
// Epilogue: O /= l, lse = m*scale + ln(l) (l == 0: O = 0, lse = -inf).
#pragma once

#include "attention_common.cuh"

template <int D_, int NWARPS_, int MT_, bool QREG_, int BC_, int STAGES_>
struct FwdCfg {
    static constexpr int D = D_;
    static constexpr int NWARPS = NWARPS_;
    static constexpr int NTHREADS = 32 * NWARPS;
    static constexpr int MT = MT_;                    // m-tiles (16 rows each) per warp
    static constexpr bool QREG = QREG_;               // Q fragments kept in registers
    static constexpr int BR = 16 * MT * NWARPS;       // query rows per block
    static constexpr int BC = BC_;                    // keys per K/V tile
    static constexpr int STAGES = STAGES_;            // K/V ring depth
    static constexpr int Q_BYTES = BR * D * 2;        // Q tile
    static constexpr int KV_BYTES = BC * D * 2;       // one K tile (or one V tile)
    static constexpr int STAGE_BYTES = 2 * KV_BYTES;  // [K tile][V tile]
    static constexpr int SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES;
    static_assert(D == 64 || D == 128, "head dim");
    static_assert(MT == 1 || MT == 2, "m-tiles per warp");
    static_assert(BC % 16 == 0 && STAGES >= 2, "tile config");
};

template <typename Tr, typename Cfg>
__device__ __forceinline__ void flash_fwd_body(const FlashParams& p, unsigned char* smem) {
    typedef typename Tr::T T;
    constexpr int D = Cfg::D;
    constexpr int BR = Cfg::BR;
    constexpr int BC = Cfg::BC;
    constexpr int MT = Cfg::MT;
    constexpr int STAGES = Cfg::STAGES;
    constexpr int NT = Cfg::NTHREADS;
    constexpr int RB = D * 2;       // smem row bytes of the Q/K/V tiles
    constexpr int KSTEPS = D / 16;  // k-steps of S = Q K^T
    constexpr int SN = BC / 8;      // n8-tiles of S (16 x BC per m-tile)
    constexpr int PK = BC / 16;     // k-steps of O += P V
    constexpr int ON = D / 8;       // n8-tiles of O (16 x D per m-tile)
    constexpr int QKS = Cfg::QREG ? KSTEPS : 1;  // Q fragments held at once per m-tile

    // swz_add needs 128-byte aligned tiles; the extern declaration asks for it, check it.
    if (smem_u32(smem) & 127u) __trap();

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;  // accumulator fragment: rows g and g+8 ...
    const int t = lane & 3;   // ... columns 2t and 2t+1 of each n8-tile

    // Blocks with the most work (last query blocks under causal) are scheduled first.
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const int hk = h / (p.H / p.Hkv);
    const int Lq = p.Lq;
    const int Lk = p.Lk;
    const int m0 = m_block * BR;  // first query row of the block

    const T* qg = static_cast<const T*>(p.q) + ((long long)(b * p.H + h) * Lq + m0) * D;
    const T* kg = static_cast<const T*>(p.k) + (long long)(b * p.Hkv + hk) * Lk * D;
    const T* vg = static_cast<const T*>(p.v) + (long long)(b * p.Hkv + hk) * Lk * D;

    // Keys this block can see: all, or (causal) up to its last valid query row.
    int kv_end = Lk;
    if (p.causal) kv_end = min(Lk, min(Lq, m0 + BR));
    const int n_tiles = (kv_end + BC - 1) / BC;  // >= 1

    // smem: [Q tile][stage 0: K, V][stage 1: K, V]...
    const unsigned s_q = smem_u32(smem);
    const unsigned s_kv = s_q + Cfg::Q_BYTES;

    // cp.async groups: group 0 = Q, group 1+j = K/V tile j (one group committed per tile,
    // empty when past the end, so that the counts below are uniform).
    load_tile_async<BR, D, NT>(s_q, qg, Lq - m0, tid);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_tiles) {
            const unsigned st = s_kv + s * Cfg::STAGE_BYTES;
            load_tile_async<BC, D, NT>(st, kg + (long long)s * BC * D, Lk - s * BC, tid);
            load_tile_async<BC, D, NT>(st + Cfg::KV_BYTES, vg + (long long)s * BC * D,
                                       Lk - s * BC, tid);
        }
        cp_async_commit();
    }
    cp_async_wait<STAGES - 1>();  // Q has landed (this thread's part) ...
    __syncthreads();              // ... and every thread's part.

    const int row0 = m0 + warp * 16 * MT;  // first query row of this warp (m-tile mt: +16 mt)
    // Q fragments (A operand, row-major 16 x 16 per k-step): ldmatrix.x4 matrices
    // (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
    // => lane l addresses row (l & 15), chunk 2*kk + (l >> 4): lane base + swz_add.
    const unsigned q_lane = s_q + swz<RB>(warp * 16 * MT + (lane & 15), lane >> 4);
    unsigned qf[MT][QKS][4];
    if (Cfg::QREG) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kk = 0; kk < QKS; ++kk)
                ldsm_x4(qf[mt][kk][0], qf[mt][kk][1], qf[mt][kk][2], qf[mt][kk][3],
                        swz_add(q_lane, RB, mt * 16, kk * 2));
    }

    float o_acc[MT][ON][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < ON; ++i) {
            o_acc[mt][i][0] = 0.f;
            o_acc[mt][i][1] = 0.f;
            o_acc[mt][i][2] = 0.f;
            o_acc[mt][i][3] = 0.f;
        }
    // running max (raw score unit) and running sum of this thread's columns (reduced over
    // the 4 threads of a row at the end), rows g (r = 0) and g + 8 (r = 1) of each m-tile
    float m_r[MT][2], l_r[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        m_r[mt][0] = attn_neg_inf();
        m_r[mt][1] = attn_neg_inf();
        l_r[mt][0] = 0.f;
        l_r[mt][1] = 0.f;
    }

    const bool warp_active = row0 < Lq;  // warps entirely past Lq only help load tiles
    const float sl2 = p.scale * ATTN_LOG2E;
    const float inv_scale = 1.f / p.scale;
    const T* mask = static_cast<const T*>(p.mask);
    const bool has_mask = mask != nullptr;
    const long long mask_base = (long long)b * p.mask_stride_b + (long long)h * p.mask_stride_h;

    for (int j = 0; j < n_tiles; ++j) {
        cp_async_wait<STAGES - 2>();  // K/V tile j has landed (this thread's copies) ...
        __syncthreads();  // ... for all threads; and all warps are done with tile j-1's slot.
        {
            const int jn = j + STAGES - 1;  // prefetch into the slot tile j-1 used
            if (jn < n_tiles) {
                const unsigned st = s_kv + (jn % STAGES) * Cfg::STAGE_BYTES;
                load_tile_async<BC, D, NT>(st, kg + (long long)jn * BC * D, Lk - jn * BC, tid);
                load_tile_async<BC, D, NT>(st + Cfg::KV_BYTES, vg + (long long)jn * BC * D,
                                           Lk - jn * BC, tid);
            }
            cp_async_commit();
        }

        const int n0 = j * BC;  // first key of the tile
        // Skip warps with no valid row, and (causal) tiles entirely right of the diagonal
        // for all rows of this warp. Warp-uniform, so the shuffles below stay convergent.
        if (!warp_active || (p.causal && n0 > row0 + 16 * MT - 1)) continue;

        const unsigned s_k = s_kv + (j % STAGES) * Cfg::STAGE_BYTES;
        const unsigned s_v = s_k + Cfg::KV_BYTES;
        // lane bases for swz_add: K as B operand (row (l&7) + 8*(l>>4), chunk (l>>3)&1),
        // V as transposed B operand (row l&15, chunk l>>4)
        const unsigned k_lane = s_k + swz<RB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
        const unsigned v_lane = s_v + swz<RB>(lane & 15, lane >> 4);

        // ---- S = Q K^T (16 x BC per m-tile) ----
        float s[MT][SN][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < SN; ++i) {
                s[mt][i][0] = 0.f;
                s[mt][i][1] = 0.f;
                s[mt][i][2] = 0.f;
                s[mt][i][3] = 0.f;
            }
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            if (!Cfg::QREG) {  // re-read this k-step's Q fragments
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldsm_x4(qf[mt][0][0], qf[mt][0][1], qf[mt][0][2], qf[mt][0][3],
                            swz_add(q_lane, RB, mt * 16, kk * 2));
            }
            const int qk = Cfg::QREG ? kk : 0;
#pragma unroll
            for (int np = 0; np < SN / 2; ++np) {
                // B operand = K^T: B(k=d, n=key) = K[key][d]: non-transposed 8x8 matrices of
                // K rows. x4: (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7),
                // (keys 8-15, d 8-15) => b0,b1 of n-tile 2np, b0,b1 of n-tile 2np+1.
                unsigned b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, swz_add(k_lane, RB, np * 16, kk * 2));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    Tr::mma(s[mt][2 * np], qf[mt][qk], b0, b1);
                    Tr::mma(s[mt][2 * np + 1], qf[mt][qk], b2, b3);
                }
            }
        }

        // ---- masking: Lk tail, causal diagonal, additive mask ----
        const bool need_mask = (n0 + BC > Lk) || (p.causal && n0 + BC - 1 > row0) || has_mask;
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < SN; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = row0 + mt * 16 + g + ((e >> 1) << 3);
                        const int col = n0 + nt * 8 + 2 * t + (e & 1);
                        float x = s[mt][nt][e];
                        if (col >= Lk || (p.causal && col > row)) {
                            x = attn_neg_inf();
                        } else if (has_mask && row < Lq) {
                            // scores stay unscaled: add mask/scale so scale*x = scale*qk + mask
                            x += Tr::to_float(mask[mask_base + (long long)row * p.mask_stride_q + col]) *
                                 inv_scale;
                        }
                        s[mt][nt][e] = x;
                    }
        }

        // ---- online softmax (per m-tile, rows g and g+8: r = 0, 1) ----
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = m_r[mt][r];
#pragma unroll
                for (int nt = 0; nt < SN; ++nt)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
                // the 4 threads t = 0..3 of a row group hold the row's columns
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                // old max -inf: nothing accumulated yet (l = 0, O = 0), any finite alpha works
                const float alpha =
                    (m_r[mt][r] == attn_neg_inf()) ? 0.f : fast_exp2((m_r[mt][r] - mx) * sl2);
                m_r[mt][r] = mx;
                // whole row masked so far: use 0 as the reference so 2^(-inf - 0) = 0, not NaN
                const float msc = (mx == attn_neg_inf()) ? 0.f : mx * sl2;
                l_r[mt][r] *= alpha;
#pragma unroll
                for (int dn = 0; dn < ON; ++dn) {
                    o_acc[mt][dn][2 * r] *= alpha;
                    o_acc[mt][dn][2 * r + 1] *= alpha;
                }
#pragma unroll
                for (int nt = 0; nt < SN; ++nt) {
                    const float p0 = fast_exp2(fmaf(s[mt][nt][2 * r], sl2, -msc));
                    const float p1 = fast_exp2(fmaf(s[mt][nt][2 * r + 1], sl2, -msc));
                    s[mt][nt][2 * r] = p0;
                    s[mt][nt][2 * r + 1] = p1;
                    l_r[mt][r] += p0 + p1;
                }
            }

        // ---- O += P V ----
#pragma unroll
        for (int kk = 0; kk < PK; ++kk) {
            // A = P (16 x 16 keys kk*16..): accumulator n-tiles 2kk, 2kk+1 are exactly the
            // a0..a3 (row g / g+8, k 2t / 2t+8) fragments of the m16n8k16 A operand.
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                a[mt][0] = Tr::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = Tr::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = Tr::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = Tr::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                // B(k=key, n=d) = V[key][d]: transposed 8x8 matrices of V rows. x4:
                // (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15)
                // => lane l addresses key row (l & 15), chunk 2*dp + (l >> 4).
                unsigned b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, swz_add(v_lane, RB, kk * 16, dp * 2));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    Tr::mma(o_acc[mt][2 * dp], a[mt], b0, b1);
                    Tr::mma(o_acc[mt][2 * dp + 1], a[mt], b2, b3);
                }
            }
        }
    }
    cp_async_wait<0>();  // only empty groups remain; drain for hygiene

    if (!warp_active) return;

    // ---- epilogue ----
    T* og = static_cast<T*>(p.o) + ((long long)(b * p.H + h) * Lq + m0) * D;
    float* lse = static_cast<float*>(p.lse) + (long long)(b * p.H + h) * Lq + m0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = l_r[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = (l > 0.f) ? 1.f / l : 0.f;  // fully masked row: O = 0
            const int lr = warp * 16 * MT + mt * 16 + g + 8 * r;  // row within the block
            if (m0 + lr < Lq) {
                T* orow = og + (long long)lr * D;
#pragma unroll
                for (int dn = 0; dn < ON; ++dn) {
                    *reinterpret_cast<unsigned*>(orow + dn * 8 + 2 * t) =
                        Tr::pack(o_acc[mt][dn][2 * r] * inv, o_acc[mt][dn][2 * r + 1] * inv);
                }
                if (t == 0) lse[lr] = (l > 0.f) ? m_r[mt][r] * p.scale + logf(l) : attn_neg_inf();
            }
        }
}
