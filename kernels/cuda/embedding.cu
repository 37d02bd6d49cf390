// embedding.cu — embedding lookup (gather rows) and its deterministic backward
// (scatter-add through a stable counting sort of the ids). CPU reference:
// ops/src/embedding/cpu.rs.
//
// dt is f32 / f16 / bf16 (T), it is i32 / u32 (I). Arithmetic in f32. Block: 256 threads
// (RTX_BLOCK, required by emb_scan and emb_rank, which run as ONE block); the other
// kernels are grid-stride (any grid), best min(ceil(work / 256), resident blocks).
// An id is valid when 0 <= id < V; invalid ids are never used as an address.
//
//   extern "C" __global__ void emb_fwd_{dt}_{it}(const T* table, const I* ids, T* y,
//       size_t n, size_t V, size_t D, unsigned* bad)
//     y[i, :] = table[ids[i], :] for i < n (y is [n, D]); a row of an invalid id is
//     zeros and adds 1 to *bad (zeroed by the launcher).
//
// Backward, dtable[v, :] = sum over i with ids[i] == v, in increasing i, of dy[i, :]:
//   emb_count_{it}(const I* ids, size_t n, size_t V, unsigned* counts, unsigned* bad)
//     counts[V] (zeroed) gets the number of each valid id; *bad (zeroed) the invalid ones.
//   emb_scan(const unsigned* counts, size_t V, unsigned* offsets, unsigned* next)
//     one block: offsets[v] = next[v] = sum of counts[0..v], offsets[V] = the total.
//   emb_rank_{it}(const I* ids, size_t n, size_t V, unsigned* next, unsigned* positions)
//     one block: positions[offsets[v] ..] = the i with ids[i] == v in increasing order
//     (a stable counting sort: chunks of 256 ids in order; within a chunk a thread's
//     rank is the number of earlier threads with its id). O(n * 256) comparisons.
//   emb_bwd_{dt}(const T* dy, const unsigned* offsets, const unsigned* positions, T* dtable,
//       size_t V, size_t D)
//     every element of dtable [V, D] written once: the ordered sum of its bucket (0 if empty).
// n and V are below 2^32 - 1 (checked at submit).

#include "common.cuh"

using namespace rtx;

#define RTX_NO_ID 0xffffffffu

template <typename I>
__device__ __forceinline__ unsigned valid_id(I raw, size_t V) {
    const long long v = (long long)raw;
    return (v >= 0 && (u64)v < V) ? (unsigned)v : RTX_NO_ID;
}

template <typename T, typename I>
__device__ __forceinline__ void fwd(const T* table, const I* ids, T* y, size_t n, size_t V, size_t D, unsigned* bad) {
    const size_t total = n * D;
    for (size_t e = global_thread(); e < total; e += global_threads()) {
        const size_t row = udiv64(e, D), d = e - row * D;
        const unsigned id = valid_id(ids[row], V);
        float v = 0.0f;
        if (id != RTX_NO_ID) v = Ty<T>::load(table + (size_t)id * D + d);
        else if (d == 0) atomicAdd(bad, 1u);
        Ty<T>::store(y + e, v);
    }
}

template <typename I>
__device__ __forceinline__ void count(const I* ids, size_t n, size_t V, unsigned* counts, unsigned* bad) {
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        const unsigned id = valid_id(ids[i], V);
        if (id != RTX_NO_ID) atomicAdd(counts + id, 1u);
        else atomicAdd(bad, 1u);
    }
}

extern "C" __global__ void __launch_bounds__(RTX_BLOCK)
    emb_scan(const unsigned* counts, size_t V, unsigned* offsets, unsigned* next) {
    __shared__ unsigned sums[RTX_BLOCK];
    const unsigned t = threadIdx.x;
    const size_t seg = (V + RTX_BLOCK - 1) / RTX_BLOCK;
    const size_t lo = t * seg, hi = lo + seg < V ? lo + seg : V;
    unsigned s = 0;
    for (size_t v = lo; v < hi; ++v) s += counts[v];
    sums[t] = s;
    __syncthreads();
    if (t == 0) {
        unsigned run = 0;
        for (int k = 0; k < RTX_BLOCK; ++k) { const unsigned c = sums[k]; sums[k] = run; run += c; }
        offsets[V] = run;
    }
    __syncthreads();
    unsigned run = sums[t];
    for (size_t v = lo; v < hi; ++v) { offsets[v] = run; next[v] = run; run += counts[v]; }
}

template <typename I>
__device__ __forceinline__ void rank(const I* ids, size_t n, size_t V, unsigned* next, unsigned* positions) {
    __shared__ unsigned sid[RTX_BLOCK];
    const unsigned t = threadIdx.x;
    for (size_t base = 0; base < n; base += RTX_BLOCK) {
        const size_t i = base + t;
        const unsigned id = i < n ? valid_id(ids[i], V) : RTX_NO_ID;
        sid[t] = id;
        __syncthreads();
        unsigned r = 0;
        bool last = true;
        if (id != RTX_NO_ID) {
            for (unsigned j = 0; j < RTX_BLOCK; ++j) {
                if (sid[j] == id) {
                    if (j < t) ++r;
                    else if (j > t) last = false;
                }
            }
            positions[next[id] + r] = (unsigned)i;
        }
        // Every thread has read next[] before the last of each id moves it on.
        __syncthreads();
        if (id != RTX_NO_ID && last) next[id] += r + 1;
        __syncthreads();
    }
}

template <typename T>
__device__ __forceinline__ void bwd(const T* dy, const unsigned* offsets, const unsigned* positions, T* dtable,
                                    size_t V, size_t D) {
    const size_t total = V * D;
    for (size_t e = global_thread(); e < total; e += global_threads()) {
        const size_t v = udiv64(e, D), d = e - v * D;
        float s = 0.0f;
        for (unsigned k = offsets[v], end = offsets[v + 1]; k < end; ++k)
            s += Ty<T>::load(dy + (size_t)positions[k] * D + d);
        Ty<T>::store(dtable + e, s);
    }
}

#define RTX_EMB_FWD(dt, T, it, I)                                                              \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) emb_fwd_##dt##_##it(               \
        const T* table, const I* ids, T* y, size_t n, size_t V, size_t D, unsigned* bad) {     \
        fwd<T, I>(table, ids, y, n, V, D, bad);                                                \
    }

#define RTX_EMB_IDX(it, I)                                                                     \
    RTX_EMB_FWD(f32, float, it, I) RTX_EMB_FWD(f16, __half, it, I) RTX_EMB_FWD(bf16, __nv_bfloat16, it, I) \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) emb_count_##it(                    \
        const I* ids, size_t n, size_t V, unsigned* counts, unsigned* bad) {                   \
        count<I>(ids, n, V, counts, bad);                                                      \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) emb_rank_##it(                     \
        const I* ids, size_t n, size_t V, unsigned* next, unsigned* positions) {               \
        rank<I>(ids, n, V, next, positions);                                                   \
    }

RTX_EMB_IDX(i32, int)
RTX_EMB_IDX(u32, unsigned)

#define RTX_EMB_BWD(dt, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) emb_bwd_##dt(                      \
        const T* dy, const unsigned* offsets, const unsigned* positions, T* dtable, size_t V, size_t D) { \
        bwd<T>(dy, offsets, positions, dtable, V, D);                                          \
    }

RTX_EMB_BWD(f32, float)
RTX_EMB_BWD(f16, __half)
RTX_EMB_BWD(bf16, __nv_bfloat16)
