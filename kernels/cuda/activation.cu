// activation.cu — activations, their derivatives, and scalar maps, element-wise.
//
// dt is f32 (T = float), f16 (T = __half) or bf16 (T = __nv_bfloat16); all arithmetic is
// in f32 and rounded to T once (round to nearest even). Block: 256 threads (RTX_BLOCK;
// fewer, a multiple of 32, also work); grid: any size (grid-stride loops), best
// ceil(n / (256 * V)) (a 16-byte vector per thread), V = 16 / sizeof(T). No shared memory.
// The formulas are those of ops/src/activation/cpu.rs (the CPU reference).
//
// Forward, y[i] = op(x[i]) for i < n; op in tanh sigmoid gelu silu add_scalar mul_scalar:
//   extern "C" __global__ void act_{op}_{dt}(const T* x, T* y, size_t n, float s)
//   gelu is the tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as the gemm
//   epilogue (ops/src/gemm/epilogue.cu); add_scalar is x + s, mul_scalar x * s; the other
//   ops ignore s.
//
// Backward, dx[i] = dy[i] * f'(v[i]); op in relu gelu silu (v is the forward input x)
// and tanh sigmoid (v is the forward output y):
//   extern "C" __global__ void actb_{op}_{dt}(const T* dy, const T* v, T* dx, size_t n)
//   relu: dy where x > 0, else 0 (NaN x gives 0, as PyTorch's threshold_backward).
//
// Aliasing: y may be x, and dx may be dy (in place); no other overlap is allowed.

#include "common.cuh"

using namespace rtx;

namespace {

constexpr float SQRT_2_OVER_PI = 0.7978845608028654f;
constexpr float GELU_C = 0.044715f;

// __fdividef (2 ulp) instead of IEEE division: its slow path is a call that made the
// f16/bf16 silu backward spill; 1 / inf = 0 is still exact for x < -88.
__device__ __forceinline__ float sigmoidf(float x) { return __fdividef(1.0f, 1.0f + expf(-x)); }

struct Tanh { float s; __device__ __forceinline__ float operator()(float x) const { return tanhf(x); } };
struct Sigmoid { float s; __device__ __forceinline__ float operator()(float x) const { return sigmoidf(x); } };
struct Gelu {
    float s;
    __device__ __forceinline__ float operator()(float x) const {
        return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x)));
    }
};
struct Silu { float s; __device__ __forceinline__ float operator()(float x) const { return x * sigmoidf(x); } };
struct AddScalar { float s; __device__ __forceinline__ float operator()(float x) const { return x + s; } };
struct MulScalar { float s; __device__ __forceinline__ float operator()(float x) const { return x * s; } };

struct ReluB {
    __device__ __forceinline__ float operator()(float dy, float x) const { return x > 0.0f ? dy : 0.0f; }
};
struct GeluB {
    __device__ __forceinline__ float operator()(float dy, float x) const {
        const float x2 = x * x;
        const float t = tanhf(SQRT_2_OVER_PI * (x + GELU_C * x2 * x));
        const float du = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * x2);
        return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
    }
};
struct SiluB {
    __device__ __forceinline__ float operator()(float dy, float x) const {
        const float s = sigmoidf(x);
        return dy * s * (1.0f + x * (1.0f - s));
    }
};
struct TanhB {
    __device__ __forceinline__ float operator()(float dy, float y) const { return dy * (1.0f - y * y); }
};
struct SigmoidB {
    __device__ __forceinline__ float operator()(float dy, float y) const { return dy * y * (1.0f - y); }
};

// 16-byte vectors per thread per step (all loads issued before any store).
constexpr int U = 2;

