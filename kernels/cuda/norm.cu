// norm.cu — layer normalization over the last dim, forward and backward.
//
// dt is f32 (T = float), f16 (T = __half) or bf16 (T = __nv_bfloat16); math in f32.
// x, y, dy, dx are [rows, d] contiguous; gamma, beta, dgamma, dbeta [d] of type T;
// mean, rstd [rows] f32. The CPU reference is ops/src/norm/cpu.rs. Block: 256 threads
// (RTX_BLOCK; a multiple of 32 up to 256 also works). No argument may overlap another.
//
// Forward and dx, grid-stride over rows (best grid min(rows, resident blocks)):
//   extern "C" __global__ void ln_fwd_{dt}(const T* x, const T* gamma, const T* beta,
//       T* y, float* mean, float* rstd, size_t rows, size_t d, float eps)
//   mean[r] = sum x / d; var = sum (x - mean)^2 / d (two passes, biased);
//   rstd[r] = rsqrt(var + eps); y = (x - mean) * rstd * gamma + beta.
// On rings of Hopper bulk copies (norm_bulk.cuh; sm_90 and newer, before it the entry
// points run ln_fwd's code and write NaN partials; taken by the launcher with the
// experimental setting layer_norm_bulk, not yet measured on a GPU):
//   extern "C" __global__ void ln_fwd_bulk_{dt}(same arguments as ln_fwd)
//     the forward with x staged through shared memory by Hopper bulk copies
//     (cp.async.bulk completing on mbarriers): a row goes to a group of gn threads (as
//     ln_group, at most LN_FWD_BULK_NV vectors per thread: bf16 d = 4096 a warp per row
//     at 16), each group's lane 0 copies its rows whole into the group's S slots of the
//     ring, S rows ahead. Block: LN_FWD_BULK_THREADS (its launch bound), one per SM;
//     grid: SMs (grid-stride). Dynamic shared memory: G * S * d * sizeof(T) bytes, G =
//     blockDim.x / gn groups, S = min(LN_FWD_BULK_S, what the dynamic shared memory
//     holds). Statistics from one group reduction (each thread's count, mean and sum of
//     squared deviations, combined by Chan's formula in lane, then warp, order), so mean
//     and rstd may differ from ln_fwd's in the last bits. Its path needs d % V == 0, x,
//     y, gamma, beta 16-byte aligned, d / V <= blockDim.x * LN_FWD_BULK_NV and S >= 1;
//     otherwise it runs ln_fwd's code (correct, not faster).
//   extern "C" __global__ void ln_bwd_bulk_{dt}(same arguments as ln_bwd_pipe)
//     ln_bwd_pipe's computation and partials (the same groups and order of every sum for
//     the same grid and vectors per thread) with each row of dy and of x copied whole by
//     a bulk copy from the group's lane 0 into the group's S slots, S rows ahead, on
//     mbarriers (no per-vector copy instructions, deeper rings). Block:
//     LN_BWD_BULK_THREADS (its launch bound), one per SM; grid SMs (the partial rows).
//     Dynamic shared memory: G * S * 2 * d * sizeof(T) bytes, G = blockDim.x / gn, S =
//     min(LN_BWD_BULK_S, what it holds). Needs the register path's conditions with
//     LN_BWD_BULK_NV vectors per thread and S >= 1 (else NaN partials).
//
// Backward, on the register path (below) two launches, ln_bwd_pipe (or ln_bwd_fused)
// then ln_bwd_final:
//   extern "C" __global__ void ln_bwd_fused_{dt}(const T* dy, const T* x, const float* mean,
//       const float* rstd, const T* gamma, T* dx, float* part_g, float* part_b, size_t rows,
//       size_t d)
//     dx as ln_bwd_dx, and in the same pass (dy and x read once) each thread's sums of
//     dy * xh and dy over the rows its group takes, in registers; block b writes its
//     groups' sums (added in group order) to part_g / part_b row b. Grid: SMs x
//     LN_FUSED_BLOCKS (the partial rows; its launch bound), chunks = the grid. Needs the
//     register path and d <= 8192 (else it writes NaN partials).
//   extern "C" __global__ void ln_bwd_pipe_{dt}(same arguments)
//     ln_bwd_fused's computation (the same groups, rows and order of every sum for the
//     same grid and vectors per thread), with dy, x, mean and rstd
//     staged through a cp.async ring (norm_ring.cuh): LN_BPIPE_NV = 4 vectors per
//     thread, LN_BPIPE_S = 3 stages, dynamic shared memory S * (2 * NV * blockDim * 16 +
//     8 * blockDim) + NV * blockDim * 16 bytes (120832 at 256 threads), one block per
//     SM; grid SMs. Needs sm_80 and the register path (else NaN partials). On the H200
//     (bf16 8192 x 4096, kernels/checks/train_kernels_check.py, 2026-12-03) the backward
//     took 0.0732 ms this way against 0.0861 through ln_bwd_fused (both with
//     ln_bwd_final).
// Otherwise three launches:
//   extern "C" __global__ void ln_bwd_dx_{dt}(const T* dy, const T* x, const float* mean,
//       const float* rstd, const T* gamma, T* dx, size_t rows, size_t d)
//     g = dy * gamma, xh = (x - mean) * rstd,
//     dx = rstd * (g - mean_row(g) - xh * mean_row(g * xh)).
//   extern "C" __global__ void ln_bwd_part_{dt}(const T* dy, const T* x, const float* mean,
//       const float* rstd, float* part_g, float* part_b, size_t rows, size_t d, size_t rpc)
//     grid (ceil(d / blockDim.x), chunks): block (bx, c) owns columns [bx * blockDim.x,
//     (bx + 1) * blockDim.x) and sums rows [c * rpc, min(rows, (c + 1) * rpc)):
//     part_g[c * d + j] = sum dy * xh, part_b[c * d + j] = sum dy. chunks = ceil(rows /
//     rpc) <= 65535. Static shared memory: 16 KiB.
//   extern "C" __global__ void ln_bwd_final_{dt}(const float* part_g, const float* part_b,
//       T* dgamma, T* dbeta, size_t chunks, size_t d)
//     blocks of LN_FINAL_BLOCK = 1024 = 32 chunk lanes x 32 columns over column tiles of
//     32 (grid-stride; best ceil(d / 32)): lane c sums chunks c, c + 32, ... in f64, the
//     32 lane sums are added in lane order. (With 8 lanes of 256-thread blocks it took
//     13.0 µs for 264 partial rows of 4096 on the H200, with 32 lanes 7.3.)
// Deterministic: no atomics; the order of every sum depends only on the launch shape.
//
// Row kernels (fwd, dx), when every row pointer is 16-byte aligned (d % V == 0 and the
// bases aligned, V = 16 / sizeof(T)): the row is read once into registers (raw 16-byte
// vectors, at most LN_NV = 4 per thread) and everything is computed from there. A row
// goes to a group of the fewest threads (a power of two from a warp to the block) that
// hold it, and the block's groups take consecutive rows (reductions: shuffles, then a
// named barrier per group): bf16 D = 768 a warp per row, D = 4096 128 threads per row.
// Rows longer than blockDim.x * LN_NV vectors, or unaligned ones, take the scalar path
// (a block per row, rereading the row from memory).
// ln_bwd_part reads 16-byte vectors (V columns per thread, V row groups per block,
// combined in shared memory in a fixed order) under the same alignment condition.
//
// Compile-time variants (-D; the defaults are the behaviour above; the launcher's
// constants in ops/src/norm/cuda.rs must follow any that it adopts):
//   LN_NV (4): most 16-byte vectors of a row per thread (sets the group size and the
//     register-path limit nv <= blockDim.x * LN_NV). LN_MIN_BLOCKS (4): fwd / dx launch
//     bound. LN_PREFETCH (0): fwd, the next row's loads issued before this row's
//     reductions. LN_FUSED_BLOCKS (2): ln_bwd_fused's launch bound (its grid: SMs x it).
//   LN_FUSED_NV (LN_NV): ln_bwd_fused's vectors per thread: its group size (ln_group
//     with LN_FUSED_NV), its register arrays (row and partials: 4 x LN_FUSED_NV x V
//     floats' worth) and its register-path limit nv <= blockDim.x * LN_FUSED_NV (2: bf16
//     d = 4096 by a whole block, 2 vectors per thread; bf16 d > 4096 then writes NaN
//     partials, so the launcher's fused gate must use LN_FUSED_NV).
//   LN_BWD_PREFETCH (0): 1: ln_bwd_fused, 2: ln_bwd_fused and ln_bwd_dx load the next
//     row's dy, x, mean, rstd (into registers) before this row's reductions, so that
//     loads stay in flight through them (twice the row registers). Same results.
//   LN_STREAM (2): the forward loads x with ld.global.nc.L1::no_allocate and stores y
//     with st.global.cs: 0 never, 1 always, 2 for rows of at least 8 KiB. On the H200
//     (2026-12-03) 1 took bf16 8192 x 4096 in 0.0405 ms against 0.0426 with 0, but
//     8192 x 768 in 0.0114 against 0.0104; hence 2.
//   LN_PAIR_SUM (1): the backward's two row sums (sum g, sum g * xh) reduced together,
//     one pair of barriers instead of two; each is added in the same order, so the
//     results are bit for bit those of 0 (the sums one after the other). On the H200
//     (kernels/checks/train_kernels_check.py, 2026-12-02) the bf16 backward at 8192 x
//     4096 took 0.0909 ms with it against 0.0942 without, at 8192 x 768 0.0348 against
//     0.0355; the other variants listed there were no faster.
//   ln_fwd_bulk's LN_FWD_BULK_THREADS (256) its block, LN_FWD_BULK_NV (16) most vectors
//     per thread, LN_FWD_BULK_S (12) most ring stages; ln_bwd_bulk's LN_BWD_BULK_THREADS
//     (256), LN_BWD_BULK_NV (4), LN_BWD_BULK_S (12). The launcher's constants in
//     ops/src/norm/cuda.rs follow the defaults.

