// reduce.cu — full and per-dimension reductions, and argmax/argmin.
//
// dt is f32 (T = float), f16 (T = __half) or bf16 (T = __nv_bfloat16); accumulation in
// f32. Block: 256 threads (RTX_BLOCK, required: shared arrays are sized for it). Grids
// are grid-stride; sizes below. max/min propagate NaN (PyTorch); mean = sum / count.
// argmax/argmin: the smallest index among equal values; NaN is the maximum for argmax
// and the minimum for argmin (the first NaN wins), like PyTorch. Indices are 32-bit.
//
// Full reductions, one launch (each block reduces its grid-stride share, writes one
// partial, and the last block to finish — __threadfence + atomic ticket — reduces the
// partials, writes the result and resets *counter to 0 for the next launch):
//   extern "C" __global__ void reduce_all_{op}_{dt}(const T* x, size_t n,
//       float* partials, unsigned* counter, T* out)          // op: sum mean prod max min
//   extern "C" __global__ void argreduce_all_{op}_{dt}(const T* x, size_t n,
//       float* pval, unsigned* pidx, unsigned* counter, unsigned* out)   // op: argmax argmin
//   Workspace: partials / pval / pidx hold gridDim.x entries (grid <= 1024: allocate 1024);
//   counter is one unsigned, zeroed once when allocated (cuMemsetD32) and left zeroed by
//   every launch. One workspace per stream: two launches in flight must not share it.
//   out is one element (argreduce: the flat index, n < 2^32). n == 0 gives sum 0,
//   mean NaN, prod 1, max -inf, min +inf, arg 0xffffffff: reject it in the launcher.
//   Grid: min(ceil(n / (256 * 4 * V)), resident blocks, 1024), V = 16 / sizeof(T).
//
// Per-dim reductions of x viewed as [outer, r, inner] (contiguous), reducing r:
//   extern "C" __global__ void reduce_dim_{op}_{dt}(const T* x, T* y,
//       size_t outer, size_t r, size_t inner)                  // op: sum mean prod max min
//   extern "C" __global__ void argreduce_dim_{op}_{dt}(const T* x, unsigned* y,
//       size_t outer, size_t r, size_t inner)                  // op: argmax argmin
//   y is [outer, inner] contiguous; argreduce writes the index along r (r < 2^32).
//   Strategy, chosen in the kernel from the shape:
//   * inner == 1 (rows): a warp per row when outer >= 2048 or r <= 1024, else a block
//     per row; 16-byte loads from the first aligned element, 4 in flight per thread.
//     Grid: ceil(outer / 8) blocks (warp per row) or outer blocks, capped at the number
//     of resident blocks (SMs x occupancy).
//   * inner > 1 (columns): threads run along inner (16-byte loads when inner % V == 0
//     and x is aligned, else scalar) and loop over r. With items = outer*inner/V >= 65536
//     output vectors, one thread per item (a tile is 256 items); else a tile is tx items
//     x (256 / tx) thread rows splitting r, met in a shared-memory tree, where tx (a
//     power of two) makes a 128-byte row segment, narrowed to no less than 32 bytes
//     while there are fewer than 512 tiles. Grid: the tile count, capped at the number
//     of resident blocks (rtx_kernels::launch::reduce_dim_grid computes it).
//   r is never split across blocks: when outer * inner is 1, use reduce_all instead.
//   r == 0 gives the values listed for n == 0 above.

#include "common.cuh"

using namespace rtx;

// Kernels here declare __launch_bounds__(256, 4): with the bare (256) form ptxas aimed
// at 40-48 registers and parked a few loop-invariant bytes in local memory (spills);
// with a floor of 4 blocks per SM it uses up to 64 registers and spills nothing.
#define RTX_COLS_THREAD_MODE 65536
#define RTX_COLS_MIN_TILES 512
#define RTX_ROWS_WARP_MIN_ROWS 2048
#define RTX_ROWS_WARP_MAX_R 1024

__device__ __forceinline__ float inf_f() { return __int_as_float(0x7f800000); }

// ---- reduction ops: Acc, init, push (one element with its index), merge, shfl, result --

