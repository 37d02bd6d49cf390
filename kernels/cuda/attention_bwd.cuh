// attention_bwd.cuh — FlashAttention-2 backward.
//
//   1. preprocess: dsum[row] = sum_d dO[row][d] * O[row][d] (f32), dq_accum[row][:] = 0
//   2. main:       one block per (KV block of BC = 16*NWARPS keys, kv head, batch), NWARPS
//                  (4 or 8) warps, warp w owns keys 16w..16w+15 of the block: its dK, dV accumulators (16 x D each,
//                  f32) stay in registers while the block walks over every query block of
//                  every query head of its GQA group (heads hk*G .. hk*G+G-1, G = H/Hkv), so
//                  dK/dV need no atomics and no workspace and are written once, as T.
//                  Per query block (BR rows), computed transposed (keys as MMA rows):
//                    S^T  = K Q^T                 P^T = exp(S^T*scale + mask - lse)
//                    dV  += P^T dO                dP^T = V dO^T
//                    dS^T = P^T o (dP^T - dsum)   dK  += dS^T Q        (scale applied at the end)
//                    dS^T -> smem;  dQ_blk = dS K -> red.global.add.v2.f32 into dq_accum
//                  Q, dO, lse, dsum of the query blocks stream through a cp.async ring.
//   3. convert:    dq = T(dq_accum * scale)
#pragma once

#include "attention_common.cuh"

// RED_V4: dQ partial sums go out as red.global.add.v4.f32 (pairs of lanes swap halves
// with one shuffle per 4 values: half the reduction instructions) instead of .v2.
template <int D_, int BR_, int STAGES_, int NWARPS_ = 4, bool RED_V4_ = false>
struct BwdCfg {
    static constexpr int D = D_;
    static constexpr int NWARPS = NWARPS_;
    static constexpr int NTHREADS = 32 * NWARPS;
    static constexpr int MINB = NWARPS == 4 ? 2 : 1;  // blocks per SM (__launch_bounds__)
    static constexpr bool RED_V4 = RED_V4_;
    static constexpr int BC = 16 * NWARPS;  // keys per block (16 per warp)
    static constexpr int BR = BR_;       // query rows per step (32 or 64)
    static constexpr int STAGES = STAGES_;
    static constexpr int K_BYTES = BC * D * 2;
    static constexpr int V_BYTES = BC * D * 2;
    static constexpr int DS_BYTES = BC * BR * 2;   // dS^T [BC keys][BR queries] of T
    static constexpr int Q_BYTES = BR * D * 2;
    static constexpr int DO_BYTES = BR * D * 2;
    static constexpr int LSE_BYTES = BR * 4;
    static constexpr int DSUM_BYTES = BR * 4;
    static constexpr int STAGE_BYTES = Q_BYTES + DO_BYTES + LSE_BYTES + DSUM_BYTES;
    // layout: [K][V][dS^T][stage 0: Q, dO, lse, dsum][stage 1 ...]   (all offsets % 128 == 0)
    static constexpr int SMEM_BYTES = K_BYTES + V_BYTES + DS_BYTES + STAGES * STAGE_BYTES;
    static_assert(D == 64 || D == 128, "head dim");
    static_assert(BR == 32 || BR == 64, "query block");
    static_assert(STAGES >= 2, "stages");
    static_assert(NWARPS == 4 || NWARPS == 8, "warps");
    static_assert(2 * BR <= NTHREADS, "lse/dsum loaders");
    static_assert((BR * D / 8) % NTHREADS == 0 && (BC * D / 8) % NTHREADS == 0, "tile loaders");
    // dQ split: warp w -> m-tile w % (BR/16), D/(NWARPS/(BR/16)) columns (a multiple of 32)
    static_assert(NWARPS % (BR / 16) == 0 && (D / (NWARPS / (BR / 16))) % 32 == 0, "dQ split");
};

