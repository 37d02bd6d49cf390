// attention.cu — FlashAttention-2 forward and backward (mma.sync m16n8k16 tensor cores,
// ldmatrix, cp.async multi-stage pipelining, online softmax), f16 and bf16, head dim 64 and
// 128, grouped KV heads, top-left causal, optional additive mask. Compiled by NVRTC
// (-std=c++17 --gpu-architecture=sm_90, include path = this folder).
//
// ======================================================================================
// ABI
// ======================================================================================
// Every kernel takes ONE argument, `struct FlashParams` by value (attention_common.cuh):
//
//   offset type                name            meaning
//   ------ ------------------- --------------- ---------------------------------------------
//        0 const void*         q               T   [B, H,   Lq, D]
//        8 const void*         k               T   [B, Hkv, Lk, D]
//       16 const void*         v               T   [B, Hkv, Lk, D]
//       24 const void*         mask            T   additive mask or NULL (see strides)
//       32 void*               o               T   [B, H, Lq, D]   fwd output / bwd input
//       40 void*               lse             f32 [B, H, Lq]      fwd output / bwd input
//       48 const void*         dout            T   [B, H, Lq, D]   bwd input dO
//       56 void*               dsum            f32 [B, H, Lq]      bwd workspace
//       64 void*               dq_accum        f32 [B, H, Lq, D]   bwd workspace
//       72 void*               dq              T   [B, H,   Lq, D] bwd output
//       80 void*               dk              T   [B, Hkv, Lk, D] bwd output
//       88 void*               dv              T   [B, Hkv, Lk, D] bwd output
//       96 long long (i64)     mask_stride_b   mask elements between batches (0 = broadcast)
//      104 long long (i64)     mask_stride_h   mask elements between heads   (0 = broadcast)
//      112 long long (i64)     mask_stride_q   mask elements between query rows (key stride 1)
//      120 int (i32)           B
//      124 int (i32)           H               query heads
//      128 int (i32)           Hkv             kv heads, H % Hkv == 0; head h reads kv head h/(H/Hkv)
//      132 int (i32)           Lq              >= 1
//      136 int (i32)           Lk              >= 1
//      140 float (f32)         scale           > 0, e.g. 1/sqrt(D)
//      144 int (i32)           causal          0 / 1 (top-left: query i sees key j iff j <= i)
//      148 int (i32)           pad_            unused
//   sizeof = 152, alignof = 8. Rust: #[repr(C)] with the same fields in the same order.
//
//   Mask [Lq, Lk] broadcast: strides (0, 0, Lk). Full [B, H, Lq, Lk]: (H*Lq*Lk, Lq*Lk, Lk).
//   The mask is added to scale*q.k (as PyTorch's attn_mask); -inf entries exclude a key.
//   Pointers: device memory, q/k/v/o/dout/dq/dk/dv 16-byte aligned, dq_accum 16-byte
//   aligned, lse/dsum 4-byte aligned, mask 2-byte aligned; tensors contiguous. Unused
//   pointers may be NULL (the forward reads q, k, v, mask and writes o, lse only).
//
// Semantics: s = scale * q.k + mask (causal: j > i -> -inf), o = softmax(s) v,
// lse = ln(sum_j exp(s_j)) (natural log, f32). A fully masked row gives o = 0, lse = -inf,
// and zero gradients.
//
// Kernels (suffix _d64_f16, _d64_bf16, _d128_f16, _d128_bf16; T = __half or __nv_bfloat16):
//
//   flash_fwd_d{D}_{T}                       forward: o, lse
//       grid  (ceil(Lq / 128), H, B)   block: D=64 (128, 1, 1) [preset 1, the default
//       for D=64], D=128 (256, 1, 1) [preset 0]
//       dynamic smem: D=64: 65536 bytes, D=128: 131072 bytes
//       (= 128*D*2 Q tile + 3 stages * (K + V tiles of 64 keys))
//       [preset 0 for D=64 (-DATTN_FWD_D64_PRESET=0): block (256, 1, 1), same smem;
//        preset 1 for D=128 (-DATTN_FWD_D128_PRESET=1): block (128, 1, 1), smem 81920 bytes;
//        grid unchanged]
//       [non-default preset 2 (-DATTN_FWD_D{D}_PRESET=2): block (256, 1, 1), smem D=64:
//        114688 (3 stages), D=128 with -DATTN_FWD_D128_STAGES=2: 163840 bytes; grid unchanged]
//
//   Backward, launch in this order on one stream (the forward's o and lse are inputs):
//   1 flash_bwd_preprocess_d{D}_{T}          dsum = rowsum(dO*O); dq_accum = 0
//       grid  (ceil(B*H*Lq / R), 1, 1), R = 256/(D/8) rows per block: 32 (D=64), 16 (D=128)
//       block (256, 1, 1), no shared memory
//   2 flash_bwd_dq_dk_dv_d{D}_{T}            dK, dV (written as T); dq_accum += (atomics)
//       grid  (ceil(Lk / 64), Hkv, B)   block (128, 1, 1)
//       dynamic smem: D=64: 58368 bytes, D=128: 70144 bytes
//       [non-default -DATTN_BWD_D{D}_NWARPS=8 (see below): block (256, 1, 1),
//        grid (ceil(Lk / 128), Hkv, B), smem D=64: 82944, D=128: 107008 bytes;
//        -DATTN_BWD_RED_V4=1 changes no launch number]
//   3 flash_bwd_convert_dq_d{D}_{T}          dq = T(dq_accum * scale)
//       grid  (g, 1, 1) with any g >= 1, e.g. min(ceil(B*H*Lq*D/4 / 256), 65535)
//       block (256, 1, 1), no shared memory (grid-stride loop)
//
//   Workspaces for the backward: dsum f32 [B, H, Lq] and dq_accum f32 [B, H, Lq, D]; both
//   are fully written by kernel 1 (no memset needed). GQA: the dK/dV kernel loops over the
//   H/Hkv query heads of its kv head inside the block (deterministic, no dK/dV atomics and
//   no dK/dV workspace); dQ is accumulated with f32 atomics (red.global.add.v2.f32) across
//   the KV blocks, so dq's summation order (not its value beyond rounding) varies run to run.
//
//   Kernels with more than 48 KB of dynamic smem need CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
//   set to (at least) their size before launch.
//
// Tiles: forward BR = 128 query rows per block (default: 8 warps x 16 rows; preset 1:
// 4 warps x 2 x 16 rows), BC = 64 keys per K/V tile (32 for preset 1, D=128), 3-stage
// cp.async K/V ring; backward BC = 64 keys per block (4 warps x 16 keys), BR = 64 (D=64) /
// 32 (D=128) query rows per step, 2-stage Q/dO/lse/dsum ring. Shared-memory tiles use a
// 16-byte-chunk XOR swizzle (conflict-free ldmatrix and cp.async stores).
// ======================================================================================