#include "common.cuh"

using namespace rtx;

#ifndef LN_NV
#define LN_NV 4  // most 16-byte vectors of a row per thread
#endif
#ifndef LN_MIN_BLOCKS
#define LN_MIN_BLOCKS 4  // fwd, dx: at most 64 registers (no spills seen at this cap)
#endif
#ifndef LN_PREFETCH
#define LN_PREFETCH 0  // fwd: load the next row before reducing this one
#endif
// ln_bwd_fused's shared row of partials: the longest register-path row (8 elements per
// vector), at most 32 KiB.
#define LN_RED (RTX_BLOCK * LN_NV * 8 < 8192 ? RTX_BLOCK * LN_NV * 8 : 8192)
#ifndef LN_FUSED_BLOCKS
#define LN_FUSED_BLOCKS 2  // ln_bwd_fused: blocks per SM (its grid; at most 128 registers)
#endif
#ifndef LN_BWD_PREFETCH
#define LN_BWD_PREFETCH 0  // 1: ln_bwd_fused, 2: and ln_bwd_dx, load the next row before reducing this one
#endif
#ifndef LN_FUSED_NV
#define LN_FUSED_NV LN_NV  // ln_bwd_fused: most 16-byte vectors of a row per thread
#endif
#ifndef LN_PAIR_SUM
#define LN_PAIR_SUM 1  // ln_bwd_fused, ln_bwd_dx: the row's two sums reduced together
#endif

