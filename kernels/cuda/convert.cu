// convert.cu — dtype conversion and constant fill.
//
// Block: 256 threads (RTX_BLOCK; fewer, a multiple of 32, also work); grid: any size
// (grid-stride loops), best ceil(n / (256 * V)) (a vector per thread), V = 16 / the
// larger element size. No shared memory. The CPU reference is ops/src/convert/cpu.rs.
//
// Cast, y[i] = (B) x[i] for i < n, through f32: integers round to the nearest f32, then
// f32 rounds once to B (nearest even; overflow to f16/bf16 gives +-inf):
//   extern "C" __global__ void cast_{a}_{b}(const A* x, B* y, size_t n)
//   a in f32 f16 bf16 i32 u32, b in f32 f16 bf16 (a == b copies).
//
// Fill, y[i] = bits for i < n (the host computes the dtype's bit pattern):
//   extern "C" __global__ void fill_b32(unsigned* y, size_t n, unsigned bits)
//   extern "C" __global__ void fill_b16(unsigned short* y, size_t n, unsigned bits)  // low 16 bits
//
// x and y must not overlap.

#include "common.cuh"

using namespace rtx;

namespace {

// Any input type to f32.
template <typename A> struct In { static __device__ __forceinline__ float load(const A* p) { return Ty<A>::load(p); } };
template <> struct In<int> { static __device__ __forceinline__ float load(const int* p) { return __int2float_rn(__ldg(p)); } };
template <> struct In<unsigned> { static __device__ __forceinline__ float load(const unsigned* p) { return __uint2float_rn(__ldg(p)); } };

template <typename A, typename B>
__device__ __forceinline__ void cast(const A* x, B* y, size_t n) {
    const size_t t = global_thread(), nt = global_threads();
    // Four elements per thread per step: 8-16 byte loads and stores in flight per element
    // group, coalesced across the warp.
    size_t i = t;
    for (; i + 3 * nt < n; i += 4 * nt) {
        float f[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) f[u] = In<A>::load(x + i + u * nt);
#pragma unroll
        for (int u = 0; u < 4; ++u) Ty<B>::store(y + i + u * nt, f[u]);
    }
    for (; i < n; i += nt) Ty<B>::store(y + i, In<A>::load(x + i));
}

template <typename W>
__device__ __forceinline__ void fill(W* y, size_t n, W bits) {
    const size_t t = global_thread(), nt = global_threads();
    size_t done = 0;
    if (aligned16(y)) {
        constexpr int V = 16 / sizeof(W);
        const size_t nv = n / V;
        unsigned w = sizeof(W) == 4 ? (unsigned)bits : ((unsigned)bits | ((unsigned)bits << 16));
        const uint4 v = make_uint4(w, w, w, w);
        for (size_t i = t; i < nv; i += nt) st16(y + i * V, v);
        done = nv * V;
    }
    for (size_t j = done + t; j < n; j += nt) y[j] = bits;
}

}  // namespace

#define RTX_CAST(a, A, b, B)                                                                   \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) cast_##a##_##b(const A* x, B* y, size_t n) { \
        cast<A, B>(x, y, n);                                                                   \
    }
#define RTX_CAST_TO(a, A) RTX_CAST(a, A, f32, float) RTX_CAST(a, A, f16, __half) RTX_CAST(a, A, bf16, __nv_bfloat16)

RTX_CAST_TO(f32, float)
RTX_CAST_TO(f16, __half)
RTX_CAST_TO(bf16, __nv_bfloat16)
RTX_CAST_TO(i32, int)
RTX_CAST_TO(u32, unsigned)

extern "C" __global__ void __launch_bounds__(RTX_BLOCK) fill_b32(unsigned* y, size_t n, unsigned bits) {
    fill<unsigned>(y, n, bits);
}

extern "C" __global__ void __launch_bounds__(RTX_BLOCK) fill_b16(unsigned short* y, size_t n, unsigned bits) {
    fill<unsigned short>(y, n, (unsigned short)(bits & 0xffffu));
}
