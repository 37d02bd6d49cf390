// embedding.cu — embedding lookup (gather rows) and its deterministic backward
// (scatter-add through a stable counting sort of the ids: five launches, or one, see
// emb_bwd_scan). CPU reference: ops/src/embedding/cpu.rs.
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
//
// The one-launch backward (the experimental setting embedding_one_launch; same sums):
//   emb_bwd_scan_{dt}_{it}(const T* dy, const I* ids, size_t n, T* dtable, size_t V,
//       size_t D, unsigned* bad)
//     every element of dtable written once, as emb_bwd, with no scratch and no launch
//     before it; *bad = the number of invalid ids (written by block 0, no memset). Blocks
//     of EMB_SCAN_THREADS = 1024, grid G = the SM count: block b owns rows b, b + G, ...
//     Needs n <= EMB_SCAN_MAX = 16384, ceil(V / G) <= EMB_SCAN_ROWS = 4096, V * G < 2^32,
//     and dynamic shared memory 4 n + 2 (n rounded up to even) + 4 (2 R + 1) + 65536 /
//     sizeof(T) bytes (R = ceil(V / G)); see bwd_scan. A row of more than
//     EMB_HEAVY entries is summed in 32 segments (emb_bwd: 8) on the 16-byte vector
//     path (in increasing i on the scalar one, as emb_bwd), so such rows may differ
//     from emb_bwd's in the last bits.

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

// A bucket's dy rows pos(k), k in [k0, k1): from global memory (emb_bwd's positions) or
// shared memory (emb_bwd_scan's).
struct GlobalPos {
    const unsigned* p;
    __device__ __forceinline__ unsigned operator()(unsigned k) const { return __ldg(p + k); }
};
struct SharedPos {
    const unsigned short* p;
    __device__ __forceinline__ unsigned operator()(unsigned k) const { return p[k]; }
};

// Sums the dy rows pos(k0..k1) (in increasing k, from 0) over vectors [base, base + 32 U)
// of the row: acc[u] holds vector base + lane + 32 u. The loads of KU rows are issued
// before any of them is added (the same additions in the same order): a long segment then
// waits on a row's latency every KU rows, not every row.
template <typename T, int U, int KU, typename Pos>
__device__ __forceinline__ void rows_sum(const T* dy, Pos pos, unsigned k0, unsigned k1, size_t D, size_t nv,
                                         size_t base, unsigned lane, float (*acc)[Ty<T>::V]) {
    constexpr int VW = Ty<T>::V;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int e = 0; e < VW; ++e) acc[u][e] = 0.0f;
    unsigned k = k0;
    if constexpr (KU > 1) {
        for (; k + KU <= k1; k += KU) {
            uint4 r[KU][U];
#pragma unroll
            for (int q = 0; q < KU; ++q) {
                const T* src = dy + (size_t)pos(k + q) * D;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const size_t j = base + lane + 32 * u;
                    if (j < nv) r[q][u] = ldg16(src + j * VW);
                }
            }
#pragma unroll
            for (int q = 0; q < KU; ++q)
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const size_t j = base + lane + 32 * u;
                    if (j < nv) {
                        float f[VW];
                        Ty<T>::unpack(r[q][u], f);
#pragma unroll
                        for (int e = 0; e < VW; ++e) acc[u][e] += f[e];
                    }
                }
        }
    }
    for (; k < k1; ++k) {
        const T* src = dy + (size_t)pos(k) * D;
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

// One warp writes table row `out`: the sum of the dy rows pos(k0..k1) in increasing k
// (zeros for an empty bucket), in 16-byte vectors (U per lane per pass) when vec, else
// element by element.
template <typename T, int U, typename Pos>
__device__ __forceinline__ void warp_row(const T* dy, Pos pos, unsigned k0, unsigned k1, T* out, size_t D,
                                         bool vec, unsigned lane) {
    constexpr int VW = Ty<T>::V;
    if (vec) {
        const size_t nv = D / VW;
        for (size_t base = 0; base < nv; base += 32 * U) {
            float acc[U][VW];
            rows_sum<T, U, 1>(dy, pos, k0, k1, D, nv, base, lane, acc);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const size_t j = base + lane + 32 * u;
                if (j < nv) st16(out + j * VW, Ty<T>::pack(acc[u]));
            }
        }
    } else {
        for (size_t j = lane; j < D; j += 32) {
            float s = 0.0f;
            for (unsigned k = k0; k < k1; ++k) s += Ty<T>::load(dy + (size_t)pos(k) * D + j);
            Ty<T>::store(out + j, s);
        }
    }
}

