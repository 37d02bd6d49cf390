// attention_wgmma.cu — FlashAttention forward for Hopper with warpgroup MMA (wgmma.mma_async,
// sm_90a), f16 and bf16, head dim 64 and 128. Same ABI and semantics as flash_fwd_d{D}_{T} of
// attention.cu (one `struct FlashParams` by value, attention_common.cuh); only the launch
// numbers differ (table below). The backward main kernel for
// Hopper is attention_wgmma_bwd.cu (D = 128); the other backward kernels are attention.cu's.
//
// rtx-kernels: arch-specific
// (the line above makes rtx-kernels compile this program for sm_90a instead of sm_90:
//  wgmma exists only on the architecture-specific target; such a CUBIN loads only on
//  compute capability 9.0 devices)
//
// ======================================================================================
// Launch (kernels flash_fwd_wgmma_d{D}_{T}, T = f16 | bf16)
// ======================================================================================
//   D = 128: grid (ceil(Lq / 128), H, B), block (256, 1, 1), dynamic smem 197632 bytes
//            (NWG = 2 warpgroups, BR = 128 query rows, BC = 128 keys per K/V tile, PIPE and
//             ORDER, 1 block per SM)
//   D =  64: grid (ceil(Lq / 128), H, B), block (256, 1, 1), dynamic smem 50176 bytes
//            (NWG = 2, BR = 128, BC = 64, no PIPE, 2 blocks per SM)
//   (BR = 64 * NWG; smem = 1024 alignment slack + BR*D*2 Q tile + 2 K stages and 3 (PIPE) or
//    2 V stages of BC*D*2 bytes; needs CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES. Other
//    tiles: the ATTN_WG_D{D}_* tunables at the bottom; launch = block 128*NWG, grid ceil(Lq/BR).)
//   Semantics, pointers and alignment: exactly as flash_fwd_* in attention.cu (o and the f32
//   natural-log lse [B, H, Lq]; fully masked rows give o = 0, lse = -inf).
//   The same program holds flash_fwd_tma_d128_{T} (FlashAttention-3's warp-specialized block,
//   bulk tensor copies, its own argument struct): its launch is documented above its body.
//
// ======================================================================================
// Design
// ======================================================================================
// One block = NWG consumer warpgroups (128 threads each), warpgroup w owning query rows
// m0 + 64w .. m0 + 64w + 63 end to end. All threads also load tiles (cp.async, no producer
// warps). Per K/V tile j of BC keys, per warpgroup:
//   S   = Q K_j^T     wgmma m64nBCk16, A = Q (smem), B = K tile (smem), both K-major
//   masking / online softmax on the S accumulators in registers (as attention_fwd.cuh:
//   raw score unit, base-2 exponent, running max m and sum l per row)
//   O  += P V_j       wgmma m64nDk16, A = P (registers, S accumulators packed to T),
//                     B = V tile (smem, N-major: transpose flag)
// One __syncthreads per tile hands the K/V stages over (loads of tile j+1 overlap tile j).
// Overlap of tensor-core and softmax work comes from (tunables at the bottom):
//   PIPE   iteration j issues S_j and O += P_{j-1} V_{j-1} back to back, waits for S_j only,
//          does the softmax of tile j while the tensor cores run P_{j-1} V_{j-1}, then waits
//          for that and rescales O (FlashAttention-3's intra-warpgroup overlap). V tiles stay
//          one iteration longer than K tiles, hence 3 V stages and 2 K stages.
//   ORDER  warpgroup w issues its GEMMs of an iteration after warpgroup w-1 (named barriers),
//          so one warpgroup's softmax runs while the next one's GEMMs do.
//   MINB   2 blocks per SM (D=64): two independent blocks, each with its own barriers.
// The wgmma issue/wait pairs each sit whole in one branch on warpgroup-uniform values (first
// tile / steady state / drain); ptxas serializes all wgmmas otherwise (checked by the kernel
// compile test).
//
// Shared memory tiles are the canonical 128-byte-swizzle layout of wgmma: a tile of R rows x
// D columns (16-bit) is D/64 panels of R rows x 128 bytes (panel p = columns 64p..64p+63, at
// tile + p * R * 128), row r at +r*128, 16-byte chunk c of a row stored at chunk c ^ (r & 7);
// every panel 1024-byte aligned. Descriptors (PTX ISA "matrix descriptor"):
//   K-major operand (Q as A, K as B):  start = panel + (16-col step within the panel) * 32 B,
//                                      LBO = 16 (unused), SBO = 1024 (next 8 rows)
//   N-major operand (V as B of P V):   start = tile + (16-key step) * 2048 B,
//                                      LBO = R * 128 (next 64 columns = next panel),
//                                      SBO = 1024 (next 8 keys)
// Every cp.async'ed tile is published to the tensor cores by: cp.async.wait_group (own copies),
// fence.proxy.async.shared::cta (generic -> async proxy), __syncthreads (everyone's copies).
// A stage is overwritten only after a __syncthreads that follows every warpgroup's
// wgmma.wait_group for the wgmmas reading it.
// ======================================================================================

