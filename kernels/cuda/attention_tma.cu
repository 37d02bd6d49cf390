// attention_tma.cu — FlashAttention-3-style forward for Hopper (sm_90a), f16 and bf16:
// flash_fwd_tma_d128_{T} and, for calls without a mask, flash_fwd_tma_nm_d{64,128}_{T} (D = 64
// with 3 consumer warpgroups), rtx's forwards on compute capability 9.0 (the wgmma kernels of
// attention_wgmma.cu are their fallback, and run D = 64 calls with a mask). Same semantics as flash_fwd_* of attention.cu;
// its argument is a `struct FlashTmaParams` (below) and its launch is documented above its body.
// The per-tile steps of its consumer warpgroups are attention_wgmma_fwd.cuh's.
//
// rtx-kernels: arch-specific
// (the line above makes rtx-kernels compile this program for sm_90a instead of sm_90:
//  wgmma, setmaxnreg and the bulk tensor copies exist only on the architecture-specific
//  target; such a CUBIN loads only on compute capability 9.0 devices)

#include "attention_common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_tma.cu needs the sm_90a target (wgmma, setmaxnreg, cp.async.bulk.tensor): compile with arch_specific"
#endif

#include "attention_wgmma_fwd.cuh"
#include "attention_tma.cuh"

// -------------------------------------------------------------------------------------
// The forward with a producer warpgroup (TMA) and mbarriers: flash_fwd_tma_d128_{T}
// -------------------------------------------------------------------------------------
// FlashAttention-3's layout of the block: warpgroup 0 is the producer (setmaxnreg down to 24
// registers; one thread issues every load as bulk tensor copies, cp.async.bulk.tensor, into
// the same 128-byte-swizzled panels as attention_wgmma.cu), warpgroups 1 and 2 are the
// consumers (setmaxnreg up to 240) running attention_wgmma.cu's PIPE steps (those of
// attention_wgmma_fwd.cuh) on query rows 64 (wg - 1) .. + 63, their GEMMs issued in strict
// alternation (tma_turn_wait / tma_turn_pass below). Stages are handed
// over by mbarriers instead of __syncthreads: full[s] (the producer's expect_tx arrival and the
// copies' transaction bytes) and empty[s] (256 consumer arrivals, each thread's after its
// wgmma reading the stage has completed), so a consumer warpgroup is never held by the other
// one or by a load it does not need yet.
// Work tiles: BR = 128 query rows of one (batch, head), n_work = ceil(Lq / BR) * H * B of them,
// tile i being query block n_m - 1 - i % n_m of (b, h) = ((i / n_m) / H, (i / n_m) % H) (the
// order of a grid (n_m, H, B), the last query blocks, a causal call's longest, first). Block x
// takes tile x first, then, with `sched` null, x + gridDim.x, x + 2 gridDim.x, ...; with
// `sched`, the next unclaimed tile (gridDim.x + atomicAdd(&sched[0], 1)), claimed by the
// producer when it loads the current tile's last K (about two key tiles before the consumers
// finish it); the last block to run out of tiles sets both counters back to 0 for the next
// launch (`done`, sched[1], counts the blocks that have). So the grid may be any size from 1
// to n_work:
//   - n_work blocks: one work tile each, the hardware scheduling them;
//   - fewer (the launcher's for calls of at most 4096 keys: one block per SM, with `sched`, a
//     persistent grid; at 16384 keys that was 3-18 % slower on an H100, so longer calls take
//     a block per tile, ops/src/attention/cuda/grid.rs, PERSISTENT_MAX_KEYS): each
//     block keeps its shared memory and barriers over its tiles, the K / V ring and the
//     consumers' turns run on from one tile to the next, and the producer loads the next
//     tile's Q (once the consumers' last S GEMM of this one has completed: q_empty) and its
//     first K and V while the consumers finish this tile (the last P V, the output's stores),
//     which a block launched per tile overlaps with nothing. Handed out by the counter, tiles
//     go to whichever block is ready, as the hardware would; a fixed share per block (`sched`
//     null) was slower at L >= 4096 and, for causal calls (tiles of different lengths), much
//     slower (kernels/checks/attention_wgmma_check.py, docs/performance-notes.md).
// Launch: grid (G, 1, 1), 1 <= G <= n_work < 2^31, block (384, 1, 1), dynamic smem
// 1024 + 128*D*2 (Q) + (TMA_KS + TMA_VS) * 128*D*2 + 8 * (3 + 2 TMA_KS + 2 TMA_VS) bytes,
// argument `const FlashTmaParams` by value: the FlashParams (pointers for o, lse, mask), `sched`
// (nullable, above) and the tensor maps of q, k, v: 3-D (D, L, B * heads), 16-bit elements,
// box (64, 128, 1), CU_TENSOR_MAP_SWIZZLE_128B, no interleave, zero fill out of bounds (rows past L read 0).
// D = 64 (flash_fwd_tma_nm_d64_*, 3 consumer warpgroups, ATTN_TMA_D64_WG below): BR = 192,
// block (512, 1, 1), 384 consumer arrivals per empty barrier, q's map with 64-row boxes,
// dynamic smem 91224 bytes (the formula above with 192 rows of Q).
struct __align__(64) FlashTmaParams {
    FlashParams p;
    // Nullable: two u32 counters [next, done], 0 at launch (the kernel leaves them at 0): the
    // work tiles past the grid's first are handed out by atomics on `next` (see "Work tiles").
    unsigned* sched;
    TmaMap q, k, v;
};
// (NVRTC has no offsetof: 152 bytes of FlashParams, sched at 152, then q, k, v at 192, 320, 448
// is the only layout of this size and alignment.)
static_assert(sizeof(FlashTmaParams) == 576 && alignof(FlashTmaParams) == 64 && sizeof(TmaMap) == 128,
              "FlashTmaParams ABI");

