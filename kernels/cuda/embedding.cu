// embedding.cu — embedding lookup (gather rows) and its deterministic backward
// (scatter-add through a stable counting sort of the ids). CPU reference:
// ops/src/embedding/cpu.rs.
//
// dt is f32 / f16 / bf16 (T), it is i32 / u32 (I). Arithmetic in f32. Block: 256 threads
// (RTX_BLOCK; emb_scan runs as ONE block of RTX_BLOCK); the other kernels are grid-stride
// (any grid). An id is valid when 0 <= id < V; invalid ids are never used as an address.
//
//   extern "C" __global__ void emb_fwd_{dt}_{it}(const T* table, const I* ids, T* y,
//       size_t n, size_t V, size_t D, unsigned* bad)
//     y[i, :] = table[ids[i], :] for i < n (y is [n, D]); a row of an invalid id is
//     zeros and adds 1 to *bad (zeroed by the launcher). A warp per row (the id read
//     once), 16-byte vectors when D % (16 / sizeof(T)) == 0 and table, y are 16-byte
//     aligned, up to 8 vectors per lane in flight; best grid ceil(n / 8) blocks, capped
//     at the resident blocks.
//
// Backward, dtable[v, :] = sum over i with ids[i] == v, in increasing i, of dy[i, :]
// (summed in f32 from 0, in that order: the same bits every run):
//   emb_count_{it}(const I* ids, size_t n, size_t V, unsigned* counts, unsigned* bad)
//     counts[V] (zeroed) gets the number of each valid id; *bad (zeroed) the invalid ones.
//   emb_scan(const unsigned* counts, size_t V, unsigned* offsets, unsigned* next)
//     one block: offsets[v] = next[v] = sum of counts[0..v], offsets[V] = the total.
//     (Each thread a contiguous segment, 16-byte loads and stores when counts, offsets
//     and next are 16-byte aligned.)
//   emb_scatter_{it}(const I* ids, size_t n, size_t V, unsigned* next, unsigned* slots)
//     slots[offsets[v] ..] = the i with ids[i] == v, in an arbitrary order (atomics on
//     the cursors next[]); grid-stride over i.
//   emb_order_{it}(const I* ids, size_t n, size_t V, const unsigned* offsets,
//       const unsigned* slots, unsigned* positions)
//     positions[offsets[v] + r] = i where r = the number of slots of bucket v holding
//     an index below i: each bucket sorted in increasing i (a stable sort: the result
//     does not depend on the order of the atomics above). O(sum of bucket sizes^2).
//   emb_bwd_{dt}(const T* dy, const unsigned* offsets, const unsigned* positions, T* dtable,
//       size_t V, size_t D)
//     every element of dtable [V, D] written once: the ordered sum of its bucket (0 if
//     empty). A warp per table row, 16-byte vectors as the forward; best grid ceil(V / 8)
//     blocks, capped at the resident blocks.
// n and V are below 2^32 - 1 (checked at submit).

#include "common.cuh"

using namespace rtx;

#define RTX_NO_ID 0xffffffffu
#ifndef EMB_U
#define EMB_U 8  // most 16-byte vectors per lane in flight (forward)
#endif

template <typename I>
__device__ __forceinline__ unsigned valid_id(I raw, size_t V) {
    const long long v = (long long)raw;
    return (v >= 0 && (u64)v < V) ? (unsigned)v : RTX_NO_ID;
}

__device__ __forceinline__ size_t global_warp() { return global_thread() >> 5; }
__device__ __forceinline__ size_t global_warps() { return global_threads() >> 5; }

template <typename T, typename I>
__device__ __forceinline__ void fwd(const T* table, const I* ids, T* y, size_t n, size_t V, size_t D, unsigned* bad) {
    constexpr int VW = Ty<T>::V;
    const unsigned lane = lane_id();
    const bool vec = D % VW == 0 && aligned16(table) && aligned16(y);
    const size_t nv = D / VW;
    for (size_t row = global_warp(); row < n; row += global_warps()) {
        const unsigned id = valid_id(ids[row], V);
        T* yr = y + row * D;
        if (id == RTX_NO_ID) {
            if (lane == 0) atomicAdd(bad, 1u);
            for (size_t j = lane; j < D; j += 32) Ty<T>::store(yr + j, 0.0f);
            continue;
        }
        const T* tr = table + (size_t)id * D;
        if (vec) {
            for (size_t base = 0; base < nv; base += 32 * EMB_U) {
                uint4 r[EMB_U];
#pragma unroll
                for (int u = 0; u < EMB_U; ++u) {
                    const size_t j = base + lane + 32 * u;
                    if (j < nv) r[u] = ldg16(tr + j * VW);
                }
#pragma unroll
                for (int u = 0; u < EMB_U; ++u) {
                    const size_t j = base + lane + 32 * u;
                    if (j < nv) st16(yr + j * VW, r[u]);
                }
            }
        } else {
            for (size_t j = lane; j < D; j += 32) yr[j] = tr[j];
        }
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

// Exclusive scan of one value per thread over the block (blockDim.x a multiple of 32, at
// most 1024); *total gets the sum.
__device__ __forceinline__ unsigned block_exclusive_scan(unsigned v, unsigned* total) {
    __shared__ unsigned warp_sums[32];
    const unsigned lane = lane_id(), w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_up_sync(RTX_FULL_MASK, inc, o);
        if (lane >= (unsigned)o) inc += t;
    }
    if (lane == 31) warp_sums[w] = inc;
    __syncthreads();
    if (w == 0) {
        unsigned s = lane < nw ? warp_sums[lane] : 0u;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned t = __shfl_up_sync(RTX_FULL_MASK, s, o);
            if (lane >= (unsigned)o) s += t;
        }
        if (lane < nw) warp_sums[lane] = s;  // inclusive over warps
    }
    __syncthreads();
    const unsigned before = (w == 0 ? 0u : warp_sums[w - 1]) + inc - v;
    *total = warp_sums[nw - 1];
    return before;
}