template <typename Tr, typename Cfg>
__device__ __forceinline__ void flash_bwd_body(const FlashParams& p, unsigned char* smem) {
    typedef typename Tr::T T;
    constexpr int D = Cfg::D;
    constexpr int BR = Cfg::BR;
    constexpr int BC = Cfg::BC;
    constexpr int STAGES = Cfg::STAGES;
    constexpr int NT = Cfg::NTHREADS;
    constexpr int RB = D * 2;    // smem row bytes of K, V, Q, dO tiles
    constexpr int DSRB = BR * 2; // smem row bytes of the dS^T tile
    constexpr int QN = BR / 8;   // n8-tiles of S^T / dP^T (16 keys x BR queries per warp)
    constexpr int DN = D / 8;    // n8-tiles of dK / dV (16 keys x D per warp)

    // swz_add needs 128-byte aligned tiles; the extern declaration asks for it, check it.
    if (smem_u32(smem) & 127u) __trap();

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int t = lane & 3;

    const int n_block = blockIdx.x;
    const int hk = blockIdx.y;
    const int b = blockIdx.z;
    const int H = p.H;
    const int G = H / p.Hkv;
    const int Lq = p.Lq;
    const int Lk = p.Lk;
    const int n0 = n_block * BC;         // first key of the block
    const int key0 = warp * 16;          // first key of this warp, within the block
    const int kmin = n0 + key0;          // first key of this warp, global

    const long long kv_off = ((long long)(b * p.Hkv + hk) * Lk + n0) * D;
    const T* q = static_cast<const T*>(p.q);
    const T* dout = static_cast<const T*>(p.dout);
    const float* lse = static_cast<const float*>(p.lse);
    const float* dsum = static_cast<const float*>(p.dsum);

    // Query blocks to visit for each head of the group: causal skips those whose rows are
    // all < n0 (they see none of this block's keys).
    const int m_begin = p.causal ? n0 / BR : 0;
    const int n_m = (Lq + BR - 1) / BR;
    const int per_head = n_m > m_begin ? n_m - m_begin : 0;
    const int total = G * per_head;  // steps: it -> head hk*G + it / per_head, block m_begin + it % per_head

    const unsigned s_k = smem_u32(smem);
    const unsigned s_v = s_k + Cfg::K_BYTES;
    const unsigned s_ds = s_v + Cfg::V_BYTES;
    const unsigned s_st = s_ds + Cfg::DS_BYTES;
    unsigned char* const st_ptr = smem + (Cfg::K_BYTES + Cfg::V_BYTES + Cfg::DS_BYTES);
    unsigned char* const ds_ptr = smem + (Cfg::K_BYTES + Cfg::V_BYTES);

    // Issue the async loads of step `it` into ring slot `slot` (all threads call it).
    auto issue_step = [&](int it, int slot) {
        const int hh = hk * G + it / per_head;
        const int mm0 = (m_begin + it % per_head) * BR;
        const long long row_base = (long long)(b * H + hh) * Lq + mm0;  // into [B, H, Lq]
        const unsigned st = s_st + slot * Cfg::STAGE_BYTES;
        load_tile_async<BR, D, NT>(st, q + row_base * D, Lq - mm0, tid);
        load_tile_async<BR, D, NT>(st + Cfg::Q_BYTES, dout + row_base * D, Lq - mm0, tid);
        if (tid < BR) {
            const bool ok = mm0 + tid < Lq;
            cp_async_4(st + Cfg::Q_BYTES + Cfg::DO_BYTES + tid * 4, lse + row_base + (ok ? tid : 0),
                       ok ? 4 : 0);
        } else if (tid < 2 * BR) {
            const int r = tid - BR;
            const bool ok = mm0 + r < Lq;
            cp_async_4(st + Cfg::Q_BYTES + Cfg::DO_BYTES + Cfg::LSE_BYTES + r * 4,
                       dsum + row_base + (ok ? r : 0), ok ? 4 : 0);
        }
    };

    // cp.async groups: group 0 = K, V and step 0; group s = step s; one group committed per
    // loop iteration (possibly empty).
    load_tile_async<BC, D, NT>(s_k, static_cast<const T*>(p.k) + kv_off, Lk - n0, tid);
    load_tile_async<BC, D, NT>(s_v, static_cast<const T*>(p.v) + kv_off, Lk - n0, tid);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < total) issue_step(s, s);
        cp_async_commit();
    }

    float dk[DN][4], dv[DN][4];
