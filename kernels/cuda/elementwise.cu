// elementwise.cu — element-wise unary and binary ops, contiguous, broadcast and strided.
//
// dt is f32 (T = float), f16 (T = __half) or bf16 (T = __nv_bfloat16); all arithmetic
// is in f32 and rounded to T once (round to nearest even). Block: 256 threads (RTX_BLOCK;
// fewer, a multiple of 32, also work); grid: any size (grid-stride loops), best
// ceil(n / (256 * V)), a 16-byte vector per thread, V = 16 / sizeof(T)
// (rtx_kernels::launch::elementwise_grid: on the H200 this beat a grid of one resident
// wave by 3-10 %, kernels/checks/train_kernels_check.py). Static shared memory: ews only (256 bytes); none dynamic. Outputs are contiguous.
//
// Unary, y[i] = op(x[i]) for i < n; op in neg exp log sin cos sqrt abs relu:
//   extern "C" __global__ void ew_{op}_{dt}(const T* x, T* y, size_t n)
//   relu(x) = x < 0 ? 0 : x (NaN stays NaN); abs, neg exact; exp log sin cos sqrt are the
//   CUDA f32 functions (expf, ...; approximate under --use_fast_math). exp of f16 on sm_90
//   takes a shorter packed form with expf's results bit for bit (Packed<Exp, __half>).
//
// Binary, same shape, y[i] = a[i] op b[i]; op in add sub mul div max min:
//   extern "C" __global__ void ew_{op}_{dt}(const T* a, const T* b, T* y, size_t n)
//   max/min propagate NaN like PyTorch (NaN if either input is NaN).
//
// Binary with trailing broadcast, y[i] = a[i % na] op b[i % nb], i < n:
//   extern "C" __global__ void ewb_{op}_{dt}(const T* a, const T* b, T* y,
//                                            size_t n, size_t na, size_t nb)
//   na, nb >= 1 and divide n: na == n is a full operand, 1 a scalar, the size of the
//   trailing dims a broadcast row (e.g. bias [C] against [N, C]: nb = C).
//
// Binary, general strided broadcast over up to 8 dims (row-major, dim 0 outermost):
//   struct StridedArgs { int ndim; long long shape[8]; long long sa[8]; long long sb[8]; };
//   extern "C" __global__ void ews_{op}_{dt}(const T* a, const T* b, T* y, size_t n,
//                                            StridedArgs args)   // passed by value
//   y is contiguous with n = prod(shape[0..ndim]) elements; for the output index with
//   coordinates c[d], y[i] = a[sum c[d]*sa[d]] op b[sum c[d]*sb[d]]. Strides are in
//   elements, 0 for a broadcast dim, may be negative. 1 <= ndim <= 8. The launcher
//   should first drop size-1 dims and merge dims that are contiguous in a, b and y.
//
// Batched, up to 16 small same-shape unary or binary ops in one launch, in order:
//   extern "C" __global__ void ew_batch(EwBatch p)   // see "batched launches" below
//
// Aliasing: y may be the very same pointer as an input of n elements (in-place);
// no other overlap is allowed.

#include "common.cuh"

using namespace rtx;

// 16-byte vectors per thread per step: 4 keeps 64-128 bytes in flight per thread.
// Ops whose f32 code is long (IEEE division's slow path) unroll less, so that the
// kernel stays under ~64 registers.
template <class Op> struct Unroll { static constexpr int value = 4; };

// ---- ops -----------------------------------------------------------------------------

struct Neg  { __device__ __forceinline__ float operator()(float x) const { return -x; } };
struct Exp  { __device__ __forceinline__ float operator()(float x) const { return expf(x); } };
struct Log  { __device__ __forceinline__ float operator()(float x) const { return logf(x); } };
struct Sin  { __device__ __forceinline__ float operator()(float x) const { return sinf(x); } };
struct Cos  { __device__ __forceinline__ float operator()(float x) const { return cosf(x); } };
struct Sqrt { __device__ __forceinline__ float operator()(float x) const { return sqrtf(x); } };
struct Abs  { __device__ __forceinline__ float operator()(float x) const { return fabsf(x); } };
struct Relu { __device__ __forceinline__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; } };

