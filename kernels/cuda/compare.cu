// compare.cu — element-wise comparisons giving u32 masks, and selection by mask.
//
// Block: 256 threads (RTX_BLOCK; fewer, a multiple of 32, also work); grid: any size
// (grid-stride loops), best min(ceil(n / (256 * 4)), resident blocks). No shared memory.
// The CPU reference is ops/src/compare/cpu.rs. Outputs do not overlap inputs.
//
// Compare, y[i] = (a[i] op b[i]) ? 1 : 0 for i < n; op in eq gt lt:
//   extern "C" __global__ void cmp_{op}_{dt}(const T* a, const T* b, unsigned* y, size_t n)
//   dt in f32 f16 bf16 (compared as f32, exact; NaN compares false) i32 u32 (native).
//
// Select, y[i] = m[i] != 0 ? a[i] : b[i], bit for bit, for any dtype of that width:
//   extern "C" __global__ void where_b32(const unsigned* m, const unsigned* a,
//                                        const unsigned* b, unsigned* y, size_t n)
//   extern "C" __global__ void where_b16(const unsigned* m, const unsigned short* a,
//                                        const unsigned short* b, unsigned short* y, size_t n)

#include "common.cuh"

using namespace rtx;

namespace {

template <typename T> struct Val {
    static __device__ __forceinline__ float load(const T* p) { return Ty<T>::load(p); }
};
template <> struct Val<int> { static __device__ __forceinline__ int load(const int* p) { return __ldg(p); } };
template <> struct Val<unsigned> {
    static __device__ __forceinline__ unsigned load(const unsigned* p) { return __ldg(p); }
};

struct Eq { template <class V> __device__ __forceinline__ bool operator()(V a, V b) const { return a == b; } };
struct Gt { template <class V> __device__ __forceinline__ bool operator()(V a, V b) const { return a > b; } };
struct Lt { template <class V> __device__ __forceinline__ bool operator()(V a, V b) const { return a < b; } };

template <class Op, typename T>
__device__ __forceinline__ void compare(const T* a, const T* b, unsigned* y, size_t n) {
    const size_t t = global_thread(), nt = global_threads();
    Op op;
    size_t i = t;
    for (; i + 3 * nt < n; i += 4 * nt) {
        bool r[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) r[u] = op(Val<T>::load(a + i + u * nt), Val<T>::load(b + i + u * nt));
#pragma unroll
        for (int u = 0; u < 4; ++u) y[i + u * nt] = r[u] ? 1u : 0u;
    }
    for (; i < n; i += nt) y[i] = op(Val<T>::load(a + i), Val<T>::load(b + i)) ? 1u : 0u;
}

template <typename W>
__device__ __forceinline__ void select(const unsigned* m, const W* a, const W* b, W* y, size_t n) {
    for (size_t i = global_thread(); i < n; i += global_threads()) y[i] = __ldg(m + i) != 0u ? __ldg(a + i) : __ldg(b + i);
}

}  // namespace

#define RTX_CMP(op, Op, dt, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        cmp_##op##_##dt(const T* a, const T* b, unsigned* y, size_t n) {                       \
        compare<Op, T>(a, b, y, n);                                                            \
    }
#define RTX_CMP_ALL(op, Op)                                                                    \
    RTX_CMP(op, Op, f32, float) RTX_CMP(op, Op, f16, __half) RTX_CMP(op, Op, bf16, __nv_bfloat16) \
    RTX_CMP(op, Op, i32, int) RTX_CMP(op, Op, u32, unsigned)

RTX_CMP_ALL(eq, Eq)
RTX_CMP_ALL(gt, Gt)
RTX_CMP_ALL(lt, Lt)

extern "C" __global__ void __launch_bounds__(RTX_BLOCK)
    where_b32(const unsigned* m, const unsigned* a, const unsigned* b, unsigned* y, size_t n) {
    select<unsigned>(m, a, b, y, n);
}

extern "C" __global__ void __launch_bounds__(RTX_BLOCK)
    where_b16(const unsigned* m, const unsigned short* a, const unsigned short* b, unsigned short* y, size_t n) {
    select<unsigned short>(m, a, b, y, n);
}
