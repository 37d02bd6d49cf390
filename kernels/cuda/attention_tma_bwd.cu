// attention_tma_bwd.cu — FlashAttention backward main kernel (dQ, dK, dV) for Hopper (sm_90a) with
// a producer warpgroup: flash_bwd_tma_d{64,128}_{T}, T = f16 | bf16. The GEMMs and the
// element-wise steps are those of flash_bwd_wgmma_d128_{T} (attention_wgmma_bwd.cu, whose design
// comment this file assumes); what differs is how the tiles arrive and how the block keeps in step
// (and, for D = 64, which that kernel does not cover, who computes dQ: see the last point):
//
//  * Warpgroup 0 is the producer (setmaxnreg down to 24 registers): its warp 0 loads K and V once
//    and then every step's Q and dO as bulk tensor copies (cp.async.bulk.tensor, tensor maps with
//    the 128-byte swizzle, so the panels are exactly the wgmma kernel's), and lse and dsum with
//    plain loads into shared memory, into a ring of 2 stages (a step ahead of the consumers;
//    -DATTN_TBW_STAGES=3: 3 stages, with one dS^T tile, see TmaBwdCfg). Warpgroups 1 and 2 are the consumers
//    (setmaxnreg up to 240): they issue no load and no cp.async wait.
//  * Stages are handed over by mbarriers instead of __syncthreads: full[s] completes with the
//    producer warp's 32 arrivals (each after that lane's lse / dsum stores; lane 0 announced the
//    copies' bytes, expect_tx without arriving, before issuing them) and the copies'
//    transaction bytes; empty[s] with the 256 consumer threads' arrivals, each at the end of the
//    step, after its warpgroup's dK GEMM (the last reader of the stage) has completed.
//  * The two consumer warpgroups meet once per step (named barrier 1, 256 threads): dS^T of both
//    is in shared memory before either computes dQ. dS^T is double-buffered so that this is the
//    only meeting point: the buffer written in step it was last read by the dQ GEMMs of step
//    it - 2, which completed before either warpgroup reached step it - 1's barrier. (With
//    -DATTN_TBW_STAGES=3 there is one buffer and two more waits per step: see TmaBwdCfg.)
//  * Within a step the dQ GEMM is issued before dK's and waited for alone, so dK += dS^T Q keeps
//    the tensor cores busy while dQ goes to its staging tile and on to dq_accum. (Carrying dK on
//    into the next step's S^T and dP^T needs more than the consumers' 240 registers at D = 128:
//    ptxas then serializes the wgmmas, C7512; it fits with ATTN_TBW_UNDEF, below.)
//  * The exponentials run without per-element mask tests on the steps that need none (full tiles,
//    no mask, not on the causal diagonal).
//  * D = 64: K, V, Q and dO are one 64-column panel each; dV and dK are m64n64 GEMMs. A step
//    takes 128 query rows (FlashAttention-3's D = 64 block, 128 keys x 128 queries): each consumer
//    warpgroup computes S^T and dP^T of its 64 keys over the 128 queries (m64n128 GEMMs) and the
//    dQ of its 64 of the queries (one m64n64 GEMM over the 128 keys, from its own staging tile),
//    so the per-step handovers and waits are spread over twice the tensor-core work of a 64-row
//    step (9-11 % faster on the H200, benches/RESULTS.md, "Attention"). (-DATTN_TBW_D64_BR=64, the
//    earlier default: 64-row steps, where warpgroup (it & 1) computes the step's whole dQ and the
//    other none, since splitting it by columns would take m64n32 GEMMs, which read shared memory
//    faster than it delivers.)
//  * Compile-time candidates (kernels/checks/attention_wgmma_check.py builds and times them):
//    ATTN_TBW_STAGES=3, ATTN_TBW_D64_BR=64 (above), ATTN_TBW_UNDEF=1 (reg_undef of the per-step
//    accumulators), ATTN_TBW_CARRY_DK=1 or 2 (dK's GEMM carried into the next step, D = 64 or both
//    head dims; with ATTN_TBW_D64_BR=64); see each macro below.
//
// rtx-kernels: arch-specific
// (the line above makes rtx-kernels compile this program for sm_90a: wgmma, setmaxnreg and the
//  bulk copies exist only on the architecture-specific target; the CUBIN loads only on compute
//  capability 9.0 devices)
//
// ======================================================================================
// Launch (kernels flash_bwd_tma_d{64,128}_{T})
// ======================================================================================
//   grid (ceil(Lk / 128), Hkv, B), block (384, 1, 1), dynamic smem 198696 bytes for D = 128:
//   1024 alignment slack + K and V (2 x 128*D*2) + two dS^T tiles (2 x 128*BR*2) + 2 stages of Q
//   and dO (2 x 2 x BR*D*2) + the dQ staging (8 consumer warps x two 16 x 32 f32 panels, 32768)
//   + 2 stages of lse and dsum (2 x 2 x BR*4) + 5 mbarriers, with BR = 64 query rows per step;
//   D = 64: 199720, the same with BR = 128 and 64 columns. Needs
//   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES.
//   (-DATTN_TBW_D64_BR=64: D = 64 takes 133160 bytes. -DATTN_TBW_STAGES=3: one dS^T tile,
//   3 stages, 7 mbarriers: 215608 bytes for D = 128, 200760 for D = 64 (133688 with 64 rows).
//   -DATTN_TBW_DQ_TMA=0: a padded staging tile (64*(D+8)*4, one per warpgroup at D = 64) instead:
//   200744 and 203816 bytes; 137256, 217656, 204856 and 137784 for the variants above.)
//   Argument: one `const FlashTmaBwdParams` by value (below): the FlashParams of
//   flash_bwd_wgmma_d128_{T} (the same pointers, workspaces and semantics) and five tensor maps,
//   each 3-D (D, L, B * heads), CU_TENSOR_MAP_SWIZZLE_128B, no interleave, zero fill out of
//   bounds (rows past L read 0):
//     q, dout: (D, Lq, B * H), 16-bit elements, box (64, BR, 1): (64, 64, 1) for D = 128,
//       (64, 128, 1) for D = 64;
//     k, v: (D, Lk, B * Hkv), 16-bit elements, box (64, 128, 1);
//     dq: dq_accum, (D, Lq, B * H), f32 elements, box (32, 16, 1) (a consumer warp's panel; the
//       kernel adds to it by bulk tensor reductions, which do not write rows past Lq; unused with
//       -DATTN_TBW_DQ_TMA=0).
//   (-DATTN_TBW_D64_BR=64: D = 64 takes q and dout boxes of (64, 64, 1).)
//   Order on one stream as the wgmma kernel's: flash_bwd_preprocess_d{D}_{T} (attention.cu), this
//   kernel, flash_bwd_convert_dq_d{D}_{T} (attention.cu).