namespace {

// Row groups: a row is taken by a group of gn threads (a power of two, 32 <= gn <=
// blockDim.x): the fewest that hold the row at LN_NV vectors per thread, so that each
// thread keeps several 16-byte loads in flight and a block works on blockDim.x / gn rows
// at once. Group gi of the block is warps [gi * gn / 32, (gi + 1) * gn / 32).
__device__ __forceinline__ unsigned ln_group(size_t nv, unsigned per_thread = LN_NV) {
    unsigned gn = 32;
    while (gn < blockDim.x && (size_t)gn * per_thread < nv) gn *= 2;
    return gn;
}

__device__ __forceinline__ void group_bar(unsigned gi, unsigned gn) {
    // Named barrier 1 + gi over the group's gn threads (0 is __syncthreads's).
    asm volatile("bar.sync %0, %1;" ::"r"(1 + gi), "r"(gn) : "memory");
}

// Sum of v over the group (every thread of it gets the sum; the same order every time).
// sm: 32 floats of shared memory for the block.
__device__ __forceinline__ float group_sum(float v, unsigned gi, unsigned gn, float* sm) {
    v = warp_reduce(v, AddOp());
    if (gn == 32) return v;
    const unsigned w0 = gi * (gn >> 5), nw = gn >> 5;
    if (gn == blockDim.x) __syncthreads(); else group_bar(gi, gn);  // earlier reads of sm done
    if (lane_id() == 0) sm[threadIdx.x >> 5] = v;
    if (gn == blockDim.x) __syncthreads(); else group_bar(gi, gn);
    float t = 0.0f;
    for (unsigned k = 0; k < nw; ++k) t += sm[w0 + k];
    return t;
}

// group_sum of a and of b at once (one pair of barriers instead of two), each summed in
// group_sum's order, so the results are bit for bit group_sum's. sm: 64 floats.
__device__ __forceinline__ void group_sum2(float& a, float& b, unsigned gi, unsigned gn, float* sm) {
    a = warp_reduce(a, AddOp());
    b = warp_reduce(b, AddOp());
    if (gn == 32) return;
    const unsigned w0 = gi * (gn >> 5), nw = gn >> 5;
    if (gn == blockDim.x) __syncthreads(); else group_bar(gi, gn);
    if (lane_id() == 0) { sm[threadIdx.x >> 5] = a; sm[32 + (threadIdx.x >> 5)] = b; }
    if (gn == blockDim.x) __syncthreads(); else group_bar(gi, gn);
    float ta = 0.0f, tb = 0.0f;
    for (unsigned k = 0; k < nw; ++k) { ta += sm[w0 + k]; tb += sm[32 + w0 + k]; }
    a = ta;
    b = tb;
}

// ---- row in registers -----------------------------------------------------------------

#ifndef LN_STREAM
#define LN_STREAM 2  // fwd: 0 plain, 1 streaming loads / stores, 2 streaming for rows >= 8 KiB
#endif
// The forward's streaming access (LN_STREAM): x loaded without L1 allocation, y stored
// with .cs (evict first); `on` is uniform over the grid (it depends on the row length).
__device__ __forceinline__ bool ln_stream_rows(size_t nv) {
#if LN_STREAM == 1
    return true;
#elif LN_STREAM == 2
    return nv * 16 >= 8192;
#else
    return false;
#endif
}
__device__ __forceinline__ uint4 ln_ld_stream(const void* p, bool on) {
    if (!on) return ldg16(p);
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ void ln_st_stream(void* p, uint4 v, bool on) {
    if (!on) {
        st16(p, v);
        return;
    }
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

template <typename T>
__device__ __forceinline__ void ln_load_row(const T* xr, size_t nv, unsigned gl, unsigned gn, uint4* raw,
                                            bool stream = false) {
    constexpr int V = Ty<T>::V;
#pragma unroll
    for (int k = 0; k < LN_NV; ++k) {
        const size_t i = gl + (size_t)k * gn;
        if (i < nv) raw[k] = ln_ld_stream(xr + i * V, stream);
    }
}

// y = (x - mu) * r * gamma + beta for this thread's NV vectors of the row (raw: vector gl
// + k * gn at k), stored with ln_st_stream.
template <typename T, int NV>
__device__ __forceinline__ void ln_store_row(const uint4* raw, const T* gamma, const T* beta, T* yr, size_t nv,
                                             unsigned gl, unsigned gn, float mu, float r, bool stream) {
    constexpr int V = Ty<T>::V;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const size_t i = gl + (size_t)k * gn;
        if (i < nv) {
            float f[V], g[V], b[V];
            Ty<T>::unpack(raw[k], f);
            load_vec<T, V>(gamma + i * V, g);
            load_vec<T, V>(beta + i * V, b);
#pragma unroll
            for (int e = 0; e < V; ++e) f[e] = (f[e] - mu) * r * g[e] + b[e];
            ln_st_stream(yr + i * V, Ty<T>::pack(f), stream);
        }
    }
}

// One row of the forward by a group of `gn` threads (lane `gl`), nv = d / V vectors, the
// row already in `raw` (ln_load_row).
template <typename T>
__device__ __forceinline__ void ln_fwd_row(const uint4* raw, const T* gamma, const T* beta, T* yr, size_t nv,
                                           float inv_d, float eps, unsigned gl, unsigned gi, unsigned gn,
                                           float* sm, float& mu, float& r, bool stream = false) {
    constexpr int V = Ty<T>::V;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < LN_NV; ++k) {
        if (gl + (size_t)k * gn < nv) {
            float f[V];
            Ty<T>::unpack(raw[k], f);
#pragma unroll
            for (int e = 0; e < V; ++e) s += f[e];
        }
    }
    mu = group_sum(s, gi, gn, sm) * inv_d;
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < LN_NV; ++k) {
        if (gl + (size_t)k * gn < nv) {
            float f[V];
            Ty<T>::unpack(raw[k], f);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float c = f[e] - mu;
                q += c * c;
            }
        }
    }
    r = rsqrtf(group_sum(q, gi, gn, sm) * inv_d + eps);
    ln_store_row<T, LN_NV>(raw, gamma, beta, yr, nv, gl, gn, mu, r, stream);
}