#include "attention_common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_wgmma.cu needs the sm_90a target (wgmma.mma_async): compile with arch_specific"
#endif

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
template <typename Tr, int BC>
__device__ __forceinline__ void wg_softmax(float (&s)[BC / 2], float (&m_r)[2], float (&alpha)[2],
                                           float (&rsum)[2], const WgRows<typename Tr::T>& w, int n0) {
    const bool need_mask = (n0 + BC > w.Lk) || (w.causal && n0 + BC - 1 > w.row0) || w.mask != nullptr;
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
                } else if (w.mask != nullptr && row < w.Lq) {
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

// -------------------------------------------------------------------------------------
// The forward
// -------------------------------------------------------------------------------------
template <typename Tr, typename Cfg>
__device__ __forceinline__ void flash_fwd_wgmma_body(const FlashParams& p, unsigned char* smem) {
    typedef typename Tr::T T;
    constexpr int D = Cfg::D;
    constexpr int BC = Cfg::BC;
    constexpr int BR = Cfg::BR;
    constexpr int NT = Cfg::NTHREADS;
    constexpr int KV_BYTES = Cfg::KV_BYTES;
    constexpr int VSTAGES = Cfg::VSTAGES;
    constexpr int SR = BC / 2;      // S accumulators per thread
    constexpr int OR = D / 2;       // O accumulators per thread
    constexpr int PR = BC / 4;      // P registers (two T each) per thread

    const int tid = threadIdx.x;
    // warpgroup: query rows 64 wg .. 64 wg + 63 of the block. Broadcast from lane 0 so that the
    // compiler knows it is warp-uniform: the wgmmas below sit in branches on values derived from
    // it, and a branch it must treat as divergent makes ptxas serialize every wgmma (C7520).
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    const int warp = (tid >> 5) & 3;   // warp within the warpgroup: rows 16 warp ..
    const int lane = tid & 31;
    const int g = lane >> 2;  // accumulator fragment: rows g and g + 8 of the warp's 16 ...
    const int t = lane & 3;   // ... columns 8 i + 2 t and + 1 (register 4 i + e)

    // Blocks with the most work (last query blocks under causal) are scheduled first.
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const int hk = h / (p.H / p.Hkv);
    const int Lq = p.Lq;
    const int Lk = p.Lk;
    const int m0 = m_block * BR;

    const T* qg = static_cast<const T*>(p.q) + ((long long)(b * p.H + h) * Lq + m0) * D;
    const T* kg = static_cast<const T*>(p.k) + (long long)(b * p.Hkv + hk) * Lk * D;
    const T* vg = static_cast<const T*>(p.v) + (long long)(b * p.Hkv + hk) * Lk * D;

    // Keys the block can see: all, or (causal) up to its last valid query row; the tiles a
    // warpgroup computes are a prefix of the block's (causal: up to its own last row).
    int kv_end = Lk;
    if (p.causal) kv_end = min(Lk, min(Lq, m0 + BR));
    const int n_tiles = (kv_end + BC - 1) / BC;  // >= 1
    const int row0 = m0 + 64 * wg;                // first query row of this warpgroup
    int wg_tiles = 0;
    if (row0 < Lq) wg_tiles = (p.causal ? min(kv_end - 1, row0 + 63) : kv_end - 1) / BC + 1;

    // smem: [Q: BR rows][K stage 0, 1][V stage 0 .. VSTAGES-1], 1024-byte aligned
    const unsigned s_q = (smem_u32(smem) + 1023u) & ~1023u;
    const unsigned s_k = s_q + Cfg::Q_BYTES;
    const unsigned s_v = s_k + Cfg::KSTAGES * KV_BYTES;
    const unsigned long long q_desc = wg_desc(s_q + wg * 64 * 128, 16, 1024);
    const unsigned long long k_desc = wg_desc(s_k, 16, 1024);
    const unsigned long long v_desc = wg_desc(s_v, BC * 128, 1024);

    // cp.async groups, committed by every thread (empty past the end, so counts are uniform):
    // [Q, K_0], [V_0], then in iteration j: [K_{j+1}], [V_{j+1}].
    const WgTileLoader<D, NT> loader(tid);
    loader.template load<BR>(s_q, qg, Lq - m0);
    loader.template load<BC>(s_k, kg, Lk);
    cp_async_commit();
    loader.template load<BC>(s_v, vg, Lk);
    cp_async_commit();

    float o[OR];
    float s[SR];
    unsigned pf[PR];
#pragma unroll
    for (int i = 0; i < OR; ++i) o[i] = 0.f;
#pragma unroll
    for (int i = 0; i < SR; ++i) s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < PR; ++i) pf[i] = 0u;
    // running max (raw score unit) and this thread's part of the running sum, rows r = 0, 1
    float m_r[2] = {attn_neg_inf(), attn_neg_inf()};
    float l_r[2] = {0.f, 0.f};
    float alpha[2], rsum[2];

    const WgRows<T> w = wg_rows<T>(p, b, h, Lq, Lk, row0, warp * 16 + g, t);

    // The wgmma issue/wait pairs below each sit whole inside one branch on warpgroup-uniform
    // values (first tile / steady state / drain): with a wgmma group left in flight across a
    // branch (tried first), ptxas can no longer prove the accumulators untouched and serializes
    // all wgmmas (C7514 / C7520).
    for (int j = 0; j < n_tiles; ++j) {
        // K_j (PIPE: and V_{j-1}; else V_j) has landed, for every thread; and every warpgroup
        // has waited for its wgmmas of the previous iteration (the slots refilled below).
        if (Cfg::PIPE) {
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async_smem();
        __syncthreads();
        if (j + 1 < n_tiles) {
            const int n1 = (j + 1) * BC;
            loader.template load<BC>(s_k + ((j + 1) & 1) * KV_BYTES, kg + (long long)n1 * D, Lk - n1);
        }
        cp_async_commit();
        if (j + 1 < n_tiles) {
            const int n1 = (j + 1) * BC;
            loader.template load<BC>(s_v + ((j + 1) % VSTAGES) * KV_BYTES, vg + (long long)n1 * D,
                                     Lk - n1);
        }
        cp_async_commit();

        const int n0 = j * BC;
        const unsigned long long kd = wg_desc_add(k_desc, (j & 1) * KV_BYTES);
        if (Cfg::PIPE) {
            // P_{j-1} V_{j-1} runs while the softmax of tile j is computed.
            const unsigned long long vd = wg_desc_add(v_desc, ((j + VSTAGES - 1) % VSTAGES) * KV_BYTES);
            if (j == 0) {
                if (wg_tiles > 0) {  // first tile: S only
                    wg_turn_wait<Cfg>(wg);
                    reg_fence(s);
                    wg_fence();
                    wg_issue_s<Tr, Cfg>(s, q_desc, kd);
                    wg_commit();
                    wg_turn_pass<Cfg>(wg);
                    wg_wait<0>();
                    reg_fence(s);
                    wg_softmax<Tr, BC>(s, m_r, alpha, rsum, w, n0);
                    wg_rescale_pack<Tr, D, BC>(o, pf, l_r, s, alpha, rsum);
                } else {
                    wg_turn_wait<Cfg>(wg);
                    wg_turn_pass<Cfg>(wg);
                }
            } else if (j < wg_tiles) {  // steady state: S_j and P_{j-1} V_{j-1}
                wg_turn_wait<Cfg>(wg);
                reg_fence(s);
                reg_fence(o);
                reg_fence(pf);
                wg_fence();
                wg_issue_s<Tr, Cfg>(s, q_desc, kd);
                wg_commit();
                wg_issue_pv<Tr, Cfg>(o, pf, vd);
                wg_commit();
                wg_turn_pass<Cfg>(wg);
                wg_wait<1>();  // S_j done
                reg_fence(s);
                wg_softmax<Tr, BC>(s, m_r, alpha, rsum, w, n0);
                wg_wait<0>();  // P_{j-1} V_{j-1} done: O and the P registers are free
                reg_fence(o);
                reg_fence(pf);
                wg_rescale_pack<Tr, D, BC>(o, pf, l_r, s, alpha, rsum);
            } else if (j == wg_tiles) {  // drain: the warpgroup's last P V
                wg_turn_wait<Cfg>(wg);
                reg_fence(o);
                reg_fence(pf);
                wg_fence();
                wg_issue_pv<Tr, Cfg>(o, pf, vd);
                wg_commit();
                wg_turn_pass<Cfg>(wg);
                wg_wait<0>();
                reg_fence(o);
            } else {
                wg_turn_wait<Cfg>(wg);
                wg_turn_pass<Cfg>(wg);
            }
        } else if (j < wg_tiles) {
            wg_turn_wait<Cfg>(wg);
            reg_fence(s);
            wg_fence();
            wg_issue_s<Tr, Cfg>(s, q_desc, kd);
            wg_commit();
            wg_turn_pass<Cfg>(wg);
            wg_wait<0>();
            reg_fence(s);
            wg_softmax<Tr, BC>(s, m_r, alpha, rsum, w, n0);
            wg_rescale_pack<Tr, D, BC>(o, pf, l_r, s, alpha, rsum);
            reg_fence(o);
            reg_fence(pf);
            wg_fence();
            wg_issue_pv<Tr, Cfg>(o, pf, wg_desc_add(v_desc, (j % VSTAGES) * KV_BYTES));
            wg_commit();
            wg_wait<0>();
            reg_fence(o);
        } else {
            wg_turn_wait<Cfg>(wg);
            wg_turn_pass<Cfg>(wg);
        }
    }
    cp_async_wait<0>();
    if (Cfg::PIPE) {
        // Drain of the warpgroups whose last tile is the block's last (V landed: wait + barrier).
        fence_proxy_async_smem();
        __syncthreads();
        if (wg_tiles == n_tiles) {
            reg_fence(o);
            reg_fence(pf);
            wg_fence();
            wg_issue_pv<Tr, Cfg>(o, pf, wg_desc_add(v_desc, ((n_tiles - 1) % VSTAGES) * KV_BYTES));
            wg_commit();
            wg_wait<0>();
            reg_fence(o);
        }
    }

    if (row0 >= Lq) return;  // warpgroup entirely past Lq: it only helped load tiles

    wg_store_o<Tr, D>(p, b, h, w, o, l_r, m_r);
}

// -------------------------------------------------------------------------------------
// The forward with a producer warpgroup (TMA) and mbarriers: flash_fwd_tma_d128_{T}
// -------------------------------------------------------------------------------------
// rtx's forward for D = 128 on compute capability 9.0 (ops/src/attention/cuda/; the wgmma
// kernel above is its fallback). FlashAttention-3's layout of the block: warpgroup 0 is the
// producer (setmaxnreg down to 24 registers; one thread issues every load as bulk tensor
// copies, cp.async.bulk.tensor, into the
// same 128-byte-swizzled panels as above), warpgroups 1 and 2 are the consumers (setmaxnreg up
// to 240) running the PIPE steps above on query rows 64 (wg - 1) .. + 63, their GEMMs issued in
// strict alternation (tma_turn_wait / tma_turn_pass below). Stages are handed
// over by mbarriers instead of __syncthreads: full[s] (the producer's expect_tx arrival and the
// copies' transaction bytes) and empty[s] (256 consumer arrivals, each thread's after its
// wgmma reading the stage has completed), so a consumer warpgroup is never held by the other
// one or by a load it does not need yet.
// Launch: grid (ceil(Lq / 128), H, B), block (384, 1, 1), dynamic smem
// 1024 + 128*D*2 (Q) + (TMA_KS + TMA_VS) * 128*D*2 + 8 * (1 + 2 TMA_KS + 2 TMA_VS) bytes,
// argument `const FlashTmaParams` by value: the FlashParams (pointers for o, lse, mask) and the
// tensor maps of q, k, v: 3-D (D, L, B * heads), 16-bit elements, box (64, 128, 1),
// CU_TENSOR_MAP_SWIZZLE_128B, no interleave, zero fill out of bounds (rows past L read 0).
struct __align__(64) TmaMap {
    unsigned long long w[16];  // a CUtensorMap (opaque, 128 bytes)
};
struct __align__(64) FlashTmaParams {
    FlashParams p;
    TmaMap q, k, v;
};
// (NVRTC has no offsetof: 152 bytes of FlashParams, then q, k, v at 192, 320, 448 is the only
// layout of this size and alignment.)
static_assert(sizeof(FlashTmaParams) == 576 && alignof(FlashTmaParams) == 64 && sizeof(TmaMap) == 128,
              "FlashTmaParams ABI");

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also expects `bytes` of transactions (the bulk copies that complete on it).
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred P1;\nTMA_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra TMA_DONE;\nbra TMA_WAIT;\nTMA_DONE:\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// Box (c0, c1, c2) of the tensor map into shared memory at dst; completes on bar.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
        "[%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

#ifndef ATTN_TMA_KS
#define ATTN_TMA_KS 2  // K stages
#endif
#ifndef ATTN_TMA_D64
#define ATTN_TMA_D64 0  // 1: also flash_fwd_tma_d64_* (see the kernels at the bottom)
#endif
#ifndef ATTN_TMA_VS
#define ATTN_TMA_VS 2  // V stages
#endif
// setmaxnreg: the producer warpgroup's registers and the consumers'. They must fit the block's
// allocation at launch, 384 threads x 168 registers (65536 / 384 rounded down to a multiple
// of 8): an increase beyond what the decrease freed would wait forever.
#ifndef ATTN_TMA_PREGS
#define ATTN_TMA_PREGS 24
#endif
#ifndef ATTN_TMA_CREGS
#define ATTN_TMA_CREGS 240
#endif
static_assert(128 * ATTN_TMA_PREGS + 256 * ATTN_TMA_CREGS <= 384 * 168, "setmaxnreg budget");

// The consumers' turns (FlashAttention-3's ping-pong): the two warpgroups issue their GEMMs of
// an iteration strictly in alternation. Warpgroup 0 waits (named barrier 1) for warpgroup 1's
// pass of the previous iteration, warpgroup 1 (barrier 2) for warpgroup 0's pass of this one;
// each barrier completes with 128 arrivals and 128 waits. (A one-way turn as ORDER's above
// lets warpgroup 0 run ahead, its arrivals completing barriers without warpgroup 1, once
// nothing else holds the two together: it deadlocked on the mbarriers here.) Both warpgroups
// take every iteration of the block, computing or not.
__device__ __forceinline__ void tma_turn_wait(int cw, int j) {
    if (cw == 0) {
        if (j > 0) named_bar_sync(1, 256);
    } else {
        named_bar_sync(2, 256);
    }
}
__device__ __forceinline__ void tma_turn_pass(int cw, int j, int n) {
    if (cw == 0) {
        named_bar_arrive(2, 256);
    } else if (j + 1 < n) {
        named_bar_arrive(1, 256);
    }
}

template <typename Tr, typename Cfg, int KS, int VS>
__device__ __forceinline__ void flash_fwd_tma_body(const FlashTmaParams& tp, unsigned char* smem) {
    static_assert(Cfg::PIPE && Cfg::NWG == 2 && Cfg::BC == 128 && Cfg::BR == 128 && (Cfg::D == 64 || Cfg::D == 128),
                  "TMA forward: PIPE, 2 x 64 rows, 128 keys, D 64 or 128");
    typedef typename Tr::T T;
    const FlashParams& p = tp.p;
    constexpr int D = Cfg::D;
    constexpr int BC = Cfg::BC;
    constexpr int BR = Cfg::BR;
    constexpr int KV_BYTES = Cfg::KV_BYTES;
    constexpr int SR = BC / 2;
    constexpr int OR = D / 2;
    constexpr int PR = BC / 4;

    const int tid = threadIdx.x;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // 0 producer, 1 and 2 consumers
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const int hk = h / (p.H / p.Hkv);
    const int Lq = p.Lq;
    const int Lk = p.Lk;
    const int m0 = m_block * BR;
    int kv_end = Lk;
    if (p.causal) kv_end = min(Lk, min(Lq, m0 + BR));
    const int n_tiles = (kv_end + BC - 1) / BC;

    // smem: [Q][K stages][V stages][barriers: q_full, k_full[KS], k_empty[KS], v_full[VS], v_empty[VS]]
    const unsigned s_q = (smem_u32(smem) + 1023u) & ~1023u;
    const unsigned s_k = s_q + Cfg::Q_BYTES;
    const unsigned s_v = s_k + KS * KV_BYTES;
    const unsigned bar = s_v + VS * KV_BYTES;
    const unsigned q_full = bar;
    const unsigned k_full = bar + 8;
    const unsigned k_empty = k_full + 8 * KS;
    const unsigned v_full = k_empty + 8 * KS;
    const unsigned v_empty = v_full + 8 * VS;
    if (tid == 0) {
        mbar_init(q_full, 1);
        for (int i = 0; i < KS; ++i) {
            mbar_init(k_full + 8 * i, 1);
            mbar_init(k_empty + 8 * i, 256);
        }
        for (int i = 0; i < VS; ++i) {
            mbar_init(v_full + 8 * i, 1);
            mbar_init(v_empty + 8 * i, 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        // ---- producer ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ATTN_TMA_PREGS) : "memory");
        if (tid == 0) {
            const int qh = b * p.H + h, kh = b * p.Hkv + hk;
            mbar_expect_tx(q_full, Cfg::Q_BYTES);
#pragma unroll
            for (int pn = 0; pn < D / 64; ++pn) tma_load_3d(s_q + pn * (BR * 128), &tp.q, q_full, 64 * pn, m0, qh);
            for (int j = 0; j < n_tiles; ++j) {
                const int ks = j % KS;
                if (j >= KS) mbar_wait(k_empty + 8 * ks, ((j / KS) + 1) & 1);
                mbar_expect_tx(k_full + 8 * ks, KV_BYTES);
#pragma unroll
                for (int pn = 0; pn < D / 64; ++pn)
                    tma_load_3d(s_k + ks * KV_BYTES + pn * (BC * 128), &tp.k, k_full + 8 * ks, 64 * pn, j * BC, kh);
                const int vs = j % VS;
                if (j >= VS) mbar_wait(v_empty + 8 * vs, ((j / VS) + 1) & 1);
                mbar_expect_tx(v_full + 8 * vs, KV_BYTES);
#pragma unroll
                for (int pn = 0; pn < D / 64; ++pn)
                    tma_load_3d(s_v + vs * KV_BYTES + pn * (BC * 128), &tp.v, v_full + 8 * vs, 64 * pn, j * BC, kh);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ATTN_TMA_CREGS) : "memory");

    // ---- consumers: warpgroup cw = wg - 1 owns query rows m0 + 64 cw .. + 63 ----
    const int cw = wg - 1;
    const int warp = (tid >> 5) & 3;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int row0 = m0 + 64 * cw;
    int wg_tiles = 0;
    if (row0 < Lq) wg_tiles = (p.causal ? min(kv_end - 1, row0 + 63) : kv_end - 1) / BC + 1;

    const unsigned long long q_desc = wg_desc(s_q + cw * 64 * 128, 16, 1024);
    const unsigned long long k_desc = wg_desc(s_k, 16, 1024);
    const unsigned long long v_desc = wg_desc(s_v, BC * 128, 1024);

    float o[OR];
    float s[SR];
    unsigned pf[PR];
#pragma unroll
    for (int i = 0; i < OR; ++i) o[i] = 0.f;
#pragma unroll
    for (int i = 0; i < SR; ++i) s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < PR; ++i) pf[i] = 0u;
    float m_r[2] = {attn_neg_inf(), attn_neg_inf()};
    float l_r[2] = {0.f, 0.f};
    float alpha[2], rsum[2];

    const WgRows<T> w = wg_rows<T>(p, b, h, Lq, Lk, row0, warp * 16 + g, t);

    mbar_wait(q_full, 0);
    // Iteration j: S_j = Q K_j^T and O += P_{j-1} V_{j-1} (the PIPE steps of the forward above).
    // Every consumer thread waits for K_j and V_{j-1} and arrives on their empty barriers once per
    // iteration, computing or not (an arrival before the wait could complete a later phase).
    for (int j = 0; j < n_tiles; ++j) {
        const int ks = j % KS;
        const int vs = (j + VS - 1) % VS;  // V_{j-1}
        mbar_wait(k_full + 8 * ks, (j / KS) & 1);
        if (j > 0) mbar_wait(v_full + 8 * vs, ((j - 1) / VS) & 1);
        const int n0 = j * BC;
        const unsigned long long kd = wg_desc_add(k_desc, ks * KV_BYTES);
        const unsigned long long vd = wg_desc_add(v_desc, vs * KV_BYTES);
        if (j == 0) {
            if (wg_tiles > 0) {
                tma_turn_wait(cw, j);
                reg_fence(s);
                wg_fence();
                wg_issue_s<Tr, Cfg>(s, q_desc, kd);
                wg_commit();
                tma_turn_pass(cw, j, n_tiles);
                wg_wait<0>();
                reg_fence(s);
                mbar_arrive(k_empty + 8 * ks);
                wg_softmax<Tr, BC>(s, m_r, alpha, rsum, w, n0);
                wg_rescale_pack<Tr, D, BC>(o, pf, l_r, s, alpha, rsum);
            } else {
                tma_turn_wait(cw, j);
                tma_turn_pass(cw, j, n_tiles);
                mbar_arrive(k_empty + 8 * ks);
            }
        } else if (j < wg_tiles) {
            tma_turn_wait(cw, j);
            reg_fence(s);
            reg_fence(o);
            reg_fence(pf);
            wg_fence();
            wg_issue_s<Tr, Cfg>(s, q_desc, kd);
            wg_commit();
            wg_issue_pv<Tr, Cfg>(o, pf, vd);
            wg_commit();
            tma_turn_pass(cw, j, n_tiles);
            wg_wait<1>();  // S_j done
            reg_fence(s);
            mbar_arrive(k_empty + 8 * ks);
            wg_softmax<Tr, BC>(s, m_r, alpha, rsum, w, n0);
            wg_wait<0>();  // P_{j-1} V_{j-1} done
            reg_fence(o);
            reg_fence(pf);
            mbar_arrive(v_empty + 8 * vs);
            wg_rescale_pack<Tr, D, BC>(o, pf, l_r, s, alpha, rsum);
        } else if (j == wg_tiles) {
            mbar_arrive(k_empty + 8 * ks);
            tma_turn_wait(cw, j);
            reg_fence(o);
            reg_fence(pf);
            wg_fence();
            wg_issue_pv<Tr, Cfg>(o, pf, vd);
            wg_commit();
            tma_turn_pass(cw, j, n_tiles);
            wg_wait<0>();
            reg_fence(o);
            mbar_arrive(v_empty + 8 * vs);
        } else {
            tma_turn_wait(cw, j);
            tma_turn_pass(cw, j, n_tiles);
            mbar_arrive(k_empty + 8 * ks);
            if (j > 0) mbar_arrive(v_empty + 8 * vs);
        }
    }
    if (wg_tiles == n_tiles) {  // the last P V (V_{n-1} is never refilled: no arrival)
        const int vs = (n_tiles - 1) % VS;
        mbar_wait(v_full + 8 * vs, ((n_tiles - 1) / VS) & 1);
        reg_fence(o);
        reg_fence(pf);
        wg_fence();
        wg_issue_pv<Tr, Cfg>(o, pf, wg_desc_add(v_desc, vs * KV_BYTES));
        wg_commit();
        wg_wait<0>();
        reg_fence(o);
    }
    if (row0 >= Lq) return;

    wg_store_o<Tr, D>(p, b, h, w, o, l_r, m_r);
}

// -------------------------------------------------------------------------------------
// Kernels
// -------------------------------------------------------------------------------------
// Tunables per head dim (compile-time; the defaults are the launch numbers documented at the
// top): BC keys per K/V tile (64 | 128), NWG warpgroups (BR = 64 NWG query rows per block),
// PIPE (S_j overlapped with P_{j-1} V_{j-1}; 3 V stages instead of 2), ORDER (warpgroups issue
// their GEMMs in turn), MINB (blocks per SM asked of the compiler: register cap 65536 /
// (MINB * 128 NWG)). Measured on the H200 (kernels/checks/attention_wgmma_check.py, 2026-11-29):
// D=128: 2 WG x 128 keys, PIPE, ORDER: 0.71-0.77x SDPA at L >= 4096 (ORDER +3-7%; PIPE on or
// off within noise); D=64: 2 WG x 64 keys, no PIPE, 2 blocks per SM: 0.80-0.88x (one block
// of 3 WG: 0.60-0.69x; moving a quarter of exp2 to the FMA pipe: -10%).
#ifndef ATTN_WG_D128_BC
#define ATTN_WG_D128_BC 128
#endif
#ifndef ATTN_WG_D128_NWG
#define ATTN_WG_D128_NWG 2
#endif
#ifndef ATTN_WG_D128_PIPE
#define ATTN_WG_D128_PIPE 1
#endif
#ifndef ATTN_WG_D128_ORDER
#define ATTN_WG_D128_ORDER 1
#endif
#ifndef ATTN_WG_D128_MINB
#define ATTN_WG_D128_MINB 1
#endif
#ifndef ATTN_WG_D64_BC
#define ATTN_WG_D64_BC 64
#endif
#ifndef ATTN_WG_D64_NWG
#define ATTN_WG_D64_NWG 2
#endif
#ifndef ATTN_WG_D64_PIPE
#define ATTN_WG_D64_PIPE 0
#endif
#ifndef ATTN_WG_D64_ORDER
#define ATTN_WG_D64_ORDER 0
#endif
#ifndef ATTN_WG_D64_MINB
#define ATTN_WG_D64_MINB 2
#endif

typedef WgFwdCfg<128, ATTN_WG_D128_BC, ATTN_WG_D128_NWG, ATTN_WG_D128_PIPE != 0, ATTN_WG_D128_ORDER != 0,
                 ATTN_WG_D128_MINB>
    AttnWgCfgD128;
typedef WgFwdCfg<64, ATTN_WG_D64_BC, ATTN_WG_D64_NWG, ATTN_WG_D64_PIPE != 0, ATTN_WG_D64_ORDER != 0,
                 ATTN_WG_D64_MINB>
    AttnWgCfgD64;

#if ATTN_WG_D128_PIPE && ATTN_WG_D128_BC == 128 && ATTN_WG_D128_NWG == 2
static_assert(AttnWgCfgD128::SMEM_BYTES == 197632 && AttnWgCfgD128::NTHREADS == 256 &&
                  AttnWgCfgD128::BR == 128,
              "documented (wgmma fwd d128)");
#endif
#if !ATTN_WG_D64_PIPE && ATTN_WG_D64_BC == 64 && ATTN_WG_D64_NWG == 2
static_assert(AttnWgCfgD64::SMEM_BYTES == 50176 && AttnWgCfgD64::NTHREADS == 256 &&
                  AttnWgCfgD64::BR == 128,
              "documented (wgmma fwd d64)");
#endif

extern __shared__ __align__(1024) unsigned char attn_wg_smem[];

#define ATTN_WG_FWD_KERNEL(NAME, TR, CFG)                                          \
    extern "C" __global__ void __launch_bounds__(CFG::NTHREADS, CFG::MINB)         \
        NAME(const FlashParams p) {                                                \
        flash_fwd_wgmma_body<TR, CFG>(p, attn_wg_smem);                            \
    }

ATTN_WG_FWD_KERNEL(flash_fwd_wgmma_d64_f16, AttnF16, AttnWgCfgD64)
ATTN_WG_FWD_KERNEL(flash_fwd_wgmma_d64_bf16, AttnBF16, AttnWgCfgD64)
ATTN_WG_FWD_KERNEL(flash_fwd_wgmma_d128_f16, AttnF16, AttnWgCfgD128)
ATTN_WG_FWD_KERNEL(flash_fwd_wgmma_d128_bf16, AttnBF16, AttnWgCfgD128)

// The TMA forward (above): D = 64 and 128, 2 consumer warpgroups x 64 rows, 128 keys per tile,
// PIPE, ping-pong turns; one block of 384 threads per SM.
typedef WgFwdCfg<128, 128, 2, true, true, 1> AttnTmaCfgD128;
typedef WgFwdCfg<64, 128, 2, true, true, 1> AttnTmaCfgD64;
template <typename Cfg>
struct AttnTmaLaunch {
    static constexpr int SMEM_BYTES =
        1024 + Cfg::Q_BYTES + (ATTN_TMA_KS + ATTN_TMA_VS) * Cfg::KV_BYTES + 8 * (1 + 2 * ATTN_TMA_KS + 2 * ATTN_TMA_VS);
    static constexpr int NTHREADS = 384;  // producer warpgroup + 2 consumer warpgroups
    static constexpr int BR = Cfg::BR;
    static_assert(SMEM_BYTES <= 232448, "TMA forward: shared memory per block");
};
typedef AttnTmaLaunch<AttnTmaCfgD128> AttnTmaLaunchD128;
typedef AttnTmaLaunch<AttnTmaCfgD64> AttnTmaLaunchD64;
#if ATTN_TMA_KS == 2 && ATTN_TMA_VS == 2
static_assert(AttnTmaLaunchD128::SMEM_BYTES == 164936 && AttnTmaLaunchD128::NTHREADS == 384 &&
                  AttnTmaLaunchD128::BR == 128,
              "documented (tma fwd d128)");
static_assert(AttnTmaLaunchD64::SMEM_BYTES == 83016 && AttnTmaLaunchD64::NTHREADS == 384 &&
                  AttnTmaLaunchD64::BR == 128,
              "documented (tma fwd d64)");
#endif
#define ATTN_TMA_FWD_KERNEL(NAME, TR, CFG)                                                              \
    extern "C" __global__ void __launch_bounds__(AttnTmaLaunch<CFG>::NTHREADS, 1) NAME(                 \
        const __grid_constant__ FlashTmaParams tp) {                                                    \
        flash_fwd_tma_body<TR, CFG, ATTN_TMA_KS, ATTN_TMA_VS>(tp, attn_wg_smem);                        \
    }
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_d128_f16, AttnF16, AttnTmaCfgD128)
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_d128_bf16, AttnBF16, AttnTmaCfgD128)
#if ATTN_TMA_D64
// D = 64 (off by default): on the H200 (attention_wgmma_check.py, 2026-12-04) against
// flash_fwd_wgmma_d64_* 311 / 402 / 423 TFLOP/s at L = 1024 / 4096 / 16384 against 335 / 393 /
// 401 (causal 230 / 356 / 421 against 281 / 357 / 387): slower on short sequences, not adopted.
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_d64_f16, AttnF16, AttnTmaCfgD64)
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_d64_bf16, AttnBF16, AttnTmaCfgD64)
#endif