#include "attention_common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_tma_bwd.cu needs the sm_90a target (wgmma, setmaxnreg, cp.async.bulk): compile with arch_specific"
#endif

#include "wgmma.cuh"
#include "attention_tma.cuh"
#include "attention_wgmma_bwd.cuh"

struct __align__(64) FlashTmaBwdParams {
    FlashParams p;
    TmaMap q, k, v, dout;
    TmaMap dq;  // dq_accum (f32): see "dQ" in the launch comment
};
// (152 bytes of FlashParams, then q, k, v, dout, dq at 192, 320, 448, 576, 704.)
static_assert(sizeof(FlashTmaBwdParams) == 832 && alignof(FlashTmaBwdParams) == 64, "FlashTmaBwdParams ABI");

// setmaxnreg: the producer warpgroup's registers and the consumers'; they must fit the block's
// allocation at launch, 384 threads x 168 registers (see attention_tma.cu).
#ifndef ATTN_TBW_PREGS
#define ATTN_TBW_PREGS 24
#endif
#ifndef ATTN_TBW_CREGS
#define ATTN_TBW_CREGS 240
#endif
static_assert(128 * ATTN_TBW_PREGS + 256 * ATTN_TBW_CREGS <= 384 * 168, "setmaxnreg budget");

// Stages of the Q / dO / lse / dsum ring: 2 (the default, with two dS^T buffers) or 3 (with one
// dS^T buffer: 3 stages and two buffers do not fit; a warpgroup then also waits, before writing
// dS^T, for the other's dQ GEMM of the previous step, named barriers 2 and 3).
#ifndef ATTN_TBW_CARRY_DK
#define ATTN_TBW_CARRY_DK 0  // 1: D = 64 carries dK's GEMM into the next step, 2: D = 128 too (candidates)
#endif
#ifndef ATTN_TBW_UNDEF
#define ATTN_TBW_UNDEF 0  // 1: reg_undef on every configuration (see UNDEF in the kernel)
#endif
// ATTN_TBW_WAIT_SLEEP (0 = off): as attention_tma.cu's ATTN_TMA_WAIT_SLEEP, 1 the producer's
// waits for free stages through mbar_wait_sleep, 2 every mbarrier wait of the kernel. On an H100
// (2026-12-06) either was within 2.5 % of the default (docs/performance-notes.md).
#ifndef ATTN_TBW_WAIT_SLEEP
#define ATTN_TBW_WAIT_SLEEP 0
#endif
#ifndef ATTN_TBW_STAGES
#define ATTN_TBW_STAGES 2
#endif
// How dQ reaches dq_accum: 1 (the default) each consumer warp stages its 16 rows x 64 columns as
// two 16 x 32 f32 panels with the 128-byte swizzle and one lane adds both with bulk tensor
// reductions through the dq tensor map; 0 (the earlier path, a candidate): a padded row-major
// staging tile and one bulk reduction per row, 16 lanes of each warp issuing one each (ptxas
// serializes them through a loop over the lanes: on the H100 that loop held a fifth of the
// kernel's stall samples, the whole dQ path a third).
#ifndef ATTN_TBW_DQ_TMA
#define ATTN_TBW_DQ_TMA 1
#endif
// 1 (the default; D = 128 only): the step's lse values are read from shared memory (and scaled)
// before the wait for S^T, and its dsum values before the wait for dP^T, so that those loads'
// latency is not waited for after the GEMMs (on the H100 the first uses of lse held about 5 % of
// the stall samples). 32 more live registers at those points (no spill). 0: after the waits.
// On the H200 (2026-12-05, check script, same call) the backward with 1 took 0.98-1.02x the time
// with 0 (the main kernel alone 0.90-1.02x): within what these timings move between calls.
#ifndef ATTN_TBW_EARLY
#define ATTN_TBW_EARLY 1
#endif
// Query rows per step for D = 64: 128 (the default: FlashAttention-3's D = 64 block, see the
// design comment) or 64 (the earlier default, kept as a candidate). D = 128 always takes 64.
#ifndef ATTN_TBW_D64_BR
#define ATTN_TBW_D64_BR 128
#endif
template <int D_>
struct TmaBwdCfg {
    static constexpr int D = D_;
    static constexpr int BC = 128;               // keys per block (2 consumer warpgroups x 64)
    static constexpr int BR = D_ == 64 ? ATTN_TBW_D64_BR : 64;  // query rows per step
    static constexpr int STAGES = ATTN_TBW_STAGES;  // Q / dO / lse / dsum stages
    static constexpr int DS_BUFS = STAGES == 2 ? 2 : 1;  // dS^T tiles
    static constexpr int NTHREADS = 384;         // producer warpgroup + 2 consumer warpgroups
    static constexpr int KV_BYTES = BC * D * 2;  // K or V tile
    static constexpr int DS_BYTES = BC * BR * 2; // one dS^T tile [BC keys][BR queries] (BR / 64 panels)
    static constexpr int Q_BYTES = BR * D * 2;   // Q or dO tile of a step
    static constexpr int RV_BYTES = 2 * BR * 4;  // lse and dsum of a step
    static constexpr int DQ_LD = D + 8;          // f32 row stride of a dQ staging tile
    // D = 128: one staging tile, each warpgroup its 64 columns; D = 64: one tile per warpgroup
    // (BR = 64: the warpgroups take the dQ GEMM of alternate steps, each all 64 columns; BR = 128:
    // each its 64 query rows every step).
    static constexpr int DQ_TILE_BYTES = 64 * DQ_LD * 4;
    // Every consumer warpgroup computes a dQ GEMM in every step (else they alternate).
    static constexpr bool DQ_EVERY = D == 128 || BR == 128;
    // ATTN_TBW_DQ_TMA: two 16 x 32 f32 panels (2048 bytes each) per consumer warp instead.
    static constexpr int DQ_BYTES = ATTN_TBW_DQ_TMA ? 8 * 2 * 2048 : (D == 64 ? 2 : 1) * DQ_TILE_BYTES;
    static constexpr int NBARS = 1 + 2 * STAGES; // kv_full, full[STAGES], empty[STAGES]
    static constexpr int SMEM_BYTES = 1024 + 2 * KV_BYTES + DS_BUFS * DS_BYTES + STAGES * 2 * Q_BYTES +
                                      STAGES * RV_BYTES + DQ_BYTES + 8 * NBARS;
    static_assert(STAGES == 2 || STAGES == 3, "stages");
    static_assert(BR == 64 || (BR == 128 && D == 64), "query rows per step");
    static_assert(D == 64 || D == 128, "head dim");
    static_assert(SMEM_BYTES <= 232448, "shared memory per block");
};
typedef TmaBwdCfg<128> TmaBwdCfgD128;
typedef TmaBwdCfg<64> TmaBwdCfgD64;
// (the defaults' asserts come first: ops/src/attention/cuda/launch.rs reads the first of each)
#if ATTN_TBW_STAGES == 2 && ATTN_TBW_D64_BR == 128 && ATTN_TBW_DQ_TMA
static_assert(TmaBwdCfgD128::SMEM_BYTES == 198696 && TmaBwdCfgD128::NTHREADS == 384 && TmaBwdCfgD128::BC == 128 &&
                  TmaBwdCfgD128::BR == 64,
              "documented (tma bwd d128)");
