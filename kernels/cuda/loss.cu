// loss.cu — fused cross-entropy forward and backward over [rows, cols] logits.
//
// dt is f32 (T = float), f16 (T = __half) or bf16 (T = __nv_bfloat16), math in f32; lt
// is the label type, u32 (L = unsigned) or i32 (L = int). rows, cols < 2^31 (checked by
// the launcher). A row whose label equals `ignore` (when has_ignore != 0) is not
// counted. A counted label outside 0..cols is "bad": it is never used as an index (the
// gather is clamped to column 0). The CPU reference is ops/src/loss/cpu.rs.
//
// Block: 256 threads (RTX_BLOCK, required: the final combine uses 256 slots). A block
// per row (grid-stride over rows), online (max, sum) per thread in the log2 domain (one
// rescale per 4 vectors of 16 bytes, exp2 of x * log2(e)), merged over the block.
// 16-byte loads (4 in flight per thread) when x (and dx) are 16-byte aligned and
// cols % (16 / sizeof(T)) == 0.
//
// Forward:
//   extern "C" __global__ void ce_fwd_{dt}_{lt}(const T* x, const L* labels, float* lse,
//       float* loss, unsigned* bad, size_t rows, size_t cols, long long ignore,
//       int has_ignore, double* part_loss, unsigned* part_count, unsigned* part_bad,
//       unsigned* counter)
//   lse[r] = log(sum_c exp(x[r, c])) (stable); loss[0] = sum over counted rows of
//   (lse[r] - x[r, label[r]]) / counted rows (NaN when none counts, or when any is bad);
//   bad[0] = the number of bad labels. Deterministic: each block writes its partial sums
//   (f64 loss, u32 counts) to part_*[blockIdx.x]; the last block to finish (counter, an
//   integer atomic) combines them in a fixed tree and resets *counter to 0. Grid: at most
//   the size of part_* (the launcher's workspace, 1024); *counter must be 0 at launch
//   and no other launch may use the workspace concurrently (one per stream, in order).
//   Static shared memory: 4 KiB.
//
// Backward:
//   extern "C" __global__ void ce_bwd_{dt}_{lt}(const T* x, const L* labels,
//       const float* lse, T* dx, size_t rows, size_t cols, long long ignore,
//       int has_ignore, float scale)
//   dx[r, c] = (exp(x[r, c] - lse[r]) - (c == label[r])) * scale / count, where count is
//   the number of counted rows (each block counts them itself when has_ignore, else
//   rows); 0 for ignored rows, NaN for rows with a bad label. Grid: any size.
//
// No argument may overlap another (dx is not x).

#include "common.cuh"

using namespace rtx;

namespace {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }


#define CE_LOG2E 1.4426950408889634f
#define CE_LN2 0.6931471805599453f
#ifndef CE_U
#define CE_U 4  // 16-byte vectors per thread per step (loads in flight)
#endif

// Adds a chunk of K values, already scaled by log2(e), to the running (m, s) of a thread
// (the log2 domain: the values are 2^f, m their max, s = sum 2^(f - m)): one rescale per
// chunk. A NaN reaches s (2^NaN); -inf values add 0; m stays -inf while all are -inf.
template <int K>
__device__ __forceinline__ void push_chunk(float& m, float& s, const float* f) {
    float cm = f[0];
#pragma unroll
    for (int e = 1; e < K; ++e) cm = fmaxf(cm, f[e]);
    const float nm = fmaxf(m, cm);
    const float base = nm == neg_inf() ? 0.0f : nm;
    float add = 0.0f;
#pragma unroll
    for (int e = 0; e < K; ++e) add += exp2f(f[e] - base);
    s = s * exp2f(m - base) + add;
    m = nm;
}