// The whole block writes table row `out` (every thread calls it: block barriers). On the
// vector path warp w of nw sums the w-th of nw consecutive segments of ceil((k1 - k0) / nw)
// entries, and the segment sums are added in segment order through part (nw rows of PS >=
// 32 U VW floats of shared memory); on the scalar path each thread sums its elements in
// increasing k.
template <typename T, int U, int KU, int PS, typename Pos>
__device__ __forceinline__ void block_row(const T* dy, Pos pos, unsigned k0, unsigned k1, T* out, size_t D,
                                          bool vec, float* part) {
    constexpr int VW = Ty<T>::V;
    static_assert(PS >= 32 * U * VW, "a warp's partials fit its row of part");
    const unsigned lane = lane_id(), warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (vec) {
        const size_t nv = D / VW;
        const unsigned seg = (k1 - k0 + nw - 1) / nw;
        const unsigned s0 = k0 + warp * seg < k1 ? k0 + warp * seg : k1;
        const unsigned s1 = s0 + seg < k1 ? s0 + seg : k1;
        for (size_t base = 0; base < nv; base += 32 * U) {
            float acc[U][VW];
            rows_sum<T, U, KU>(dy, pos, s0, s1, D, nv, base, lane, acc);
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int e = 0; e < VW; ++e) part[warp * PS + (lane + 32 * u) * VW + e] = acc[u][e];
            __syncthreads();
            const size_t left = nv - base < (size_t)(32 * U) ? nv - base : (size_t)(32 * U);
            for (size_t q = threadIdx.x; q < left * VW; q += blockDim.x) {
                float t = 0.0f;
                for (unsigned w = 0; w < nw; ++w) t += part[w * PS + q];
                Ty<T>::store(out + base * VW + q, t);
            }
            __syncthreads();
        }
    } else {
        for (size_t j = threadIdx.x; j < D; j += blockDim.x) {
            float s = 0.0f;
            for (unsigned k = k0; k < k1; ++k) s += Ty<T>::load(dy + (size_t)pos(k) * D + j);
            Ty<T>::store(out + j, s);
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
            warp_row<T, U>(dy, GlobalPos{positions}, k0, k1, dtable + row * D, D, vec, lane);
        }
        for (unsigned long long heavy = s_heavy; heavy; heavy &= heavy - 1) {  // uniform over the block
            const size_t j = (size_t)(__ffsll((long long)heavy) - 1);
            block_row<T, U, 1, 32 * U * 8>(dy, GlobalPos{positions}, s_k[0][j], s_k[1][j],
                                           dtable + (tile + j * ntiles) * D, D, vec, &part[0][0]);
        }
        __syncthreads();  // s_k is rewritten by the next tile
    }
}

// ---- the one-launch backward (emb_bwd_scan) ------------------------------------------
//
// Each block owns the table rows b, b + G, b + 2G, ... (G = gridDim.x, one block per SM):
// interleaved, so that the frequent ids of text (low rows) spread over the blocks. Every
// block reads all n ids (from L2: 64 KiB at n = 16384) and keeps those of its rows as
// entries (j << 14 | i, j = id / G its local row), in increasing i. A counting sort of
// the entries by j in shared memory (counts, a block scan, a stable placement by one
// warp) gives each local row its positions in increasing i; then each warp writes whole
// rows as emb_bwd does (the ordered sum of its positions, zeros for an empty row), and a
// row of more than EMB_HEAVY entries is summed by the whole block in NW segments. So the
// table is written once, with no scratch in device memory and no launch before it.
// Needs n <= EMB_SCAN_MAX, ceil(V / G) <= EMB_SCAN_ROWS, V * G < 2^32 (the quotient by
// multiplication below is exact there) and blockDim.x == EMB_SCAN_THREADS; dynamic shared
// memory scan_smem(n, ceil(V / G), sizeof(T)) bytes (the launcher's formula, in
// ops/src/embedding/cuda.rs).
#define EMB_SCAN_THREADS 1024
#define EMB_SCAN_MAX 16384     // most ids (an entry keeps i in 14 bits)
#define EMB_SCAN_IBITS 14
#define EMB_SCAN_ROWS 4096     // most table rows per block (4 counts per thread in the scan)
#define EMB_SCAN_Q (EMB_SCAN_MAX / 4 / EMB_SCAN_THREADS)  // 16-byte vectors of ids per thread
#define EMB_SCAN_NW (EMB_SCAN_THREADS / 32)