struct SumR {
    typedef float Acc;
    static __device__ __forceinline__ Acc init() { return 0.0f; }
    static __device__ __forceinline__ Acc push(Acc a, float v, size_t) { return a + v; }
    static __device__ __forceinline__ Acc merge(Acc a, Acc b) { return a + b; }
    static __device__ __forceinline__ float result(Acc a, size_t) { return a; }
};
struct MeanR : SumR {
    static __device__ __forceinline__ float result(Acc a, size_t n) { return a / (float)n; }
};
struct ProdR : SumR {
    static __device__ __forceinline__ Acc init() { return 1.0f; }
    static __device__ __forceinline__ Acc push(Acc a, float v, size_t) { return a * v; }
    static __device__ __forceinline__ Acc merge(Acc a, Acc b) { return a * b; }
};
struct MaxR : SumR {
    static __device__ __forceinline__ Acc init() { return -inf_f(); }
    static __device__ __forceinline__ Acc push(Acc a, float v, size_t) { return max_nan(a, v); }
    static __device__ __forceinline__ Acc merge(Acc a, Acc b) { return max_nan(a, b); }
};
struct MinR : SumR {
    static __device__ __forceinline__ Acc init() { return inf_f(); }
    static __device__ __forceinline__ Acc push(Acc a, float v, size_t) { return min_nan(a, v); }
    static __device__ __forceinline__ Acc merge(Acc a, Acc b) { return min_nan(a, b); }
};

struct ArgAcc { float v; unsigned i; };

template <bool MAX>
struct ArgR {
    typedef ArgAcc Acc;
    static __device__ __forceinline__ Acc init() { return Acc{MAX ? -inf_f() : inf_f(), 0xffffffffu}; }
    // Whether (v, i) beats b: NaN beats numbers, then the larger (smaller) value, then
    // the smaller index.
    static __device__ __forceinline__ bool beats(float v, unsigned i, Acc b) {
        const bool vn = v != v, bn = b.v != b.v;
        if (vn || bn) return vn && (!bn || i < b.i);
        if (v == b.v) return i < b.i;
        return MAX ? v > b.v : v < b.v;
    }
    static __device__ __forceinline__ Acc push(Acc a, float v, size_t i) {
        return beats(v, (unsigned)i, a) ? Acc{v, (unsigned)i} : a;
    }
    static __device__ __forceinline__ Acc merge(Acc a, Acc b) { return beats(b.v, b.i, a) ? b : a; }
    static __device__ __forceinline__ unsigned result(Acc a, size_t) { return a.i; }
};

__device__ __forceinline__ float shfl_acc(float a, int m) { return __shfl_xor_sync(RTX_FULL_MASK, a, m); }
__device__ __forceinline__ ArgAcc shfl_acc(ArgAcc a, int m) {
    return ArgAcc{__shfl_xor_sync(RTX_FULL_MASK, a.v, m), __shfl_xor_sync(RTX_FULL_MASK, a.i, m)};
}

template <class R>
__device__ __forceinline__ typename R::Acc warp_merge(typename R::Acc a) {
    __syncwarp();
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = R::merge(a, shfl_acc(a, o));
    return a;
}

// Merges over the block; every thread gets the result. Reusable back to back.
template <class R>
__device__ __forceinline__ typename R::Acc block_merge(typename R::Acc a) {
    __shared__ typename R::Acc partial[32];
    a = warp_merge<R>(a);
    __syncthreads();
    if (lane_id() == 0) partial[threadIdx.x >> 5] = a;
    __syncthreads();
    a = lane_id() < (blockDim.x >> 5) ? partial[lane_id()] : R::init();
    return warp_merge<R>(a);
}

// Output stores: a T value or an index.
template <typename T> __device__ __forceinline__ void put(T* y, float v) { Ty<T>::store(y, v); }
__device__ __forceinline__ void put(unsigned* y, unsigned v) { *y = v; }

// ---- contiguous accumulation -----------------------------------------------------------

// Thread t of nt accumulates x[0..n) (indices pushed are positions in x): scalar up to the
// first 16-byte boundary, then 4 vectors in flight per step, then the scalar tail.
template <class R, typename T>
__device__ __forceinline__ typename R::Acc accumulate(const T* x, size_t n, size_t t, size_t nt) {
    constexpr int V = Ty<T>::V, U = 4;
    typename R::Acc acc = R::init();
    size_t head = ((16 - ((u64)x & 15)) & 15) / sizeof(T);
    if (head > n) head = n;
    for (size_t j = t; j < head; j += nt) acc = R::push(acc, Ty<T>::load(x + j), j);
    const T* xv = x + head;
    const size_t nv = (n - head) / V;
    // Steps with all U vectors in range: i + (U - 1) * nt < nv.
    const size_t full = nv > (U - 1) * nt ? nv - (U - 1) * nt : 0;
    size_t i = t;
    for (; i < full; i += U * nt) {
        float f[U][V];
#pragma unroll
        for (int u = 0; u < U; ++u) load_vec<T, V>(xv + (i + u * nt) * V, f[u]);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int e = 0; e < V; ++e) acc = R::push(acc, f[u][e], head + (i + u * nt) * V + e);
    }
    for (; i < nv; i += nt) {
        float f[V];
        load_vec<T, V>(xv + i * V, f);
#pragma unroll
        for (int e = 0; e < V; ++e) acc = R::push(acc, f[e], head + i * V + e);
    }
    for (size_t j = head + nv * V + t; j < n; j += nt) acc = R::push(acc, Ty<T>::load(x + j), j);
    return acc;
}

