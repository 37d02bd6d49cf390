// small_gemm.cu — y = act(x · wᵀ + bias) for small f16/bf16 products, the `linear` form,
// launched straight through the driver instead of through cublasLtMatmul (whose host
// cost per call is most of a small GEMM's cost; see ops/src/gemm/cuda/small.rs).
//
//   extern "C" __global__ void small_gemm_{none,relu,gelu}_{f16,bf16}(
//       const T* x, const T* w, const T* bias, T* y, int m, int n, int k,
//       long long sx, long long sw, long long sb, long long sy)
//
// For each z < gridDim.z (the batch): x + z·sx is [m, k] row-major, w + z·sw is [n, k]
// row-major (so y = x · wᵀ), bias + z·sb holds n elements or bias is null, y + z·sy is
// [m, n] row-major. Strides are in elements; 0 shares an operand over the batch.
// Requires: n % 8 == 0, k % 8 == 0, m, n, k >= 1; x, w, y (and every batch offset of
// them) 16-byte aligned (the 16-byte cp.async copies and the 4-byte stores); bias
// 2-byte aligned. The launcher checks these before it picks this kernel.
//
// Geometry (the defaults below): grid (ceil(n / 64), ceil(m / 64), batch), block 128
// threads (4 warps), 32 KiB of static shared memory. A block computes a 64 × 64 tile of
// y; warp (wm, wn) its 32 × 32 quarter with mma.sync m16n8k16 (f32 accumulators). k is
// walked in steps of 64 through a 2-stage cp.async ring; rows past m or n and chunks past
// k are zero-filled, so every product term outside the problem is 0 · 0. Measured on the
// H200 (kernels/checks/small_gemm_check.py) this was the fastest of the variants tried
// (32-row tiles, k steps of 32, 3-4 stages, warp groups splitting each stage's k).
//
// Numerics: products and sums in f32 by the tensor cores, in a fixed order (k ascending,
// the same for every launch), then + bias, the activation (relu keeps NaN; gelu is the
// tanh form, as cuBLASLt's GELU epilogue and PyTorch's gelu(approximate="tanh")) and
// one rounding on store. No atomics: results are bitwise reproducible.
//
// Programmatic dependent launch: the kernel waits for its predecessor on the stream
// (wait_prior_grid) before it touches global memory.
#include "common.cuh"
#include "attention_common.cuh"

namespace {

// The tile and the ring; compile-time, so that kernels/checks/small_gemm_check.py can time
// variants (-DSG_BM=32 ...). The launcher (ops/src/gemm/cuda/small.rs) uses the defaults.
#ifndef SG_BM
#define SG_BM 64
#endif
#ifndef SG_BN
#define SG_BN 64
#endif
#ifndef SG_BK
#define SG_BK 64
#endif
#ifndef SG_STAGES
#define SG_STAGES 2
#endif
#ifndef SG_KSPLIT
#define SG_KSPLIT 1
#endif
constexpr int BM = SG_BM;     // rows of y per block (32 or 64)
constexpr int BN = SG_BN;     // columns of y per block (32, 64 or 128)
constexpr int BK = SG_BK;     // k per stage (32 or 64: 64- or 128-byte smem rows)
constexpr int STAGES = SG_STAGES;
constexpr int KSPLIT = SG_KSPLIT;  // warp groups sharing each stage's k16 steps
constexpr int WARPS_M = BM / 32;   // each warp computes 32 x 32 of the tile
constexpr int WARPS_N = BN / 32;
constexpr int WARPS_MN = WARPS_M * WARPS_N;
constexpr int THREADS = WARPS_MN * 32 * KSPLIT;
constexpr int ROW_BYTES = BK * 2;
constexpr int X_BYTES = BM * ROW_BYTES;  // x's tile of one stage
constexpr int W_BYTES = BN * ROW_BYTES;  // w's tile of one stage
constexpr int STAGE_BYTES = X_BYTES + W_BYTES;
static_assert(BM % 32 == 0 && BN % 32 == 0 && (BK == 32 || BK == 64), "unsupported tile");
static_assert((BM * (BK / 8)) % THREADS == 0 && (BN * (BK / 8)) % THREADS == 0,
              "chunks divide evenly among the threads");
static_assert((BK / 16) % KSPLIT == 0, "the k16 steps of a stage divide among the groups");
// The ring, and after the main loop the partial sums of groups 1 .. KSPLIT-1 (32 floats
// per lane of each warp), in one static buffer.
constexpr int RED_BYTES = (KSPLIT - 1) * WARPS_MN * 32 * 32 * 4;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES > RED_BYTES ? STAGES * STAGE_BYTES : RED_BYTES;
static_assert(STAGES >= 2 && SMEM_BYTES <= 48 * 1024, "static shared memory");

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2 };

