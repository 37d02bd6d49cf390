// norm_bulk.cuh — layer norm on rings of Hopper bulk copies (ln_fwd_bulk, ln_bwd_bulk),
// a part of norm.cu: included by it after its row helpers (ln_group, group_sum2, ln_fwd's
// code, ln_dx_regs, ln_write_partials) and norm_ring.cuh (ln_smem_addr). norm.cu's header
// documents the kernels and defines the entry points, which call these only on sm_90 and
// newer (bulk copies and mbarrier transaction counts); the launcher takes them there with
// the setting layer_norm_bulk.
#pragma once

// ---- the forward on a ring of bulk copies (ln_fwd_bulk, a variant) ----------------------
//
// ln_fwd has at most its groups' rows in flight (64 KiB per SM at bf16 d = 4096) and none
// while it reduces and stores. Here the copy engine loads whole rows into shared memory,
// S rows ahead of each group, and a group hands its slot back once the row is in its
// registers (after the row's one reduction, which orders the lanes' reads before the
// refill), so S rows per group stay in flight while it normalizes and stores
// (bf16 d = 4096 at the defaults: 8 warps x 3 slots of 8 KiB, 192 KiB per SM).
#ifndef LN_FWD_BULK_THREADS
#define LN_FWD_BULK_THREADS 256  // ln_fwd_bulk: its block (one per SM)
#endif
#ifndef LN_FWD_BULK_NV
#define LN_FWD_BULK_NV 16  // ln_fwd_bulk: most 16-byte vectors of a row per thread (sets the group)
#endif
#ifndef LN_FWD_BULK_S
#define LN_FWD_BULK_S 12  // ln_fwd_bulk: most ring stages (rows ahead per group; fewer where
                          // the dynamic shared memory holds fewer: 3 at bf16 d = 4096)
#endif

#ifndef LN_BWD_BULK_THREADS
#define LN_BWD_BULK_THREADS 256  // ln_bwd_bulk: its block (one per SM)
#endif
#ifndef LN_BWD_BULK_NV
#define LN_BWD_BULK_NV 4  // ln_bwd_bulk: most 16-byte vectors of a row per thread (as LN_BPIPE_NV)
#endif
#ifndef LN_BWD_BULK_S
#define LN_BWD_BULK_S 12  // ln_bwd_bulk: most ring stages (rows ahead per group; fewer where
                          // the dynamic shared memory holds fewer: 7 at bf16 d = 4096)
#endif

namespace {

// mbarrier and bulk-copy PTX as attention_tma.cu writes it (that program is sm_90a only).
__device__ __forceinline__ void ln_mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also expects `bytes` of transactions (the bulk copy that completes on it).
__device__ __forceinline__ void ln_mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void ln_mbar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// `bytes` (a multiple of 16) from global src to shared dst, both 16-byte aligned; completes on bar.
__device__ __forceinline__ void ln_bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// Count, mean and sum of squared deviations of a set of values: combined by Chan et al.'s
// parallel formula, a row's variance needs one reduction (not a sum, then a second over
// the deviations) with the accuracy of two passes.
struct LnStat {
    float n, m, q;
};
// a's set followed by b's (the order fixes the rounding).
__device__ __forceinline__ LnStat ln_chan(LnStat a, LnStat b) {
    if (b.n == 0.0f) return a;
    if (a.n == 0.0f) return b;
    const float n = a.n + b.n, dl = b.m - a.m, wb = b.n / n;
    return {n, a.m + dl * wb, a.q + b.q + dl * dl * a.n * wb};
}
// Over the warp: blocks of 1, 2, 4, ... lanes combined with their neighbour block, the
// lower one first, so that every lane computes the same values in the same order.
__device__ __forceinline__ LnStat ln_chan_warp(LnStat a) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const LnStat p = {__shfl_xor_sync(RTX_FULL_MASK, a.n, o), __shfl_xor_sync(RTX_FULL_MASK, a.m, o),
                          __shfl_xor_sync(RTX_FULL_MASK, a.q, o)};
        const bool hi = lane_id() & o;
        a = ln_chan(hi ? p : a, hi ? a : p);
    }
    return a;
}