// The row's dy and x vectors this thread holds (NV per thread, as ln_load_row).
template <typename T, int NV>
__device__ __forceinline__ void ln_load_dx(const T* dyr, const T* xr, size_t nv, unsigned gl, unsigned gn,
                                           uint4* rdy, uint4* rx) {
    constexpr int V = Ty<T>::V;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const size_t i = gl + (size_t)k * gn;
        if (i < nv) {
            rdy[k] = ldg16(dyr + i * V);
            rx[k] = ldg16(xr + i * V);
        }
    }
}

// One row of dx by a group of `gn` threads (lane `gl`), its dy and x already in rdy, rx
// (ln_load_dx, NV vectors per thread). With ACC, also adds the row's dy * xh and dy to
// ag, ab (this thread's columns: vector gl + k * gn, element e). sm: 32 floats (64 with
// LN_PAIR_SUM). gamma is read from global memory, or with GK from this thread's shared
// slots gk (its vector k at gk[k * blockDim.x], ln_bwd_pipe's layout).
template <typename T, bool ACC, int NV, bool GK = false>
__device__ __forceinline__ void ln_dx_regs(const uint4* rdy, const uint4* rx, const T* gamma, T* dxr, size_t nv,
                                           float inv_d, float m, float rs, unsigned gl, unsigned gi, unsigned gn,
                                           float* sm, float (*ag)[Ty<T>::V], float (*ab)[Ty<T>::V],
                                           const uint4* gk = nullptr) {
    constexpr int V = Ty<T>::V;
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const size_t i = gl + (size_t)k * gn;
        if (i < nv) {
            float fd[V], fx[V], g[V];
            Ty<T>::unpack(rdy[k], fd);
            Ty<T>::unpack(rx[k], fx);
            if constexpr (GK) Ty<T>::unpack(gk[k * blockDim.x], g);
            else load_vec<T, V>(gamma + i * V, g);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float gg = fd[e] * g[e];
                sg += gg;
                sgx += gg * (fx[e] - m) * rs;
            }
        }
    }