static_assert(TmaBwdCfgD64::SMEM_BYTES == 199720 && TmaBwdCfgD64::NTHREADS == 384 && TmaBwdCfgD64::BC == 128 &&
                  TmaBwdCfgD64::BR == 128,
              "documented (tma bwd d64)");
#elif ATTN_TBW_STAGES == 2 && ATTN_TBW_D64_BR == 128
static_assert(TmaBwdCfgD128::SMEM_BYTES == 200744 && TmaBwdCfgD64::SMEM_BYTES == 203816, "tma bwd, dQ rows one by one");
#elif ATTN_TBW_STAGES == 2
static_assert(TmaBwdCfgD64::SMEM_BYTES == (ATTN_TBW_DQ_TMA ? 133160 : 137256) && TmaBwdCfgD64::BR == 64,
              "tma bwd d64 with 64-row steps");
#elif ATTN_TBW_D64_BR == 64
static_assert(TmaBwdCfgD128::SMEM_BYTES == (ATTN_TBW_DQ_TMA ? 215608 : 217656) &&
                  TmaBwdCfgD64::SMEM_BYTES == (ATTN_TBW_DQ_TMA ? 133688 : 137784),
              "tma bwd with 3 stages");
#else
static_assert(TmaBwdCfgD128::SMEM_BYTES == (ATTN_TBW_DQ_TMA ? 215608 : 217656) &&
                  TmaBwdCfgD64::SMEM_BYTES == (ATTN_TBW_DQ_TMA ? 200760 : 204856),
              "tma bwd with 3 stages, d64 with 128-row steps");