struct Add { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
struct Sub { __device__ __forceinline__ float operator()(float a, float b) const { return a - b; } };
struct Mul { __device__ __forceinline__ float operator()(float a, float b) const { return a * b; } };
struct Div { __device__ __forceinline__ float operator()(float a, float b) const { return a / b; } };
template <> struct Unroll<Div> { static constexpr int value = 2; };
struct Max { __device__ __forceinline__ float operator()(float a, float b) const { return max_nan(a, b); } };
struct Min { __device__ __forceinline__ float operator()(float a, float b) const { return min_nan(a, b); } };

// Ops with a packed 16-bit form, applied to the loaded 16-byte vector as is (no f32
// unpacking), with the same results as the f32 form rounded to T. Without one
// (Packed<Op, T>::value false) the kernels compute in f32.
template <class Op, typename T> struct Packed { static constexpr bool value = false; };

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
// exp of f16 on sm_90: 2^(x log2 e) by ex2.approx.ftz in f32 (one MUFU.EX2), rounded to
// f16. On sm_90 that gives expf's result rounded to f16 on every one of the 65,536 inputs
// but two, 0xC13B (-2.6152) and 0xC1EF (-2.9668), whose result it rounds one unit low;
// those two are corrected (a compare and an add per pair of inputs each). So the results
// are those of the f32 form bit for bit (and PyTorch's: kernels/checks/ew_math_check.py
// runs all 65,536 inputs through each of the kernel's paths on the GPU), in fewer
// instructions: the f32 form's expf takes eight per element. cuda_fp16's h2exp is the same
// computation but corrects four inputs, two of which (0x1F79, 0x25CF) sm_90's EX2 already
// rounds right, so it misrounds those two. Other architectures keep the f32 form: their
// EX2 may round other inputs differently.
struct ExpF16 {
    static __device__ __forceinline__ float ex2(float x) {
        float y;
        asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
        return y;
    }
    static __device__ __forceinline__ __half2 pair(__half2 h) {
        const float2 f = __half22float2(h);
        __half2 r = __floats2half2_rn(ex2(__fmul_rn(f.x, 1.4426950408889634f)),
                                      ex2(__fmul_rn(f.y, 1.4426950408889634f)));
        // r += (h == input) * ulp, per half: __heq2 is 1 where equal, 0 elsewhere (and for NaN).
        r = __hfma2(__heq2(h, __half2half2(__ushort_as_half(0xC13Bu))),
                    __half2half2(__ushort_as_half(0x0400u)), r);  // 2^-14
        r = __hfma2(__heq2(h, __half2half2(__ushort_as_half(0xC1EFu))),
                    __half2half2(__ushort_as_half(0x0200u)), r);  // 2^-15
        return r;
    }
};
template <> struct Packed<Exp, __half> {
    static constexpr bool value = true;
    static __device__ __forceinline__ unsigned word(unsigned w) {
        __half2 h;
        memcpy(&h, &w, 4);
        h = ExpF16::pair(h);
        memcpy(&w, &h, 4);
        return w;
    }
    static __device__ __forceinline__ uint4 vec(uint4 v) {
        return make_uint4(word(v.x), word(v.y), word(v.z), word(v.w));
    }
    static __device__ __forceinline__ void one(const __half* x, __half* y) {
        *y = __low2half(ExpF16::pair(__half2half2(__ldg(x))));
    }
};
#endif

// ---- contiguous ----------------------------------------------------------------------

// Each thread handles U 16-byte vectors per step (all loads issued before any
// store), then the vectors that remain, then the n % V tail element by element.
template <class Op, typename T>
__device__ __forceinline__ void unary(const T* x, T* y, size_t n) {
    constexpr int V = Ty<T>::V, U = Unroll<Op>::value;
    const size_t t = global_thread(), nt = global_threads();
    Op op;
    size_t done = 0;
    if (aligned16(x) && aligned16(y)) {
        const size_t nv = n / V;
        size_t i = t;
        if constexpr (Packed<Op, T>::value) {
            if (nt >= nv) {  // the launcher's grid: at most one vector per thread
                if (i < nv) st16(y + i * V, Packed<Op, T>::vec(ldg16(x + i * V)));
                for (size_t j = nv * V + t; j < n; j += nt) Packed<Op, T>::one(x + j, y + j);
                return;
            }
            for (; i + (U - 1) * nt < nv; i += U * nt) {
                uint4 v[U];
#pragma unroll
                for (int u = 0; u < U; ++u) v[u] = ldg16(x + (i + u * nt) * V);
#pragma unroll
                for (int u = 0; u < U; ++u) st16(y + (i + u * nt) * V, Packed<Op, T>::vec(v[u]));
            }
            for (; i < nv; i += nt) st16(y + i * V, Packed<Op, T>::vec(ldg16(x + i * V)));
        } else {
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
        }
        done = nv * V;
    }
    for (size_t j = done + t; j < n; j += nt) {
        if constexpr (Packed<Op, T>::value) Packed<Op, T>::one(x + j, y + j);
        else Ty<T>::store(y + j, op(Ty<T>::load(x + j)));
    }
}

template <class Op, typename T>
__device__ __forceinline__ void binary(const T* a, const T* b, T* y, size_t n) {
    constexpr int V = Ty<T>::V, U = Unroll<Op>::value;
    const size_t t = global_thread(), nt = global_threads();
    Op op;
    size_t done = 0;
    if (aligned16(a) && aligned16(b) && aligned16(y)) {
        const size_t nv = n / V;
        size_t i = t;
        for (; i + (U - 1) * nt < nv; i += U * nt) {
            float fa[U][V], fb[U][V];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                load_vec<T, V>(a + (i + u * nt) * V, fa[u]);
                load_vec<T, V>(b + (i + u * nt) * V, fb[u]);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int e = 0; e < V; ++e) fa[u][e] = op(fa[u][e], fb[u][e]);
                store_vec<T, V>(y + (i + u * nt) * V, fa[u]);
            }
        }
        for (; i < nv; i += nt) {
            float fa[V], fb[V];
            load_vec<T, V>(a + i * V, fa);
            load_vec<T, V>(b + i * V, fb);
#pragma unroll
            for (int e = 0; e < V; ++e) fa[e] = op(fa[e], fb[e]);
            store_vec<T, V>(y + i * V, fa);
        }
        done = nv * V;
    }
    for (size_t j = done + t; j < n; j += nt)
        Ty<T>::store(y + j, op(Ty<T>::load(a + j), Ty<T>::load(b + j)));
}