// Each thread handles U 16-byte vectors per step, then the vectors that remain, then the
// n % V tail element by element (and everything element by element when unaligned).
template <class Op, typename T>
__device__ __forceinline__ void map(const T* x, T* y, size_t n, Op op) {
    constexpr int V = Ty<T>::V;
    const size_t t = global_thread(), nt = global_threads();
    size_t done = 0;
    if (aligned16(x) && aligned16(y)) {
        const size_t nv = n / V;
        size_t i = t;
        for (; i + (U - 1) * nt < nv; i += U * nt) {
            float f[U][V];
#pragma unroll
            for (int u = 0; u < U; ++u) load_vec<T, V>(x + (i + u * nt) * V, f[u]);
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int e = 0; e < V; ++e) f[u][e] = op(f[u][e]);
                store_vec<T, V>(y + (i + u * nt) * V, f[u]);
            }
        }
        for (; i < nv; i += nt) {
            float f[V];
            load_vec<T, V>(x + i * V, f);
#pragma unroll
            for (int e = 0; e < V; ++e) f[e] = op(f[e]);
            store_vec<T, V>(y + i * V, f);
        }
        done = nv * V;
    }
    for (size_t j = done + t; j < n; j += nt) Ty<T>::store(y + j, op(Ty<T>::load(x + j)));
}

template <class Op, typename T>
__device__ __forceinline__ void grad(const T* dy, const T* v, T* dx, size_t n) {
    constexpr int V = Ty<T>::V;
    const size_t t = global_thread(), nt = global_threads();
    Op op;
    size_t done = 0;
    if (aligned16(dy) && aligned16(v) && aligned16(dx)) {
        const size_t nv = n / V;
        size_t i = t;
        for (; i + (U - 1) * nt < nv; i += U * nt) {
            float fg[U][V], fv[U][V];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                load_vec<T, V>(dy + (i + u * nt) * V, fg[u]);
                load_vec<T, V>(v + (i + u * nt) * V, fv[u]);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int e = 0; e < V; ++e) fg[u][e] = op(fg[u][e], fv[u][e]);
                store_vec<T, V>(dx + (i + u * nt) * V, fg[u]);
            }
        }
        for (; i < nv; i += nt) {
            float fg[V], fv[V];
            load_vec<T, V>(dy + i * V, fg);
            load_vec<T, V>(v + i * V, fv);
#pragma unroll
            for (int e = 0; e < V; ++e) fg[e] = op(fg[e], fv[e]);
            store_vec<T, V>(dx + i * V, fg);
        }
        done = nv * V;
    }
    for (size_t j = done + t; j < n; j += nt)
        Ty<T>::store(dx + j, op(Ty<T>::load(dy + j), Ty<T>::load(v + j)));
}

}  // namespace

// Loads of an in-place operand go through __ldg in load_vec; the pointers alias only as
// the same element read then written by the same thread, which the read-only path allows
// (each element is read before it is written, and never read again).
#define RTX_ACT(op, Op, dt, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        act_##op##_##dt(const T* x, T* y, size_t n, float s) {                                 \
        map<Op, T>(x, y, n, Op{s});                                                            \
    }

#define RTX_ACTB(op, Op, dt, T)                                                                \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        actb_##op##_##dt(const T* dy, const T* v, T* dx, size_t n) {                           \
        grad<Op, T>(dy, v, dx, n);                                                             \
    }

#define RTX_ALL_DTYPES(M, op, Op) M(op, Op, f32, float) M(op, Op, f16, __half) M(op, Op, bf16, __nv_bfloat16)

RTX_ALL_DTYPES(RTX_ACT, tanh, Tanh)
RTX_ALL_DTYPES(RTX_ACT, sigmoid, Sigmoid)
RTX_ALL_DTYPES(RTX_ACT, gelu, Gelu)
RTX_ALL_DTYPES(RTX_ACT, silu, Silu)
RTX_ALL_DTYPES(RTX_ACT, add_scalar, AddScalar)
RTX_ALL_DTYPES(RTX_ACT, mul_scalar, MulScalar)

RTX_ALL_DTYPES(RTX_ACTB, relu, ReluB)
RTX_ALL_DTYPES(RTX_ACTB, gelu, GeluB)
RTX_ALL_DTYPES(RTX_ACTB, silu, SiluB)
RTX_ALL_DTYPES(RTX_ACTB, tanh, TanhB)
RTX_ALL_DTYPES(RTX_ACTB, sigmoid, SigmoidB)