#if LN_PAIR_SUM
    group_sum2(sg, sgx, gi, gn, sm);
    const float mg = sg * inv_d;
    const float mgx = sgx * inv_d;
#else
    const float mg = group_sum(sg, gi, gn, sm) * inv_d;
    const float mgx = group_sum(sgx, gi, gn, sm) * inv_d;
#endif
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const size_t i = gl + (size_t)k * gn;
        if (i < nv) {
            float fd[V], fx[V], g[V];
            Ty<T>::unpack(rdy[k], fd);
            Ty<T>::unpack(rx[k], fx);
            if constexpr (GK) Ty<T>::unpack(gk[k * blockDim.x], g);
            else load_vec<T, V>(gamma + i * V, g);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float gg = fd[e] * g[e];
                const float xh = (fx[e] - m) * rs;
                if constexpr (ACC) {
                    ag[k][e] += fd[e] * xh;
                    ab[k][e] += fd[e];
                }
                fd[e] = rs * (gg - mg - xh * mgx);
            }
            store_vec<T, V>(dxr + i * V, fd);
        }
    }
}

// One row of dx by a group of `gn` threads (lane `gl`), NV vectors per thread. With ACC, also adds the row's
// dy * xh and dy to ag, ab (this thread's columns: vector gl + k * gn, element e).
template <typename T, bool ACC, int NV = LN_NV>
__device__ __forceinline__ void ln_dx_row(const T* dyr, const T* xr, const T* gamma, T* dxr, size_t nv,
                                          float inv_d, float m, float rs, unsigned gl, unsigned gi, unsigned gn,
                                          float* sm, float (*ag)[Ty<T>::V], float (*ab)[Ty<T>::V]) {
    constexpr int V = Ty<T>::V;
    uint4 rdy[NV], rx[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const size_t i = gl + (size_t)k * gn;
        if (i < nv) {
            rdy[k] = ldg16(dyr + i * V);
            rx[k] = ldg16(xr + i * V);
        }
    }
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const size_t i = gl + (size_t)k * gn;
        if (i < nv) {
            float fd[V], fx[V], g[V];
            Ty<T>::unpack(rdy[k], fd);
            Ty<T>::unpack(rx[k], fx);
            load_vec<T, V>(gamma + i * V, g);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float gg = fd[e] * g[e];
                sg += gg;
                sgx += gg * (fx[e] - m) * rs;
            }
        }
    }
#if LN_PAIR_SUM
    group_sum2(sg, sgx, gi, gn, sm);
    const float mg = sg * inv_d;
    const float mgx = sgx * inv_d;
#else
    const float mg = group_sum(sg, gi, gn, sm) * inv_d;
    const float mgx = group_sum(sgx, gi, gn, sm) * inv_d;
