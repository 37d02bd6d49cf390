// embedding.cu — embedding lookup (gather rows) and its deterministic backward
// (scatter-add through a stable counting sort of the ids). CPU reference:
// ops/src/embedding/cpu.rs.
//
// dt is f32 / f16 / bf16 (T), it is i32 / u32 (I). Arithmetic in f32. Block: 256 threads
// (RTX_BLOCK, required by emb_scan and emb_bwd); every kernel is grid-stride (any grid).
// An id is valid when 0 <= id < V; invalid ids are never used as an address.
//
//   extern "C" __global__ void emb_fwd_{dt}_{it}(const T* table, const I* ids, T* y,
//       size_t n, size_t V, size_t D, unsigned* bad)
//     y[i, :] = table[ids[i], :] for i < n (y is [n, D]); a row of an invalid id is
//     zeros and adds 1 to *bad (zeroed by the launcher). A warp per row (the id read
//     once), 16-byte vectors when D % (16 / sizeof(T)) == 0 and table, y are 16-byte
//     aligned, up to 8 vectors per lane in flight; best grid ceil(n / 8) blocks, capped
//     at the resident blocks.
//
// Backward, dtable[v, :] = sum over i with ids[i] == v of dy[i, :], in f32, in an order
// fixed by the ids alone (increasing i, or for buckets of more than EMB_HEAVY entries 8
// segments of increasing i, see emb_bwd): the same bits every run. The CPU reference sums
// in f64 in increasing i; the two agree within f32 rounding.
//   emb_count_{it}(const I* ids, size_t n, size_t V, unsigned* counts, unsigned* tiles,
//       unsigned* bad)
//     counts[V] (zeroed) gets the number of each valid id, tiles[ceil(V / 1024)] (zeroed)
//     the number in each tile of 1024 rows; *bad is set to 0 (emb_scatter counts the
//     invalid ids into it: the backward needs no memset for it).
//   emb_scan(const unsigned* counts, const unsigned* tiles, size_t V, unsigned* offsets,
//       unsigned* next)
//     offsets[v] = next[v] = sum of counts[0..v], offsets[V] = the total. A block per
//     tile of 1024 counts (grid-stride, any grid; best ceil(V / 1024)): its start is the
//     sum of the tiles before it, then a block scan of 4 counts per thread.
//   emb_scatter_{it}(const I* ids, size_t n, size_t V, unsigned* next, unsigned* slots,
//       unsigned* bad)
//     slots[offsets[v] ..] = the i with ids[i] == v, in an arbitrary order (atomics on
//     the cursors next[]); each invalid id adds 1 to *bad (zeroed by emb_count);
//     grid-stride over i.
//   emb_order_{it}(const I* ids, size_t n, size_t V, const unsigned* offsets,
//       const unsigned* slots, unsigned* positions)
//     positions[offsets[v] + r] = i where r = the number of slots of bucket v holding
//     an index below i: each bucket sorted in increasing i (a stable sort: the result
//     does not depend on the order of the atomics above). O(sum of bucket sizes^2).
//   emb_bwd_{dt}(const T* dy, const unsigned* offsets, const unsigned* positions, T* dtable,
//       size_t V, size_t D)
//     every element of dtable [V, D] written once: the ordered sum of its bucket (0 if
//     empty). Blocks take tiles of EMB_ROWS = 64 table rows, every ceil(V / 64)-th row
//     (interleaved, so that the heavy buckets of frequent ids spread over blocks; the
//     tile's 128 bucket bounds read into shared memory at once, and a 64-bit mask of its
//     heavy buckets made from them, so that the block visits only those; grid-stride; best
//     ceil(V / 64) blocks, capped at the resident blocks); a bucket of at most EMB_HEAVY
//     entries is summed by one warp, in increasing i; a larger one by the whole block:
//     warp w sums the w-th of 8 consecutive segments of ceil(c / 8) entries (increasing
//     i) and the 8 segment sums are added in segment order. 16-byte vectors as the
//     forward.
// n and V are below 2^32 - 1 (checked at submit).

#include "common.cuh"

using namespace rtx;

#define RTX_NO_ID 0xffffffffu
#ifndef EMB_U
#define EMB_U 8  // most 16-byte vectors per lane in flight (forward)
#endif
#define EMB_TILE 1024  // counts per block of emb_scan (RTX_BLOCK threads x 4)
#ifndef EMB_HEAVY
#define EMB_HEAVY 64  // buckets larger than this are summed by the whole block (H200: 64
                      // beat 4 and 16 on Zipf ids, equal on uniform ones)
#endif
#define EMB_ROWS 64    // table rows per block of emb_bwd (8 per warp; the heavy mask is 64 bits)