#pragma unroll
    for (int i = 0; i < DN; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            dk[i][e] = 0.f;
            dv[i][e] = 0.f;
        }
    }

    const float sl2 = p.scale * ATTN_LOG2E;
    const T* mask = static_cast<const T*>(p.mask);
    const bool has_mask = mask != nullptr;
    float* dq_accum = static_cast<float*>(p.dq_accum);

    for (int it = 0; it < total; ++it) {
        cp_async_wait<STAGES - 2>();  // step it (and K, V) landed for this thread ...
        __syncthreads();  // ... for all; all warps done with step it-1 (its slot and dS^T).
        {
            const int itn = it + STAGES - 1;
            if (itn < total) issue_step(itn, itn % STAGES);
            cp_async_commit();
        }

        const int hh = hk * G + it / per_head;
        const int mm0 = (m_begin + it % per_head) * BR;  // first query row of the step
        const int slot = it % STAGES;
        const unsigned s_q = s_st + slot * Cfg::STAGE_BYTES;
        const unsigned s_do = s_q + Cfg::Q_BYTES;
        const float* s_lse =
            reinterpret_cast<const float*>(st_ptr + slot * Cfg::STAGE_BYTES + Cfg::Q_BYTES + Cfg::DO_BYTES);
        const float* s_dsum = s_lse + BR;
        // ldmatrix lane bases (see swz_add): A operands of this warp's 16 rows of K / V
        // (row key0 + (l & 15), chunk l >> 4); B operands from Q / dO, non-transposed
        // (row (l & 7) + 8 * (l >> 4), chunk (l >> 3) & 1) and transposed (row l & 15, chunk l >> 4).
        const unsigned ka_lane = s_k + swz<RB>(key0 + (lane & 15), lane >> 4);
        const unsigned va_lane = s_v + swz<RB>(key0 + (lane & 15), lane >> 4);
        const unsigned q_b_lane = s_q + swz<RB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
        const unsigned do_b_lane = s_do + swz<RB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
        const unsigned q_t_lane = s_q + swz<RB>(lane & 15, lane >> 4);
        const unsigned do_t_lane = s_do + swz<RB>(lane & 15, lane >> 4);

        // ---- S^T = K Q^T (16 keys x BR queries) ----
        float s[QN][4];
#pragma unroll
        for (int i = 0; i < QN; ++i) {
            s[i][0] = 0.f;
            s[i][1] = 0.f;
            s[i][2] = 0.f;
            s[i][3] = 0.f;
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            // A = K rows of this warp (row-major, like Q in the forward)
            unsigned a[4];
            ldsm_x4(a[0], a[1], a[2], a[3], swz_add(ka_lane, RB, 0, kk * 2));
#pragma unroll
            for (int qp = 0; qp < QN / 2; ++qp) {
                // B(k=d, n=query) = Q[query][d] (non-transposed, like K in the forward)
                unsigned b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, swz_add(q_b_lane, RB, qp * 16, kk * 2));
                Tr::mma(s[2 * qp], a, b0, b1);
                Tr::mma(s[2 * qp + 1], a, b2, b3);
            }
        }

        // ---- P^T = 2^(S^T*scale*log2e + mask*log2e - lse*log2e), masked entries 0 ----
        const bool need_mask = (mm0 + BR > Lq) || (kmin + 16 > Lk) ||
                               (p.causal && kmin + 15 > mm0) || has_mask;
        const long long mask_base = (long long)b * p.mask_stride_b + (long long)hh * p.mask_stride_h;