template <int ACT>
__device__ __forceinline__ float act(float v) {
    if (ACT == ACT_RELU) return v < 0.0f ? 0.0f : v;  // NaN stays NaN
    if (ACT == ACT_GELU) {
        const float c = 0.7978845608028654f;  // sqrt(2/pi)
        return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
    return v;
}

// A 2-byte element through L2 (ld.global.cg).
template <typename T>
__device__ __forceinline__ T ld_cg(const T* p) {
    static_assert(sizeof(T) == 2, "f16 / bf16");
    const unsigned short u = __ldcg(reinterpret_cast<const unsigned short*>(p));
    T v;
    memcpy(&v, &u, 2);
    return v;
}

// Copies stage `kt` (k from kt·BK) of the x rows [row0, row0 + BM) and the w rows
// [col0, col0 + BN) into the ring slot at shared addresses sx (x) and sw (w).
template <int ROWS, typename T>
__device__ __forceinline__ void load_rows(unsigned s, const T* g, int rows, int k, int r0,
                                          int kt, int tid) {
#pragma unroll
    for (int i = 0; i < ROWS * (BK / 8) / THREADS; ++i) {
        const int c = tid + i * THREADS;
        const int r = c / (BK / 8);
        const int ch = c % (BK / 8);
        const int kk = kt * BK + ch * 8;
        const bool in = kk < k && r0 + r < rows;
        const T* src = in ? g + (long long)(r0 + r) * k + kk : g;
        cp_async_16(s + swz<ROW_BYTES>(r, ch), src, in ? 16 : 0);
    }
}

template <typename T>
__device__ __forceinline__ void load_stage(unsigned sx, unsigned sw, const T* x, const T* w,
                                           int m, int n, int k, int row0, int col0, int kt,
                                           int tid) {
    load_rows<BM>(sx, x, m, k, row0, kt, tid);
    load_rows<BN>(sw, w, n, k, col0, kt, tid);
}

// One 64 × 64 tile of y = act(x · wᵀ + bias): rows row0.., columns col0... x and w are
// read through cp.async.cg and the bias through ld.global.cg (L2, never the read-only
// path), so the tile may read what another block wrote before a grid barrier
// (small_gemm_batch). The shared ring is free when it returns.
template <typename Tr, int ACT>
__device__ __forceinline__ void small_gemm_tile(const typename Tr::T* x, const typename Tr::T* w,
                                                const typename Tr::T* bias, typename Tr::T* y,
                                                int m, int n, int k, int row0, int col0,
                                                unsigned char* smem) {
    typedef typename Tr::T T;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int kg = warp / WARPS_MN;  // k group: k16 steps kg, kg + KSPLIT, ... of a stage
    const int wmn = warp % WARPS_MN;
    const int wm = wmn / WARPS_N;    // warp row: rows wm·32 .. +32 of the tile
    const int wn = wmn % WARPS_N;    // warp column: columns wn·32 .. +32

    rtx::wait_prior_grid();

    const unsigned base = smem_u32(smem);
    auto sx_at = [&](int s) { return base + (unsigned)(s * STAGE_BYTES); };
    auto sw_at = [&](int s) { return base + (unsigned)(s * STAGE_BYTES + X_BYTES); };

    const int kts = (k + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < kts) load_stage(sx_at(s), sw_at(s), x, w, m, n, k, row0, col0, s, tid);
        cp_async_commit();
    }

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // ldmatrix rows and chunks of this lane. x (A operand, 16 × 16 per fragment): lane l
    // gives row l % 16, chunk l / 16 -> registers a0..a3 in mma order. w (B operand,
    // two n8 × k16 fragments per x4): matrix i = l / 8 covers w rows (i / 2)·8 .. +8 and
    // chunk i % 2 -> b0, b1 of n-tile 0, then b0, b1 of n-tile 1.
    const int a_row = wm * 32 + (lane & 15);
    const int a_ch = lane >> 4;
    const int b_row = wn * 32 + ((lane >> 4) << 3) + (lane & 7);
    const int b_ch = (lane >> 3) & 1;

    for (int kt = 0; kt < kts; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // stage kt landed for every thread; slot (kt - 1) is free
        {
            const int next = kt + STAGES - 1;
            const int slot = next % STAGES;
            if (next < kts) load_stage(sx_at(slot), sw_at(slot), x, w, m, n, k, row0, col0, next, tid);
            cp_async_commit();
        }
        const int slot = kt % STAGES;
        const unsigned ax = sx_at(slot);
        const unsigned bw = sw_at(slot);
#pragma unroll
        for (int kq = 0; kq < BK / 16 / KSPLIT; ++kq) {
            const int ks = kq * KSPLIT + kg;
            unsigned a[2][4];
            unsigned b[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                ldsm_x4(a[i][0], a[i][1], a[i][2], a[i][3],
                        ax + swz<ROW_BYTES>(a_row + i * 16, ks * 2 + a_ch));
#pragma unroll
            for (int j = 0; j < 2; ++j)
                ldsm_x4(b[2 * j][0], b[2 * j][1], b[2 * j + 1][0], b[2 * j + 1][1],
                        bw + swz<ROW_BYTES>(b_row + j * 16, ks * 2 + b_ch));
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) Tr::mma(acc[i][j], a[i], b[j][0], b[j][1]);
        }
    }
    cp_async_wait<0>();
    rtx::allow_next_grid();

    if (KSPLIT > 1) {
        // Groups 1 .. KSPLIT-1 hand their sums to group 0 through shared memory (lane-major,
        // conflict-free); group 0 adds them in group order: a fixed order.
        float* red = reinterpret_cast<float*>(smem);
        __syncthreads();  // every warp is done with the ring
        if (kg > 0) {
            float* dst = red + ((kg - 1) * WARPS_MN + wmn) * 32 * 32 + lane;
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) dst[((i * 4 + j) * 4 + e) * 32] = acc[i][j][e];
        }
        __syncthreads();
        if (kg > 0) return;
#pragma unroll
        for (int g = 1; g < KSPLIT; ++g) {
            const float* src = red + ((g - 1) * WARPS_MN + wmn) * 32 * 32 + lane;
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][j][e] += src[((i * 4 + j) * 4 + e) * 32];
        }
    }

    // Accumulator (i, j): rows wm·32 + i·16 + lane / 4 (+ 8 for e = 2, 3), columns
    // wn·32 + j·8 + 2·(lane % 4) (+ 1 for odd e). n is a multiple of 8, so a column
    // pair is either inside y or past it.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int col = col0 + wn * 32 + j * 8 + 2 * (lane & 3);
        if (col >= n) continue;
        float b0 = 0.0f, b1 = 0.0f;
        if (bias != nullptr) {
            b0 = Tr::to_float(ld_cg(bias + col));
            b1 = Tr::to_float(ld_cg(bias + col + 1));
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + wm * 32 + i * 16 + (lane >> 2) + h * 8;
                if (row >= m) continue;
                const float v0 = act<ACT>(acc[i][j][2 * h] + b0);
                const float v1 = act<ACT>(acc[i][j][2 * h + 1] + b1);
                *reinterpret_cast<unsigned*>(y + (long long)row * n + col) = Tr::pack(v0, v1);
            }
        }
    }
}