// ---- trailing broadcast --------------------------------------------------------------

// V elements of a broadcast operand starting at position pos (< len): one vector load
// when `vec` (pos is then a multiple of V and pos + V <= len), the scalar once when
// len == 1, else element by element, wrapping at len.
template <typename T, int V>
__device__ __forceinline__ void load_bcast(const T* p, size_t len, size_t pos, bool vec, float* f) {
    if (vec) {
        load_vec<T, V>(p + pos, f);
    } else if (len == 1) {
        const float s = Ty<T>::load(p);
#pragma unroll
        for (int e = 0; e < V; ++e) f[e] = s;
    } else {
#pragma unroll
        for (int e = 0; e < V; ++e) {
            f[e] = Ty<T>::load(p + pos);
            pos = (pos + 1 == len) ? 0 : pos + 1;
        }
    }
}

// Each thread takes V outputs per step (one 16-byte store when V > 1) and keeps its
// positions in a and b incrementally (the step modulo len is < len, so one subtraction
// wraps): the loop has no 64-bit division. (Unrolling two chunks a step raised the
// registers to 64 and halved occupancy: no more bytes in flight.)
template <class Op, typename T, int V>
__device__ __forceinline__ void bcast(const T* a, const T* b, T* y, size_t n, size_t na, size_t nb) {
    const size_t t = global_thread(), nt = global_threads();
    const size_t step = nt * V, vec_end = n / V * V;
    const bool va = V > 1 && aligned16(a) && (na % V == 0 || na == n);
    const bool vb = V > 1 && aligned16(b) && (nb % V == 0 || nb == n);
    Op op;
    size_t i = t * V;
    if (i < vec_end) {
        size_t pa = i % na, pb = i % nb;
        const size_t sa = step % na, sb = step % nb;
        for (; i < vec_end; i += step) {
            float fa[V], fb[V];
            load_bcast<T, V>(a, na, pa, va, fa);
            load_bcast<T, V>(b, nb, pb, vb, fb);
#pragma unroll
            for (int e = 0; e < V; ++e) fa[e] = op(fa[e], fb[e]);
            store_vec<T, V>(y + i, fa);
            pa += sa; if (pa >= na) pa -= na;
            pb += sb; if (pb >= nb) pb -= nb;
        }
    }
    for (size_t j = vec_end + t; j < n; j += nt)
        Ty<T>::store(y + j, op(Ty<T>::load(a + j % na), Ty<T>::load(b + j % nb)));
}

