// attention_common.cuh — shared pieces of the FlashAttention-2 kernels in attention.cu:
// the parameter struct, dtype traits (f16 / bf16 tensor-core MMA), the inline-PTX
// wrappers (ldmatrix, mma.sync, cp.async, ex2, vector red) and the shared-memory swizzle.
//
// NVRTC-only: includes nothing but cuda_fp16.h / cuda_bf16.h (no <cstdint>, no <cmath>).
//
// Host emulation hook: when RTX_ATTN_HOST_EMULATION is defined, the PTX wrappers are not
// defined here; the includer provides functions of the same names and signatures
// (a warp-level CPU emulator used to check the fragment/index math without a GPU).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

// -------------------------------------------------------------------------------------
// Parameter block (passed by value to every attention kernel). Field order, types and
// byte offsets are part of the ABI: the Rust side mirrors this with #[repr(C)].
// All pointers are device pointers, 16-byte aligned (cp.async 16-byte copies), tensors
// contiguous row-major. Sizes are in elements. See the table in attention.cu.
// -------------------------------------------------------------------------------------
struct FlashParams {
    const void* q;          //   0  T   [B, H,   Lq, D]
    const void* k;          //   8  T   [B, Hkv, Lk, D]
    const void* v;          //  16  T   [B, Hkv, Lk, D]
    const void* mask;       //  24  T   additive mask, nullable (see mask_stride_*)
    void* o;                //  32  T   [B, H, Lq, D]  forward output, backward input
    void* lse;              //  40  f32 [B, H, Lq]     forward output, backward input
    const void* dout;       //  48  T   [B, H, Lq, D]  backward input dO
    void* dsum;             //  56  f32 [B, H, Lq]     backward workspace: rowsum(dO*O)
    void* dq_accum;         //  64  f32 [B, H, Lq, D]  backward workspace (unscaled dQ)
    void* dq;               //  72  T   [B, H,   Lq, D] backward output
    void* dk;               //  80  T   [B, Hkv, Lk, D] backward output
    void* dv;               //  88  T   [B, Hkv, Lk, D] backward output
    long long mask_stride_b;//  96  mask element stride between batches (0: broadcast)
    long long mask_stride_h;// 104  mask element stride between heads   (0: broadcast)
    long long mask_stride_q;// 112  mask element stride between query rows (key stride is 1)
    int B;                  // 120
    int H;                  // 124  query heads
    int Hkv;                // 128  key/value heads; H % Hkv == 0, head h uses kv head h/(H/Hkv)
    int Lq;                 // 132  >= 1
    int Lk;                 // 136  >= 1
    float scale;            // 140  softmax scale, > 0 (e.g. 1/sqrt(D))
    int causal;             // 144  0/1: top-left causal, query i sees key j iff j <= i
    int pad_;               // 148  unused, keeps sizeof == 152
};                          // sizeof 152, alignof 8

// ABI guard: the offsets above are what the Rust #[repr(C)] mirror and the check script use.
// (NVRTC has no offsetof; the offsets are checked by host builds of this header and, on the
// device, by the echo kernel of kernels/checks/attention_check.py.)
static_assert(sizeof(FlashParams) == 152 && alignof(FlashParams) == 8, "FlashParams ABI size");
#if defined(__GNUC__) && !defined(__CUDACC_RTC__)
#define ATTN_CHECK_OFFSET(f, off) static_assert(__builtin_offsetof(FlashParams, f) == off, "FlashParams ABI: " #f)
ATTN_CHECK_OFFSET(q, 0);
ATTN_CHECK_OFFSET(k, 8);
ATTN_CHECK_OFFSET(v, 16);
ATTN_CHECK_OFFSET(mask, 24);
ATTN_CHECK_OFFSET(o, 32);
ATTN_CHECK_OFFSET(lse, 40);
ATTN_CHECK_OFFSET(dout, 48);
ATTN_CHECK_OFFSET(dsum, 56);
ATTN_CHECK_OFFSET(dq_accum, 64);
ATTN_CHECK_OFFSET(dq, 72);
ATTN_CHECK_OFFSET(dk, 80);
ATTN_CHECK_OFFSET(dv, 88);
ATTN_CHECK_OFFSET(mask_stride_b, 96);
ATTN_CHECK_OFFSET(mask_stride_h, 104);
ATTN_CHECK_OFFSET(mask_stride_q, 112);
ATTN_CHECK_OFFSET(B, 120);
ATTN_CHECK_OFFSET(H, 124);
ATTN_CHECK_OFFSET(Hkv, 128);
ATTN_CHECK_OFFSET(Lq, 132);
ATTN_CHECK_OFFSET(Lk, 136);
ATTN_CHECK_OFFSET(scale, 140);
ATTN_CHECK_OFFSET(causal, 144);
ATTN_CHECK_OFFSET(pad_, 148);
#undef ATTN_CHECK_OFFSET
#endif

#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_LN2 0.6931471805599453f

__device__ __forceinline__ float attn_neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float attn_pos_inf() { return __int_as_float(0x7f800000); }

