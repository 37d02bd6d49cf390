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
//   The forward rtx runs for D = 128 on the H200 is attention_tma.cu's (FlashAttention-3's
//   warp-specialized block, bulk tensor copies); this one is its fallback. The tile steps both
//   use are in attention_wgmma_fwd.cuh.
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

#include "attention_wgmma_fwd.cuh"
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