#ifndef ATTN_TMA_KS
#define ATTN_TMA_KS 2  // K stages
#endif
#ifndef ATTN_TMA_D64
#define ATTN_TMA_D64 1  // 1: also flash_fwd_tma_nm_d64_* (and flash_fwd_tma_d64_*: the kernels at the bottom)
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
// ATTN_TMA_SOFTMAX_FIRST=1 (a candidate; measured slower, off): the softmax of S_j runs before
// the wait for P_{j-1} V_{j-1} in the SASS too, as the program orders it (FlashAttention-3's
// overlap of a warpgroup's softmax with its own P V GEMM). Without it ptxas schedules that wait
// (WARPGROUP.DEPBAR) at the top of the softmax's basic block, so the whole softmax waits for the
// P V GEMM (kernels/checks/sass_order.py shows where). wg_keep_before_wait (wgmma.cuh) ends the
// block on the row sums. On an H100 the default order was 2-12 % faster at L >= 4096 (not
// profiled; docs/performance-notes.md, "The consumers' order in the SASS").
#ifndef ATTN_TMA_SOFTMAX_FIRST
#define ATTN_TMA_SOFTMAX_FIRST 0
#endif
// ATTN_TMA_WAIT_SLEEP (0 = off): mbarrier waits through mbar_wait_sleep, whose tries
// ask to be suspended until the phase completes (cuDNN's sm90 flash forward waits so: a try_wait,
// then NANOSLEEP.SYNCS with the same 10 ms hint, in its SASS): 1 the producer's waits for free
// stages (k_empty, v_empty, q_empty), 2 every wait of the kernel. Nsight Compute (run 25b, H100,
// D = 128, L = 4096) counted 8.8 M turns of the producer's spin on v_empty (a YIELD, a try_wait
// and a branch each: 9 % of the kernel's warp instructions) on the scheduler that also issues one
// warp of each consumer warpgroup. Measured on an H100 (2026-12-06, docs/performance-notes.md):
// level to 10 % slower at D = 128, L >= 4096; for D = 64 on the persistent grid 6-11 % faster at
// L = 1024 in one run, which a second (run 27a) did not repeat, level at 4096.
#ifndef ATTN_TMA_WAIT_SLEEP
#define ATTN_TMA_WAIT_SLEEP 0
#endif
// With 3 consumer warpgroups (512 threads, 128 registers each at launch): the consumers'.
#ifndef ATTN_TMA_CREGS3
#define ATTN_TMA_CREGS3 160
#endif
static_assert(128 * ATTN_TMA_PREGS + 384 * ATTN_TMA_CREGS3 <= 512 * 128, "setmaxnreg budget (3 consumers)");