// -------------------------------------------------------------------------------------
// Inline PTX wrappers.
// -------------------------------------------------------------------------------------
#ifndef RTX_ATTN_HOST_EMULATION

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the 16-byte row addresses of matrix i;
// register i of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix i.
__device__ __forceinline__ void ldsm_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                                        unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// Same with each 8x8 matrix transposed on the way into registers.
__device__ __forceinline__ void ldsm_x4_t(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                                          unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// 16-byte global -> shared async copy; bytes beyond src_bytes (0 or 16) are zero-filled.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// 4-byte global -> shared async copy (lse / dsum rows); zero-filled when src_bytes == 0.
__device__ __forceinline__ void cp_async_4(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 2^x, approximate (2 ulp), ex2(-inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// dst[0] += a, dst[1] += b (one 8-byte vector reduction; dst 8-byte aligned, sm_90).
__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b)
                 : "memory");
}

// dst[0..3] += a, b, c, d (one 16-byte vector reduction; dst 16-byte aligned, sm_90).
__device__ __forceinline__ void red_add_f32x4(float* dst, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b),
                 "f"(c), "f"(d)
                 : "memory");
}

__device__ __forceinline__ void mma_16816_f16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                              unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_16816_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                               unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif  // RTX_ATTN_HOST_EMULATION

// -------------------------------------------------------------------------------------
// dtype traits
// -------------------------------------------------------------------------------------
struct AttnF16 {
    typedef __half T;
    static __device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                               unsigned b1) {
        mma_16816_f16(c, a, b0, b1);
    }
    // Two floats -> packed pair (lo in the low 16 bits), round to nearest.
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    static __device__ __forceinline__ float to_float(T x) { return __half2float(x); }
    static __device__ __forceinline__ T from_float(float x) { return __float2half_rn(x); }
};

struct AttnBF16 {
    typedef __nv_bfloat16 T;
    static __device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                               unsigned b1) {
        mma_16816_bf16(c, a, b0, b1);
    }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    static __device__ __forceinline__ float to_float(T x) { return __bfloat162float(x); }
    static __device__ __forceinline__ T from_float(float x) { return __float2bfloat16_rn(x); }
};

// -------------------------------------------------------------------------------------
// Shared-memory tiles: row-major rows of ROW_BYTES bytes, addressed in 16-byte chunks.
// XOR swizzle of the chunk index so that the 8 row addresses of one ldmatrix phase
// (8 consecutive rows, same logical chunk), and 8 threads storing one row's chunks, hit
// 8 different 16-byte bank groups:
//   ROW_BYTES >= 128 (>= 8 chunks):  phys_chunk = chunk ^ (row & 7)
//   ROW_BYTES == 64  (4 chunks):     phys_chunk = chunk ^ ((row >> 1) & 3)
//     (two rows share a 128-byte line; rows r, r+1 sit in its two halves)
// Returns the byte offset of (row, logical chunk) from the tile base.
// -------------------------------------------------------------------------------------
template <int ROW_BYTES>
__device__ __forceinline__ unsigned swz(int row, int chunk) {
    static_assert(ROW_BYTES == 64 || (ROW_BYTES >= 128 && ROW_BYTES % 128 == 0),
                  "unsupported smem row size");
    if (ROW_BYTES == 64) {
        return static_cast<unsigned>(row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4));
    } else {
        return static_cast<unsigned>(row * ROW_BYTES + ((chunk ^ (row & 7)) << 4));
    }
}

// Swizzled addressing factorized for unrolled ldmatrix loops (keeps one base register per
// tile instead of one precomputed address per (row, chunk) pair).
//   lane_base = tile + swz<RB>(r_l, c_l), with tile % 128 == 0 (absolute shared address) and
//   RB % 128 == 0. Then for R % 8 == 0 and a chunk offset C with no bit in common with c_l:
//   tile + swz<RB>(r_l + R, c_l + C) == swz_add(lane_base, RB, R, C)
// because c_l + C == c_l ^ C, (c_l ^ C) ^ x == (c_l ^ x) ^ C for x = r_l & 7 < 8, the low three
// chunk bits are address bits 4..6 of a 128-byte aligned row (XOR), and bit 3 of C, which
// c_l ^ x does not have, is a plain +128.
__device__ __forceinline__ unsigned swz_add(unsigned lane_base, int RB, int R, int C) {
    return (lane_base ^ static_cast<unsigned>((C & 7) << 4)) + static_cast<unsigned>((C >> 3) * 128 + R * RB);
}

// Async copy of a [ROWS x D] tile of 16-bit elements (global rows contiguous, D elements
// each) into a swizzled smem tile. Rows >= valid_rows are zero-filled (their source is
// row 0, which is never read). Requires valid_rows >= 1. All NTHREADS threads call it.
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_tile_async(unsigned smem_tile, const void* gsrc,
                                                int valid_rows, int tid) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    constexpr int TOTAL = ROWS * CPR;
    static_assert(TOTAL % NTHREADS == 0, "tile chunks must divide evenly among threads");
    const char* g = static_cast<const char*>(gsrc);
#pragma unroll
    for (int i = 0; i < TOTAL / NTHREADS; ++i) {
        const int c = tid + i * NTHREADS;
        const int r = c / CPR;
        const int ch = c % CPR;
        const bool ok = r < valid_rows;
        const char* src = g + static_cast<long long>(ok ? r : 0) * (D * 2) + ch * 16;
        cp_async_16(smem_tile + swz<D * 2>(r, ch), src, ok ? 16 : 0);
    }
}