template <typename Tr, int ACT>
__device__ __forceinline__ void small_gemm(const typename Tr::T* x, const typename Tr::T* w,
                                           const typename Tr::T* bias, typename Tr::T* y, int m,
                                           int n, int k, long long sx, long long sw,
                                           long long sb, long long sy) {
    __shared__ __align__(128) unsigned char smem[SMEM_BYTES];
    const long long z = blockIdx.z;
    small_gemm_tile<Tr, ACT>(x + z * sx, w + z * sw, bias != nullptr ? bias + z * sb : bias,
                             y + z * sy, m, n, k, (int)blockIdx.y * BM, (int)blockIdx.x * BN,
                             smem);
}

// ---- batched launches ----------------------------------------------------------------
//
// Up to 16 small products in one cooperative launch (rtx-runtime's eager launch
// batching, runtime/src/driver/batch.rs): every block takes tiles t = blockIdx.x,
// + gridDim.x, ... of a step, then the grid meets at a barrier before the next step, so
// a step reads the products of the steps before it. Each tile computes what
// small_gemm_{act}_{dt} computes for it (the same code, bit for bit).
//
//   struct SgStep { unsigned code; int m; int n; int k; const void* x; const void* w;
//                   const void* bias; void* y; unsigned* bar; };   // 56 bytes
//   struct SgBatch { unsigned count; unsigned pad; SgStep steps[16]; };
//   extern "C" __global__ void small_gemm_batch(SgBatch p)  // cooperative, block THREADS
//
// code = 2 · act + d: act 0 none, 1 relu, 2 gelu; d 0 f16, 1 bf16. Per step: one
// product (no batch), y = act(x · wᵀ + bias) with the shapes and alignment
// small_gemm_{act}_{dt} requires; bias may be null. bar: two zeroed words of the
// stream's (count, generation), left zeroed behind each barrier; the same for every
// step. An unknown code computes nothing (the launcher never makes one).

