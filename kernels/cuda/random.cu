// random.cu — device-side random initialization from the Philox4x32-10 counter-based
// generator (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011). The same arithmetic is written in ops/src/random/cpu.rs, so one seed gives
// the same numbers on both backends.
//
// dt is f32 (T = float), f16 (T = __half) or bf16 (T = __nv_bfloat16). Block: 256 threads
// (RTX_BLOCK); grid: any size (grid-stride over the n/4 counters), best
// min(ceil(n / 4 / 256), resident blocks). No shared memory.
//
//   extern "C" __global__ void rand_uniform_{dt}(T* y, size_t n, unsigned k0, unsigned k1,
//       unsigned o0, unsigned o1, float a, float b)     // y[i] = a + b * u_i   (a = lo, b = hi - lo)
//   extern "C" __global__ void rand_normal_{dt}(T* y, size_t n, unsigned k0, unsigned k1,
//       unsigned o0, unsigned o1, float a, float b)     // y[i] = a + b * z_i   (a = mean, b = std)
//
// Element i takes lane i % 4 of Philox4x32-10 at counter (c, c >> 32, o0, o1) with
// c = i / 4 and key (k0, k1) (the seed's low and high words; (o0, o1) is the offset that
// separates tensors drawn from one seed). From a 32-bit output x, u = (2 * (x >> 9) + 1)
// * 2^-24: exactly representable, in (0, 1). z: Box-Muller on the lane pairs (0, 1) and
// (2, 3): r = sqrt(-2 ln u_even), z_even = r cos(2 pi u_odd), z_odd = r sin(2 pi u_odd),
// computed in f64 and rounded to f32. a + b * v is computed in f32 without contraction
// (__fmul_rn / __fadd_rn), then rounded once to T. y has n elements, each written once.

#include "common.cuh"

using namespace rtx;

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

// Ten rounds of Philox4x32 on the counter c with key (k0, k1) (Random123's
// philox4x32_R(10, ...): the key is bumped by the Weyl constants between rounds).
__device__ __forceinline__ void philox4x32_10(unsigned (&c)[4], unsigned k0, unsigned k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
        const unsigned hi0 = __umulhi(PHILOX_M0, c[0]), lo0 = PHILOX_M0 * c[0];
        const unsigned hi1 = __umulhi(PHILOX_M1, c[2]), lo1 = PHILOX_M1 * c[2];
        const unsigned n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

// (2 * (x >> 9) + 1) * 2^-24: an odd integer below 2^24 times a power of two, exact.
__device__ __forceinline__ float u01(unsigned x) {
    return (float)(((x >> 9) << 1) | 1u) * 5.9604644775390625e-8f;
}

struct Uniform {
    static __device__ __forceinline__ void map(const unsigned (&x)[4], float (&v)[4]) {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = u01(x[e]);
    }
};

struct Normal {
    static __device__ __forceinline__ void map(const unsigned (&x)[4], float (&v)[4]) {
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const double r = sqrt(-2.0 * log((double)u01(x[2 * p])));
            double s, c;
            sincospi(2.0 * (double)u01(x[2 * p + 1]), &s, &c);
            v[2 * p] = (float)(r * c);
            v[2 * p + 1] = (float)(r * s);
        }
    }
};

template <typename T>
__device__ __forceinline__ void store4(T* y, size_t i, size_t n, const float (&v)[4]) {
    if (i + 4 <= n) {
        if constexpr (sizeof(T) == 4) {
            if (aligned16(y + i)) {
                st16(y + i, Ty<T>::pack(v));
                return;
            }
        } else {
            if (((u64)(y + i) & 7) == 0) {
                *reinterpret_cast<uint2*>(y + i) = make_uint2(Ty<T>::pair(v[0], v[1]), Ty<T>::pair(v[2], v[3]));
                return;
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
        if (i + e < n) Ty<T>::store(y + i + e, v[e]);
}

template <class D, typename T>
__device__ __forceinline__ void fill(T* y, size_t n, unsigned k0, unsigned k1, unsigned o0, unsigned o1,
                                     float a, float b) {
    const size_t counters = (n + 3) / 4;
    for (size_t c = global_thread(); c < counters; c += global_threads()) {
        unsigned x[4] = {(unsigned)c, (unsigned)(c >> 32), o0, o1};
        philox4x32_10(x, k0, k1);
        float v[4];
        D::map(x, v);
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = __fadd_rn(a, __fmul_rn(b, v[e]));
        store4<T>(y, c * 4, n, v);
    }
}

#define RTX_RANDOM(dist, D, dt, T)                                                            \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) rand_##dist##_##dt(                \
        T* y, size_t n, unsigned k0, unsigned k1, unsigned o0, unsigned o1, float a, float b) { \
        fill<D, T>(y, n, k0, k1, o0, o1, a, b);                                               \
    }

RTX_RANDOM(uniform, Uniform, f32, float)
RTX_RANDOM(uniform, Uniform, f16, __half)
RTX_RANDOM(uniform, Uniform, bf16, __nv_bfloat16)
RTX_RANDOM(normal, Normal, f32, float)
RTX_RANDOM(normal, Normal, f16, __half)
RTX_RANDOM(normal, Normal, bf16, __nv_bfloat16)