template <typename T>
__device__ __forceinline__ void ln_fwd_bulk(const T* x, const T* gamma, const T* beta, T* y, float* mean,
                                            float* rstd, size_t rows, size_t d, float eps) {
    constexpr int V = Ty<T>::V, NV = LN_FWD_BULK_NV;
    extern __shared__ __align__(128) unsigned char ln_bulk_ring[];
    __shared__ unsigned long long full[LN_FWD_BULK_THREADS / 32 * LN_FWD_BULK_S];  // [group][stage]
    __shared__ LnStat st[2][32];  // the warps' statistics, by the parity of the group's row
    const size_t nv = d / V, bytes = nv * 16;
    const unsigned gn = ln_group(nv, NV), gpb = blockDim.x / gn, gi = threadIdx.x / gn, gl = threadIdx.x % gn;
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    const size_t fit = nv ? dyn / (gpb * bytes) : 0;
    const unsigned S = fit < LN_FWD_BULK_S ? (unsigned)fit : LN_FWD_BULK_S;
    // (blockDim.x % gn, gpb <= 15: every thread in a group, a named barrier per group.)
    if (!(d % V == 0 && nv <= (size_t)blockDim.x * NV && S >= 1 && blockDim.x % gn == 0 && gpb <= 15 &&
          aligned16(x) && aligned16(y) && aligned16(gamma) && aligned16(beta))) {
        ln_fwd<T>(x, gamma, beta, y, mean, rstd, rows, d, eps);
        return;
    }
    const unsigned rb = (unsigned)bytes;  // S >= 1: the group's slots fit the shared memory
    const unsigned bar = ln_smem_addr(full) + 8u * gi * LN_FWD_BULK_S;
    const unsigned ring = ln_smem_addr(ln_bulk_ring) + gi * S * rb;
    if (threadIdx.x == 0) {
        for (unsigned i = 0; i < gpb * LN_FWD_BULK_S; ++i) ln_mbar_init(ln_smem_addr(full + i), 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    const float inv_d = 1.0f / (float)d;
    const size_t stride = (size_t)gridDim.x * gpb, row0 = (size_t)blockIdx.x * gpb + gi;
    const bool stream = ln_stream_rows(nv);
    // The group's j-th row (row0 + j * stride) goes to stage j % S, copied by lane 0 S rows
    // ahead: the first S here, the others when the group has taken row j - S out of the slot.
    if (gl == 0) {
        for (unsigned s = 0; s < S; ++s) {
            const size_t row = row0 + s * stride;
            if (row < rows) {
                ln_mbar_expect_tx(bar + 8u * s, rb);
                ln_bulk_load(ring + s * rb, x + row * d, rb, bar + 8u * s);
            }
        }
    }
    unsigned s = 0, ph = 0, par = 0;
    for (size_t row = row0; row < rows; row += stride) {
        // The k-th row of stage s completes its barrier's phase k (parity ph = k & 1). The
        // slot is refilled (phase k + 1 armed) only after every lane has passed this wait,
        // so no lane can wait on a parity whose phase has already come round again.
        ln_mbar_wait(bar + 8u * s, ph);
        const uint4* slot = reinterpret_cast<const uint4*>(ln_bulk_ring + (size_t)(gi * S + s) * rb);
        uint4 raw[NV];
        float n = 0.0f, sum = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const size_t i = gl + (size_t)k * gn;
            if (i < nv) {
                raw[k] = slot[i];
                float f[V];
                Ty<T>::unpack(raw[k], f);
#pragma unroll
                for (int e = 0; e < V; ++e) sum += f[e];
                n += (float)V;
            }
        }
        LnStat a = {n, n > 0.0f ? sum / n : 0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            if (gl + (size_t)k * gn < nv) {
                float f[V];
                Ty<T>::unpack(raw[k], f);
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float c = f[e] - a.m;
                    a.q += c * c;
                }
            }
        }
        a = ln_chan_warp(a);
        if (gn > 32) {
            // The group's warps in order. st alternates by row: a lane writes row j + 2's
            // entry only after the barrier of row j + 1, which follows every lane's reads of
            // row j's.
            if (lane_id() == 0) st[par][threadIdx.x >> 5] = a;
            group_bar(gi, gn);
            const unsigned w0 = gi * (gn >> 5);
            a = st[par][w0];
            for (unsigned w = 1; w < (gn >> 5); ++w) a = ln_chan(a, st[par][w0 + w]);
            par ^= 1;
        } else {
            __syncwarp();
        }
        // Every lane's reads of the slot are done (the barrier above): the copy engine may
        // overwrite it with the row S ahead while this one is normalized and stored.
        const size_t ahead = row + (size_t)S * stride;
        if (gl == 0 && ahead < rows) {
            ln_mbar_expect_tx(bar + 8u * s, rb);
            ln_bulk_load(ring + s * rb, x + ahead * d, rb, bar + 8u * s);
        }
        const float mu = a.m, r = rsqrtf(a.q * inv_d + eps);
        ln_store_row<T, NV>(raw, gamma, beta, y + row * d, nv, gl, gn, mu, r, stream);
        if (gl == 0) { mean[row] = mu; rstd[row] = r; }
        if (++s == S) { s = 0; ph ^= 1; }
    }
}