#endif
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const size_t i = gl + (size_t)k * gn;
        if (i < nv) {
            float fd[V], fx[V], g[V];
            Ty<T>::unpack(rdy[k], fd);
            Ty<T>::unpack(rx[k], fx);
            load_vec<T, V>(gamma + i * V, g);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float gg = fd[e] * g[e];
                const float xh = (fx[e] - m) * rs;
                if constexpr (ACC) {
                    ag[k][e] += fd[e] * xh;
                    ab[k][e] += fd[e];
                }
                fd[e] = rs * (gg - mg - xh * mgx);
            }
            store_vec<T, V>(dxr + i * V, fd);
        }
    }
}

// Row blockIdx.x of part_g / part_b set to NaN: a partial-sums kernel handed rows it does
// not take (the launcher never does) poisons dgamma and dbeta instead of leaving them unset.
__device__ __forceinline__ void ln_nan_partials(float* part_g, float* part_b, size_t d) {
    for (size_t j = threadIdx.x; j < d; j += blockDim.x) {
        part_g[blockIdx.x * d + j] = __int_as_float(0x7fc00000);
        part_b[blockIdx.x * d + j] = __int_as_float(0x7fc00000);
    }
}

// The block's parameter-gradient partials out (ln_bwd_fused, ln_bwd_pipe): the groups'
// sums ag, ab (NV vectors per thread, as ln_dx_regs adds them) are added in group order
// into red (d floats of shared memory), then written to row blockIdx.x of part_g /
// part_b. Every thread of the block calls it (block barriers).
template <typename T, int NV>
__device__ __forceinline__ void ln_write_partials(const float (*ag)[Ty<T>::V], const float (*ab)[Ty<T>::V],
                                                  float* red, float* part_g, float* part_b, size_t nv, size_t d,
                                                  unsigned gl, unsigned gi, unsigned gn, unsigned gpb) {
    constexpr int V = Ty<T>::V;
    for (int which = 0; which < 2; ++which) {
        for (unsigned g = 0; g < gpb; ++g) {
            if (gi == g) {
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    const size_t i = gl + (size_t)k * gn;
                    if (i < nv) {
#pragma unroll
                        for (int e = 0; e < V; ++e) {
                            const float a = which == 0 ? ag[k][e] : ab[k][e];
                            red[i * V + e] = g == 0 ? a : red[i * V + e] + a;
                        }
                    }
                }
            }
            __syncthreads();
        }
        float* part = which == 0 ? part_g : part_b;
        for (size_t j = threadIdx.x; j < d; j += blockDim.x) part[blockIdx.x * d + j] = red[j];
        __syncthreads();
    }
}

// LN_BWD_PREFETCH's loop: rows row0, row0 + stride, ... below rows of dx (and with ACC
// the sums of ln_dx_regs) by a group of `gn` threads (lane `gl`), NV vectors per thread;
// the next row's dy, x, mean and rstd are loaded before this row's reductions (twice
// the row registers), so that loads stay in flight through them.
template <typename T, bool ACC, int NV>
__device__ __forceinline__ void ln_dx_rows_prefetch(const T* dy, const T* x, const float* mean, const float* rstd,
                                           const T* gamma, T* dx, size_t rows, size_t d, size_t row0,
                                           size_t stride, size_t nv, float inv_d, unsigned gl, unsigned gi,
                                           unsigned gn, float* sm, float (*ag)[Ty<T>::V],
                                           float (*ab)[Ty<T>::V]) {
    uint4 rdy[NV], rx[NV];
    float m = 0.0f, rs = 0.0f;
    if (row0 < rows) {
        ln_load_dx<T, NV>(dy + row0 * d, x + row0 * d, nv, gl, gn, rdy, rx);
        m = __ldg(mean + row0);
        rs = __ldg(rstd + row0);
    }
    for (size_t row = row0; row < rows; row += stride) {
        uint4 ndy[NV], nx[NV];
        float nm = 0.0f, nrs = 0.0f;
        const size_t nr = row + stride;
        if (nr < rows) {
            ln_load_dx<T, NV>(dy + nr * d, x + nr * d, nv, gl, gn, ndy, nx);
            nm = __ldg(mean + nr);
            nrs = __ldg(rstd + nr);
        }
        ln_dx_regs<T, ACC, NV>(rdy, rx, gamma, dx + row * d, nv, inv_d, m, rs, gl, gi, gn, sm, ag, ab);
#pragma unroll
        for (int k = 0; k < NV; ++k) { rdy[k] = ndy[k]; rx[k] = nx[k]; }
        m = nm;
        rs = nrs;
    }
}

