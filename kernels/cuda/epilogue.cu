// epilogue.cu — in-place bias + activation, the epilogue of `linear` when cuBLASLt has
// no algorithm (cuBLAS fallback) and of every `conv2d` with a bias or an activation.
//
//   extern "C" __global__ void bias_act_{f32,f16,bf16}(T* y, const T* bias,
//       unsigned long long n, unsigned long long channels, unsigned long long inner,
//       int act)
//
// y has n elements; element i belongs to channel (i / inner) % channels: inner = 1 for
// channels-last data ([rows, channels], NHWC), inner = h*w for NCHW. bias (channels
// elements) may be null. act: 0 none, 1 relu (NaN stays NaN), 2 gelu (tanh
// approximation, as PyTorch's gelu(approximate="tanh") and cuBLASLt's GELU epilogue).
// Arithmetic in f32, one rounding on store. Grid-stride: any grid size is correct.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace {

__device__ __forceinline__ float load(float v) { return v; }
__device__ __forceinline__ float load(__half v) { return __half2float(v); }
__device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

__device__ __forceinline__ float activate(float v, int act) {
    if (act == 1) return v < 0.0f ? 0.0f : v;
    if (act == 2) {
        const float k = 0.7978845608028654f;  // sqrt(2/pi)
        return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
    return v;
}

template <typename T>
__device__ __forceinline__ void bias_act(T* y, const T* bias, unsigned long long n,
                                         unsigned long long channels,
                                         unsigned long long inner, int act) {
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += step) {
        float v = load(y[i]);
        if (bias != nullptr) v += load(bias[(i / inner) % channels]);
        store(&y[i], activate(v, act));
    }
}

}  // namespace

#define RTX_BIAS_ACT(dt, T)                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                      \
        bias_act_##dt(T* y, const T* bias, unsigned long long n,                           \
                      unsigned long long channels, unsigned long long inner, int act) {    \
        bias_act(y, bias, n, channels, inner, act);                                        \
    }

RTX_BIAS_ACT(f32, float)
RTX_BIAS_ACT(f16, __half)
RTX_BIAS_ACT(bf16, __nv_bfloat16)