#pragma unroll
        for (int nt = 0; nt < QN; ++nt) {
            const int qc = nt * 8 + 2 * t;  // query column (and qc+1) within the step
            float l2[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float v = s_lse[qc + c];
                // fully masked row (lse = -inf): make every P of the row 0
                l2[c] = (v == attn_neg_inf()) ? attn_pos_inf() : v * ATTN_LOG2E;
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = fmaf(s[nt][e], sl2, -l2[e & 1]);
                if (need_mask) {
                    const int key = kmin + g + ((e >> 1) << 3);
                    const int qrow = mm0 + qc + (e & 1);
                    if (qrow >= Lq || key >= Lk || (p.causal && key > qrow)) {
                        x = attn_neg_inf();
                    } else if (has_mask) {
                        x += Tr::to_float(mask[mask_base + (long long)qrow * p.mask_stride_q + key]) *
                             ATTN_LOG2E;
                    }
                }
                s[nt][e] = fast_exp2(x);
            }
        }

        // ---- dV += P^T dO ----
#pragma unroll
        for (int kq = 0; kq < BR / 16; ++kq) {
            unsigned a[4];
            a[0] = Tr::pack(s[2 * kq][0], s[2 * kq][1]);
            a[1] = Tr::pack(s[2 * kq][2], s[2 * kq][3]);
            a[2] = Tr::pack(s[2 * kq + 1][0], s[2 * kq + 1][1]);
            a[3] = Tr::pack(s[2 * kq + 1][2], s[2 * kq + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                // B(k=query, n=d) = dO[query][d] (transposed, like V in the forward)
                unsigned b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, swz_add(do_t_lane, RB, kq * 16, dp * 2));
                Tr::mma(dv[2 * dp], a, b0, b1);
                Tr::mma(dv[2 * dp + 1], a, b2, b3);
            }
        }

        // ---- dP^T = V dO^T (16 keys x BR queries) ----
        float dpt[QN][4];
#pragma unroll
        for (int i = 0; i < QN; ++i) {
            dpt[i][0] = 0.f;
            dpt[i][1] = 0.f;
            dpt[i][2] = 0.f;
            dpt[i][3] = 0.f;
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned a[4];
            ldsm_x4(a[0], a[1], a[2], a[3], swz_add(va_lane, RB, 0, kk * 2));
#pragma unroll
            for (int qp = 0; qp < QN / 2; ++qp) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, swz_add(do_b_lane, RB, qp * 16, kk * 2));
                Tr::mma(dpt[2 * qp], a, b0, b1);
                Tr::mma(dpt[2 * qp + 1], a, b2, b3);
            }
        }

        // ---- dS^T = P^T o (dP^T - dsum[query]) (in place in dpt) ----
#pragma unroll
        for (int nt = 0; nt < QN; ++nt) {
            const int qc = nt * 8 + 2 * t;
            const float d0 = s_dsum[qc];
            const float d1 = s_dsum[qc + 1];
            dpt[nt][0] = s[nt][0] * (dpt[nt][0] - d0);
            dpt[nt][1] = s[nt][1] * (dpt[nt][1] - d1);
            dpt[nt][2] = s[nt][2] * (dpt[nt][2] - d0);
            dpt[nt][3] = s[nt][3] * (dpt[nt][3] - d1);
        }

        // ---- dK += dS^T Q; dS^T -> smem ----
