// softmax.cu — softmax over the last dimension, numerically stable.
//
//   extern "C" __global__ void softmax_{dt}(const T* x, T* y, size_t rows, size_t cols)
//
// dt is f32 (T = float), f16 (T = __half) or bf16 (T = __nv_bfloat16); math in f32.
// x and y are [rows, cols] contiguous; y[r, c] = exp(x[r, c] - max_r) / sum_r exp(x - max_r).
// y may be the same pointer as x (in place). A row holding NaN gives NaN; a row of
// only -inf gives NaN (as PyTorch); -inf elements among finite ones give 0.
//
// Block: 256 threads (RTX_BLOCK, required). Strategy by cols, chosen in the kernel:
//   cols <= 1024:          a warp per row, the row in registers (read once, written once).
//                          Grid: ceil(rows / 8) blocks, capped at the resident blocks.
//   1024 < cols <= 16384:  a block per row, the row in registers (8 to 64 per thread).
//                          Grid: rows blocks, capped at the resident blocks.
//   cols > 16384:          a block per row, online (max, sum) pass, then a second pass
//                          that writes (x is read twice). Grid as above.
// 16-byte loads and stores when x, y are 16-byte aligned and cols % (16 / sizeof(T)) == 0.
// Static shared memory: 128 bytes (block reductions).

#include "common.cuh"

using namespace rtx;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// The group (a warp, or the 256-thread block when BLOCK) owns the row; thread g keeps
// NPER values as NPER / V chunks: chunk c, element e is column c * G * V + g * V + e.
// G is a compile-time constant, so the chunks are immediate offsets from one address.
template <typename T, int NPER, bool BLOCK>
__device__ __forceinline__ void softmax_regs(const T* x, T* y, size_t rows, size_t cols) {
    constexpr int V = Ty<T>::V, C = NPER / V, G = BLOCK ? RTX_BLOCK : 32;
    const unsigned g = BLOCK ? threadIdx.x : lane_id();
    const unsigned first = BLOCK ? blockIdx.x : blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const unsigned groups = BLOCK ? gridDim.x : gridDim.x * (blockDim.x >> 5);
    const bool vec = aligned16(x) && aligned16(y) && cols % V == 0;
    // Columns at or past `left` (relative to this thread's first) are outside the row.
    const long long left = (long long)cols - (long long)g * V;
    for (size_t row = first; row < rows; row += groups) {
        const T* xr = x + row * cols + g * V;
        T* yr = y + row * cols + g * V;
        float v[C][V];
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int col = c * G * V;
            if (vec && col < left) {
                load_vec<T, V>(xr + col, v[c]);
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e) v[c][e] = col + e < left ? Ty<T>::load(xr + col + e) : neg_inf();
            }
        }
        float m = neg_inf();
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int e = 0; e < V; ++e) m = fmaxf(m, v[c][e]);
        m = BLOCK ? block_reduce(m, MaxOp(), neg_inf()) : warp_reduce(m, MaxOp());
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int e = 0; e < V; ++e) {
                v[c][e] = expf(v[c][e] - m);
                s += v[c][e];
            }
        s = BLOCK ? block_reduce(s, AddOp(), 0.0f) : warp_reduce(s, AddOp());
        const float inv = 1.0f / s;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int col = c * G * V;
#pragma unroll
            for (int e = 0; e < V; ++e) v[c][e] *= inv;
            if (vec && col < left) {
                store_vec<T, V>(yr + col, v[c]);
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e)
                    if (col + e < left) Ty<T>::store(yr + col + e, v[c][e]);
            }
        }
    }
}

// Online softmax state: running max m and sum s of exp(x - m).
struct MaxSum {
    float m, s;
    __device__ __forceinline__ void push(float v) {
        if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
        else if (v != neg_inf()) s += expf(v - m);  // NaN falls through here: s becomes NaN
    }
};

// Rows too long for registers: pass 1 keeps (max, sum) online per thread, merged over
// the block; pass 2 reads the row again and writes.
template <typename T>
__device__ __forceinline__ void softmax_online(const T* x, T* y, size_t rows, size_t cols) {
    constexpr int V = Ty<T>::V, U = 4;
    const bool vec = aligned16(x) && aligned16(y) && cols % V == 0;
    const unsigned t = threadIdx.x, nt = blockDim.x;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        T* yr = y + row * cols;
        MaxSum st{neg_inf(), 0.0f};
        size_t done = 0;
        if (vec) {
            const size_t nv = cols / V;
            size_t i = t;
            for (; i + (U - 1) * nt < nv; i += U * nt) {
                float f[U][V];
#pragma unroll
                for (int u = 0; u < U; ++u) load_vec<T, V>(xr + (i + u * nt) * V, f[u]);
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int e = 0; e < V; ++e) st.push(f[u][e]);
            }
            for (; i < nv; i += nt) {
                float f[V];
                load_vec<T, V>(xr + i * V, f);
#pragma unroll
                for (int e = 0; e < V; ++e) st.push(f[e]);
            }
            done = nv * V;
        }
        for (size_t j = done + t; j < cols; j += nt) st.push(Ty<T>::load(xr + j));
        const float m = block_reduce(st.m, MaxOp(), neg_inf());
        const float s = block_reduce(st.m == neg_inf() ? 0.0f : st.s * expf(st.m - m), AddOp(), 0.0f);
        const float inv = 1.0f / s;
        if (vec) {
            for (size_t i = t; i < cols / V; i += nt) {
                float f[V];
                load_vec<T, V>(xr + i * V, f);
#pragma unroll
                for (int e = 0; e < V; ++e) f[e] = expf(f[e] - m) * inv;
                store_vec<T, V>(yr + i * V, f);
            }
        }
        for (size_t j = done + t; j < cols; j += nt) Ty<T>::store(yr + j, expf(Ty<T>::load(xr + j) - m) * inv);
    }
}

template <typename T>
__device__ __forceinline__ void softmax(const T* x, T* y, size_t rows, size_t cols) {
    const bool block256 = blockDim.x == RTX_BLOCK;
    if (cols <= 256) softmax_regs<T, 8, false>(x, y, rows, cols);
    else if (cols <= 512) softmax_regs<T, 16, false>(x, y, rows, cols);
    else if (cols <= 1024) softmax_regs<T, 32, false>(x, y, rows, cols);
    else if (block256 && cols <= 8 * RTX_BLOCK) softmax_regs<T, 8, true>(x, y, rows, cols);
    else if (block256 && cols <= 16 * RTX_BLOCK) softmax_regs<T, 16, true>(x, y, rows, cols);
    else if (block256 && cols <= 32 * RTX_BLOCK) softmax_regs<T, 32, true>(x, y, rows, cols);
    else softmax_online<T>(x, y, rows, cols);
}

#define RTX_SOFTMAX(dt, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                  \
        softmax_##dt(const T* x, T* y, size_t rows, size_t cols) {                           \
        softmax<T>(x, y, rows, cols);                                                        \
    }

RTX_SOFTMAX(f32, float)
RTX_SOFTMAX(f16, __half)
RTX_SOFTMAX(bf16, __nv_bfloat16)