// The log-sum-exp of one row, on every thread of the block.
template <typename T>
__device__ __forceinline__ float row_lse(const T* xr, size_t cols, bool vec) {
    constexpr int V = Ty<T>::V;
    const unsigned t = threadIdx.x, nt = blockDim.x;
    float m = neg_inf(), s = 0.0f;
    size_t done = 0;
    if (vec) {
        const size_t nv = cols / V;
        size_t i = t;
        for (; i + (CE_U - 1) * nt < nv; i += CE_U * nt) {
            uint4 raw[CE_U];
#pragma unroll
            for (int u = 0; u < CE_U; ++u) raw[u] = ldg16(xr + (i + u * nt) * V);
            float f[CE_U * V];
#pragma unroll
            for (int u = 0; u < CE_U; ++u) Ty<T>::unpack(raw[u], f + u * V);
#pragma unroll
            for (int e = 0; e < CE_U * V; ++e) f[e] *= CE_LOG2E;
            push_chunk<CE_U * V>(m, s, f);
        }
        for (; i < nv; i += nt) {
            float f[V];
            load_vec<T, V>(xr + i * V, f);
#pragma unroll
            for (int e = 0; e < V; ++e) f[e] *= CE_LOG2E;
            push_chunk<V>(m, s, f);
        }
        done = nv * V;
    }
    for (size_t j = done + t; j < cols; j += nt) {
        float f[1] = {Ty<T>::load(xr + j) * CE_LOG2E};
        push_chunk<1>(m, s, f);
    }
    const float bm = block_reduce(m, MaxOp(), neg_inf());
    const float base = bm == neg_inf() ? 0.0f : bm;
    const float bs = block_reduce(m == neg_inf() ? 0.0f : s * exp2f(m - base), AddOp(), 0.0f);
    return (bm + log2f(bs)) * CE_LN2;
}

__device__ __forceinline__ unsigned warp_sum_u32(unsigned v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RTX_FULL_MASK, v, o);
    return v;
}