#pragma unroll
        for (int kq = 0; kq < BR / 16; ++kq) {
            unsigned a[4];
            a[0] = Tr::pack(dpt[2 * kq][0], dpt[2 * kq][1]);
            a[1] = Tr::pack(dpt[2 * kq][2], dpt[2 * kq][3]);
            a[2] = Tr::pack(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]);
            a[3] = Tr::pack(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3]);
            // dS^T [key][query] rows key0+g (a0, a2) and key0+g+8 (a1, a3); query chunk = n-tile
            *reinterpret_cast<unsigned*>(ds_ptr + swz<DSRB>(key0 + g, 2 * kq) + 4 * t) = a[0];
            *reinterpret_cast<unsigned*>(ds_ptr + swz<DSRB>(key0 + g + 8, 2 * kq) + 4 * t) = a[1];
            *reinterpret_cast<unsigned*>(ds_ptr + swz<DSRB>(key0 + g, 2 * kq + 1) + 4 * t) = a[2];
            *reinterpret_cast<unsigned*>(ds_ptr + swz<DSRB>(key0 + g + 8, 2 * kq + 1) + 4 * t) = a[3];
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                // B(k=query, n=d) = Q[query][d] (transposed)
                unsigned b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, swz_add(q_t_lane, RB, kq * 16, dp * 2));
                Tr::mma(dk[2 * dp], a, b0, b1);
                Tr::mma(dk[2 * dp + 1], a, b2, b3);
            }
        }
        __syncthreads();  // dS^T complete

        // ---- dQ[step rows] += dS K, into dq_accum (unscaled) ----
        // Work split: warp w -> query m-tile (w % MT) and a D/DSPLIT column range.
        {
            constexpr int MT = BR / 16;
            constexpr int DSPLIT = Cfg::NWARPS / MT;
            constexpr int DW = D / DSPLIT;  // columns per warp (32 or 64 or 128)
            const int mt = warp % MT;
            const int dbase = (warp / MT) * DW;
            // A = dS (queries x keys) = transpose of the stored dS^T [key][query]: transposed
            // 8x8 matrices. x4: (keys 0-7, q 0-7)->a0, (keys 0-7, q 8-15)->a1,
            // (keys 8-15, q 0-7)->a2, (keys 8-15, q 8-15)->a3.
            unsigned af[BC / 16][4];
#pragma unroll
            for (int kk = 0; kk < BC / 16; ++kk) {
                ldsm_x4_t(af[kk][0], af[kk][1], af[kk][2], af[kk][3],
                          s_ds + swz<DSRB>(kk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                           mt * 2 + ((lane >> 3) & 1)));
            }
            const long long row_base = (long long)(b * H + hh) * Lq + mm0 + mt * 16;
            // K as transposed B operand, columns from dbase: row l & 15, chunk dbase/8 + (l >> 4);
            // dbase/8 is a multiple of 4 and the loop's chunk offsets dc*4 + dp*2 < DW/8 share
            // no bit with it (DW/8 is a power of two dividing dbase/8).
            const unsigned k_t_lane = s_k + swz<RB>(lane & 15, dbase / 8 + (lane >> 4));
#pragma unroll
            for (int dc = 0; dc < DW / 32; ++dc) {
                const int d0 = dbase + dc * 32;
                float acc[4][4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    acc[i][0] = 0.f;
                    acc[i][1] = 0.f;
                    acc[i][2] = 0.f;
                    acc[i][3] = 0.f;
                }
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
#pragma unroll
                    for (int dp = 0; dp < 2; ++dp) {
                        // B(k=key, n=d) = K[key][d] (transposed)
                        unsigned b0, b1, b2, b3;
                        ldsm_x4_t(b0, b1, b2, b3, swz_add(k_t_lane, RB, kk * 16, dc * 4 + dp * 2));
                        Tr::mma(acc[2 * dp], af[kk], b0, b1);
                        Tr::mma(acc[2 * dp + 1], af[kk], b2, b3);
                    }
                }
                if (Cfg::RED_V4) {
                    // lanes t, t^1 swap: even t keeps row g and gets the partner's row-g pair
                    // (columns 2t..2t+3, 16-byte aligned), odd t keeps row g+8 and gets the
                    // partner's row-(g+8) pair (columns 2t-2..2t+1).
                    const int odd = t & 1;
                    const int ql = mt * 16 + g + 8 * odd;  // query row within the step
                    float* dst = dq_accum + (row_base + g + 8 * odd) * D + d0 + 2 * (t & 2);
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) {
                        // send the pair the partner keeps: even t sends row g+8, odd t row g
                        const float s0 = odd ? acc[nt][0] : acc[nt][2];
                        const float s1 = odd ? acc[nt][1] : acc[nt][3];
                        const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
                        const float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
                        const float k0 = odd ? acc[nt][2] : acc[nt][0];
                        const float k1 = odd ? acc[nt][3] : acc[nt][1];
                        if (mm0 + ql < Lq) {
                            if (odd) red_add_f32x4(dst + nt * 8, r0, r1, k0, k1);
                            else red_add_f32x4(dst + nt * 8, k0, k1, r0, r1);
                        }
                    }
                } else {
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int ql = mt * 16 + g + 8 * r;  // query row within the step
                        if (mm0 + ql < Lq) {
                            float* dst = dq_accum + (row_base + g + 8 * r) * D + d0 + 2 * t;
#pragma unroll
                            for (int nt = 0; nt < 4; ++nt) red_add_f32x2(dst + nt * 8, acc[nt][2 * r], acc[nt][2 * r + 1]);
                        }
                    }
                }
            }
        }
    }
    cp_async_wait<0>();  // K/V may still be in flight when total == 0

    // ---- epilogue: dK = scale * acc, dV; rows past Lk are not stored ----
    T* dkg = static_cast<T*>(p.dk) + kv_off;
    T* dvg = static_cast<T*>(p.dv) + kv_off;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int kl = key0 + g + 8 * r;  // key within the block
        if (n0 + kl < Lk) {
#pragma unroll
            for (int dn = 0; dn < DN; ++dn) {
                *reinterpret_cast<unsigned*>(dkg + (long long)kl * D + dn * 8 + 2 * t) =
                    Tr::pack(dk[dn][2 * r] * p.scale, dk[dn][2 * r + 1] * p.scale);
                *reinterpret_cast<unsigned*>(dvg + (long long)kl * D + dn * 8 + 2 * t) =
                    Tr::pack(dv[dn][2 * r], dv[dn][2 * r + 1]);
            }
        }
    }
}