#ifndef EMB_BWD_MIN_BLOCKS
#define EMB_BWD_MIN_BLOCKS 3  // emb_bwd's launch bound (at most 80 registers)
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
__device__ __forceinline__ void count(const I* ids, size_t n, size_t V, unsigned* counts, unsigned* tiles,
                                      unsigned* bad) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *bad = 0u;  // counted by emb_scatter
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        const unsigned id = valid_id(ids[i], V);
        if (id != RTX_NO_ID) {
            atomicAdd(counts + id, 1u);
            atomicAdd(tiles + id / EMB_TILE, 1u);
        }
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

// Block b scans counts [b * EMB_TILE, (b + 1) * EMB_TILE): its start is the sum of the
// tiles before it (tiles[], from emb_count), then 4 counts per thread.
extern "C" __global__ void __launch_bounds__(RTX_BLOCK)
    emb_scan(const unsigned* counts, const unsigned* tiles, size_t V, unsigned* offsets, unsigned* next) {
    const size_t ntiles = (V + EMB_TILE - 1) / EMB_TILE;
    for (size_t b = blockIdx.x; b < ntiles; b += gridDim.x) {
        unsigned before = 0;
        for (size_t k = threadIdx.x; k < b; k += blockDim.x) before += tiles[k];
        __shared__ unsigned red[32];
        unsigned w = before;  // the block's sum of `before` (integers: exact in any order)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(RTX_FULL_MASK, w, o);
        __syncthreads();
        if (lane_id() == 0) red[threadIdx.x >> 5] = w;
        __syncthreads();
        unsigned start = 0;
        for (unsigned k = 0; k < (blockDim.x >> 5); ++k) start += red[k];
        const size_t v0 = b * EMB_TILE + 4 * (size_t)threadIdx.x;
        unsigned c[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) c[e] = v0 + e < V ? counts[v0 + e] : 0u;
        unsigned total;
        unsigned run = start + block_exclusive_scan(c[0] + c[1] + c[2] + c[3], &total);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (v0 + e < V) { offsets[v0 + e] = run; next[v0 + e] = run; }
            run += c[e];
        }
        if (b == ntiles - 1 && threadIdx.x == 0) offsets[V] = start + total;
        __syncthreads();
    }
}

