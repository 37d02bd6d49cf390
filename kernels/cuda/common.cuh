// common.cuh — shared by every rtx kernel: element types, 16-byte vector access,
// launch geometry and warp/block reductions.
//
// Conventions (all kernels):
// * Element types: float (f32), __half (f16), __nv_bfloat16 (bf16); arithmetic in f32.
// * Sizes and indices are size_t (64-bit); pointers from cudaMalloc / stream-ordered
//   pools are 256-byte aligned. Kernels test alignment at run time and fall back to
//   scalar code for unaligned views and for the n % vector tail.
// * Block size: RTX_BLOCK (256) threads, one-dimensional. Grids are grid-stride: any
//   grid size is correct; the launcher sizes it from the SM count.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define RTX_BLOCK 256
#define RTX_FULL_MASK 0xffffffffu

namespace rtx {

typedef unsigned long long u64;

// ---- element types --------------------------------------------------------------------

// Ty<T>: V elements per 16 bytes, scalar load/store through f32, and conversion of a
// 16-byte vector (uint4) to and from V floats.
template <typename T> struct Ty;

template <> struct Ty<float> {
    static constexpr int V = 4;
    static __device__ __forceinline__ float load(const float* p) { return __ldg(p); }
    static __device__ __forceinline__ void store(float* p, float v) { *p = v; }
    static __device__ __forceinline__ void unpack(uint4 u, float* f) {
        f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y);
        f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
    }
    static __device__ __forceinline__ uint4 pack(const float* f) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]),
                          __float_as_uint(f[2]), __float_as_uint(f[3]));
    }
};

template <> struct Ty<__half> {
    static constexpr int V = 8;
    static __device__ __forceinline__ float bits(unsigned short b) { return __half2float(__ushort_as_half(b)); }
    static __device__ __forceinline__ float load(const __half* p) {
        return bits(__ldg(reinterpret_cast<const unsigned short*>(p)));
    }
    static __device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
    static __device__ __forceinline__ void word(unsigned w, float* f) {
        f[0] = bits((unsigned short)(w & 0xffffu)); f[1] = bits((unsigned short)(w >> 16));
    }
    static __device__ __forceinline__ unsigned pair(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        unsigned w; memcpy(&w, &h, 4); return w;
    }
    static __device__ __forceinline__ void unpack(uint4 u, float* f) {
        word(u.x, f); word(u.y, f + 2); word(u.z, f + 4); word(u.w, f + 6);
    }
    static __device__ __forceinline__ uint4 pack(const float* f) {
        return make_uint4(pair(f[0], f[1]), pair(f[2], f[3]), pair(f[4], f[5]), pair(f[6], f[7]));
    }
};

template <> struct Ty<__nv_bfloat16> {
    static constexpr int V = 8;
    // bf16 -> f32 is exact: the 16 bits are the high half of the f32.
    static __device__ __forceinline__ float load(const __nv_bfloat16* p) {
        return __uint_as_float((unsigned)__ldg(reinterpret_cast<const unsigned short*>(p)) << 16);
    }
    static __device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
    static __device__ __forceinline__ void word(unsigned w, float* f) {
        f[0] = __uint_as_float(w << 16); f[1] = __uint_as_float(w & 0xffff0000u);
    }
    static __device__ __forceinline__ unsigned pair(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        unsigned w; memcpy(&w, &h, 4); return w;
    }
    static __device__ __forceinline__ void unpack(uint4 u, float* f) {
        word(u.x, f); word(u.y, f + 2); word(u.z, f + 4); word(u.w, f + 6);
    }
    static __device__ __forceinline__ uint4 pack(const float* f) {
        return make_uint4(pair(f[0], f[1]), pair(f[2], f[3]), pair(f[4], f[5]), pair(f[6], f[7]));
    }
};

// ---- memory access --------------------------------------------------------------------

__device__ __forceinline__ bool aligned16(const void* p) { return ((u64)p & 15) == 0; }

// 16-byte load through the read-only path (ld.global.nc.v4).
__device__ __forceinline__ uint4 ldg16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ void st16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

// Loads V floats from p: one 16-byte load when V is T's vector width (p must then be
// 16-byte aligned), else V scalar loads.
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, float* f) {
    if constexpr (V == Ty<T>::V) {
        Ty<T>::unpack(ldg16(p), f);
    } else {
#pragma unroll
        for (int e = 0; e < V; ++e) f[e] = Ty<T>::load(p + e);
    }
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float* f) {
    if constexpr (V == Ty<T>::V) {
        st16(p, Ty<T>::pack(f));
    } else {
#pragma unroll
        for (int e = 0; e < V; ++e) Ty<T>::store(p + e, f[e]);
    }
}

// ---- integer division ---------------------------------------------------------------

// a / b without a subroutine call: 64-bit division compiles to a call, and registers
// live across a call get spilled. 32-bit operands (the usual case) use the inline
// 32-bit divide; larger ones a shift-subtract loop (about 64 steps, rare).
__device__ __forceinline__ u64 udiv64(u64 a, u64 b) {
    if (((a | b) >> 32) == 0) return (unsigned)a / (unsigned)b;
    u64 q = 0, rem = 0;
#pragma unroll 1
    for (int bit = 63; bit >= 0; --bit) {
        rem = (rem << 1) | ((a >> bit) & 1);
        if (rem >= b) { rem -= b; q |= 1ull << bit; }
    }
    return q;
}

__device__ __forceinline__ u64 umod64(u64 a, u64 b) { return a - udiv64(a, b) * b; }

// ---- launch geometry ------------------------------------------------------------------

__device__ __forceinline__ size_t global_thread() { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t global_threads() { return (size_t)gridDim.x * blockDim.x; }
__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31u; }

// ---- programmatic dependent launch (sm_90 and newer) ----------------------------------

// A kernel the host launches as a programmatic dependent (the launch attribute
// PROGRAMMATIC_STREAM_SERIALIZATION; `launch_direct` in rtx-ops does with
// `Settings::programmatic_launch`) may start while the kernel before it on the stream
// still runs: it must call `wait_prior_grid()` before it reads or writes global memory,
// which returns once that kernel has completed and its writes are visible.
// `allow_next_grid()` lets the next such kernel start early (it still waits for this
// one to complete before touching memory). Launched the ordinary way, or compiled for an
// architecture before sm_90, both are no-ops.
__device__ __forceinline__ void wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- reductions -----------------------------------------------------------------------

// NaN-propagating max/min (PyTorch semantics): NaN wins.
__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float min_nan(float a, float b) { return (a < b || a != a) ? a : b; }

struct AddOp { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
struct MaxOp { __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); } };

template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(RTX_FULL_MASK, v, o));
    return v;
}

// Reduces v over the block; every thread gets the result. `identity` fills the unused
// slots. Safe to call repeatedly (it synchronizes before reusing its shared memory).
template <class Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float identity) {
    __shared__ float partial[32];
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane_id() == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (lane_id() < (blockDim.x >> 5)) ? partial[lane_id()] : identity;
    return warp_reduce(v, op);
}

}  // namespace rtx