#include "attention_common.cuh"
#include "attention_fwd.cuh"
#include "attention_bwd.cuh"

// Tunables (compile-time; defaults are the documented ABI numbers above). Overriding one
// with -D changes that kernel's launch: fwd smem = 128*D*2 + STAGES*2*BC*D*2 bytes,
// block = 32 * NWARPS threads (see the presets).
#ifndef ATTN_FWD_D64_STAGES
#define ATTN_FWD_D64_STAGES 3
#endif
#ifndef ATTN_FWD_D128_STAGES
#define ATTN_FWD_D128_STAGES 3
#endif
// Forward warp layout presets (both give BR = 128 query rows per block):
//   0: 8 warps x 1 m-tile of 16 rows, Q fragments in registers     (256 threads)
//   1: 4 warps x 2 m-tiles of 16 rows, 2 blocks per SM (128 threads); D=64: Q in registers,
//      64-key tiles; D=128: Q re-read from smem, 32-key tiles (register budget)
//   2: as 0 with 128-key tiles (half the barriers and O rescales per key); D=128: Q re-read
//      from smem (register budget). 256 threads; smem 128*D*2 + STAGES*2*128*D*2
#ifndef ATTN_FWD_D64_PRESET
// Preset 1 for D=64: measured 1.24-1.30x preset 0 on the H200 (2026-11-29, GPU run 3b).
#define ATTN_FWD_D64_PRESET 1
#endif
#ifndef ATTN_FWD_D128_PRESET
#define ATTN_FWD_D128_PRESET 0
#endif