template <typename I>
__device__ __forceinline__ void scatter(const I* ids, size_t n, size_t V, unsigned* next, unsigned* slots,
                                        unsigned* bad) {
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        const unsigned id = valid_id(ids[i], V);
        if (id != RTX_NO_ID) slots[atomicAdd(next + id, 1u)] = (unsigned)i;
        else atomicAdd(bad, 1u);
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

// Sums entries [k0, k1) of a bucket (the dy rows positions[k], in increasing k, from
// 0) over vectors [base, base + 32 * U) of the row: acc[u] holds vector base + lane + 32 u.
template <typename T, int U>
__device__ __forceinline__ void bucket_sum(const T* dy, const unsigned* positions, unsigned k0, unsigned k1,
                                           size_t D, size_t nv, size_t base, unsigned lane,
                                           float (*acc)[Ty<T>::V]) {
    constexpr int VW = Ty<T>::V;
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
}

// Table rows in tiles of EMB_ROWS per block (grid-stride over tiles; a tile's rows are
// interleaved, every ntiles-th, see below). A bucket of at
// most EMB_HEAVY entries is summed by one warp in increasing i; a larger one by the
// whole block: warp w sums the w-th of blockDim.x / 32 consecutive segments of
// ceil(c / warps) entries (in increasing i), and the segment sums are added in segment
// order. (The order depends only on the ids and the block size: the same bits every run.)
template <typename T>
__device__ __forceinline__ void bwd(const T* dy, const unsigned* offsets, const unsigned* positions, T* dtable,
                                    size_t V, size_t D) {
    constexpr int VW = Ty<T>::V;
    constexpr int U = 4;  // vectors per lane per pass (16 or 32 accumulators)
    __shared__ float part[RTX_BLOCK / 32][32 * U * 8];
    // The tile's bucket bounds, read once per tile (one round of loads instead of a
    // dependent pair per row): s_k[0][j] = offsets[row j], s_k[1][j] = offsets[row j + 1].
    __shared__ unsigned s_k[2][EMB_ROWS];
    __shared__ unsigned long long s_heavy;  // bit j: row j of the tile has > EMB_HEAVY entries
    const unsigned lane = lane_id(), warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const bool vec = D % VW == 0 && aligned16(dy) && aligned16(dtable) && blockDim.x <= RTX_BLOCK;
    const size_t nv = D / VW;
    // Tile t holds rows t, t + ntiles, t + 2 ntiles, ... (interleaved, not consecutive):
    // frequent ids cluster at low rows in real text (Zipf), and consecutive tiles would
    // give one block every heavy bucket to sum one after another.
    const size_t ntiles = (V + EMB_ROWS - 1) / EMB_ROWS;
    for (size_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        for (unsigned q = threadIdx.x; q < 2 * EMB_ROWS; q += blockDim.x) {
            const unsigned j = q % EMB_ROWS, hi = q / EMB_ROWS;
            const size_t row = tile + (size_t)j * ntiles;
            s_k[hi][j] = row < V ? __ldg(offsets + row + hi) : 0u;
        }
        __syncthreads();
        if (warp == 0) {
            const bool h0 = s_k[1][lane] - s_k[0][lane] > EMB_HEAVY;
            const bool h1 = s_k[1][lane + 32] - s_k[0][lane + 32] > EMB_HEAVY;
            const unsigned lo = __ballot_sync(RTX_FULL_MASK, h0), hi = __ballot_sync(RTX_FULL_MASK, h1);
            if (lane == 0) s_heavy = ((unsigned long long)hi << 32) | lo;
        }
        __syncthreads();
        for (size_t j = warp; j < EMB_ROWS; j += nw) {
            const size_t row = tile + j * ntiles;
            if (row >= V) break;
            const unsigned k0 = s_k[0][j], k1 = s_k[1][j];
            if (k1 - k0 > EMB_HEAVY) continue;
            T* out = dtable + row * D;
            if (vec) {
                for (size_t base = 0; base < nv; base += 32 * U) {
                    float acc[U][VW];
                    bucket_sum<T, U>(dy, positions, k0, k1, D, nv, base, lane, acc);
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
        for (unsigned long long heavy = s_heavy; heavy; heavy &= heavy - 1) {  // uniform over the block
            const size_t j = (size_t)(__ffsll((long long)heavy) - 1);
            const size_t row = tile + j * ntiles;
            const unsigned k0 = s_k[0][j], k1 = s_k[1][j];
            T* out = dtable + row * D;
            if (vec) {
                const unsigned seg = (k1 - k0 + nw - 1) / nw;
                const unsigned s0 = k0 + warp * seg < k1 ? k0 + warp * seg : k1;
                const unsigned s1 = s0 + seg < k1 ? s0 + seg : k1;
                for (size_t base = 0; base < nv; base += 32 * U) {
                    float acc[U][VW];
                    bucket_sum<T, U>(dy, positions, s0, s1, D, nv, base, lane, acc);
#pragma unroll
                    for (int u = 0; u < U; ++u)
#pragma unroll
                        for (int e = 0; e < VW; ++e) part[warp][(lane + 32 * u) * VW + e] = acc[u][e];
                    __syncthreads();
                    const size_t left = nv - base < (size_t)(32 * U) ? nv - base : (size_t)(32 * U);
                    for (size_t q = threadIdx.x; q < left * VW; q += blockDim.x) {
                        float t = 0.0f;
                        for (unsigned w = 0; w < nw; ++w) t += part[w][q];
                        Ty<T>::store(out + base * VW + q, t);
                    }
                    __syncthreads();
                }
            } else {
                for (size_t j = threadIdx.x; j < D; j += blockDim.x) {
                    float s = 0.0f;
                    for (unsigned k = k0; k < k1; ++k) s += Ty<T>::load(dy + (size_t)__ldg(positions + k) * D + j);
                    Ty<T>::store(out + j, s);
                }
            }
        }
        __syncthreads();  // s_k is rewritten by the next tile
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
        const I* ids, size_t n, size_t V, unsigned* counts, unsigned* tiles, unsigned* bad) {  \
        count<I>(ids, n, V, counts, tiles, bad);                                               \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) emb_scatter_##it(                  \
        const I* ids, size_t n, size_t V, unsigned* next, unsigned* slots, unsigned* bad) {    \
        scatter<I>(ids, n, V, next, slots, bad);                                               \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) emb_order_##it(                    \
        const I* ids, size_t n, size_t V, const unsigned* offsets, const unsigned* slots,      \
        unsigned* positions) {                                                                 \
        order<I>(ids, n, V, offsets, slots, positions);                                        \
    }

RTX_EMB_IDX(i32, int)
RTX_EMB_IDX(u32, unsigned)


#define RTX_EMB_BWD(dt, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK, EMB_BWD_MIN_BLOCKS) emb_bwd_##dt(                      \
        const T* dy, const unsigned* offsets, const unsigned* positions, T* dtable, size_t V, size_t D) { \
        bwd<T>(dy, offsets, positions, dtable, V, D);                                          \
    }

RTX_EMB_BWD(f32, float)
RTX_EMB_BWD(f16, __half)
RTX_EMB_BWD(bf16, __nv_bfloat16)