template <class Op, typename T>
__device__ __forceinline__ void bcast_any(const T* a, const T* b, T* y, size_t n, size_t na, size_t nb) {
    if (aligned16(y)) bcast<Op, T, Ty<T>::V>(a, b, y, n, na, nb);
    else bcast<Op, T, 1>(a, b, y, n, na, nb);
}

// ---- general strided -----------------------------------------------------------------

struct StridedArgs {
    int ndim;
    long long shape[8];
    long long sa[8];
    long long sb[8];
};

// The launch's shape and strides in shared memory, with 32-bit magic divisors
// (q = (umulhi(x, mul) + x) >> shift) when every index fits in 31 bits.
struct StridedShared {
    long long shape[8], sa[8], sb[8];
    unsigned mul[8], shift[8];
};

__device__ __forceinline__ void strided_setup(const StridedArgs& args, StridedShared& s) {
    const int d = threadIdx.x;
    if (d < args.ndim && d < 8) {
        const u64 div = (u64)args.shape[d];
        s.shape[d] = args.shape[d]; s.sa[d] = args.sa[d]; s.sb[d] = args.sb[d];
        unsigned sh = 0;
        while (sh < 32 && (1ull << sh) < div) ++sh;
        s.shift[d] = sh;
        s.mul[d] = div == 0 ? 0u : (unsigned)(((1ull << 32) * ((1ull << sh) - div)) / div + 1);
    }
    __syncthreads();
}

// Offsets in a and b of output index i; `last` gets the innermost coordinate.
__device__ __forceinline__ void unravel(size_t i, int ndim, const StridedShared& s, bool small,
                                        long long& oa, long long& ob, long long& last) {
    oa = 0; ob = 0; last = 0;
    for (int d = ndim - 1; d >= 0; --d) {
        size_t q;
        if (small) {
            const unsigned x = (unsigned)i;
            q = (unsigned)(((u64)__umulhi(x, s.mul[d]) + x) >> s.shift[d]);
        } else {
            q = i / (size_t)s.shape[d];
        }
        const long long c = (long long)(i - q * (size_t)s.shape[d]);
        if (d == ndim - 1) last = c;
        oa += c * s.sa[d];
        ob += c * s.sb[d];
        i = q;
    }
}

// Each thread takes V consecutive outputs. When they lie in one innermost row (the
// common case) it unravels the first, steps the innermost stride for the rest and
// stores one 16-byte vector; otherwise it unravels each output on its own.
template <class Op, typename T, int V>
__device__ __forceinline__ void strided(const T* a, const T* b, T* y, size_t n, const StridedShared& s, int ndim) {
    const size_t t = global_thread(), nt = global_threads();
    const bool small = n < (1ull << 31);
    const long long inner = s.shape[ndim - 1], ia = s.sa[ndim - 1], ib = s.sb[ndim - 1];
    const size_t vec_end = n / V * V;
    Op op;
    for (size_t i = t * V; i < vec_end; i += nt * V) {
        long long oa, ob, c;
        unravel(i, ndim, s, small, oa, ob, c);
        if (c + V <= inner) {
            float f[V];
#pragma unroll
            for (int e = 0; e < V; ++e) f[e] = op(Ty<T>::load(a + oa + e * ia), Ty<T>::load(b + ob + e * ib));
            store_vec<T, V>(y + i, f);
        } else {
#pragma unroll 1
            for (int e = 0; e < V; ++e) {
                if (e > 0) unravel(i + e, ndim, s, small, oa, ob, c);
                Ty<T>::store(y + i + e, op(Ty<T>::load(a + oa), Ty<T>::load(b + ob)));
            }
        }
    }
    for (size_t j = vec_end + t; j < n; j += nt) {
        long long oa, ob, c;
        unravel(j, ndim, s, small, oa, ob, c);
        Ty<T>::store(y + j, op(Ty<T>::load(a + oa), Ty<T>::load(b + ob)));
    }
}