#if ATTN_FWD_D64_PRESET == 0
typedef FwdCfg<64, 8, 1, true, 64, ATTN_FWD_D64_STAGES> AttnFwdCfgD64;
#define ATTN_FWD_D64_MINB 1
#elif ATTN_FWD_D64_PRESET == 2
typedef FwdCfg<64, 8, 1, true, 128, ATTN_FWD_D64_STAGES> AttnFwdCfgD64;
#define ATTN_FWD_D64_MINB 1
#else
typedef FwdCfg<64, 4, 2, true, 64, ATTN_FWD_D64_STAGES> AttnFwdCfgD64;
#define ATTN_FWD_D64_MINB 2
#endif
#if ATTN_FWD_D128_PRESET == 0
typedef FwdCfg<128, 8, 1, true, 64, ATTN_FWD_D128_STAGES> AttnFwdCfgD128;
#define ATTN_FWD_D128_MINB 1
#elif ATTN_FWD_D128_PRESET == 2
typedef FwdCfg<128, 8, 1, false, 128, ATTN_FWD_D128_STAGES> AttnFwdCfgD128;
#define ATTN_FWD_D128_MINB 1
#else
typedef FwdCfg<128, 4, 2, false, 32, ATTN_FWD_D128_STAGES> AttnFwdCfgD128;
#define ATTN_FWD_D128_MINB 2
#endif
// Backward variants (non-default, for tuning): ATTN_BWD_D{D}_NWARPS = 4 (default) or 8
// (8 warps = 256 threads, BC = 128 keys per block, 1 block per SM: half the dQ reductions and
// Q/dO tile loads per key), ATTN_BWD_D{D}_BR = query rows per step (D=64: 64; D=128: 32),
// ATTN_BWD_RED_V4 = 1: dQ reductions as red.global.add.v4.f32 (half the instructions),
// ATTN_BWD_STAGES = depth of the Q/dO/lse/dsum ring (default 2).
// Launch of a variant: block 32*NWARPS, grid (ceil(Lk / (16*NWARPS)), Hkv, B),
// smem = 2*BC*D*2 + BC*BR*2 + STAGES*(2*BR*D*2 + 8*BR).
#ifndef ATTN_BWD_D64_NWARPS
#define ATTN_BWD_D64_NWARPS 4
#endif
#ifndef ATTN_BWD_D128_NWARPS
#define ATTN_BWD_D128_NWARPS 4
#endif
#ifndef ATTN_BWD_D64_BR
#define ATTN_BWD_D64_BR 64
#endif
#ifndef ATTN_BWD_D128_BR
#define ATTN_BWD_D128_BR 32
#endif
#ifndef ATTN_BWD_RED_V4
#define ATTN_BWD_RED_V4 0
#endif
#ifndef ATTN_BWD_STAGES
#define ATTN_BWD_STAGES 2
#endif
typedef BwdCfg<64, ATTN_BWD_D64_BR, ATTN_BWD_STAGES, ATTN_BWD_D64_NWARPS, ATTN_BWD_RED_V4 != 0> AttnBwdCfgD64;
typedef BwdCfg<128, ATTN_BWD_D128_BR, ATTN_BWD_STAGES, ATTN_BWD_D128_NWARPS, ATTN_BWD_RED_V4 != 0> AttnBwdCfgD128;

