// attention_wgmma_bwd.cu — FlashAttention backward main kernel (dQ, dK, dV) for Hopper with
// warpgroup MMA (wgmma.mma_async, sm_90a), f16 and bf16, head dim 128. Same ABI and semantics as
// flash_bwd_dq_dk_dv_d128_{T} of attention.cu (one `struct FlashParams` by value,
// attention_common.cuh); the preprocess (dsum, dq_accum = 0) and convert (dq) kernels stay
// attention.cu's and run before / after it exactly as documented there. Only the launch differs.
//
// rtx-kernels: arch-specific
// (the line above makes rtx-kernels compile this program for sm_90a: wgmma exists only on the
//  architecture-specific target; the CUBIN loads only on compute capability 9.0 devices)
//
// ======================================================================================
// Launch (kernels flash_bwd_wgmma_d128_{T}, T = f16 | bf16)
// ======================================================================================
//   grid (ceil(Lk / 128), Hkv, B), block (256, 1, 1), dynamic smem 217600 bytes
//   (BC = 128 keys per block, 2 warpgroups, BR = 64 query rows per step; smem = 1024 alignment
//    slack + K and V tiles (2 x BC*D*2) + dS^T tile (BC*BR*2) + 3 stages of Q and dO
//    (3 x 2 x BR*D*2) + 3 stages of lse and dsum (3 x 2 x BR*4) + the dQ staging tile
//    (BR*(D+8)*4; 182784 bytes in all without it, -DATTN_WGB_DQ_BULK=0; with 2 stages,
//    -DATTN_WGB_STAGES=2, 184320 and 149504); needs
//    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
//   Order on one stream: flash_bwd_preprocess_d128_{T} (attention.cu), this kernel,
//   flash_bwd_convert_dq_d128_{T} (attention.cu). Pointers, workspaces and alignment as there.
//
// ======================================================================================
// Design
// ======================================================================================
// One block = BC keys of one kv head, 2 consumer warpgroups (128 threads each); warpgroup w owns
// keys n0 + 64w .. n0 + 64w + 63 and keeps their dK, dV (64 x D, f32) in registers while the
// block walks over every query step (BR rows) of every query head of its GQA group, as the
// mma.sync kernel (attention_bwd.cuh) does. Everything is computed with keys as MMA rows:
//   S^T  = K_w Q^T        wgmma m64n64k16 x D/16, A = K rows (smem, K-major), B = Q (K-major)
//   dP^T = V_w dO^T       same with V and dO
//   P^T  = 2^(S^T scale log2e + mask log2e - lse log2e)  (masked entries 0; lse = -inf rows 0)
//   dS^T = P^T o (dP^T - dsum)                            in registers
//   dV  += P^T dO         wgmma m64n128k16 x BR/16, A = P^T (registers), B = dO (smem, MN-major)
//   dK  += dS^T Q         same with dS^T and Q
//   dS^T -> smem; barrier; dQ_w = dS K[:, 64w .. 64w + 63]: wgmma m64n64k16 x BC/16, A = dS
//   (the stored dS^T read MN-major: transpose flag), B = K (MN-major) -> a shared staging tile
//   -> cp.reduce.async.bulk .add.f32 into dq_accum, one 256-byte row segment per lane 0..15 of
//   each warp (unscaled; the convert kernel applies the scale). dK gets the scale at the end.
// Within a step, S^T and dP^T are two wgmma groups: the exponentials run while dP^T is still
// on the tensor cores, and dV += P^T dO runs while dS^T is formed.
// Q, dO, lse, dsum of the steps stream through a 3-stage cp.async ring (the loads of step it+2
// are issued at the start of step it). Every cp.async'ed tile
// and the dS^T tile (st.shared) are published to the tensor cores by fence.proxy.async.shared::cta
// in each writing thread and a __syncthreads; the staging tile is handed to the bulk engine by
// fence.proxy.async + __syncwarp, and rewritten only after cp.async.bulk.wait_group.read by the
// lanes that issued from it. All wgmmas are issued unconditionally by both
// warpgroups (no branch around an issue/wait pair; ptxas serializes them otherwise).
//
// Shared memory tiles use the 128-byte-swizzle layout of attention_wgmma.cu: a tile of R rows x
// C 16-bit columns is C/64 panels of R rows x 128 bytes (panel p at tile + p*R*128), row r at
// +r*128, 16-byte chunk c of a row at chunk c ^ (r & 7), 1024-byte aligned. Descriptors:
//   K-major (A = K / V rows, B = Q / dO):  start = panel + row0*128 + (16-col step in panel)*32,
//                                          LBO = 16 (unused), SBO = 1024
//   MN-major (B = dO / Q / K, A = dS):     start = tile + (16-row k step)*2048,
//                                          LBO = R*128 (next 64 columns), SBO = 1024
// ======================================================================================

