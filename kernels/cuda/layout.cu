// layout.cu — strided copies for the layout ops (permute / transpose, narrow, concat).
// The elements are moved as raw bits: b4 serves f32, i32 and u32, b2 serves f16 and bf16.
//
// Block: 256 threads (RTX_BLOCK); grid: any size (grid-stride), best
// min(ceil(n / 256), resident blocks). No shared memory.
//
//   struct CopyArgs { int ndim; long long shape[8]; long long ss[8]; long long ds[8]; };
//   extern "C" __global__ void layout_copy_{b2,b4}(const T* x, T* y, size_t n, CopyArgs a)
//   For each index i < n of the row-major index space `shape` (n = its product), with
//   coordinates c[d]: y[sum c[d] * ds[d]] = x[sum c[d] * ss[d]]. Strides are in elements
//   (>= 0); x and y are already offset to the first element. 1 <= ndim <= 8; the launcher
//   drops size-1 dims and merges dims contiguous in both. The destinations of distinct i
//   must be distinct (every layout op's are); x and y must not overlap.

#include "common.cuh"

using namespace rtx;

struct CopyArgs {
    int ndim;
    long long shape[8];
    long long ss[8];
    long long ds[8];
};

template <typename T>
__device__ __forceinline__ void copy(const T* __restrict__ x, T* __restrict__ y, size_t n, const CopyArgs& a) {
    const int ndim = a.ndim;
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        u64 r = i;
        long long so = 0, d = 0;
        // Unrolled with constant indices, so the arguments stay in the parameter bank.
#pragma unroll
        for (int k = 7; k >= 0; --k) {
            if (k < ndim) {
                const u64 dim = (u64)a.shape[k];
                const u64 q = udiv64(r, dim);
                const long long c = (long long)(r - q * dim);
                so += c * a.ss[k];
                d += c * a.ds[k];
                r = q;
            }
        }
        y[d] = x[so];
    }
}

extern "C" __global__ void __launch_bounds__(RTX_BLOCK)
    layout_copy_b2(const unsigned short* x, unsigned short* y, size_t n, CopyArgs a) {
    copy(x, y, n, a);
}

extern "C" __global__ void __launch_bounds__(RTX_BLOCK)
    layout_copy_b4(const unsigned* x, unsigned* y, size_t n, CopyArgs a) {
    copy(x, y, n, a);
}