// ---- full reductions -------------------------------------------------------------------

// Where blocks leave their partials: one float, or a (value, index) pair.
struct PlainWs {
    float* p;
    __device__ __forceinline__ void store(unsigned b, float a) const { p[b] = a; }
    __device__ __forceinline__ float load(unsigned b) const { return __ldcg(p + b); }
};
struct ArgWs {
    float* v;
    unsigned* i;
    __device__ __forceinline__ void store(unsigned b, ArgAcc a) const { v[b] = a.v; i[b] = a.i; }
    __device__ __forceinline__ ArgAcc load(unsigned b) const { return ArgAcc{__ldcg(v + b), __ldcg(i + b)}; }
};

template <class R, typename T, class Ws, typename Out>
__device__ __forceinline__ void reduce_all(const T* x, size_t n, Ws ws, unsigned* counter, Out* out) {
    __shared__ bool is_last;
    typename R::Acc acc = block_merge<R>(accumulate<R, T>(x, n, global_thread(), global_threads()));
    if (threadIdx.x == 0) {
        ws.store(blockIdx.x, acc);
        __threadfence();  // the partial is visible device-wide before the ticket is taken
        is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();  // and read only after every other block's ticket
    acc = R::init();
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) acc = R::merge(acc, ws.load(b));
    acc = block_merge<R>(acc);
    if (threadIdx.x == 0) {
        put(out, R::result(acc, n));
        *counter = 0;
    }
}

// ---- per-dim: rows (inner == 1) ----------------------------------------------------------

// A group (a warp, or the block when BLOCK) reduces each row it is given.
template <class R, typename T, typename Out, bool BLOCK>
__device__ __forceinline__ void reduce_rows(const T* x, Out* y, size_t rows, size_t r) {
    const unsigned gt = BLOCK ? threadIdx.x : lane_id();
    const unsigned gsize = BLOCK ? blockDim.x : 32u;
    // 32-bit group counts (grids are capped far below 2^27 blocks) keep the loop's
    // invariants cheap enough that ptxas rematerializes them instead of spilling.
    const unsigned first = BLOCK ? blockIdx.x : blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const unsigned groups = BLOCK ? gridDim.x : gridDim.x * (blockDim.x >> 5);
    for (size_t row = first; row < rows; row += groups) {
        typename R::Acc acc = accumulate<R, T>(x + row * r, r, gt, gsize);
        acc = BLOCK ? block_merge<R>(acc) : warp_merge<R>(acc);
        if (gt == 0) put(y + row, R::result(acc, r));
    }
}

// ---- per-dim: columns (inner > 1) --------------------------------------------------------