#include "attention_common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_wgmma_bwd.cu needs the sm_90a target (wgmma.mma_async): compile with arch_specific"
#endif

#include "wgmma.cuh"
#include "attention_tma.cuh"
#include "attention_wgmma_bwd.cuh"

#ifndef ATTN_WGB_DQ_FIRST
#define ATTN_WGB_DQ_FIRST 0  // 1: dQ's GEMM issued before dK's, dK running on under the dQ
                             // stores (as attention_tma_bwd.cu; untimed candidate)
#endif
#ifndef ATTN_WGB_EXP_SPLIT
#define ATTN_WGB_EXP_SPLIT 0  // 1: steps that need no mask take a copy of the exponential loop
                              // without the per-element mask tests (untimed candidate)
#endif
#ifndef ATTN_WGB_STAGES
#define ATTN_WGB_STAGES 3  // stages of the Q, dO, lse, dsum ring (3: loads two steps ahead; on
                           // the H200 the backward took 2.5-3.2 % less time than with 2,
                           // attention_wgmma_check.py --bwd, 2026-12-04)
#endif
template <int D_, int BC_, bool DQ_BULK_, bool DQ_MMA_>
struct WgBwdCfg {
    static constexpr int D = D_;
    static constexpr bool DQ_MMA = DQ_MMA_;      // dQ = dS K with mma.sync (else wgmma)
    static constexpr bool DQ_BULK = DQ_BULK_;    // dQ through smem + bulk reduce (else red.v2)
    static constexpr int BC = BC_;               // keys per block
    static constexpr int NWG = BC / 64;          // warpgroups, 64 keys each
    static constexpr int NTHREADS = 128 * NWG;
    static constexpr int BR = 64;                // query rows per step
    static constexpr int STAGES = ATTN_WGB_STAGES;  // Q / dO / lse / dsum ring (2 or 3)
    static constexpr int KV_BYTES = BC * D * 2;  // K or V tile
    static constexpr int DS_BYTES = BC * BR * 2; // dS^T [BC keys][BR queries]
    static constexpr int Q_BYTES = BR * D * 2;   // Q or dO tile of a step
    static constexpr int ROWV_BYTES = 2 * BR * 4;  // lse and dsum of a step
    static constexpr int DQ_LD = D + 8;          // f32 row stride of the dQ staging tile
    static constexpr int DQ_BYTES = DQ_BULK ? BR * DQ_LD * 4 : 0;
    static constexpr int SMEM_BYTES =
        1024 + 2 * KV_BYTES + DS_BYTES + STAGES * 2 * Q_BYTES + STAGES * ROWV_BYTES + DQ_BYTES;
    static_assert(D == 64 * NWG, "dQ split: warpgroup w computes dQ columns 64w .. 64w + 63");
    static_assert(BR == 64, "dS^T rows are one 128-byte panel row");
    static_assert(!(ATTN_WGB_DQ_FIRST && DQ_MMA), "DQ_FIRST orders the wgmma dQ");
    static_assert(SMEM_BYTES <= 232448, "shared memory per block");
};