#endif

// ATTN_TBW_DQ_TMA: the dQ of a consumer warp's 16 rows x the GEMM's 64 columns (dq[4 nt + 2 r + c]:
// row g + 8 r, column 8 nt + 2 t + c, the m64n64 accumulator layout) into its two 16 x 32 f32 panels
// at s_w (gw: the same as a generic pointer; 128-byte rows, 1024-byte aligned, the 128-byte swizzle:
// 16-byte chunk c of row r at chunk c ^ (r & 7), as the dq tensor map reads it), then lane 0 adds
// both to dq_accum (columns col0 .. + 63 of rows row0 .. + 15 of head bh) with bulk tensor
// reductions; rows at or past Lq are not written (nor, when row0 >= Lq, issued). Lane 0 must have
// waited for its previous reductions' reads (bulk_wait_read) before the warp comes here again.
// (Stores: each 8-byte store of the warp covers 32 bytes of each of 8 rows, two rows per 32-byte
// bank group, so two wavefronts, the least for 256 bytes.)
__device__ __forceinline__ void tbw_reduce_dq(const float (&dq)[32], unsigned char* gw, unsigned s_w, const TmaMap* map,
                                              int col0, int row0, int bh, int Lq, int lane, int g, int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const unsigned chunk = (unsigned)(2 * (nt & 3) + (t >> 1)) ^ (unsigned)g;
            const unsigned off = (unsigned)(nt >> 2) * 2048u + (unsigned)(g + 8 * r) * 128u + chunk * 16u + (t & 1) * 8u;
            *reinterpret_cast<float2*>(gw + off) = make_float2(dq[4 * nt + 2 * r], dq[4 * nt + 2 * r + 1]);
        }
    }
    fence_proxy_async_smem();
    __syncwarp();
    if (lane == 0) {
        if (row0 < Lq) {
            tma_red_add_3d(map, s_w, col0, row0, bh);
            tma_red_add_3d(map, s_w + 2048, col0 + 32, row0, bh);
        }
        bulk_commit();
    }
}

