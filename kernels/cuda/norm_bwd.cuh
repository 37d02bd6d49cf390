// norm_bwd.cuh — layer norm's backward kernels off the rings (ln_bwd_dx, ln_bwd_part,
// ln_bwd_fused, ln_bwd_final), a part of norm.cu: included by it after its row helpers
// (ln_group, group_sum2, ln_dx_row, ln_dx_scalar, ln_write_partials, ...), whose unnamed
// namespace it reopens. norm.cu's header documents the kernels and defines the entry
// points.
#pragma once

namespace {

template <typename T>
__device__ __forceinline__ void ln_bwd_dx(const T* dy, const T* x, const float* mean, const float* rstd,
                                          const T* gamma, T* dx, size_t rows, size_t d) {
    constexpr int V = Ty<T>::V;
    const float inv_d = 1.0f / (float)d;
    const bool vec = d % V == 0 && aligned16(dy) && aligned16(x) && aligned16(dx) && aligned16(gamma);
    const size_t nv = d / V;
    if (vec && nv <= (size_t)blockDim.x * LN_NV) {
        __shared__ float sm[LN_PAIR_SUM ? 64 : 32];
        const unsigned gn = ln_group(nv), gpb = blockDim.x / gn, gi = threadIdx.x / gn, gl = threadIdx.x % gn;
#if LN_BWD_PREFETCH >= 2
        ln_dx_rows_prefetch<T, false, LN_NV>(dy, x, mean, rstd, gamma, dx, rows, d, (size_t)blockIdx.x * gpb + gi,
                                             (size_t)gridDim.x * gpb, nv, inv_d, gl, gi, gn, sm, nullptr, nullptr);
#else
        for (size_t row = (size_t)blockIdx.x * gpb + gi; row < rows; row += (size_t)gridDim.x * gpb) {
            const size_t o = row * d;
            ln_dx_row<T, false>(dy + o, x + o, gamma, dx + o, nv, inv_d, __ldg(mean + row), __ldg(rstd + row), gl,
                                gi, gn, sm, nullptr, nullptr);
        }
#endif
    } else {
        for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
            const size_t o = row * d;
            ln_dx_scalar<T>(dy + o, x + o, gamma, dx + o, d, inv_d, __ldg(mean + row), __ldg(rstd + row));
        }
    }
}

template <typename T>
__device__ __forceinline__ void ln_bwd_part(const T* dy, const T* x, const float* mean, const float* rstd,
                                            float* part_g, float* part_b, size_t rows, size_t d, size_t rpc) {
    constexpr int V = Ty<T>::V;
    const size_t r0 = (size_t)blockIdx.y * rpc;
    const size_t r1 = r0 + rpc < rows ? r0 + rpc : rows;
    const size_t c0 = (size_t)blockIdx.x * blockDim.x;  // the block's first column
    const bool vec = d % V == 0 && aligned16(dy) && aligned16(x) && blockDim.x <= RTX_BLOCK;
    if (!vec) {
        const size_t j = c0 + threadIdx.x;
        if (j >= d) return;
        float ag = 0.0f, ab = 0.0f;
        for (size_t r = r0; r < r1; ++r) {
            const float g = Ty<T>::load(dy + r * d + j);
            ag += g * (Ty<T>::load(x + r * d + j) - __ldg(mean + r)) * __ldg(rstd + r);
            ab += g;
        }
        part_g[blockIdx.y * d + j] = ag;
        part_b[blockIdx.y * d + j] = ab;
        return;
    }
    // V row groups of blockDim.x / V threads; thread (rg, cv) sums columns
    // c0 + cv * V .. + V over rows r0 + rg, r0 + rg + V, ...
    __shared__ float s_g[V][RTX_BLOCK], s_b[V][RTX_BLOCK];
    const unsigned vpb = blockDim.x / V, rg = threadIdx.x / vpb, cv = threadIdx.x % vpb;
    const size_t j0 = c0 + (size_t)cv * V;
    float ag[V], ab[V];
#pragma unroll
    for (int e = 0; e < V; ++e) { ag[e] = 0.0f; ab[e] = 0.0f; }
    if (rg < V && j0 < d) {
        size_t r = r0 + rg;
        for (; r + V < r1; r += 2 * V) {
            float g0[V], x0[V], g1[V], x1[V];
            load_vec<T, V>(dy + r * d + j0, g0);
            load_vec<T, V>(x + r * d + j0, x0);
            load_vec<T, V>(dy + (r + V) * d + j0, g1);
            load_vec<T, V>(x + (r + V) * d + j0, x1);
            const float m0 = __ldg(mean + r), s0 = __ldg(rstd + r);
            const float m1 = __ldg(mean + r + V), s1 = __ldg(rstd + r + V);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                ag[e] += g0[e] * (x0[e] - m0) * s0;
                ab[e] += g0[e];
                ag[e] += g1[e] * (x1[e] - m1) * s1;
                ab[e] += g1[e];
            }
        }
        for (; r < r1; r += V) {
            float g0[V], x0[V];
            load_vec<T, V>(dy + r * d + j0, g0);
            load_vec<T, V>(x + r * d + j0, x0);
            const float m0 = __ldg(mean + r), s0 = __ldg(rstd + r);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                ag[e] += g0[e] * (x0[e] - m0) * s0;
                ab[e] += g0[e];
            }
        }
    }
    if (rg < V) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
            s_g[rg][cv * V + e] = ag[e];
            s_b[rg][cv * V + e] = ab[e];
        }
    }
    __syncthreads();
    const size_t j = c0 + threadIdx.x;
    if (threadIdx.x < vpb * V && j < d) {
        float sg = 0.0f, sb = 0.0f;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            sg += s_g[k][threadIdx.x];
            sb += s_b[k][threadIdx.x];
        }
        part_g[blockIdx.y * d + j] = sg;
        part_b[blockIdx.y * d + j] = sb;
    }
}

