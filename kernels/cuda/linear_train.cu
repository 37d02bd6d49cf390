// linear_train.cu — the element-wise and reduction pieces of `linear_train` and
// `linear_backward` where no cuBLASLt epilogue does the work (see
// ops/src/gemm/backward_cuda.rs for when each runs).
//
//   extern "C" __global__ void act_fwd_{dt}(T* y, const T* pre, size_t n, int act)
//       y[i] = act(pre[i])
//   extern "C" __global__ void act_grad_{dt}(T* dz, const T* dy, const T* pre, size_t n,
//                                           int act)
//       dz[i] = dy[i] * act'(pre[i]); dz may be the same pointer as dy (in place)
//   extern "C" __global__ void bias_grad_{dt}(T* db, const T* dz, size_t rows, size_t cols)
//       db[j] = sum over r of dz[r, j]   (dz is [rows, cols] row-major)
//
// dt is f32, f16 or bf16; arithmetic and accumulation in f32, one rounding on store.
// act: 0 none, 1 relu, 2 gelu (tanh approximation, as the GELU epilogues). The ReLU
// derivative is 1 where pre > 0 and 0 elsewhere (0 at the kink, as PyTorch); the GELU
// derivative is that of 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi).
//
// act_fwd / act_grad: grid-stride, one element per thread per step (plain loads: dz may
// alias dy). bias_grad: a block owns 32 consecutive columns (grid-stride over column
// tiles); its 8 warps split the rows, each lane one column (coalesced 32-wide reads),
// and the 8 partial sums meet in shared memory. Block: RTX_BLOCK (256) threads, required.
#include "common.cuh"

using namespace rtx;

namespace {

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }

__device__ __forceinline__ float activate(float v, int act) {
    if (act == 1) return v < 0.0f ? 0.0f : v;
    if (act == 2) {
        const float k = 0.7978845608028654f;  // sqrt(2/pi)
        return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
    return v;
}

__device__ __forceinline__ float derivative(float v, int act) {
    if (act == 1) return v > 0.0f ? 1.0f : 0.0f;
    if (act == 2) {
        const float k = 0.7978845608028654f;
        const float v2 = v * v;
        const float t = tanhf(k * (v + 0.044715f * v2 * v));
        return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * v2);
    }
    return 1.0f;
}

template <typename T>
__device__ __forceinline__ void act_fwd(T* y, const T* pre, size_t n, int act) {
    for (size_t i = global_thread(); i < n; i += global_threads())
        Ty<T>::store(y + i, activate(ld(pre + i), act));
}

template <typename T>
__device__ __forceinline__ void act_grad(T* dz, const T* dy, const T* pre, size_t n, int act) {
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        const float g = ld(dy + i) * derivative(ld(pre + i), act);
        Ty<T>::store(dz + i, g);
    }
}

template <typename T>
__device__ __forceinline__ void bias_grad(T* db, const T* dz, size_t rows, size_t cols) {
    __shared__ float part[8][33];
    const unsigned lane = lane_id(), warp = threadIdx.x >> 5;
    const size_t tiles = (cols + 31) / 32;
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const size_t col = tile * 32 + lane;
        float s = 0.0f;
        if (col < cols)
            for (size_t r = warp; r < rows; r += 8) s += ld(dz + r * cols + col);
        part[warp][lane] = s;
        __syncthreads();
        if (warp == 0 && col < cols) {
            float t = 0.0f;
#pragma unroll
            for (int w = 0; w < 8; ++w) t += part[w][lane];
            Ty<T>::store(db + col, t);
        }
        __syncthreads();
    }
}

}  // namespace

#define RTX_LINEAR_TRAIN(dt, T)                                                             \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                 \
        act_fwd_##dt(T* y, const T* pre, size_t n, int act) {                               \
        act_fwd(y, pre, n, act);                                                            \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                 \
        act_grad_##dt(T* dz, const T* dy, const T* pre, size_t n, int act) {                \
        act_grad(dz, dy, pre, n, act);                                                      \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                 \
        bias_grad_##dt(T* db, const T* dz, size_t rows, size_t cols) {                      \
        bias_grad(db, dz, rows, cols);                                                      \
    }

RTX_LINEAR_TRAIN(f32, float)
RTX_LINEAR_TRAIN(f16, __half)
RTX_LINEAR_TRAIN(bf16, __nv_bfloat16)