// Sum of v over the block, on every thread.
__device__ __forceinline__ unsigned block_sum_u32(unsigned v) {
    __shared__ unsigned partial[32];
    v = warp_sum_u32(v);
    __syncthreads();
    if (lane_id() == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (lane_id() < (blockDim.x >> 5)) ? partial[lane_id()] : 0u;
    return warp_sum_u32(v);
}

template <typename T, typename L>
__device__ __forceinline__ void ce_fwd(const T* x, const L* labels, float* lse, float* loss, unsigned* bad,
                                       size_t rows, size_t cols, long long ignore, int has_ignore,
                                       double* part_loss, unsigned* part_count, unsigned* part_bad,
                                       unsigned* counter) {
    const unsigned t = threadIdx.x;
    const bool vec = aligned16(x) && cols % Ty<T>::V == 0;
    double my_loss = 0.0;
    unsigned my_count = 0, my_bad = 0;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        const float l = row_lse<T>(xr, cols, vec);
        if (t == 0) {
            lse[row] = l;
            const long long lab = (long long)labels[row];
            if (!(has_ignore && lab == ignore)) {
                const bool ok = lab >= 0 && lab < (long long)cols;
                my_count += 1;
                my_bad += ok ? 0u : 1u;
                my_loss += (double)l - (double)Ty<T>::load(xr + (ok ? (size_t)lab : 0));
            }
        }
    }
    __shared__ bool last;
    if (t == 0) {
        part_loss[blockIdx.x] = my_loss;
        part_count[blockIdx.x] = my_count;
        part_bad[blockIdx.x] = my_bad;
        __threadfence();
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // A fixed tree over the partials: the same order for the same grid, every run.
    __shared__ double s_loss[RTX_BLOCK];
    __shared__ unsigned s_count[RTX_BLOCK], s_bad[RTX_BLOCK];
    double a = 0.0;
    unsigned c = 0, b = 0;
    for (unsigned i = t; i < gridDim.x; i += blockDim.x) {
        a += __ldcg(part_loss + i);
        c += __ldcg(part_count + i);
        b += __ldcg(part_bad + i);
    }
    s_loss[t] = a; s_count[t] = c; s_bad[t] = b;
    __syncthreads();
    for (unsigned w = RTX_BLOCK / 2; w > 0; w >>= 1) {
        if (t < w) {
            s_loss[t] += s_loss[t + w];
            s_count[t] += s_count[t + w];
            s_bad[t] += s_bad[t + w];
        }
        __syncthreads();
    }
    if (t == 0) {
        const double mean = s_loss[0] / (double)s_count[0];  // 0 / 0 = NaN when none counts
        loss[0] = s_bad[0] != 0 ? __int_as_float(0x7fc00000) : (float)mean;
        bad[0] = s_bad[0];
        *counter = 0;
    }
}

template <typename T, typename L>
__device__ __forceinline__ void ce_bwd(const T* x, const L* labels, const float* lse, T* dx, size_t rows,
                                       size_t cols, long long ignore, int has_ignore, float scale) {
    constexpr int V = Ty<T>::V;
    const unsigned t = threadIdx.x, nt = blockDim.x;
    float count = (float)rows;
    if (has_ignore) {
        unsigned c = 0;
        for (size_t r = t; r < rows; r += nt) c += (long long)labels[r] != ignore ? 1u : 0u;
        count = (float)block_sum_u32(c);
    }
    const float g = scale / count;
    const bool vec = aligned16(x) && aligned16(dx) && cols % V == 0;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        T* dr = dx + row * cols;
        const long long lab = (long long)labels[row];
        const bool ignored = has_ignore && lab == ignore;
        const bool ok = lab >= 0 && lab < (long long)cols;
        // A bad label makes the row NaN (exp(x - NaN)); an ignored row is 0.
        const float l = ok ? lse[row] : __int_as_float(0x7fc00000);
        const float rg = ignored ? 0.0f : g;
        const float l2 = l * CE_LOG2E;
        size_t done = 0;
        if (vec) {
            const size_t nv = cols / V;
            size_t i = t;
            for (; i + (CE_U - 1) * nt < nv; i += CE_U * nt) {
                uint4 raw[CE_U];
#pragma unroll
                for (int u = 0; u < CE_U; ++u) raw[u] = ldg16(xr + (i + u * nt) * V);
#pragma unroll
                for (int u = 0; u < CE_U; ++u) {
                    float f[V];
                    Ty<T>::unpack(raw[u], f);
                    const long long c0 = (long long)((i + u * nt) * V);
#pragma unroll
                    for (int e = 0; e < V; ++e) {
                        const float hot = c0 + e == lab ? 1.0f : 0.0f;
                        f[e] = ignored ? 0.0f : (exp2f(fmaf(f[e], CE_LOG2E, -l2)) - hot) * rg;
                    }
                    store_vec<T, V>(dr + (i + u * nt) * V, f);
                }
            }
            for (; i < nv; i += nt) {
                float f[V];
                load_vec<T, V>(xr + i * V, f);
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float hot = (long long)(i * V + e) == lab ? 1.0f : 0.0f;
                    f[e] = ignored ? 0.0f : (exp2f(fmaf(f[e], CE_LOG2E, -l2)) - hot) * rg;
                }
                store_vec<T, V>(dr + i * V, f);
            }
            done = nv * V;
        }
        for (size_t j = done + t; j < cols; j += nt) {
            const float hot = (long long)j == lab ? 1.0f : 0.0f;
            Ty<T>::store(dr + j, ignored ? 0.0f : (expf(Ty<T>::load(xr + j) - l) - hot) * rg);
        }
    }
}

}  // namespace

#define RTX_CE(dt, T, lt, L)                                                                   \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ce_fwd_##dt##_##lt(const T* x, const L* labels, float* lse, float* loss, unsigned* bad, \
                           size_t rows, size_t cols, long long ignore, int has_ignore,         \
                           double* part_loss, unsigned* part_count, unsigned* part_bad,        \
                           unsigned* counter) {                                                \
        ce_fwd<T, L>(x, labels, lse, loss, bad, rows, cols, ignore, has_ignore, part_loss,     \
                     part_count, part_bad, counter);                                           \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ce_bwd_##dt##_##lt(const T* x, const L* labels, const float* lse, T* dx, size_t rows,  \
                           size_t cols, long long ignore, int has_ignore, float scale) {       \
        ce_bwd<T, L>(x, labels, lse, dx, rows, cols, ignore, has_ignore, scale);               \
    }

#define RTX_CE_LABELS(dt, T) RTX_CE(dt, T, u32, unsigned) RTX_CE(dt, T, i32, int)

RTX_CE_LABELS(f32, float)
RTX_CE_LABELS(f16, __half)
RTX_CE_LABELS(bf16, __nv_bfloat16)
