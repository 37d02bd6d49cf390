// wgmma.cuh — Hopper warpgroup-MMA plumbing shared by the sm_90a attention programs
// (attention_wgmma.cu, attention_wgmma_bwd.cu): wgmma fences, commits and waits, the
// generic-to-async proxy fence, named barriers, register pins and 128-byte-swizzle shared
// memory matrix descriptors. Include it only from programs built for sm_90a.
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

// Pins the registers of `r` here: the compiler may not move their reads or writes across this
// point, so that no access to an accumulator or A fragment falls between a wgmma and its wait.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
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