template <typename T, typename I>
__device__ __forceinline__ void bwd_scan(const T* dy, const I* ids, size_t n, T* dtable, size_t V, size_t D,
                                         unsigned* bad) {
    constexpr int VW = Ty<T>::V;
    constexpr int U = 16 / VW;  // vectors per lane per pass: 16 accumulators
    constexpr unsigned NW = EMB_SCAN_NW;
    extern __shared__ __align__(16) unsigned char emb_smem[];
    __shared__ unsigned s_heavy[EMB_SCAN_MAX / (EMB_HEAVY + 1) + 1], s_nheavy, s_bad;
    const unsigned G = gridDim.x, b = blockIdx.x, t = threadIdx.x, lane = lane_id(), warp = t >> 5;
    const unsigned R = (unsigned)((V + G - 1) / G);                         // local rows (layout)
    const unsigned rows_b = V > b ? (unsigned)((V - b + G - 1) / G) : 0u;   // this block's
    // Shared memory (the launcher's scan_smem): entries L[n], positions P[n] (u16, padded to 4 bytes),
    // row offsets off[R + 1], cursors cur[R], heavy partials part[NW][32 VW].
    unsigned* L = reinterpret_cast<unsigned*>(emb_smem);
    unsigned short* P = reinterpret_cast<unsigned short*>(L + n);
    unsigned* off = reinterpret_cast<unsigned*>(P + ((n + 1) & ~(size_t)1));
    unsigned* cur = off + R + 1;
    float* part = reinterpret_cast<float*>(cur + R);
    // id / G as umulhi(id, M), M = ceil(2^32 / G) = floor((2^32 - 1) / G) + 1 for G >= 2
    // (a 32-bit division): exact for id * G < 2^32 (id < V here); G = 1 (M = 2^32 does not
    // fit) is the identity.
    const unsigned M = G > 1 ? 0xffffffffu / G + 1u : 0u;
    auto quot = [&](unsigned v) { return G > 1 ? __umulhi(v, M) : v; };

    for (unsigned j = t; j <= R; j += blockDim.x) off[j] = 0u;
    if (t == 0) { s_nheavy = 0u; s_bad = 0u; }
    // 1. This block's entries. Thread t takes the ids [4 q t, 4 q (t + 1)): contiguous, so
    // that one block scan of the per-thread counts keeps them in increasing i.
    const unsigned q = (unsigned)((n + 4 * (size_t)blockDim.x - 1) / (4 * (size_t)blockDim.x));
    const bool vids = aligned16(ids);
    unsigned id[EMB_SCAN_Q][4];
    unsigned c = 0, nbad = 0;
#pragma unroll
    for (int u = 0; u < EMB_SCAN_Q; ++u) {
        const size_t i0 = 4 * ((size_t)q * t + u);
        if ((unsigned)u < q && vids && i0 + 3 < n) {
            const uint4 r = ldg16(ids + i0);
            id[u][0] = valid_id((I)r.x, V);
            id[u][1] = valid_id((I)r.y, V);
            id[u][2] = valid_id((I)r.z, V);
            id[u][3] = valid_id((I)r.w, V);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                id[u][e] = (unsigned)u < q && i0 + e < n ? valid_id(__ldg(ids + i0 + e), V) : RTX_NO_ID - 1u;
        }
    }
#pragma unroll
    for (int u = 0; u < EMB_SCAN_Q; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const unsigned v = id[u][e];
            if (v == RTX_NO_ID) ++nbad;  // (RTX_NO_ID - 1: past n, never a valid id here)
            else if (v < V && v - quot(v) * G == b) ++c;
        }
    unsigned total;
    unsigned w = block_exclusive_scan(c, &total);  // (its barriers also order the zeroing above)
#pragma unroll
    for (int u = 0; u < EMB_SCAN_Q; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const unsigned v = id[u][e];
            const unsigned j = quot(v);
            if (v != RTX_NO_ID && v < V && v - j * G == b)
                L[w++] = (j << EMB_SCAN_IBITS) | (unsigned)(4 * ((size_t)q * t + u) + e);
        }
    if (b == 0 && nbad) atomicAdd(&s_bad, nbad);
    const unsigned m = total;
    __syncthreads();
    if (b == 0 && t == 0) *bad = s_bad;  // every block sees every id; block 0 reports them
    // 2. Counting sort by local row: counts, offsets (a block scan, 4 rows per thread), then
    // one warp places the entries in order, so that each row's positions stay increasing.
    for (unsigned k = t; k < m; k += blockDim.x) atomicAdd(off + (L[k] >> EMB_SCAN_IBITS), 1u);
    __syncthreads();
    unsigned cc[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) cc[e] = 4 * t + e < R ? off[4 * t + e] : 0u;
    unsigned run = block_exclusive_scan(cc[0] + cc[1] + cc[2] + cc[3], &total);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        if (4 * t + e < R) { off[4 * t + e] = run; cur[4 * t + e] = run; }
        run += cc[e];
    }
    if (t == 0) off[R] = m;
    __syncthreads();
    if (warp == 0) {
        for (unsigned base = 0; base < m; base += 32) {
            const unsigned k = base + lane;
            const unsigned e = k < m ? L[k] : 0xffffffffu;
            const unsigned j = e >> EMB_SCAN_IBITS;  // 2^18 - 1 past m: no row (R <= 4096)
            const unsigned peers = __match_any_sync(RTX_FULL_MASK, j);
            const unsigned rank = __popc(peers & ((1u << lane) - 1u));
            const unsigned at = k < m ? cur[j] : 0u;
            __syncwarp();
            if (k < m) {
                P[at + rank] = (unsigned short)(e & ((1u << EMB_SCAN_IBITS) - 1u));
                if (rank == 0) cur[j] = at + __popc(peers);
            }
            __syncwarp();
        }
    }
    __syncthreads();
    // 3. The rows: a warp per row of at most EMB_HEAVY entries, the others listed.
    const bool vec = D % VW == 0 && aligned16(dy) && aligned16(dtable);
    for (unsigned j = warp; j < rows_b; j += NW) {
        const unsigned k0 = off[j], k1 = off[j + 1];
        if (k1 - k0 > EMB_HEAVY) {
            if (lane == 0) s_heavy[atomicAdd(&s_nheavy, 1u)] = j;
            continue;
        }
        warp_row<T, U>(dy, SharedPos{P}, k0, k1, dtable + ((size_t)b + (size_t)j * G) * D, D, vec, lane);
    }
    __syncthreads();
    // Heavy rows (the list's order does not matter: each row's sum order is fixed): warp w
    // sums the w-th of NW consecutive segments, the segment sums are added in order.
    const unsigned nheavy = s_nheavy;
    for (unsigned h = 0; h < nheavy; ++h) {
        const unsigned j = s_heavy[h];
        block_row<T, 1, 4, 32 * VW>(dy, SharedPos{P}, off[j], off[j + 1], dtable + ((size_t)b + (size_t)j * G) * D,
                                    D, vec, part);
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

#define RTX_EMB_BWD_SCAN(dt, T, it, I)                                                         \
    extern "C" __global__ void __launch_bounds__(EMB_SCAN_THREADS, 1) emb_bwd_scan_##dt##_##it(       \
        const T* dy, const I* ids, size_t n, T* dtable, size_t V, size_t D, unsigned* bad) {   \
        bwd_scan<T, I>(dy, ids, n, dtable, V, D, bad);                                         \
    }
#define RTX_EMB_BWD_SCAN_IDX(it, I)                                                            \
    RTX_EMB_BWD_SCAN(f32, float, it, I) RTX_EMB_BWD_SCAN(f16, __half, it, I)                  \
    RTX_EMB_BWD_SCAN(bf16, __nv_bfloat16, it, I)

RTX_EMB_BWD_SCAN_IDX(i32, int)
RTX_EMB_BWD_SCAN_IDX(u32, unsigned)

RTX_EMB_BWD(f32, float)
RTX_EMB_BWD(f16, __half)
RTX_EMB_BWD(bf16, __nv_bfloat16)