struct SgStep {
    unsigned code;
    int m;
    int n;
    int k;
    const void* x;
    const void* w;
    const void* bias;
    void* y;
    unsigned* bar;
};
static_assert(sizeof(SgStep) == 56, "rtx-runtime's BATCH_STEP_BYTES");
struct SgBatch {
    unsigned count;
    unsigned pad;
    SgStep steps[16];
};
static_assert(KSPLIT == 1, "a tile returns only at its end (the grid barrier needs every thread)");

// Every block of the (cooperative, all-resident) grid arrives; the last one zeroes the
// count and bumps the generation the others wait on. The fences order each block's
// writes before its arrival and the others' reads after their release.
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned* gen = bar + 1;
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*gen == g) __nanosleep(20);
        }
        __threadfence();
    }
    __syncthreads();
}

template <typename Tr, int ACT>
__device__ __forceinline__ void sg_step(const SgStep& s, unsigned char* smem) {
    typedef typename Tr::T T;
    const int tn = (s.n + BN - 1) / BN;
    const int tiles = tn * ((s.m + BM - 1) / BM);
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        __syncthreads();  // the ring is free: every warp is done with the last tile
        small_gemm_tile<Tr, ACT>(static_cast<const T*>(s.x), static_cast<const T*>(s.w),
                                 static_cast<const T*>(s.bias), static_cast<T*>(s.y), s.m, s.n,
                                 s.k, (t / tn) * BM, (t % tn) * BN, smem);
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS) small_gemm_batch(SgBatch p) {
    __shared__ __align__(128) unsigned char smem[SMEM_BYTES];
    const unsigned count = p.count < 16u ? p.count : 16u;
    for (unsigned i = 0; i < count; ++i) {
        const SgStep s = p.steps[i];
        switch (s.code) {
            case 0: sg_step<AttnF16, ACT_NONE>(s, smem); break;
            case 1: sg_step<AttnBF16, ACT_NONE>(s, smem); break;
            case 2: sg_step<AttnF16, ACT_RELU>(s, smem); break;
            case 3: sg_step<AttnBF16, ACT_RELU>(s, smem); break;
            case 4: sg_step<AttnF16, ACT_GELU>(s, smem); break;
            case 5: sg_step<AttnBF16, ACT_GELU>(s, smem); break;
            default: break;
        }
        if (i + 1 < count) grid_barrier(p.steps[0].bar);
    }
}

#define RTX_SMALL_GEMM(name, ACT, dt, Tr)                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS) small_gemm_##name##_##dt(           \
        const Tr::T* x, const Tr::T* w, const Tr::T* bias, Tr::T* y, int m, int n, int k,     \
        long long sx, long long sw, long long sb, long long sy) {                             \
        small_gemm<Tr, ACT>(x, w, bias, y, m, n, k, sx, sw, sb, sy);                          \
    }

RTX_SMALL_GEMM(none, ACT_NONE, f16, AttnF16)
RTX_SMALL_GEMM(relu, ACT_RELU, f16, AttnF16)
RTX_SMALL_GEMM(gelu, ACT_GELU, f16, AttnF16)
RTX_SMALL_GEMM(none, ACT_NONE, bf16, AttnBF16)
RTX_SMALL_GEMM(relu, ACT_RELU, bf16, AttnBF16)
RTX_SMALL_GEMM(gelu, ACT_GELU, bf16, AttnBF16)