// dsum = rowsum(dO o O); dq_accum = 0. Block of 256 threads, D/8 threads per row (one
// 16-byte chunk each), 256/(D/8) rows per block over the B*H*Lq rows.
template <typename Tr, int D>
__device__ __forceinline__ void flash_bwd_preprocess_body(const FlashParams& p) {
    typedef typename Tr::T T;
    constexpr int TPR = D / 8;
    constexpr int RPB = 256 / TPR;
    const long long rows = (long long)p.B * p.H * p.Lq;
    const long long row = (long long)blockIdx.x * RPB + threadIdx.x / TPR;
    const int part = threadIdx.x % TPR;
    float sum = 0.f;
    if (row < rows) {
        const long long off = row * D + part * 8;
        const uint4 a = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.dout) + off);
        const uint4 c = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.o) + off);
        const T* ah = reinterpret_cast<const T*>(&a);
        const T* ch = reinterpret_cast<const T*>(&c);
#pragma unroll
        for (int i = 0; i < 8; ++i) sum += Tr::to_float(ah[i]) * Tr::to_float(ch[i]);
        float4* z = reinterpret_cast<float4*>(static_cast<float*>(p.dq_accum) + off);
        z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (row < rows && part == 0) static_cast<float*>(p.dsum)[row] = sum;
}

// dq = T(dq_accum * scale), 4 elements per thread per grid-stride step.
template <typename Tr, int D>
__device__ __forceinline__ void flash_bwd_convert_dq_body(const FlashParams& p) {
    const long long n4 = (long long)p.B * p.H * p.Lq * D / 4;
    const float4* src = static_cast<const float4*>(p.dq_accum);
    uint2* dst = static_cast<uint2*>(p.dq);
    const float sc = p.scale;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        const float4 v = src[i];
        uint2 o;
        o.x = Tr::pack(v.x * sc, v.y * sc);
        o.y = Tr::pack(v.z * sc, v.w * sc);
        dst[i] = o;
    }
}