// dx and the block's parameter-gradient partials in one pass over dy and x: each thread
// sums dy * xh and dy over the rows its group takes, for its own columns, in registers;
// the block's groups are combined in group order through shared memory and written to
// part_g / part_b row blockIdx.x. Needs the register path (d % V == 0, 16-byte aligned
// rows, nv <= blockDim.x * LN_NV); otherwise it writes NaN partials (the launcher takes
// the three-kernel path then).
template <typename T>
__device__ __forceinline__ void ln_bwd_fused(const T* dy, const T* x, const float* mean, const float* rstd,
                                             const T* gamma, T* dx, float* part_g, float* part_b, size_t rows,
                                             size_t d) {
    constexpr int V = Ty<T>::V;
    const float inv_d = 1.0f / (float)d;
    const bool vec = d % V == 0 && aligned16(dy) && aligned16(x) && aligned16(dx) && aligned16(gamma);
    const size_t nv = d / V;
    __shared__ float red[LN_RED];
    if (!(vec && nv <= (size_t)blockDim.x * LN_FUSED_NV && d <= LN_RED)) {
        ln_nan_partials(part_g, part_b, d);
        return;
    }
    __shared__ float sm[LN_PAIR_SUM ? 64 : 32];
    const unsigned gn = ln_group(nv, LN_FUSED_NV), gpb = blockDim.x / gn, gi = threadIdx.x / gn,
                   gl = threadIdx.x % gn;
    float ag[LN_FUSED_NV][V], ab[LN_FUSED_NV][V];
#pragma unroll
    for (int k = 0; k < LN_FUSED_NV; ++k)
#pragma unroll
        for (int e = 0; e < V; ++e) { ag[k][e] = 0.0f; ab[k][e] = 0.0f; }
#if LN_BWD_PREFETCH
    ln_dx_rows_prefetch<T, true, LN_FUSED_NV>(dy, x, mean, rstd, gamma, dx, rows, d, (size_t)blockIdx.x * gpb + gi,
                                              (size_t)gridDim.x * gpb, nv, inv_d, gl, gi, gn, sm, ag, ab);
#else
    for (size_t row = (size_t)blockIdx.x * gpb + gi; row < rows; row += (size_t)gridDim.x * gpb) {
        const size_t o = row * d;
        ln_dx_row<T, true, LN_FUSED_NV>(dy + o, x + o, gamma, dx + o, nv, inv_d, __ldg(mean + row),
                                        __ldg(rstd + row), gl, gi, gn, sm, ag, ab);
    }
#endif
    ln_write_partials<T, LN_FUSED_NV>(ag, ab, red, part_g, part_b, nv, d, gl, gi, gn, gpb);
}

// The chunks' partials summed in chunk order, in f64. Block: up to 1024 threads = L
// chunk lanes (L = blockDim.x / 32, at most 32) x 32 columns; chunk lane c sums chunks c,
// c + L, ... (8 loads in flight per thread); the L lane sums are added in lane order.
// Column tiles of 32, grid-stride (any grid; best ceil(d / 32)). The launcher uses 1024
// threads (LN_FINAL_BLOCK): the partial rows are read by 32 lanes at once, not 8.
template <typename T>
__device__ __forceinline__ void ln_bwd_final(const float* part_g, const float* part_b, T* dgamma, T* dbeta,
                                             size_t chunks, size_t d) {
    __shared__ double sg[32][32], sb[32][32];
    const unsigned cl = threadIdx.x >> 5, jl = threadIdx.x & 31u;
    const unsigned lanes = (blockDim.x >> 5) < 32 ? (blockDim.x >> 5) : 32;
    for (size_t tile = blockIdx.x; tile * 32 < d; tile += gridDim.x) {
        const size_t j = tile * 32 + jl;
        double ag = 0.0, ab = 0.0;
        if (j < d && cl < lanes) {
#pragma unroll 4
            for (size_t c = cl; c < chunks; c += lanes) {
                ag += part_g[c * d + j];
                ab += part_b[c * d + j];
            }
        }
        if (cl < lanes) { sg[cl][jl] = ag; sb[cl][jl] = ab; }
        __syncthreads();
        if (cl == 0 && j < d) {
            double tg = 0.0, tb = 0.0;
            for (unsigned k = 0; k < lanes; ++k) { tg += sg[k][jl]; tb += sb[k][jl]; }
            Ty<T>::store(dgamma + j, (float)tg);
            Ty<T>::store(dbeta + j, (float)tb);
        }
        __syncthreads();
    }
}

}  // namespace
