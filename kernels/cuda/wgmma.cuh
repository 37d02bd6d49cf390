// wgmma.cuh — Hopper warpgroup-MMA plumbing shared by the sm_90a attention programs
// (attention_wgmma.cu, attention_wgmma_bwd.cu): wgmma fences, commits and waits, the
// generic-to-async proxy fence, named barriers, register pins and 128-byte-swizzle shared
// memory matrix descriptors, the m64nNk16 MMA wrappers and the swizzled tile loader.
// Include it only from programs built for sm_90a, after attention_common.cuh.
#pragma once

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Wait until at most N of this warpgroup's committed wgmma groups are still running.
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Makes this thread's generic-proxy writes to shared memory (st.shared, cp.async) visible to
// the async proxy (wgmma operand reads) once a barrier follows.
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Named barriers 1.. (0 is __syncthreads): `count` threads, arriving or waiting.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Keeps the work that computed x and y before the wgmma wait that follows it, in the SASS too.
// ptxas may schedule a wait (WARPGROUP.DEPBAR) anywhere in its basic block, also above register-only
// work the program puts before it (reg_fence does not stop that: its asm emits no instruction). A
// branch on x and y ends the basic block there. Its body, a CTA memory fence, is harmless and runs
// only when the two words are bitwise complements: never for the non-negative row sums it is given.
__device__ __forceinline__ void wg_keep_before_wait(float x, float y) {
    if ((__float_as_uint(x) ^ __float_as_uint(y)) == 0xFFFFFFFFu) asm volatile("membar.cta;\n" ::: "memory");
}

// Pins the registers of `r` here: the compiler may not move their reads or writes across this
// point, so that no access to an accumulator or A fragment falls between a wgmma and its wait.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Ends the life of the values in r without an instruction: an empty asm "writes" every register,
// so the compiler need not keep the old values from their last use to r's next GEMM (an
// accumulator that GEMM overwrites, scale-d 0, is otherwise carried across loop iterations, since
// the wgmma asm reads and writes it).
template <int N>
__device__ __forceinline__ void reg_undef(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "=f"(r[i]));  // (volatile: never merged)
}
template <int N>
__device__ __forceinline__ void reg_fence(unsigned (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63), base offset 0
// (swizzle pattern anchored at 1024-byte boundaries). Addresses and offsets in bytes.
__device__ __forceinline__ unsigned long long wg_desc(unsigned saddr, unsigned lbo, unsigned sbo) {
    return static_cast<unsigned long long>((saddr & 0x3FFFFu) >> 4) |
           (static_cast<unsigned long long>((lbo & 0x3FFFFu) >> 4) << 16) |
           (static_cast<unsigned long long>((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

// The descriptor `d` moved `bytes` further (start address field; no carry out of it for
// shared addresses < 256 KB).
__device__ __forceinline__ unsigned long long wg_desc_add(unsigned long long d, unsigned bytes) {
    return d + (bytes >> 4);
}

// -------------------------------------------------------------------------------------
// wgmma.mma_async m64nNk16 with f32 accumulators, N = 64 or 128, f16 or bf16 inputs.
// Uses the attention dtype tags AttnF16 / AttnBF16 of attention_common.cuh (include that
// header first) and its cp_async_16.
// -------------------------------------------------------------------------------------
// Wgmma<Tr, N>::ss<TA, TB>(d, da, db, accumulate): D[64 x N] (+)= A[64 x 16] B[16 x N], both
// from shared memory (descriptors); TA / TB are the transpose flags (0: K-major, 1:
// MN-major); `accumulate` 0 overwrites D.
// Wgmma<Tr, N>::rs(d, a, db): D[64 x N] += A[64 x 16] B[16 x N], A from registers (4 x
// f16x2 / bf16x2 per thread), B MN-major in shared memory (descriptor; transpose flag set).
template <typename Tr, int N>
struct Wgmma;
template <>
struct Wgmma<AttnF16, 64> {
    template <int TA = 0, int TB = 0>
    static __device__ __forceinline__ void ss(float (&d)[32], unsigned long long da, unsigned long long db,
                                              int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
            "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
    }
    static __device__ __forceinline__ void rs(float (&d)[32], const unsigned (&a)[4], unsigned long long db) {
        asm volatile(
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
            "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
template <>
struct Wgmma<AttnBF16, 64> {
    template <int TA = 0, int TB = 0>
    static __device__ __forceinline__ void ss(float (&d)[32], unsigned long long da, unsigned long long db,
                                              int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
            "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
    }
    static __device__ __forceinline__ void rs(float (&d)[32], const unsigned (&a)[4], unsigned long long db) {
        asm volatile(
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
            "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
template <>
struct Wgmma<AttnF16, 128> {
    template <int TA = 0, int TB = 0>
    static __device__ __forceinline__ void ss(float (&d)[64], unsigned long long da, unsigned long long db,
                                              int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
            "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
    }
    static __device__ __forceinline__ void rs(float (&d)[64], const unsigned (&a)[4], unsigned long long db) {
        asm volatile(
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
            "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
template <>
struct Wgmma<AttnBF16, 128> {
    template <int TA = 0, int TB = 0>
    static __device__ __forceinline__ void ss(float (&d)[64], unsigned long long da, unsigned long long db,
                                              int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
            "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
    }
    static __device__ __forceinline__ void rs(float (&d)[64], const unsigned (&a)[4], unsigned long long db) {
        asm volatile(
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
            "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};

// -------------------------------------------------------------------------------------
// Tiles
// -------------------------------------------------------------------------------------
// Async copies of [ROWS x D] tiles of 16-bit elements (global rows of D elements, contiguous)
// into the 128-byte-swizzled panel layout (see the top of the file), by all NT threads: thread
// tid copies 16-byte chunk (tid % CPR) of rows tid / CPR + i * RSTEP. Since RSTEP is a multiple
// of 8, a thread's swizzle (row & 7) is the same in every pass, so its offsets are computed once.
template <int D, int NT>
struct WgTileLoader {
    static constexpr int CPR = D / 8;        // 16-byte chunks per row
    static constexpr int RSTEP = NT / CPR;   // rows per pass
    static_assert(NT % CPR == 0 && RSTEP % 8 == 0, "tile loader geometry");
    int row;       // first row of this thread
    unsigned dst;  // its smem byte offset in a tile, without the panel term of ROWS
    unsigned pan;  // its panel (0 or 1)
    int src;       // its global byte offset in a tile

    __device__ __forceinline__ explicit WgTileLoader(int tid) {
        row = tid / CPR;
        const int ch = tid % CPR;
        pan = static_cast<unsigned>(ch >> 3);
        dst = static_cast<unsigned>(row * 128 + (((ch & 7) ^ (row & 7)) << 4));
        src = row * (D * 2) + ch * 16;
    }

    // Rows >= valid_rows are zero-filled (their source is row 0, never read; valid_rows >= 1).
    template <int ROWS>
    __device__ __forceinline__ void load(unsigned tile, const void* gsrc, int valid_rows) const {
        const char* g = static_cast<const char*>(gsrc);
        const unsigned d0 = tile + pan * (ROWS * 128) + dst;
#pragma unroll
        for (int i = 0; i < (ROWS + RSTEP - 1) / RSTEP; ++i) {
            if (ROWS % RSTEP == 0 || row + i * RSTEP < ROWS) {
                const bool ok = row + i * RSTEP < valid_rows;
                const char* sp = ok ? g + src + i * RSTEP * (D * 2) : g;
                cp_async_16(d0 + i * RSTEP * 128, sp, ok ? 16 : 0);
            }
        }
    }
};