// The consumers' turns (FlashAttention-3's ping-pong): the two warpgroups issue their GEMMs of
// an iteration strictly in alternation. Warpgroup 0 waits (named barrier 1) for warpgroup 1's
// pass of the previous iteration, warpgroup 1 (barrier 2) for warpgroup 0's pass of this one;
// each barrier completes with 128 arrivals and 128 waits. (A one-way turn as ORDER's
// lets warpgroup 0 run ahead, its arrivals completing barriers without warpgroup 1, once
// nothing else holds the two together: it deadlocked on the mbarriers here.) Both warpgroups
// take every iteration of the block, computing or not.
// With 3 consumer warpgroups the turn goes round: warpgroup c > 0 waits (barrier 1 + c) for
// warpgroup c - 1's pass, warpgroup 0 (barrier 1) for warpgroup 2's of the previous iteration.
// (Constant barrier ids: ptxas reserves every id a register could name.)
template <int NWG>
__device__ __forceinline__ void tma_turn_wait(int cw, int j) {
    if (cw == 0) {
        if (j > 0) named_bar_sync(1, 256);
    } else if (NWG == 2 || cw == 1) {
        named_bar_sync(2, 256);
    } else {
        named_bar_sync(3, 256);
    }
}
template <int NWG>
__device__ __forceinline__ void tma_turn_pass(int cw, int j, int n) {
    if (cw == 0) {
        named_bar_arrive(2, 256);
    } else if (NWG == 3 && cw == 1) {
        named_bar_arrive(3, 256);
    } else if (j + 1 < n) {
        named_bar_arrive(1, 256);
    }
}