extern "C" __global__ void __launch_bounds__(RTX_BLOCK)
    emb_scan(const unsigned* counts, size_t V, unsigned* offsets, unsigned* next) {
    const unsigned t = threadIdx.x;
    // Segments of a multiple of 4 counts, so that each starts 16-byte aligned.
    const size_t seg = ((V + blockDim.x - 1) / blockDim.x + 3) / 4 * 4;
    const size_t lo = (size_t)t * seg < V ? (size_t)t * seg : V;
    const size_t hi = lo + seg < V ? lo + seg : V;
    const bool vec = aligned16(counts) && aligned16(offsets) && aligned16(next);
    unsigned s = 0;
    size_t v = lo;
    if (vec) {
#pragma unroll 4
        for (; v + 4 <= hi; v += 4) {
            const uint4 c = *reinterpret_cast<const uint4*>(counts + v);
            s += c.x + c.y + c.z + c.w;
        }
    }
    for (; v < hi; ++v) s += counts[v];
    unsigned total;
    unsigned run = block_exclusive_scan(s, &total);
    if (t == 0) offsets[V] = total;
    v = lo;
    if (vec) {
#pragma unroll 4
        for (; v + 4 <= hi; v += 4) {
            const uint4 c = *reinterpret_cast<const uint4*>(counts + v);
            uint4 o;
            o.x = run; run += c.x;
            o.y = run; run += c.y;
            o.z = run; run += c.z;
            o.w = run; run += c.w;
            *reinterpret_cast<uint4*>(offsets + v) = o;
            *reinterpret_cast<uint4*>(next + v) = o;
        }
    }
    for (; v < hi; ++v) { offsets[v] = run; next[v] = run; run += counts[v]; }
}

template <typename I>
__device__ __forceinline__ void scatter(const I* ids, size_t n, size_t V, unsigned* next, unsigned* slots) {
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        const unsigned id = valid_id(ids[i], V);
        if (id != RTX_NO_ID) slots[atomicAdd(next + id, 1u)] = (unsigned)i;
    }
}

template <typename I>
__device__ __forceinline__ void order(const I* ids, size_t n, size_t V, const unsigned* offsets,
                                      const unsigned* slots, unsigned* positions) {
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        const unsigned id = valid_id(ids[i], V);
        if (id == RTX_NO_ID) continue;
        const unsigned o = offsets[id], c = offsets[id + 1] - o;
        unsigned r = 0;
        if (c > 1) {
#pragma unroll 4
            for (unsigned k = 0; k < c; ++k) r += slots[o + k] < (unsigned)i ? 1u : 0u;
        }
        positions[o + r] = (unsigned)i;
    }
}

template <typename T>
__device__ __forceinline__ void bwd(const T* dy, const unsigned* offsets, const unsigned* positions, T* dtable,
                                    size_t V, size_t D) {
    constexpr int VW = Ty<T>::V;
    constexpr int U = 32 / VW;  // vectors per lane per pass: 32 accumulators
    const unsigned lane = lane_id();
    const bool vec = D % VW == 0 && aligned16(dy) && aligned16(dtable);
    const size_t nv = D / VW;
    for (size_t row = global_warp(); row < V; row += global_warps()) {
        const unsigned k0 = __ldg(offsets + row), k1 = __ldg(offsets + row + 1);
        T* out = dtable + row * D;
        if (vec) {
            for (size_t base = 0; base < nv; base += 32 * U) {
                float acc[U][VW];
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int e = 0; e < VW; ++e) acc[u][e] = 0.0f;
                for (unsigned k = k0; k < k1; ++k) {
                    const T* src = dy + (size_t)__ldg(positions + k) * D;
                    uint4 r[U];
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const size_t j = base + lane + 32 * u;
                        if (j < nv) r[u] = ldg16(src + j * VW);
                    }
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const size_t j = base + lane + 32 * u;
                        if (j < nv) {
                            float f[VW];
                            Ty<T>::unpack(r[u], f);
#pragma unroll
                            for (int e = 0; e < VW; ++e) acc[u][e] += f[e];
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const size_t j = base + lane + 32 * u;
                    if (j < nv) st16(out + j * VW, Ty<T>::pack(acc[u]));
                }
            }
        } else {
            for (size_t j = lane; j < D; j += 32) {
                float s = 0.0f;
                for (unsigned k = k0; k < k1; ++k) s += Ty<T>::load(dy + (size_t)__ldg(positions + k) * D + j);
                Ty<T>::store(out + j, s);
            }
        }
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
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) emb_scatter_##it(                  \
        const I* ids, size_t n, size_t V, unsigned* next, unsigned* slots) {                   \
        scatter<I>(ids, n, V, next, slots);                                                    \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) emb_order_##it(                    \
        const I* ids, size_t n, size_t V, const unsigned* offsets, const unsigned* slots,      \
        unsigned* positions) {                                                                 \
        order<I>(ids, n, V, offsets, slots, positions);                                        \
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