// ---- scalar fallback (a block per row) --------------------------------------------------

template <typename T>
__device__ __forceinline__ void ln_fwd_scalar(const T* xr, const T* gamma, const T* beta, T* yr, size_t d,
                                              float inv_d, float eps, float& mu, float& r) {
    const unsigned t = threadIdx.x, nt = blockDim.x;
    float s = 0.0f;
    for (size_t j = t; j < d; j += nt) s += Ty<T>::load(xr + j);
    mu = block_reduce(s, AddOp(), 0.0f) * inv_d;
    float q = 0.0f;
    for (size_t j = t; j < d; j += nt) {
        const float c = Ty<T>::load(xr + j) - mu;
        q += c * c;
    }
    r = rsqrtf(block_reduce(q, AddOp(), 0.0f) * inv_d + eps);
    for (size_t j = t; j < d; j += nt)
        Ty<T>::store(yr + j, (Ty<T>::load(xr + j) - mu) * r * Ty<T>::load(gamma + j) + Ty<T>::load(beta + j));
}

template <typename T>
__device__ __forceinline__ void ln_dx_scalar(const T* dyr, const T* xr, const T* gamma, T* dxr, size_t d,
                                             float inv_d, float m, float rs) {
    const unsigned t = threadIdx.x, nt = blockDim.x;
    float sg = 0.0f, sgx = 0.0f;
    for (size_t j = t; j < d; j += nt) {
        const float g = Ty<T>::load(dyr + j) * Ty<T>::load(gamma + j);
        sg += g;
        sgx += g * (Ty<T>::load(xr + j) - m) * rs;
    }
    const float mg = block_reduce(sg, AddOp(), 0.0f) * inv_d;
    const float mgx = block_reduce(sgx, AddOp(), 0.0f) * inv_d;
    for (size_t j = t; j < d; j += nt) {
        const float g = Ty<T>::load(dyr + j) * Ty<T>::load(gamma + j);
        const float xh = (Ty<T>::load(xr + j) - m) * rs;
        Ty<T>::store(dxr + j, rs * (g - mg - xh * mgx));
    }
}

// ---- kernels ------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ void ln_fwd(const T* x, const T* gamma, const T* beta, T* y, float* mean,
                                       float* rstd, size_t rows, size_t d, float eps) {
    constexpr int V = Ty<T>::V;
    const float inv_d = 1.0f / (float)d;
    const bool vec = d % V == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) && aligned16(beta);
    const size_t nv = d / V;
    if (vec && nv <= (size_t)blockDim.x * LN_NV) {
        __shared__ float sm[32];
        const unsigned gn = ln_group(nv), gpb = blockDim.x / gn, gi = threadIdx.x / gn, gl = threadIdx.x % gn;
        const size_t stride = (size_t)gridDim.x * gpb;
        const bool stream = ln_stream_rows(nv);
        size_t row = (size_t)blockIdx.x * gpb + gi;
#if LN_PREFETCH
        // The next row's loads are issued before this row's reductions.
        uint4 raw[LN_NV];
        if (row < rows) ln_load_row<T>(x + row * d, nv, gl, gn, raw, stream);
        for (; row < rows; row += stride) {
            uint4 nxt[LN_NV];
            if (row + stride < rows) ln_load_row<T>(x + (row + stride) * d, nv, gl, gn, nxt, stream);
            float mu, r;
            ln_fwd_row<T>(raw, gamma, beta, y + row * d, nv, inv_d, eps, gl, gi, gn, sm, mu, r, stream);
            if (gl == 0) { mean[row] = mu; rstd[row] = r; }
#pragma unroll
            for (int k = 0; k < LN_NV; ++k) raw[k] = nxt[k];
        }
#else
        for (; row < rows; row += stride) {
            uint4 raw[LN_NV];
            ln_load_row<T>(x + row * d, nv, gl, gn, raw, stream);
            float mu, r;
            ln_fwd_row<T>(raw, gamma, beta, y + row * d, nv, inv_d, eps, gl, gi, gn, sm, mu, r, stream);
            if (gl == 0) { mean[row] = mu; rstd[row] = r; }
        }
#endif
    } else {
        for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
            float mu, r;
            ln_fwd_scalar<T>(x + row * d, gamma, beta, y + row * d, d, inv_d, eps, mu, r);
            if (threadIdx.x == 0) { mean[row] = mu; rstd[row] = r; }
        }
    }
}

}  // namespace

// ln_bwd_dx, ln_bwd_part, ln_bwd_fused, ln_bwd_final: norm_bwd.cuh (it uses the helpers
// above).
#include "norm_bwd.cuh"