// -------------------------------------------------------------------------------------
// The backward main kernel
// -------------------------------------------------------------------------------------
template <typename Tr, typename Cfg>
__device__ __forceinline__ void flash_bwd_wgmma_body(const FlashParams& p, unsigned char* smem) {
    typedef typename Tr::T T;
    constexpr int D = Cfg::D;
    constexpr int BC = Cfg::BC;
    constexpr int BR = Cfg::BR;
    constexpr int NT = Cfg::NTHREADS;
    constexpr int SR = BR / 2;  // S^T / dP^T accumulators per thread (64 keys x BR queries)
    constexpr int KR = D / 2;   // dK / dV accumulators per thread (64 keys x D)
    constexpr int QR = 32;      // dQ accumulators per thread (64 queries x 64 columns)
    constexpr int PR = BR / 4;  // packed P^T / dS^T registers

    const int tid = threadIdx.x;
    // warp-uniform warpgroup index (broadcast, so ptxas sees it uniform: see attention_wgmma.cu)
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    const int warp = (tid >> 5) & 3;
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
    const int n0 = n_block * BC;
    const int kw0 = n0 + 64 * wg;  // first key of this warpgroup

    const long long kv_off = ((long long)(b * p.Hkv + hk) * Lk + n0) * D;
    const T* q = static_cast<const T*>(p.q);
    const T* dout = static_cast<const T*>(p.dout);
    const float* lse = static_cast<const float*>(p.lse);
    const float* dsum = static_cast<const float*>(p.dsum);

    // Query steps per head of the group: causal skips those whose rows all precede n0.
    const int m_begin = p.causal ? n0 / BR : 0;
    const int n_m = (Lq + BR - 1) / BR;
    const int per_head = n_m > m_begin ? n_m - m_begin : 0;
    const int total = G * per_head;

    // smem: [K][V][dS^T][Q, dO stage 0][Q, dO stage 1][lse, dsum stage 0, 1][dQ staging], 1024-aligned
    const unsigned base = (smem_u32(smem) + 1023u) & ~1023u;
    const unsigned s_k = base;
    const unsigned s_v = s_k + Cfg::KV_BYTES;
    const unsigned s_ds = s_v + Cfg::KV_BYTES;
    const unsigned s_st = s_ds + Cfg::DS_BYTES;
    const unsigned s_rv = s_st + Cfg::STAGES * 2 * Cfg::Q_BYTES;
    const unsigned s_dq = s_rv + Cfg::STAGES * Cfg::ROWV_BYTES;  // DQ_BULK: [BR][DQ_LD] f32
    unsigned char* const gbase = smem + (base - smem_u32(smem));
    unsigned char* const ds_ptr = gbase + (s_ds - base);
    const float* const rv_ptr = reinterpret_cast<const float*>(gbase + (s_rv - base));

    const WgTileLoader<D, NT> loader(tid);
    auto issue_step = [&](int it, int slot) {
        const int hh = hk * G + it / per_head;
        const int mm0 = (m_begin + it % per_head) * BR;
        const long long row_base = (long long)(b * H + hh) * Lq + mm0;
        const unsigned st = s_st + slot * 2 * Cfg::Q_BYTES;
        loader.template load<BR>(st, q + row_base * D, Lq - mm0);
        loader.template load<BR>(st + Cfg::Q_BYTES, dout + row_base * D, Lq - mm0);
        const unsigned rv = s_rv + slot * Cfg::ROWV_BYTES;
        if (tid < BR) {
            const bool ok = mm0 + tid < Lq;
            cp_async_4(rv + tid * 4, lse + row_base + (ok ? tid : 0), ok ? 4 : 0);
        } else if (tid < 2 * BR) {
            const int r = tid - BR;
            const bool ok = mm0 + r < Lq;
            cp_async_4(rv + BR * 4 + r * 4, dsum + row_base + (ok ? r : 0), ok ? 4 : 0);
        }
    };

    // group 0: K, V and step 0; then one group per iteration (possibly empty)
    loader.template load<BC>(s_k, static_cast<const T*>(p.k) + kv_off, Lk - n0);
    loader.template load<BC>(s_v, static_cast<const T*>(p.v) + kv_off, Lk - n0);
    if (total > 0) issue_step(0, 0);
    cp_async_commit();
    if (Cfg::STAGES == 3) {  // group 1: step 1
        if (total > 1) issue_step(1, 1);
        cp_async_commit();
    }

    float dk[KR], dv[KR], s[SR], dp[SR], dq[QR];
    unsigned pf[PR], df[PR];
#pragma unroll
    for (int i = 0; i < KR; ++i) {
        dk[i] = 0.f;
        dv[i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < SR; ++i) {
        s[i] = 0.f;
        dp[i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < QR; ++i) dq[i] = 0.f;
#pragma unroll
    for (int i = 0; i < PR; ++i) {
        pf[i] = 0u;
        df[i] = 0u;
    }

    // Descriptors (stage 0; a stage is + 2 * Q_BYTES).
    const unsigned long long k_a = wg_desc(s_k + wg * 64 * 128, 16, 1024);   // K rows of wg
    const unsigned long long v_a = wg_desc(s_v + wg * 64 * 128, 16, 1024);   // V rows of wg
    const unsigned long long st_kmaj = wg_desc(s_st, 16, 1024);               // Q / dO as B, K-major
    const unsigned long long st_mn = wg_desc(s_st, BR * 128, 1024);           // Q / dO as B, MN-major
    const unsigned long long ds_a = wg_desc(s_ds, BC * 128, 1024);            // dS (A, MN-major)
    const unsigned long long k_b = wg_desc(s_k + wg * (BC * 128), BC * 128, 1024);  // K cols 64wg.. (B, MN)

    const float sl2 = p.scale * ATTN_LOG2E;
    const T* mask = static_cast<const T*>(p.mask);
    const bool has_mask = mask != nullptr;
    float* dq_accum = static_cast<float*>(p.dq_accum);
    const int krow = kw0 + warp * 16 + g;  // this thread's keys: krow and krow + 8

    for (int it = 0; it < total; ++it) {
        // step it (and K, V) landed for this thread (3 stages: all groups but step it+1's) ...
        if (Cfg::STAGES == 3) {
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async_smem();
        __syncthreads();      // ... for all; every warpgroup is done with step it-1 (slot, dS^T)
        {
            const int ahead = it + Cfg::STAGES - 1;  // the step whose slot step it-1 freed
            if (ahead < total) issue_step(ahead, ahead % Cfg::STAGES);
        }
        cp_async_commit();

        const int hh = hk * G + it / per_head;
        const int mm0 = (m_begin + it % per_head) * BR;
        const int slot = it % Cfg::STAGES;
        const unsigned st_off = slot * 2 * Cfg::Q_BYTES;
        const float* s_lse = rv_ptr + slot * (Cfg::ROWV_BYTES / 4);
        const float* s_dsum = s_lse + BR;

        // ---- S^T = K_w Q^T and dP^T = V_w dO^T (two groups) ----
        reg_fence(s);
        reg_fence(dp);
        wg_fence();
        wgb_issue_sdp<Tr, D, BC, BR>(s, dp, k_a, v_a, st_kmaj, st_off, Cfg::Q_BYTES);
        wg_wait<1>();  // S^T done (dP^T may run on)
        reg_fence(s);

        // ---- P^T (rows = keys krow + 8r, columns = queries mm0 + 8nt + 2t + c) ----
        const bool need_mask = (mm0 + BR > Lq) || (kw0 + 64 > Lk) || (p.causal && kw0 + 63 > mm0) || has_mask;
        const WgbMask<T> wm = {krow, mm0, t, Lq, Lk, p.causal, mask, has_mask,
                               (long long)b * p.mask_stride_b + (long long)hh * p.mask_stride_h, p.mask_stride_q};
        wgb_probs<Tr, BR, ATTN_WGB_EXP_SPLIT != 0>(s, s_lse, sl2, need_mask, wm);
        wgb_pack<Tr, PR>(pf, s);

        // ---- dV += P^T dO (runs while dS^T is computed) ----
        reg_fence(dv);
        reg_fence(pf);
        wg_fence();
        wgb_issue_rs<Tr, D, BR>(dv, pf, wg_desc_add(st_mn, st_off + Cfg::Q_BYTES));
        wg_commit();
        wg_wait<1>();  // dP^T done (dV may run on)
        reg_fence(dp);

        // ---- dS^T = P^T o (dP^T - dsum) -> smem [key][query] ----
        wgb_ds<Tr, BR>(dp, s, df, s_dsum, ds_ptr, krow - n0, g, t);

        // ---- dK += dS^T Q (DQ_FIRST: after dQ's GEMM, below) ----
        if (!ATTN_WGB_DQ_FIRST) {
            reg_fence(dk);
            reg_fence(df);
            wg_fence();
            wgb_issue_rs<Tr, D, BR>(dk, df, wg_desc_add(st_mn, st_off));
            wg_commit();
        }
        if (Cfg::DQ_BULK && lane < 16) bulk_wait_read();  // last step's dQ rows left the staging tile
        fence_proxy_async_smem();
        __syncthreads();  // dS^T complete (both warpgroups' keys)

        // ---- dQ[step rows, 64wg .. 64wg + 63] = dS K ----
        if (Cfg::DQ_MMA) {
            // mma.sync variant: warp w of the warpgroup -> query rows 16w .. 16w + 15 (same
            // accumulator layout as the wgmma: dq[4 nt + e]); dS by ldmatrix.trans from the
            // dS^T tile, K by ldmatrix.trans from the K panels.
            wg_wait<0>();
            reg_fence(dv);
            reg_fence(dk);
            reg_fence(pf);
            reg_fence(df);
#pragma unroll
            for (int i = 0; i < QR; ++i) dq[i] = 0.f;
#pragma unroll
            for (int kk = 0; kk < BC / 16; ++kk) {
                unsigned af[4];
                {
                    const int row = kk * 16 + (lane & 7) + ((lane >> 4) << 3);
                    const int ch = warp * 2 + ((lane >> 3) & 1);
                    ldsm_x4_t(af[0], af[1], af[2], af[3], s_ds + row * 128 + ((ch ^ (row & 7)) << 4));
                }
#pragma unroll
                for (int dp2 = 0; dp2 < 4; ++dp2) {
                    const int row = kk * 16 + (lane & 15);
                    const int ch = 8 * wg + 2 * dp2 + (lane >> 4);
                    unsigned b0, b1, b2, b3;
                    ldsm_x4_t(b0, b1, b2, b3,
                              s_k + (ch >> 3) * (BC * 128) + row * 128 + (((ch & 7) ^ (row & 7)) << 4));
                    float c0[4] = {dq[8 * dp2], dq[8 * dp2 + 1], dq[8 * dp2 + 2], dq[8 * dp2 + 3]};
                    float c1[4] = {dq[8 * dp2 + 4], dq[8 * dp2 + 5], dq[8 * dp2 + 6], dq[8 * dp2 + 7]};
                    Tr::mma(c0, af, b0, b1);
                    Tr::mma(c1, af, b2, b3);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        dq[8 * dp2 + e] = c0[e];
                        dq[8 * dp2 + 4 + e] = c1[e];
                    }
                }
            }
        } else {
            reg_fence(dq);
            wg_fence();
            wgb_issue_dq<Tr, BC>(dq, ds_a, k_b);
            wg_commit();
            if (ATTN_WGB_DQ_FIRST) {
                // dK += dS^T Q now, running on under the dQ stores below
                reg_fence(dk);
                reg_fence(df);
                wg_fence();
                wgb_issue_rs<Tr, D, BR>(dk, df, wg_desc_add(st_mn, st_off));
                wg_commit();
                wg_wait<1>();  // dV and dQ done
            } else {
                wg_wait<0>();
            }
            reg_fence(dq);
        }
        reg_fence(dv);
        reg_fence(pf);
        if (!ATTN_WGB_DQ_FIRST) {
            reg_fence(dk);
            reg_fence(df);
        }

        const long long row_base = (long long)(b * H + hh) * Lq + mm0;
        if (Cfg::DQ_BULK) {
            // The warp's 16 rows x the warpgroup's 64 columns -> staging tile, then lane l < 16
            // reduces row 16 warp + l (256 contiguous bytes) into dq_accum with one bulk op.
            float* sdq = reinterpret_cast<float*>(gbase + (s_dq - base));
            wgb_reduce_dq<D>(dq, sdq, s_dq, Cfg::DQ_LD, 64 * wg, dq_accum, row_base, mm0, Lq, warp, lane, g, t);
        } else {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int ql = warp * 16 + g + 8 * r;
                if (mm0 + ql < Lq) {
                    float* dst = dq_accum + (row_base + ql) * D + 64 * wg + 2 * t;
#pragma unroll
                    for (int nt = 0; nt < 8; ++nt) red_add_f32x2(dst + nt * 8, dq[4 * nt + 2 * r], dq[4 * nt + 2 * r + 1]);
                }
            }
        }
        if (ATTN_WGB_DQ_FIRST) {
            wg_wait<0>();  // dK done before the next step's barrier frees its stage
            reg_fence(dk);
            reg_fence(df);
        }
    }
    if (Cfg::DQ_BULK && lane < 16) bulk_wait_all();
    cp_async_wait<0>();  // K/V may still be in flight when total == 0

    // ---- epilogue: dK = scale * acc, dV; rows past Lk are not stored ----
    wgb_store_dkdv<Tr, D>(dk, dv, static_cast<T*>(p.dk) + kv_off, static_cast<T*>(p.dv) + kv_off, p.scale, krow - n0,
                          n0, Lk, t);
}

// -------------------------------------------------------------------------------------
// Kernels
// -------------------------------------------------------------------------------------
// Tunables (compile-time; the defaults are the launch documented at the top):
//   ATTN_WGB_DQ_BULK = 1 (default): dQ goes through a shared-memory staging tile ([BR][D + 8] f32,
//     +34816 bytes) and bulk reductions (cp.reduce.async.bulk .add.f32, one per warp row and
//     64-column half); 0: red.global.add.v2.f32 from the accumulators (smem 182784 bytes).
//   ATTN_WGB_STAGES = 3 (default): the Q / dO / lse / dsum ring's stages; 2: the earlier ring.
//   ATTN_WGB_DQ_MMA = 1: dQ = dS K with mma.sync + ldmatrix instead of wgmma (same smem).
//   ATTN_WGB_DQ_FIRST = 1, ATTN_WGB_EXP_SPLIT = 1: the candidates described where they are
//     defined (above the configuration), not yet timed.
// Measured on the H200 (kernels/checks/attention_wgmma_check.py --bwd, 2026-11-29; bf16, B*L = 16384,
// H = 16, L 4096 / 16384, causal 0/1; all four passed the gradient check): backward
// (preprocess + this + convert) 292-347 TFLOP/s with BULK (0.57-0.66x SDPA's backward), 286-337
// with red.v2, 265-319 with the mma.sync dQ; the mma.sync kernel of attention.cu 203-225.
#ifndef ATTN_WGB_DQ_BULK
#define ATTN_WGB_DQ_BULK 1
#endif
#ifndef ATTN_WGB_DQ_MMA
#define ATTN_WGB_DQ_MMA 0
#endif
typedef WgBwdCfg<128, 128, ATTN_WGB_DQ_BULK != 0, ATTN_WGB_DQ_MMA != 0> AttnWgBwdCfgD128;
#if ATTN_WGB_DQ_BULK && ATTN_WGB_STAGES == 3
static_assert(AttnWgBwdCfgD128::SMEM_BYTES == 217600 && AttnWgBwdCfgD128::NTHREADS == 256 &&
                  AttnWgBwdCfgD128::BC == 128,
              "documented (wgmma bwd d128)");
#elif ATTN_WGB_STAGES == 3
static_assert(AttnWgBwdCfgD128::SMEM_BYTES == 182784, "wgmma bwd d128 with dQ red.v2");
#endif

extern __shared__ __align__(1024) unsigned char attn_wgb_smem[];

#define ATTN_WG_BWD_KERNEL(NAME, TR, CFG)                                  \
    extern "C" __global__ void __launch_bounds__(CFG::NTHREADS, 1)         \
        NAME(const FlashParams p) {                                        \
        flash_bwd_wgmma_body<TR, CFG>(p, attn_wgb_smem);                   \
    }

ATTN_WG_BWD_KERNEL(flash_bwd_wgmma_d128_f16, AttnF16, AttnWgBwdCfgD128)
ATTN_WG_BWD_KERNEL(flash_bwd_wgmma_d128_bf16, AttnBF16, AttnWgBwdCfgD128)
