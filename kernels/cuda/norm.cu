// norm.cu — layer normalization over the last dim, forward and backward.
//
// dt is f32 (T = float), f16 (T = __half) or bf16 (T = __nv_bfloat16); math in f32.
// x, y, dy, dx are [rows, d] contiguous; gamma, beta, dgamma, dbeta [d] of type T;
// mean, rstd [rows] f32. The CPU reference is ops/src/norm/cpu.rs. Block: 256 threads
// (RTX_BLOCK; a multiple of 32 also works). No argument may overlap another.
//
// Forward, a block per row (grid-stride over rows; best min(rows, resident blocks)):
//   extern "C" __global__ void ln_fwd_{dt}(const T* x, const T* gamma, const T* beta,
//       T* y, float* mean, float* rstd, size_t rows, size_t d, float eps)
//   mean[r] = sum x / d; var = sum (x - mean)^2 / d (two passes, biased);
//   rstd[r] = rsqrt(var + eps); y = (x - mean) * rstd * gamma + beta.
//
// Backward, three launches:
//   extern "C" __global__ void ln_bwd_dx_{dt}(const T* dy, const T* x, const float* mean,
//       const float* rstd, const T* gamma, T* dx, size_t rows, size_t d)
//     a block per row: g = dy * gamma, xh = (x - mean) * rstd,
//     dx = rstd * (g - mean_row(g) - xh * mean_row(g * xh)).
//   extern "C" __global__ void ln_bwd_part_{dt}(const T* dy, const T* x, const float* mean,
//       const float* rstd, float* part_g, float* part_b, size_t rows, size_t d, size_t rpc)
//     grid (ceil(d / blockDim.x), chunks): thread per column, chunk c sums rows
//     [c * rpc, min(rows, (c + 1) * rpc)): part_g[c * d + j] = sum dy * xh,
//     part_b[c * d + j] = sum dy. chunks = ceil(rows / rpc) <= 65535.
//   extern "C" __global__ void ln_bwd_final_{dt}(const float* part_g, const float* part_b,
//       T* dgamma, T* dbeta, size_t chunks, size_t d)
//     thread per column (grid-stride): the chunks' partials summed in chunk order (f64).
// Deterministic: no atomics; the order of every sum depends only on the launch shape.

#include "common.cuh"

using namespace rtx;

namespace {

template <typename T>
__device__ __forceinline__ void ln_fwd(const T* x, const T* gamma, const T* beta, T* y, float* mean,
                                       float* rstd, size_t rows, size_t d, float eps) {
    const unsigned t = threadIdx.x, nt = blockDim.x;
    const float inv_d = 1.0f / (float)d;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * d;
        T* yr = y + row * d;
        float s = 0.0f;
        for (size_t j = t; j < d; j += nt) s += Ty<T>::load(xr + j);
        const float mu = block_reduce(s, AddOp(), 0.0f) * inv_d;
        float q = 0.0f;
        for (size_t j = t; j < d; j += nt) {
            const float c = Ty<T>::load(xr + j) - mu;
            q += c * c;
        }
        const float var = block_reduce(q, AddOp(), 0.0f) * inv_d;
        const float r = rsqrtf(var + eps);
        if (t == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
        for (size_t j = t; j < d; j += nt)
            Ty<T>::store(yr + j, (Ty<T>::load(xr + j) - mu) * r * Ty<T>::load(gamma + j) + Ty<T>::load(beta + j));
    }
}

template <typename T>
__device__ __forceinline__ void ln_bwd_dx(const T* dy, const T* x, const float* mean, const float* rstd,
                                          const T* gamma, T* dx, size_t rows, size_t d) {
    const unsigned t = threadIdx.x, nt = blockDim.x;
    const float inv_d = 1.0f / (float)d;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const size_t o = row * d;
        const float m = mean[row], rs = rstd[row];
        float sg = 0.0f, sgx = 0.0f;
        for (size_t j = t; j < d; j += nt) {
            const float g = Ty<T>::load(dy + o + j) * Ty<T>::load(gamma + j);
            sg += g;
            sgx += g * (Ty<T>::load(x + o + j) - m) * rs;
        }
        const float mg = block_reduce(sg, AddOp(), 0.0f) * inv_d;
        const float mgx = block_reduce(sgx, AddOp(), 0.0f) * inv_d;
        for (size_t j = t; j < d; j += nt) {
            const float g = Ty<T>::load(dy + o + j) * Ty<T>::load(gamma + j);
            const float xh = (Ty<T>::load(x + o + j) - m) * rs;
            Ty<T>::store(dx + o + j, rs * (g - mg - xh * mgx));
        }
    }
}

template <typename T>
__device__ __forceinline__ void ln_bwd_part(const T* dy, const T* x, const float* mean, const float* rstd,
                                            float* part_g, float* part_b, size_t rows, size_t d, size_t rpc) {
    const size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    const size_t r0 = (size_t)blockIdx.y * rpc;
    const size_t r1 = r0 + rpc < rows ? r0 + rpc : rows;
    float ag = 0.0f, ab = 0.0f;
    for (size_t r = r0; r < r1; ++r) {
        const float g = Ty<T>::load(dy + r * d + j);
        ag += g * (Ty<T>::load(x + r * d + j) - __ldg(mean + r)) * __ldg(rstd + r);
        ab += g;
    }
    part_g[blockIdx.y * d + j] = ag;
    part_b[blockIdx.y * d + j] = ab;
}

template <typename T>
__device__ __forceinline__ void ln_bwd_final(const float* part_g, const float* part_b, T* dgamma, T* dbeta,
                                             size_t chunks, size_t d) {
    for (size_t j = global_thread(); j < d; j += global_threads()) {
        double ag = 0.0, ab = 0.0;
        for (size_t c = 0; c < chunks; ++c) {
            ag += part_g[c * d + j];
            ab += part_b[c * d + j];
        }
        Ty<T>::store(dgamma + j, (float)ag);
        Ty<T>::store(dbeta + j, (float)ab);
    }
}

}  // namespace

#define RTX_LN(dt, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ln_fwd_##dt(const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd, \
                    size_t rows, size_t d, float eps) {                                        \
        ln_fwd<T>(x, gamma, beta, y, mean, rstd, rows, d, eps);                                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ln_bwd_dx_##dt(const T* dy, const T* x, const float* mean, const float* rstd,          \
                       const T* gamma, T* dx, size_t rows, size_t d) {                         \
        ln_bwd_dx<T>(dy, x, mean, rstd, gamma, dx, rows, d);                                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ln_bwd_part_##dt(const T* dy, const T* x, const float* mean, const float* rstd,        \
                         float* part_g, float* part_b, size_t rows, size_t d, size_t rpc) {    \
        ln_bwd_part<T>(dy, x, mean, rstd, part_g, part_b, rows, d, rpc);                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ln_bwd_final_##dt(const float* part_g, const float* part_b, T* dgamma, T* dbeta,       \
                          size_t chunks, size_t d) {                                           \
        ln_bwd_final<T>(part_g, part_b, dgamma, dbeta, chunks, d);                             \
    }

RTX_LN(f32, float)
RTX_LN(f16, __half)
RTX_LN(bf16, __nv_bfloat16)