template <class Op, typename T>
__device__ __forceinline__ void strided_any(const T* a, const T* b, T* y, size_t n, const StridedArgs& args) {
    __shared__ StridedShared s;
    strided_setup(args, s);
    if (args.ndim < 1 || args.ndim > 8) return;
    if (aligned16(y)) strided<Op, T, Ty<T>::V>(a, b, y, n, s, args.ndim);
    else strided<Op, T, 1>(a, b, y, n, s, args.ndim);
}

// ---- entry points --------------------------------------------------------------------

// Every entry point may be launched as a programmatic dependent (common.cuh): it waits
// for the kernel before it first, then lets the next one start.
#define RTX_UNARY(op, Op, dt, T)                                                               \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) ew_##op##_##dt(const T* x, T* y, size_t n) { \
        wait_prior_grid(); allow_next_grid();                                                  \
        unary<Op, T>(x, y, n);                                                                 \
    }

#define RTX_BINARY(op, Op, dt, T)                                                              \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ew_##op##_##dt(const T* a, const T* b, T* y, size_t n) {                               \
        wait_prior_grid(); allow_next_grid();                                                  \
        binary<Op, T>(a, b, y, n);                                                             \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ewb_##op##_##dt(const T* a, const T* b, T* y, size_t n, size_t na, size_t nb) {        \
        wait_prior_grid(); allow_next_grid();                                                  \
        bcast_any<Op, T>(a, b, y, n, na, nb);                                                  \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        ews_##op##_##dt(const T* a, const T* b, T* y, size_t n, StridedArgs args) {            \
        wait_prior_grid(); allow_next_grid();                                                  \
        strided_any<Op, T>(a, b, y, n, args);                                                  \
    }

#define RTX_ALL_DTYPES(M, op, Op) M(op, Op, f32, float) M(op, Op, f16, __half) M(op, Op, bf16, __nv_bfloat16)

RTX_ALL_DTYPES(RTX_UNARY, neg, Neg)
RTX_ALL_DTYPES(RTX_UNARY, exp, Exp)
RTX_ALL_DTYPES(RTX_UNARY, log, Log)
RTX_ALL_DTYPES(RTX_UNARY, sin, Sin)
RTX_ALL_DTYPES(RTX_UNARY, cos, Cos)
RTX_ALL_DTYPES(RTX_UNARY, sqrt, Sqrt)
RTX_ALL_DTYPES(RTX_UNARY, abs, Abs)
RTX_ALL_DTYPES(RTX_UNARY, relu, Relu)

RTX_ALL_DTYPES(RTX_BINARY, add, Add)
RTX_ALL_DTYPES(RTX_BINARY, sub, Sub)
RTX_ALL_DTYPES(RTX_BINARY, mul, Mul)
RTX_ALL_DTYPES(RTX_BINARY, div, Div)
RTX_ALL_DTYPES(RTX_BINARY, max, Max)
RTX_ALL_DTYPES(RTX_BINARY, min, Min)

// ---- batched launches ----------------------------------------------------------------
//
// Up to 16 small same-shape ops in one launch (rtx-runtime's eager launch batching,
// `runtime/src/driver/batch.rs`): one block, the steps in order with a barrier between
// them, so a step reads what the steps before it wrote. Loads go through L2
// (ld.global.cg), not the read-only path, which may hold a line an earlier step has
// since rewritten. Each step computes what its own kernel (ew_{op}_{dt}) computes: the
// same f32 functor, the same rounding to T.
//
//   struct EwStep { unsigned code; unsigned n; const void* a; const void* b; void* y;
//                   unsigned long long reserved[3]; };    // 56 bytes
//   struct EwBatch { unsigned count; unsigned pad; EwStep steps[16]; };
//   extern "C" __global__ void ew_batch(EwBatch p)    // grid 1, block RTX_BLOCK
//
// code = 3 * k + d: d is the dtype (0 f32, 1 f16, 2 bf16); k 0-7 the unary ops
// neg exp log sin cos sqrt abs relu (y[i] = op(a[i]), b unused), 8-13 the binary ops
// add sub mul div max min (y[i] = a[i] op b[i]). y may be a (in place). An unknown code
// writes nothing (the launcher never makes one).