// Items are V-wide column slices (o, jv): item = o * (inner / V) + jv. A tile is tx_n
// consecutive items; ty_n = 256 / tx_n thread rows split r between them and meet in a
// shared-memory tree. With many items tx_n = 256 and ty_n = 1 (a thread per item).
template <class R, typename T, typename Out, int V>
__device__ __forceinline__ void reduce_cols(const T* x, Out* y, size_t outer, size_t r, size_t inner) {
    typedef typename R::Acc Acc;
    __shared__ Acc tree[V][RTX_BLOCK];
    const size_t nv = inner / V, items = outer * nv;
    // Tile width: each row segment 128 bytes if the row has them, narrowed (not below
    // 32 bytes, one sector) until there are RTX_COLS_MIN_TILES tiles to spread.
    constexpr unsigned seg_max = 128 / (V * sizeof(T)), seg_min = 32 / (V * sizeof(T));
    unsigned tx_n = blockDim.x;
    if (items < RTX_COLS_THREAD_MODE) {
        tx_n = 1;
        while (tx_n < seg_max && tx_n < nv) tx_n <<= 1;
        while (tx_n > seg_min && ((unsigned)items + tx_n - 1) / tx_n < RTX_COLS_MIN_TILES) tx_n >>= 1;
    }
    const unsigned ty_n = blockDim.x / tx_n, tx = threadIdx.x % tx_n, ty = threadIdx.x / tx_n;
    const size_t tiles = udiv64(items + tx_n - 1, tx_n);
    // Steps with all 4 rows in range: k + 3 * ty_n < r.
    const size_t full = r > 3 * ty_n ? r - 3 * ty_n : 0;
    // (o, jv) are recomputed per tile (udiv64 is an inline 32-bit divide for sizes under
    // 2^32) rather than carried: fewer values live across the loop.
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const size_t item = tile * tx_n + tx;
        Acc acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = R::init();
        if (item < items) {
            const size_t o = udiv64(item, nv), jv = item - o * nv;
            const T* p = x + o * r * inner + jv * V;
            size_t k = ty;
            for (; k < full; k += 4 * ty_n) {
                float f[4][V];
#pragma unroll
                for (int u = 0; u < 4; ++u) load_vec<T, V>(p + (k + u * ty_n) * inner, f[u]);
#pragma unroll
                for (int u = 0; u < 4; ++u)
#pragma unroll
                    for (int e = 0; e < V; ++e) acc[e] = R::push(acc[e], f[u][e], k + u * ty_n);
            }
            for (; k < r; k += ty_n) {
                float f[V];
                load_vec<T, V>(p + k * inner, f);
#pragma unroll
                for (int e = 0; e < V; ++e) acc[e] = R::push(acc[e], f[e], k);
            }
        }
        if (ty_n > 1) {
#pragma unroll
            for (int e = 0; e < V; ++e) tree[e][threadIdx.x] = acc[e];
            __syncthreads();
            for (unsigned s = ty_n / 2; s > 0; s >>= 1) {
                if (ty < s)
#pragma unroll
                    for (int e = 0; e < V; ++e)
                        tree[e][threadIdx.x] = R::merge(tree[e][threadIdx.x], tree[e][threadIdx.x + s * tx_n]);
                __syncthreads();
            }
#pragma unroll
            for (int e = 0; e < V; ++e) acc[e] = tree[e][threadIdx.x];
        }
        if (ty == 0 && item < items) {
            Out* q = y + item * V;  // = o * inner + jv * V
#pragma unroll
            for (int e = 0; e < V; ++e) put(q + e, R::result(acc[e], r));
        }
    }
}

template <class R, typename T, typename Out>
__device__ __forceinline__ void reduce_dim(const T* x, Out* y, size_t outer, size_t r, size_t inner) {
    constexpr int V = Ty<T>::V;
    if (inner == 1) {
        if (outer >= RTX_ROWS_WARP_MIN_ROWS || r <= RTX_ROWS_WARP_MAX_R)
            reduce_rows<R, T, Out, false>(x, y, outer, r);
        else
            reduce_rows<R, T, Out, true>(x, y, outer, r);
    } else if (inner % V == 0 && aligned16(x)) {
        reduce_cols<R, T, Out, V>(x, y, outer, r, inner);
    } else {
        reduce_cols<R, T, Out, 1>(x, y, outer, r, inner);
    }
}

// ---- entry points ------------------------------------------------------------------------

#define RTX_REDUCE(op, R, dt, T)                                                              \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK, 4)                                   \
        reduce_all_##op##_##dt(const T* x, size_t n, float* partials, unsigned* counter, T* out) { \
        reduce_all<R, T>(x, n, PlainWs{partials}, counter, out);                              \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK, 4)                                   \
        reduce_dim_##op##_##dt(const T* x, T* y, size_t outer, size_t r, size_t inner) {      \
        reduce_dim<R, T>(x, y, outer, r, inner);                                              \
    }

#define RTX_ARGREDUCE(op, R, dt, T)                                                           \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK, 4) argreduce_all_##op##_##dt(        \
        const T* x, size_t n, float* pval, unsigned* pidx, unsigned* counter, unsigned* out) { \
        reduce_all<R, T>(x, n, ArgWs{pval, pidx}, counter, out);                              \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK, 4)                                   \
        argreduce_dim_##op##_##dt(const T* x, unsigned* y, size_t outer, size_t r, size_t inner) { \
        reduce_dim<R, T>(x, y, outer, r, inner);                                              \
    }

#define RTX_ALL_DTYPES(M, op, R) M(op, R, f32, float) M(op, R, f16, __half) M(op, R, bf16, __nv_bfloat16)

RTX_ALL_DTYPES(RTX_REDUCE, sum, SumR)
RTX_ALL_DTYPES(RTX_REDUCE, mean, MeanR)
RTX_ALL_DTYPES(RTX_REDUCE, prod, ProdR)
RTX_ALL_DTYPES(RTX_REDUCE, max, MaxR)
RTX_ALL_DTYPES(RTX_REDUCE, min, MinR)
RTX_ALL_DTYPES(RTX_ARGREDUCE, argmax, ArgR<true>)
RTX_ALL_DTYPES(RTX_ARGREDUCE, argmin, ArgR<false>)