// ---- the backward on a ring of bulk copies (ln_bwd_bulk, a variant) ---------------------
//
// ln_bwd_pipe's computation (the same groups, rows and order of every sum for the same
// grid and vectors per thread: ln_dx_regs, then ln_write_partials) with dy and x copied
// whole by the copy engine instead of by each thread's cp.async: one bulk copy per row
// and operand from the group's lane 0, S rows ahead on mbarriers, so that deeper rings
// cost no instructions per vector (ln_bwd_pipe: 2 rows ahead per group, 64 KiB in flight
// per SM at bf16 d = 4096; here as many rows as the shared memory holds, up to 12: 7 of
// 16 KiB per group, 2 groups, 224 KiB). mean
// and rstd are loaded into registers one row ahead; gamma is read through L1 as in
// ln_fwd. A slot is refilled after the row's ln_dx_regs (its group barriers follow every
// lane's reads of the slot; a one-warp group adds a __syncwarp).
template <typename T>
__device__ __forceinline__ void ln_bwd_bulk(const T* dy, const T* x, const float* mean, const float* rstd,
                                            const T* gamma, T* dx, float* part_g, float* part_b, size_t rows,
                                            size_t d) {
    constexpr int V = Ty<T>::V, NV = LN_BWD_BULK_NV;
    extern __shared__ __align__(128) unsigned char ln_bulk_ring[];
    __shared__ unsigned long long full[LN_BWD_BULK_THREADS / 32 * LN_BWD_BULK_S];  // [group][stage]
    __shared__ float sm[64];
    const size_t nv = d / V, bytes = nv * 16;
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    const unsigned gn = ln_group(nv, NV), gpb = blockDim.x / gn, gi = threadIdx.x / gn, gl = threadIdx.x % gn;
    // A stage of a group holds its row of dy, then of x (2 * bytes; at least the d floats
    // of the partials' row, which reuses the ring at the end).
    const size_t fit = nv ? dyn / (gpb * 2 * bytes) : 0;
    const unsigned S = fit < LN_BWD_BULK_S ? (unsigned)fit : LN_BWD_BULK_S;
    if (!(d % V == 0 && nv <= (size_t)blockDim.x * NV && S >= 1 && blockDim.x % gn == 0 && gpb <= 15 &&
          aligned16(dy) && aligned16(x) && aligned16(dx) && aligned16(gamma))) {
        // Not this kernel's rows (the launcher takes another path): NaN partials, as ln_bwd_pipe.
        ln_nan_partials(part_g, part_b, d);
        return;
    }
    const float inv_d = 1.0f / (float)d;
    const unsigned rb = (unsigned)bytes;
    const unsigned bar = ln_smem_addr(full) + 8u * gi * LN_BWD_BULK_S;
    const unsigned ring = ln_smem_addr(ln_bulk_ring) + gi * S * 2 * rb;
    if (threadIdx.x == 0) {
        for (unsigned i = 0; i < gpb * LN_BWD_BULK_S; ++i) ln_mbar_init(ln_smem_addr(full + i), 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    const size_t stride = (size_t)gridDim.x * gpb, row0 = (size_t)blockIdx.x * gpb + gi;
    // The group's j-th row goes to stage j % S: dy at slot + 0, x at slot + rb.
    auto issue = [&](unsigned s, size_t row) {
        ln_mbar_expect_tx(bar + 8u * s, 2 * rb);
        ln_bulk_load(ring + s * 2 * rb, dy + row * d, rb, bar + 8u * s);
        ln_bulk_load(ring + s * 2 * rb + rb, x + row * d, rb, bar + 8u * s);
    };
    if (gl == 0) {
        for (unsigned s = 0; s < S; ++s) {
            const size_t row = row0 + s * stride;
            if (row < rows) issue(s, row);
        }
    }
    float ag[NV][V], ab[NV][V];
#pragma unroll
    for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int e = 0; e < V; ++e) { ag[k][e] = 0.0f; ab[k][e] = 0.0f; }
    float m_next = 0.0f, r_next = 0.0f;
    if (row0 < rows) { m_next = __ldg(mean + row0); r_next = __ldg(rstd + row0); }
    unsigned s = 0, ph = 0;
    for (size_t row = row0; row < rows; row += stride) {
        const float m = m_next, rs = r_next;
        if (row + stride < rows) { m_next = __ldg(mean + row + stride); r_next = __ldg(rstd + row + stride); }
        // The k-th row of stage s completes its barrier's phase k (parity ph); the slot is
        // refilled only after every lane of the group has passed this wait (below).
        ln_mbar_wait(bar + 8u * s, ph);
        const uint4* slot = reinterpret_cast<const uint4*>(ln_bulk_ring + (size_t)(gi * S + s) * 2 * rb);
        uint4 rdy[NV], rx[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const size_t i = gl + (size_t)k * gn;
            if (i < nv) { rdy[k] = slot[i]; rx[k] = slot[nv + i]; }
        }
        ln_dx_regs<T, true, NV>(rdy, rx, gamma, dx + row * d, nv, inv_d, m, rs, gl, gi, gn, sm, ag, ab);
        if (gn == 32) __syncwarp();  // (a larger group passed group_sum2's barriers)
        const size_t ahead = row + (size_t)S * stride;
        if (gl == 0 && ahead < rows) issue(s, ahead);
        if (++s == S) { s = 0; ph ^= 1; }
    }
    // Every copy issued was waited on above: the ring is free for the partials' row.
    __syncthreads();
    ln_write_partials<T, NV>(ag, ab, reinterpret_cast<float*>(ln_bulk_ring), part_g, part_b, nv, d, gl, gi, gn,
                             gpb);
}

}  // namespace