#if ATTN_FWD_D64_STAGES == 3 && ATTN_FWD_D64_PRESET == 1
static_assert(AttnFwdCfgD64::SMEM_BYTES == 65536 && AttnFwdCfgD64::NTHREADS == 128, "documented (fwd d64)");
#endif
#if ATTN_FWD_D128_STAGES == 3 && ATTN_FWD_D128_PRESET == 0
static_assert(AttnFwdCfgD128::SMEM_BYTES == 131072 && AttnFwdCfgD128::NTHREADS == 256, "documented (fwd d128)");
#endif
#if ATTN_BWD_D64_NWARPS == 4 && ATTN_BWD_D64_BR == 64 && ATTN_BWD_STAGES == 2
// smem 3 * 8192 + 2 * (2 * 8192 + 512) = 58368
static_assert(AttnBwdCfgD64::SMEM_BYTES == 58368 && AttnBwdCfgD64::NTHREADS == 128, "documented (bwd d64)");
#endif
#if ATTN_BWD_D128_NWARPS == 4 && ATTN_BWD_D128_BR == 32 && ATTN_BWD_STAGES == 2
// smem 2 * 16384 + 4096 + 2 * (2 * 8192 + 256) = 70144
static_assert(AttnBwdCfgD128::SMEM_BYTES == 70144 && AttnBwdCfgD128::NTHREADS == 128, "documented (bwd d128)");
#endif
static_assert(sizeof(FlashParams) == 152, "FlashParams ABI size");

extern __shared__ __align__(128) unsigned char attn_smem[];

#define ATTN_FWD_KERNEL(NAME, TR, CFG, MINB)                                        \
    extern "C" __global__ void __launch_bounds__(CFG::NTHREADS, MINB)               \
        NAME(const FlashParams p) {                                                 \
        flash_fwd_body<TR, CFG>(p, attn_smem);                                      \
    }

#define ATTN_BWD_KERNELS(SUFFIX, TR, D, CFG)                                        \
    extern "C" __global__ void __launch_bounds__(256)                               \
        flash_bwd_preprocess_##SUFFIX(const FlashParams p) {                        \
        flash_bwd_preprocess_body<TR, D>(p);                                        \
    }                                                                               \
    extern "C" __global__ void __launch_bounds__(CFG::NTHREADS, CFG::MINB)          \
        flash_bwd_dq_dk_dv_##SUFFIX(const FlashParams p) {                          \
        flash_bwd_body<TR, CFG>(p, attn_smem);                                      \
    }                                                                               \
    extern "C" __global__ void __launch_bounds__(256)                               \
        flash_bwd_convert_dq_##SUFFIX(const FlashParams p) {                        \
        flash_bwd_convert_dq_body<TR, D>(p);                                        \
    }

ATTN_FWD_KERNEL(flash_fwd_d64_f16, AttnF16, AttnFwdCfgD64, ATTN_FWD_D64_MINB)
ATTN_FWD_KERNEL(flash_fwd_d64_bf16, AttnBF16, AttnFwdCfgD64, ATTN_FWD_D64_MINB)
ATTN_FWD_KERNEL(flash_fwd_d128_f16, AttnF16, AttnFwdCfgD128, ATTN_FWD_D128_MINB)
ATTN_FWD_KERNEL(flash_fwd_d128_bf16, AttnBF16, AttnFwdCfgD128, ATTN_FWD_D128_MINB)

ATTN_BWD_KERNELS(d64_f16, AttnF16, 64, AttnBwdCfgD64)
ATTN_BWD_KERNELS(d64_bf16, AttnBF16, 64, AttnBwdCfgD64)
ATTN_BWD_KERNELS(d128_f16, AttnF16, 128, AttnBwdCfgD128)
ATTN_BWD_KERNELS(d128_bf16, AttnBF16, 128, AttnBwdCfgD128)