template <typename Tr, typename Cfg>
__device__ __forceinline__ void flash_bwd_tma_body(const FlashTmaBwdParams& tp, unsigned char* smem) {
    typedef typename Tr::T T;
    const FlashParams& p = tp.p;
    constexpr int D = Cfg::D;
    constexpr int BC = Cfg::BC;
    constexpr int BR = Cfg::BR;
    constexpr int ST = Cfg::STAGES;
    constexpr int SR = BR / 2;  // S^T / dP^T accumulators per thread (64 keys x BR queries)
    constexpr int KR = D / 2;   // dK / dV accumulators per thread (64 keys x D)
    constexpr int QR = 32;      // dQ accumulators per thread (64 queries x 64 columns)
    // D = 64, BR = 64: warpgroup (it & 1) computes the whole dQ of step it (one m64n64 GEMM over
    // the 128 keys) and the other none, so that neither needs an N = 32 GEMM; D = 128: each its
    // half of the columns; D = 64, BR = 128: each its 64 query rows (cw).
    constexpr int PR = BR / 4;  // packed P^T / dS^T registers
    // D = 64 with ATTN_TBW_CARRY_DK: dK's GEMM runs on into the next step, completed there with
    // S^T (D = 128 too with ATTN_TBW_CARRY_DK=2, which needs ATTN_TBW_UNDEF: without it ptxas
    // serializes the wgmmas, C7512).
    constexpr bool CARRY = ATTN_TBW_CARRY_DK && (Cfg::D == 64 || ATTN_TBW_CARRY_DK == 2);
    static_assert(!(CARRY && BR == 128), "ATTN_TBW_CARRY_DK with 128-row steps: not built");
    // Tell the compiler that S^T, dP^T and dQ die at their last use in a step (reg_undef): needed
    // for 128-row steps, whose registers do not hold them across the loop (ptxas would spill and
    // serialize the wgmmas); an untimed candidate elsewhere (ATTN_TBW_UNDEF=1).
    constexpr bool UNDEF = BR == 128 || ATTN_TBW_UNDEF;
    constexpr bool DQ_EVERY = Cfg::DQ_EVERY;
    constexpr bool EARLY = ATTN_TBW_EARLY && D == 128;  // (see the macro)

    const int tid = threadIdx.x;
    // warp-uniform warpgroup index (broadcast, so ptxas sees it uniform): 0 producer, 1 and 2 consumers
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);

    const int n_block = blockIdx.x;
    const int hk = blockIdx.y;
    const int b = blockIdx.z;
    const int H = p.H;
    const int G = H / p.Hkv;
    const int Lq = p.Lq;
    const int Lk = p.Lk;
    const int n0 = n_block * BC;

    // Query steps per head of the group: causal skips those whose rows all precede n0.
    const int m_begin = p.causal ? n0 / BR : 0;
    const int n_m = (Lq + BR - 1) / BR;
    const int per_head = n_m > m_begin ? n_m - m_begin : 0;
    const int total = G * per_head;

    // smem: [K][V][dS^T x DS_BUFS][Q, dO stage 0, 1 (, 2)][dQ staging][lse, dsum stage 0, 1 (, 2)][barriers]
    // (every part up to the dQ staging a multiple of 1024 bytes: its swizzled panels need that alignment)
    const unsigned base = (smem_u32(smem) + 1023u) & ~1023u;
    const unsigned s_k = base;
    const unsigned s_v = s_k + Cfg::KV_BYTES;
    const unsigned s_ds = s_v + Cfg::KV_BYTES;
    const unsigned s_st = s_ds + Cfg::DS_BUFS * Cfg::DS_BYTES;
    const unsigned s_dq = s_st + ST * 2 * Cfg::Q_BYTES;
    const unsigned s_rv = s_dq + Cfg::DQ_BYTES;
    const unsigned bar = s_rv + ST * Cfg::RV_BYTES;
    const unsigned kv_full = bar;
    const unsigned full = bar + 8;
    const unsigned empty = full + 8 * ST;
    unsigned char* const gbase = smem + (base - smem_u32(smem));

    if (tid == 0) {
        mbar_init(kv_full, 1);
        for (int i = 0; i < ST; ++i) {
            mbar_init(full + 8 * i, 32);
            mbar_init(empty + 8 * i, 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        // ---- producer: warp 0 ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ATTN_TBW_PREGS) : "memory");
        if (tid >= 32) return;
        const int lane = tid;
        if (lane == 0) {
            const int kh = b * p.Hkv + hk;
            mbar_expect_tx(kv_full, 2 * Cfg::KV_BYTES);
#pragma unroll
            for (int pn = 0; pn < D / 64; ++pn) {
                tma_load_3d(s_k + pn * (BC * 128), &tp.k, kv_full, 64 * pn, n0, kh);
                tma_load_3d(s_v + pn * (BC * 128), &tp.v, kv_full, 64 * pn, n0, kh);
            }
        }
        const float* lse = static_cast<const float*>(p.lse);
        const float* dsum = static_cast<const float*>(p.dsum);
        for (int it = 0; it < total; ++it) {
            const int slot = it % ST;
            if (it >= ST) mbar_wait_as<ATTN_TBW_WAIT_SLEEP, true>(empty + 8 * slot, ((it / ST) + 1) & 1);
            const int hh = hk * G + it / per_head;
            const int mm0 = (m_begin + it % per_head) * BR;
            const long long row_base = (long long)(b * H + hh) * Lq + mm0;
            const unsigned fb = full + 8 * slot;
            // Lane 0 announces the copies' bytes (before issuing them, so that none can land
            // first) without arriving; then every lane stores its lse and dsum values and
            // arrives, each arrival releasing that lane's stores.
            if (lane == 0) {
                const unsigned st = s_st + slot * 2 * Cfg::Q_BYTES;
                const int qh = b * H + hh;
                mbar_expect_tx_only(fb, 2 * Cfg::Q_BYTES);
#pragma unroll
                for (int pn = 0; pn < D / 64; ++pn) {
                    tma_load_3d(st + pn * (BR * 128), &tp.q, fb, 64 * pn, mm0, qh);
                    tma_load_3d(st + Cfg::Q_BYTES + pn * (BR * 128), &tp.dout, fb, 64 * pn, mm0, qh);
                }
            }
            float* rv = reinterpret_cast<float*>(gbase + (s_rv - base) + slot * Cfg::RV_BYTES);
#pragma unroll
            for (int r = lane; r < BR; r += 32) {
                const bool ok = mm0 + r < Lq;
                rv[r] = ok ? lse[row_base + r] : 0.f;  // rows past Lq: masked by the consumers
                rv[BR + r] = ok ? dsum[row_base + r] : 0.f;
            }
            mbar_arrive(fb);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ATTN_TBW_CREGS) : "memory");

    // ---- consumers: warpgroup cw = wg - 1 owns keys n0 + 64 cw .. + 63 ----
    const int cw = wg - 1;
    const int warp = (tid >> 5) & 3;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int kw0 = n0 + 64 * cw;          // first key of this warpgroup
    const int krow = kw0 + warp * 16 + g;  // this thread's keys: krow and krow + 8

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

    // Descriptors (stage 0, dS^T buffer 0; a stage is + 2 * Q_BYTES, a buffer + DS_BYTES).
    const unsigned long long k_a = wg_desc(s_k + cw * 64 * 128, 16, 1024);   // K rows of cw
    const unsigned long long v_a = wg_desc(s_v + cw * 64 * 128, 16, 1024);   // V rows of cw
    const unsigned long long st_kmaj = wg_desc(s_st, 16, 1024);               // Q / dO as B, K-major
    const unsigned long long st_mn = wg_desc(s_st, BR * 128, 1024);           // Q / dO as B, MN-major
    const unsigned long long ds_a = wg_desc(s_ds, BC * 128, 1024);            // dS (A, MN-major)
    // K columns 64cw .. (D = 128) or all 64 (D = 64) as B, MN-major
    const unsigned long long k_b = wg_desc(s_k + (D == 128 ? cw : 0) * (BC * 128), BC * 128, 1024);
    const int dq_col0 = D == 128 ? 64 * cw : 0;  // first dq column of this warpgroup's GEMM
    const int dq_row0 = BR == 128 ? 64 * cw : 0;  // its first query row in the step
    // A operand of its dQ GEMM: the dS^T panel of its query rows (BR = 128), else the tile
    const unsigned ds_panel = BR == 128 ? cw * (BC * 128) : 0;
    // its staging: ATTN_TBW_DQ_TMA, the warp's two panels; else its warpgroup's tile (D = 128: one shared tile)
    const unsigned s_dqw = ATTN_TBW_DQ_TMA ? s_dq + (cw * 4 + warp) * 4096 : s_dq + (D == 64 ? cw * Cfg::DQ_TILE_BYTES : 0);

    const float sl2 = p.scale * ATTN_LOG2E;
    const T* mask = static_cast<const T*>(p.mask);
    const bool has_mask = mask != nullptr;
    float* dq_accum = static_cast<float*>(p.dq_accum);
    const float* const rv_ptr = reinterpret_cast<const float*>(gbase + (s_rv - base));
    float* const sdq = reinterpret_cast<float*>(gbase + (s_dqw - base));

    mbar_wait_as<ATTN_TBW_WAIT_SLEEP, false>(kv_full, 0);  // also when total == 0: no copy may be in flight when the block exits
    for (int it = 0; it < total; ++it) {
        const int slot = it % ST;
        const int buf = Cfg::DS_BUFS == 2 ? (it & 1) : 0;
        mbar_wait_as<ATTN_TBW_WAIT_SLEEP, false>(full + 8 * slot, (it / ST) & 1);
        const int hh = hk * G + it / per_head;
        const int mm0 = (m_begin + it % per_head) * BR;
        const unsigned st_off = slot * 2 * Cfg::Q_BYTES;
        const float* s_lse = rv_ptr + slot * (Cfg::RV_BYTES / 4);
        const float* s_dsum = s_lse + BR;
        if (UNDEF) {  // S^T, dP^T and dQ are overwritten (scale-d 0): the last step's values are dead
            reg_undef(s);
            reg_undef(dp);
            if (DQ_EVERY) reg_undef(dq);  // (alternate steps' dQ: ptxas would serialize, C7515)
        }

        // ---- S^T = K_w Q^T and dP^T = V_w dO^T (two groups) ----
        reg_fence(s);
        reg_fence(dp);
        wg_fence();
        wgb_issue_sdp<Tr, D, BC, BR>(s, dp, k_a, v_a, st_kmaj, st_off, Cfg::Q_BYTES);
        float2 lpre[EARLY ? BR / 8 : 1], dpre[EARLY ? BR / 8 : 1];
        if (EARLY) {
#pragma unroll
            for (int nt = 0; nt < BR / 8; ++nt) lpre[nt] = wgb_lse_pair(s_lse, nt, t);
        }
        wg_wait<1>();  // S^T done (dP^T may run on); CARRY: also dK of step it-1
        reg_fence(s);
        if (CARRY) {
            reg_fence(dk);
            reg_fence(df);
            if (it > 0) mbar_arrive(empty + 8 * ((it - 1) % ST));  // step it-1's stage is free
        }

        // ---- P^T (rows = keys krow + 8r, columns = queries mm0 + 8nt + 2t + c) ----
        const bool need_mask = (mm0 + BR > Lq) || (kw0 + 64 > Lk) || (p.causal && kw0 + 63 > mm0) || has_mask;
        const WgbMask<T> wm = {krow, mm0, t, Lq, Lk, p.causal, mask, has_mask,
                               (long long)b * p.mask_stride_b + (long long)hh * p.mask_stride_h, p.mask_stride_q};
        wgb_probs<Tr, BR, true>(s, s_lse, sl2, need_mask, wm, EARLY ? lpre : nullptr);
        wgb_pack<Tr, PR>(pf, s);

        // ---- dV += P^T dO (runs while dS^T is computed) ----
        reg_fence(dv);
        reg_fence(pf);
        wg_fence();
        wgb_issue_rs<Tr, D, BR>(dv, pf, wg_desc_add(st_mn, st_off + Cfg::Q_BYTES));
        wg_commit();
        if (EARLY) {
#pragma unroll
            for (int nt = 0; nt < BR / 8; ++nt) dpre[nt] = *reinterpret_cast<const float2*>(s_dsum + nt * 8 + 2 * t);
        }
        wg_wait<1>();  // dP^T done (dV may run on)
        reg_fence(dp);

        // One dS^T buffer: the other warpgroup's dQ GEMM of step it-1 (reading all 128 rows) is done.
        if (Cfg::DS_BUFS == 1 && it > 0) {
            if (cw == 0) {  // (constant barrier ids: ptxas reserves every id a register may name)
                named_bar_sync(3, 256);
            } else {
                named_bar_sync(2, 256);
            }
        }
        // ---- dS^T = P^T o (dP^T - dsum) -> smem buffer `buf` [key][query] ----
        wgb_ds<Tr, BR, BC>(dp, s, df, s_dsum, gbase + (s_ds - base) + buf * Cfg::DS_BYTES, krow - n0, g, t,
                           EARLY ? dpre : nullptr);
        fence_proxy_async_smem();
        named_bar_sync(1, 256);  // dS^T of both warpgroups written

        // ---- dQ[step rows, dq_col0 .. + 63] = dS K (D = 64: on alternate steps), then dK += dS^T Q ----
        const bool do_dq = DQ_EVERY || (it & 1) == cw;  // warpgroup-uniform
        reg_fence(dq);
        reg_fence(dk);
        reg_fence(df);
        if (DQ_EVERY) wg_fence();
        if (do_dq) {
            if (!DQ_EVERY) wg_fence();  // (inside the branch: ptxas would insert it there, C7519)
            wgb_issue_dq<Tr, BC>(dq, wg_desc_add(ds_a, buf * Cfg::DS_BYTES + ds_panel), k_b);
            wg_commit();
        }
        if (!DQ_EVERY) wg_fence();  // (after the branch, likewise)
        wgb_issue_rs<Tr, D, BR>(dk, df, wg_desc_add(st_mn, st_off));
        wg_commit();
        wg_wait<1>();  // dV and dQ (if any) done (dK runs on)
        reg_fence(dq);
        reg_fence(dv);
        reg_fence(pf);
        // One dS^T buffer: tell the other warpgroup this one's dQ GEMM no longer reads it.
        if (Cfg::DS_BUFS == 1 && it + 1 < total) {
            if (cw == 0) {
                named_bar_arrive(2, 256);
            } else {
                named_bar_arrive(3, 256);
            }
        }

        // ---- dQ: the warp's 16 rows x the GEMM's 64 columns -> its staging, then into dq_accum:
        // ATTN_TBW_DQ_TMA, two bulk tensor reductions by lane 0 (tbw_reduce_dq); else lane l < 16
        // reduces row 16 warp + l (256 contiguous bytes) with one bulk op ----
        if (do_dq) {
            if (ATTN_TBW_DQ_TMA ? lane == 0 : lane < 16) bulk_wait_read();  // the staging's last reads are done
            __syncwarp();
            if (ATTN_TBW_DQ_TMA) {
                tbw_reduce_dq(dq, gbase + (s_dqw - base), s_dqw, &tp.dq, dq_col0, mm0 + dq_row0 + 16 * warp, b * H + hh,
                              Lq, lane, g, t);
            } else {
                wgb_reduce_dq<D>(dq, sdq, s_dqw, Cfg::DQ_LD, dq_col0, dq_accum,
                                 (long long)(b * H + hh) * Lq + mm0 + dq_row0, mm0 + dq_row0, Lq, warp, lane, g, t);
            }
        }

        if (!CARRY) {
            wg_wait<0>();  // dK done: the stage has no reader left in this warpgroup
            reg_fence(dk);
            reg_fence(df);
            mbar_arrive(empty + 8 * slot);
        }
    }
    if (CARRY) {  // the last dK (its stage is never refilled: no arrival)
        wg_wait<0>();
        reg_fence(dk);
        reg_fence(df);
    }
    if (ATTN_TBW_DQ_TMA ? lane == 0 : lane < 16) bulk_wait_all();

    // ---- epilogue: dK = scale * acc, dV; rows past Lk are not stored ----
    const long long kv_off = ((long long)(b * p.Hkv + hk) * Lk + n0) * D;
    wgb_store_dkdv<Tr, D>(dk, dv, static_cast<T*>(p.dk) + kv_off, static_cast<T*>(p.dv) + kv_off, p.scale, krow - n0,
                          n0, Lk, t);
}

// -------------------------------------------------------------------------------------
// Kernels
// -------------------------------------------------------------------------------------
extern __shared__ __align__(1024) unsigned char attn_tbw_smem[];

#define ATTN_TMA_BWD_KERNEL(NAME, TR, CFG)                                                                \
    extern "C" __global__ void __launch_bounds__(CFG::NTHREADS, 1) NAME(                                  \
        const __grid_constant__ FlashTmaBwdParams tp) {                                                   \
        flash_bwd_tma_body<TR, CFG>(tp, attn_tbw_smem);                                                   \
    }
ATTN_TMA_BWD_KERNEL(flash_bwd_tma_d128_f16, AttnF16, TmaBwdCfgD128)
ATTN_TMA_BWD_KERNEL(flash_bwd_tma_d128_bf16, AttnBF16, TmaBwdCfgD128)
ATTN_TMA_BWD_KERNEL(flash_bwd_tma_d64_f16, AttnF16, TmaBwdCfgD64)
ATTN_TMA_BWD_KERNEL(flash_bwd_tma_d64_bf16, AttnBF16, TmaBwdCfgD64)