// ln_bwd_pipe, the backward on a cp.async ring: norm_ring.cuh (it uses the helpers above).
#include "norm_ring.cuh"

// ln_fwd_bulk, ln_bwd_bulk, on rings of bulk copies: norm_bulk.cuh. Before sm_90 (no bulk
// copies) their entry points run ln_fwd's code and write NaN partials (the launcher never
// takes them there).
#include "norm_bulk.cuh"
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define LN_FWD_BULK_BODY(T) ln_fwd_bulk<T>(x, gamma, beta, y, mean, rstd, rows, d, eps)
#define LN_BWD_BULK_BODY(T) ln_bwd_bulk<T>(dy, x, mean, rstd, gamma, dx, part_g, part_b, rows, d)
#else
#define LN_FWD_BULK_BODY(T) ln_fwd<T>(x, gamma, beta, y, mean, rstd, rows, d, eps)
#define LN_BWD_BULK_BODY(T) ln_nan_partials(part_g, part_b, d)
#endif

#define RTX_LN_BULK(dt, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(LN_FWD_BULK_THREADS, 1)                       \
        ln_fwd_bulk_##dt(const T* x, const T* gamma, const T* beta, T* y, float* mean,         \
                         float* rstd, size_t rows, size_t d, float eps) {                      \
        LN_FWD_BULK_BODY(T);                                                                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(LN_BWD_BULK_THREADS, 1)                       \
        ln_bwd_bulk_##dt(const T* dy, const T* x, const float* mean, const float* rstd,        \
                         const T* gamma, T* dx, float* part_g, float* part_b, size_t rows,     \
                         size_t d) {                                                           \
        LN_BWD_BULK_BODY(T);                                                                   \
    }
RTX_LN_BULK(f32, float)
RTX_LN_BULK(f16, __half)
RTX_LN_BULK(bf16, __nv_bfloat16)

#define RTX_LN(dt, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK, LN_MIN_BLOCKS)                     \
        ln_fwd_##dt(const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd, \
                    size_t rows, size_t d, float eps) {                                        \
        ln_fwd<T>(x, gamma, beta, y, mean, rstd, rows, d, eps);                                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK, LN_MIN_BLOCKS)                     \
        ln_bwd_dx_##dt(const T* dy, const T* x, const float* mean, const float* rstd,          \
                       const T* gamma, T* dx, size_t rows, size_t d) {                         \
        ln_bwd_dx<T>(dy, x, mean, rstd, gamma, dx, rows, d);                                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ln_bwd_part_##dt(const T* dy, const T* x, const float* mean, const float* rstd,        \
                         float* part_g, float* part_b, size_t rows, size_t d, size_t rpc) {    \
        ln_bwd_part<T>(dy, x, mean, rstd, part_g, part_b, rows, d, rpc);                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK, LN_FUSED_BLOCKS)                   \
        ln_bwd_fused_##dt(const T* dy, const T* x, const float* mean, const float* rstd,       \
                          const T* gamma, T* dx, float* part_g, float* part_b, size_t rows,    \
                          size_t d) {                                                          \
        ln_bwd_fused<T>(dy, x, mean, rstd, gamma, dx, part_g, part_b, rows, d);                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(LN_FINAL_BLOCK)                               \
        ln_bwd_final_##dt(const float* part_g, const float* part_b, T* dgamma, T* dbeta,       \
                          size_t chunks, size_t d) {                                           \
        ln_bwd_final<T>(part_g, part_b, dgamma, dbeta, chunks, d);                             \
    }

#define LN_FINAL_BLOCK 1024  // ln_bwd_final's block (32 chunk lanes x 32 columns)
#define RTX_LN_PIPE(dt, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK, LN_BPIPE_BLOCKS)                   \
        ln_bwd_pipe_##dt(const T* dy, const T* x, const float* mean, const float* rstd,        \
                         const T* gamma, T* dx, float* part_g, float* part_b, size_t rows,     \
                         size_t d) {                                                           \
        ln_bwd_pipe<T, LN_BPIPE_NV, LN_BPIPE_S>(dy, x, mean, rstd, gamma, dx, part_g, part_b,  \
                                                rows, d);                                      \
    }

RTX_LN_PIPE(f32, float)
RTX_LN_PIPE(f16, __half)
RTX_LN_PIPE(bf16, __nv_bfloat16)

RTX_LN(f32, float)
RTX_LN(f16, __half)
RTX_LN(bf16, __nv_bfloat16)