template <typename Tr, typename Cfg, int KS, int VS, bool HAS_MASK = true>
__device__ __forceinline__ void flash_fwd_tma_body(const FlashTmaParams& tp, unsigned char* smem) {
    static_assert(Cfg::PIPE && (Cfg::NWG == 2 || Cfg::NWG == 3) && Cfg::BC == 128 && Cfg::BR == 64 * Cfg::NWG &&
                      (Cfg::D == 64 || Cfg::D == 128),
                  "TMA forward: PIPE, 2 or 3 x 64 rows, 128 keys, D 64 or 128");
    typedef typename Tr::T T;
    const FlashParams& p = tp.p;
    constexpr int D = Cfg::D;
    constexpr int BC = Cfg::BC;
    constexpr int BR = Cfg::BR;
    constexpr int KV_BYTES = Cfg::KV_BYTES;
    constexpr int SR = BC / 2;
    constexpr int OR = D / 2;
    constexpr int PR = BC / 4;
    constexpr int NWG = Cfg::NWG;
    constexpr int NCONS = 128 * NWG;            // consumer threads
    constexpr int QBOX = BR == 128 ? 128 : 64;  // rows of the q tensor map's box
    constexpr bool SOFTMAX_FIRST = ATTN_TMA_SOFTMAX_FIRST;  // (see the macro)

    const int tid = threadIdx.x;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // 0 producer, 1 .. NWG consumers
    const int Lq = p.Lq;
    const int Lk = p.Lk;
    // Work tiles: see "Work tiles" above the kernel.
    const int n_m = (Lq + BR - 1) / BR;
    const unsigned n_work = (unsigned)n_m * p.H * p.B;  // (the launcher keeps it under 2^31)

    // smem: [Q][K stages][V stages]
    //       [barriers: q_full, q_empty, k_full[KS], k_empty[KS], v_full[VS], v_empty[VS]]
    //       [tile slots: the block's next work tile (n_work or more: none), by the parity of its
    //        current tile's count]
    const unsigned s_q = (smem_u32(smem) + 1023u) & ~1023u;
    const unsigned s_k = s_q + Cfg::Q_BYTES;
    const unsigned s_v = s_k + KS * KV_BYTES;
    const unsigned bar = s_v + VS * KV_BYTES;
    const unsigned q_full = bar;
    const unsigned q_empty = bar + 8;
    const unsigned k_full = bar + 16;
    const unsigned k_empty = k_full + 8 * KS;
    const unsigned v_full = k_empty + 8 * KS;
    const unsigned v_empty = v_full + 8 * VS;
    volatile unsigned* const slot = reinterpret_cast<volatile unsigned*>(smem + (v_empty + 8 * VS - smem_u32(smem)));
    if (tid == 0) {
        mbar_init(q_full, 1);
        mbar_init(q_empty, NCONS);
        for (int i = 0; i < KS; ++i) {
            mbar_init(k_full + 8 * i, 1);
            mbar_init(k_empty + 8 * i, NCONS);
        }
        for (int i = 0; i < VS; ++i) {
            mbar_init(v_full + 8 * i, 1);
            mbar_init(v_empty + 8 * i, NCONS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        // ---- producer ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ATTN_TMA_PREGS) : "memory");
        if (tid == 0) {
            // kv: the K / V tiles issued so far (over the block's work tiles: the ring's
            // stages and phases run on across them); tc: the block's work tiles so far.
            unsigned* const sched = tp.sched;
            int kv = 0;
            unsigned cur = blockIdx.x;  // < n_work: the grid is at most n_work
            for (int tc = 0; cur < n_work; ++tc) {
                const unsigned tile = cur;
                const int bh = (int)(tile / n_m);
                const int m0 = (n_m - 1 - ((int)tile - bh * n_m)) * BR;
                const int h = bh % p.H, b = bh / p.H;
                const int kh = b * p.Hkv + h / (p.H / p.Hkv);
                const int kv_end = p.causal ? min(Lk, min(Lq, m0 + BR)) : Lk;
                const int n_tiles = (kv_end + BC - 1) / BC;
                // Q: the consumers' last S GEMM of the previous work tile has completed.
                if (tc > 0) mbar_wait_as<ATTN_TMA_WAIT_SLEEP, true>(q_empty, (tc - 1) & 1);
                mbar_expect_tx(q_full, Cfg::Q_BYTES);
#pragma unroll
                for (int pn = 0; pn < D / 64; ++pn)
#pragma unroll
                    for (int i = 0; i < BR / QBOX; ++i)
                        tma_load_3d(s_q + pn * (BR * 128) + i * (QBOX * 128), &tp.q, q_full, 64 * pn,
                                    m0 + i * QBOX, bh);
#pragma unroll 1
                for (int j = 0; j < n_tiles; ++j, ++kv) {  // (not unrolled: 24 registers)
                    const int ks = kv % KS;
                    if (kv >= KS) mbar_wait_as<ATTN_TMA_WAIT_SLEEP, true>(k_empty + 8 * ks, ((kv / KS) + 1) & 1);
                    if (j == n_tiles - 1) {
                        // The block's next tile, claimed about KS key tiles before this one ends
                        // and announced with its last K (the expect_tx arrival releases the store;
                        // the consumers read it in that iteration). Slot tc & 1: the slot is
                        // written again only for tile tc + 2, whose Q waits for q_empty of tile
                        // tc + 1, after every consumer's reads of tile tc.
                        cur = sched ? gridDim.x + atomicAdd(sched, 1u) : cur + gridDim.x;
                        slot[tc & 1] = cur;
                    }
                    mbar_expect_tx(k_full + 8 * ks, KV_BYTES);
#pragma unroll
                    for (int pn = 0; pn < D / 64; ++pn)
                        tma_load_3d(s_k + ks * KV_BYTES + pn * (BC * 128), &tp.k, k_full + 8 * ks, 64 * pn, j * BC,
                                    kh);
                    const int vs = kv % VS;
                    if (kv >= VS) mbar_wait_as<ATTN_TMA_WAIT_SLEEP, true>(v_empty + 8 * vs, ((kv / VS) + 1) & 1);
                    mbar_expect_tx(v_full + 8 * vs, KV_BYTES);
#pragma unroll
                    for (int pn = 0; pn < D / 64; ++pn)
                        tma_load_3d(s_v + vs * KV_BYTES + pn * (BC * 128), &tp.v, v_full + 8 * vs, 64 * pn, j * BC,
                                    kh);
                }
            }
            // Every block has claimed its last tile once `done` counts the grid: the last one
            // leaves the counters at 0 for the next launch (stream order makes them visible).
            // The fences order each block's last claim before its count (relaxed atomics on two
            // addresses may land in either order: a claim landing after the reset would leave
            // `next` above 0, and the next launch would skip tiles) and the reset after the
            // last count.
            if (sched) {
                __threadfence();
                if (atomicAdd(sched + 1, 1u) == gridDim.x - 1) {
                    __threadfence();
                    atomicExch(sched, 0u);
                    atomicExch(sched + 1, 0u);
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(NWG == 2 ? ATTN_TMA_CREGS : ATTN_TMA_CREGS3) : "memory");

    // ---- consumers: warpgroup cw = wg - 1 owns query rows m0 + 64 cw .. + 63 of each work tile ----
    const int cw = wg - 1;
    const int warp = (tid >> 5) & 3;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int t = lane & 3;

    const unsigned long long q_desc = wg_desc(s_q + cw * 64 * 128, 16, 1024);
    const unsigned long long k_desc = wg_desc(s_k, 16, 1024);
    const unsigned long long v_desc = wg_desc(s_v, BC * 128, 1024);

    int kv = 0;                  // as the producer's
    unsigned tile = blockIdx.x;  // the producer's first, then what its slots announce
    for (int tc = 0; tile < n_work; ++tc) {
        const int bh = (int)(tile / n_m);
        const int m0 = (n_m - 1 - ((int)tile - bh * n_m)) * BR;
        const int h = bh % p.H, b = bh / p.H;
        const int kv_end = p.causal ? min(Lk, min(Lq, m0 + BR)) : Lk;
        const int n_tiles = (kv_end + BC - 1) / BC;
        const int row0 = m0 + 64 * cw;
        int wg_tiles = 0;
        if (row0 < Lq) wg_tiles = (p.causal ? min(kv_end - 1, row0 + 63) : kv_end - 1) / BC + 1;

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

        // The turns run on across the block's work tiles (else a warpgroup entering the next one
        // could pass twice before the other waits once): the first warpgroup waits in every
        // iteration but the block's first (tma_turn_wait with the ring's tile kv + j), the last
        // passes in every one but the block's last (turns: past n_tiles unless this is the
        // block's last work tile, which the last iteration learns from the slot).
        unsigned nxt = n_work;

        mbar_wait_as<ATTN_TMA_WAIT_SLEEP, false>(q_full, tc & 1);
        // Iteration j: S_j = Q K_j^T and O += P_{j-1} V_{j-1} (the PIPE steps of attention_wgmma.cu).
        // Every consumer thread waits for K_j and V_{j-1} and arrives on their empty barriers once
        // per iteration, computing or not (an arrival before the wait could complete a later
        // phase); K / V tile j of this work tile is the ring's tile kv + j.
        for (int j = 0; j < n_tiles; ++j) {
            const int kj = kv + j;
            const int ks = kj % KS;
            const int vs = (kj + VS - 1) % VS;  // V_{j-1}
            mbar_wait_as<ATTN_TMA_WAIT_SLEEP, false>(k_full + 8 * ks, (kj / KS) & 1);
            if (j == n_tiles - 1) nxt = slot[tc & 1];
            const int turns = nxt < n_work ? n_tiles + 1 : n_tiles;
            if (j > 0) mbar_wait_as<ATTN_TMA_WAIT_SLEEP, false>(v_full + 8 * vs, ((kj - 1) / VS) & 1);
            const int n0 = j * BC;
            const unsigned long long kd = wg_desc_add(k_desc, ks * KV_BYTES);
            const unsigned long long vd = wg_desc_add(v_desc, vs * KV_BYTES);
            if (j == 0) {
                if (wg_tiles > 0) {
                    tma_turn_wait<NWG>(cw, kj);
                    reg_fence(s);
                    wg_fence();
                    wg_issue_s<Tr, Cfg>(s, q_desc, kd);
                    wg_commit();
                    tma_turn_pass<NWG>(cw, j, turns);
                    wg_wait<0>();
                    reg_fence(s);
                    mbar_arrive(k_empty + 8 * ks);
                    wg_softmax<Tr, BC, HAS_MASK>(s, m_r, alpha, rsum, w, n0);
                    wg_rescale_pack<Tr, D, BC>(o, pf, l_r, s, alpha, rsum);
                } else {
                    tma_turn_wait<NWG>(cw, kj);
                    tma_turn_pass<NWG>(cw, j, turns);
                    mbar_arrive(k_empty + 8 * ks);
                }
            } else if (j < wg_tiles) {
                tma_turn_wait<NWG>(cw, kj);
                reg_fence(s);
                reg_fence(o);
                reg_fence(pf);
                wg_fence();
                wg_issue_s<Tr, Cfg>(s, q_desc, kd);
                wg_commit();
                wg_issue_pv<Tr, Cfg>(o, pf, vd);
                wg_commit();
                tma_turn_pass<NWG>(cw, j, turns);
                wg_wait<1>();  // S_j done
                reg_fence(s);
                mbar_arrive(k_empty + 8 * ks);
                wg_softmax<Tr, BC, HAS_MASK>(s, m_r, alpha, rsum, w, n0);
                if (SOFTMAX_FIRST) wg_keep_before_wait(rsum[0], rsum[1]);
                wg_wait<0>();  // P_{j-1} V_{j-1} done
                reg_fence(o);
                reg_fence(pf);
                mbar_arrive(v_empty + 8 * vs);
                wg_rescale_pack<Tr, D, BC>(o, pf, l_r, s, alpha, rsum);
            } else if (j == wg_tiles) {
                mbar_arrive(k_empty + 8 * ks);
                tma_turn_wait<NWG>(cw, kj);
                reg_fence(o);
                reg_fence(pf);
                wg_fence();
                wg_issue_pv<Tr, Cfg>(o, pf, vd);
                wg_commit();
                tma_turn_pass<NWG>(cw, j, turns);
                wg_wait<0>();
                reg_fence(o);
                mbar_arrive(v_empty + 8 * vs);
            } else {
                tma_turn_wait<NWG>(cw, kj);
                tma_turn_pass<NWG>(cw, j, turns);
                mbar_arrive(k_empty + 8 * ks);
                if (j > 0) mbar_arrive(v_empty + 8 * vs);
            }
        }
        // Every S GEMM of this work tile has completed: Q may take the next tile's rows.
        mbar_arrive(q_empty);
        // The last V (V_{n-1}): its P V if this warpgroup's rows reach it, then its stage is free
        // for the ring's next tile (the block's next work tile; an arrival no load waits for
        // after the last one).
        {
            const int kl = kv + n_tiles - 1;
            const int vs = kl % VS;
            mbar_wait_as<ATTN_TMA_WAIT_SLEEP, false>(v_full + 8 * vs, (kl / VS) & 1);
            if (wg_tiles == n_tiles) {
                reg_fence(o);
                reg_fence(pf);
                wg_fence();
                wg_issue_pv<Tr, Cfg>(o, pf, wg_desc_add(v_desc, vs * KV_BYTES));
                wg_commit();
                wg_wait<0>();
                reg_fence(o);
            }
            mbar_arrive(v_empty + 8 * vs);
        }
        kv += n_tiles;
        if (row0 < Lq) wg_store_o<Tr, D>(p, b, h, w, o, l_r, m_r);
        tile = nxt;
    }
}

// -------------------------------------------------------------------------------------
// Kernels
// -------------------------------------------------------------------------------------
extern __shared__ __align__(1024) unsigned char attn_tma_smem[];

// The forward above: D = 128 with 2 consumer warpgroups x 64 rows, 128 keys per tile, PIPE,
// ping-pong turns, one block of 384 threads per SM; D = 64 (ATTN_TMA_D64) with
// ATTN_TMA_D64_WG consumer warpgroups: 2 as for D = 128, or 3 (192 rows per block, 512
// threads, consumers at ATTN_TMA_CREGS3 registers, turns going round the three:
// FlashAttention-3's block for D = 64), whose q tensor map has 64-row boxes (3 copies per
// panel; the others 128-row ones).
#ifndef ATTN_TMA_D64_WG
#define ATTN_TMA_D64_WG 3
#endif
typedef WgFwdCfg<128, 128, 2, true, true, 1> AttnTmaCfgD128;
typedef WgFwdCfg<64, 128, ATTN_TMA_D64_WG, true, true, 1> AttnTmaCfgD64;
template <typename Cfg>
struct AttnTmaLaunch {
    static constexpr int SMEM_BYTES =
        1024 + Cfg::Q_BYTES + (ATTN_TMA_KS + ATTN_TMA_VS) * Cfg::KV_BYTES + 8 * (3 + 2 * ATTN_TMA_KS + 2 * ATTN_TMA_VS);
    static constexpr int NTHREADS = 128 * (Cfg::NWG + 1);  // producer warpgroup + consumers
    static constexpr int BR = Cfg::BR;
    static_assert(SMEM_BYTES <= 232448, "TMA forward: shared memory per block");
};
typedef AttnTmaLaunch<AttnTmaCfgD128> AttnTmaLaunchD128;
typedef AttnTmaLaunch<AttnTmaCfgD64> AttnTmaLaunchD64;
#if ATTN_TMA_KS == 2 && ATTN_TMA_VS == 2
static_assert(AttnTmaLaunchD128::SMEM_BYTES == 164952 && AttnTmaLaunchD128::NTHREADS == 384 &&
                  AttnTmaLaunchD128::BR == 128,
              "documented (tma fwd d128)");
// (the default's assert first: ops/src/attention/cuda/launch.rs reads the first of each)
#if ATTN_TMA_D64_WG == 3
static_assert(AttnTmaLaunchD64::SMEM_BYTES == 91224 && AttnTmaLaunchD64::NTHREADS == 512 &&
                  AttnTmaLaunchD64::BR == 192,
              "documented (tma fwd d64, 3 consumer warpgroups)");
#else
static_assert(AttnTmaLaunchD64::SMEM_BYTES == 83032 && AttnTmaLaunchD64::NTHREADS == 384 &&
                  AttnTmaLaunchD64::BR == 128,
              "documented (tma fwd d64)");
#endif
#endif
#define ATTN_TMA_FWD_KERNEL(NAME, TR, CFG, HAS_MASK)                                                    \
    extern "C" __global__ void __launch_bounds__(AttnTmaLaunch<CFG>::NTHREADS, 1) NAME(                 \
        const __grid_constant__ FlashTmaParams tp) {                                                    \
        flash_fwd_tma_body<TR, CFG, ATTN_TMA_KS, ATTN_TMA_VS, HAS_MASK>(tp, attn_tma_smem);              \
    }
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_d128_f16, AttnF16, AttnTmaCfgD128, true)
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_d128_bf16, AttnBF16, AttnTmaCfgD128, true)
#ifndef ATTN_TMA_NOMASK
// 1 (the default): also flash_fwd_tma_nm_d{D}_{T}, the same kernels for calls without an
// additive mask (the mask pointer is ignored; the launcher takes them only for calls without
// one): without the mask's loads their consumers need fewer registers (at D = 128 no spill,
// against 24 bytes spilled by the masked kernel; at D = 64 with 3 consumer warpgroups 160
// suffice). 0: the masked kernels alone.
#define ATTN_TMA_NOMASK 1
#endif
#if ATTN_TMA_NOMASK
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_nm_d128_f16, AttnF16, AttnTmaCfgD128, false)
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_nm_d128_bf16, AttnBF16, AttnTmaCfgD128, false)
#endif
#if ATTN_TMA_D64
// D = 64: with 3 consumer warpgroups (the default) the mask-less build alone, since the
// masked one spills at 160 registers (calls with a mask take the wgmma forward;
// ATTN_TMA_D64_MASKED=1 builds it for the check); with 2 (ATTN_TMA_D64_WG=2) the masked build
// too. With 2, on the H200 (attention_wgmma_check.py,
// 2026-12-04) against flash_fwd_wgmma_d64_* 311 / 402 / 423 TFLOP/s at L = 1024 / 4096 / 16384
// against 335 / 393 / 401 (causal 230 / 356 / 421 against 281 / 357 / 387).
#ifndef ATTN_TMA_D64_MASKED
#define ATTN_TMA_D64_MASKED 0
#endif
#if ATTN_TMA_D64_WG == 2 || ATTN_TMA_D64_MASKED
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_d64_f16, AttnF16, AttnTmaCfgD64, true)
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_d64_bf16, AttnBF16, AttnTmaCfgD64, true)
#endif
#if ATTN_TMA_NOMASK
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_nm_d64_f16, AttnF16, AttnTmaCfgD64, false)
ATTN_TMA_FWD_KERNEL(flash_fwd_tma_nm_d64_bf16, AttnBF16, AttnTmaCfgD64, false)
#endif
#endif