struct EwStep {
    unsigned code;
    unsigned n;
    const void* a;
    const void* b;
    void* y;
    unsigned long long reserved[3];
};
static_assert(sizeof(EwStep) == 56, "rtx-runtime's BATCH_STEP_BYTES");
struct EwBatch {
    unsigned count;
    unsigned pad;
    EwStep steps[16];
};

template <typename T> __device__ __forceinline__ float load_cg(const T* p);
template <> __device__ __forceinline__ float load_cg<float>(const float* p) { return __ldcg(p); }
template <> __device__ __forceinline__ float load_cg<__half>(const __half* p) {
    return Ty<__half>::bits(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}
template <> __device__ __forceinline__ float load_cg<__nv_bfloat16>(const __nv_bfloat16* p) {
    return __uint_as_float((unsigned)__ldcg(reinterpret_cast<const unsigned short*>(p)) << 16);
}

// A step's elements, STEP_U per thread per round with every load of a round issued
// before its stores (4096 elements take 2 rounds of 256 threads).
constexpr unsigned STEP_U = 8;

template <class Op, typename T> __device__ __forceinline__ void step_unary(const EwStep& s) {
    const T* x = static_cast<const T*>(s.a);
    T* y = static_cast<T*>(s.y);
    Op op;
    for (unsigned r = 0; r < s.n; r += STEP_U * blockDim.x) {
        float v[STEP_U];
#pragma unroll
        for (unsigned u = 0; u < STEP_U; ++u) {
            const unsigned i = r + u * blockDim.x + threadIdx.x;
            v[u] = i < s.n ? load_cg(x + i) : 0.0f;
        }
#pragma unroll
        for (unsigned u = 0; u < STEP_U; ++u) {
            const unsigned i = r + u * blockDim.x + threadIdx.x;
            if (i < s.n) Ty<T>::store(y + i, op(v[u]));
        }
    }
}

template <class Op, typename T> __device__ __forceinline__ void step_binary(const EwStep& s) {
    const T* a = static_cast<const T*>(s.a);
    const T* b = static_cast<const T*>(s.b);
    T* y = static_cast<T*>(s.y);
    Op op;
    for (unsigned r = 0; r < s.n; r += STEP_U * blockDim.x) {
        float va[STEP_U], vb[STEP_U];
#pragma unroll
        for (unsigned u = 0; u < STEP_U; ++u) {
            const unsigned i = r + u * blockDim.x + threadIdx.x;
            va[u] = i < s.n ? load_cg(a + i) : 0.0f;
            vb[u] = i < s.n ? load_cg(b + i) : 0.0f;
        }
#pragma unroll
        for (unsigned u = 0; u < STEP_U; ++u) {
            const unsigned i = r + u * blockDim.x + threadIdx.x;
            if (i < s.n) Ty<T>::store(y + i, op(va[u], vb[u]));
        }
    }
}

#define RTX_STEP3(k, F, Op)                                                                    \
    case 3 * (k) + 0: F<Op, float>(s); break;                                                  \
    case 3 * (k) + 1: F<Op, __half>(s); break;                                                 \
    case 3 * (k) + 2: F<Op, __nv_bfloat16>(s); break;

extern "C" __global__ void __launch_bounds__(RTX_BLOCK) ew_batch(EwBatch p) {
    wait_prior_grid();
    const unsigned count = p.count < 16u ? p.count : 16u;
    for (unsigned k = 0; k < count; ++k) {
        const EwStep s = p.steps[k];
        switch (s.code) {
            RTX_STEP3(0, step_unary, Neg)
            RTX_STEP3(1, step_unary, Exp)
            RTX_STEP3(2, step_unary, Log)
            RTX_STEP3(3, step_unary, Sin)
            RTX_STEP3(4, step_unary, Cos)
            RTX_STEP3(5, step_unary, Sqrt)
            RTX_STEP3(6, step_unary, Abs)
            RTX_STEP3(7, step_unary, Relu)
            RTX_STEP3(8, step_binary, Add)
            RTX_STEP3(9, step_binary, Sub)
            RTX_STEP3(10, step_binary, Mul)
            RTX_STEP3(11, step_binary, Div)
            RTX_STEP3(12, step_binary, Max)
            RTX_STEP3(13, step_binary, Min)
            default: break;
        }
        __syncthreads();
    }
}
