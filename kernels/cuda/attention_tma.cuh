// attention_tma.cuh — asynchronous copies of the sm_90a attention programs (attention_tma.cu,
// attention_tma_bwd.cu, attention_wgmma_bwd.cu): tensor maps, mbarriers, bulk tensor copies
// (cp.async.bulk.tensor) completing on an mbarrier, and bulk reductions (cp.reduce.async.bulk)
// completing through the issuing thread's bulk groups. Include it only from programs built for
// sm_90a.
#pragma once

// A CUtensorMap (opaque, 128 bytes, 64-aligned), made on the host by cuTensorMapEncodeTiled and
// passed inside a __grid_constant__ kernel argument.
struct __align__(64) TmaMap {
    unsigned long long w[16];  // a CUtensorMap (opaque, 128 bytes)
};

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also expects `bytes` of transactions (the bulk copies that complete on it).
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Expects `bytes` more of transactions in the barrier's current phase, without arriving.
__device__ __forceinline__ void mbar_expect_tx_only(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred P1;\nTMA_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra TMA_DONE;\nbra TMA_WAIT;\nTMA_DONE:\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// The same for a thread that expects to wait long (a producer waiting for its consumers): each
// try asks to be suspended until the phase completes, up to 10 ms (the suspend-time hint), where
// mbar_wait's tries return after a system-dependent short limit and spin.
__device__ __forceinline__ void mbar_wait_sleep(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred P1;\nTMA_WAITS:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1, %2;\n"
        "@P1 bra TMA_DONES;\nbra TMA_WAITS;\nTMA_DONES:\n}\n" ::"r"(bar),
        "r"(parity), "n"(10000000)
        : "memory");
}
// A kernel's wait of the producer (PRODUCER) or of a consumer under the kernel's setting SLEEP
// (attention_tma.cu's ATTN_TMA_WAIT_SLEEP, attention_tma_bwd.cu's ATTN_TBW_WAIT_SLEEP): 0 every wait
// spins (mbar_wait), 1 the producer's suspend (mbar_wait_sleep), 2 every wait suspends.
template <int SLEEP, bool PRODUCER>
__device__ __forceinline__ void mbar_wait_as(unsigned bar, unsigned parity) {
    if (SLEEP >= (PRODUCER ? 1 : 2)) {
        mbar_wait_sleep(bar, parity);
    } else {
        mbar_wait(bar, parity);
    }
}
// Box (c0, c1, c2) of the tensor map into shared memory at dst; completes on bar.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
        "[%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// -------------------------------------------------------------------------------------
// Bulk asynchronous reductions (shared -> global)
// -------------------------------------------------------------------------------------
// Bulk asynchronous reduction dst[0 .. bytes/4) += src (f32, shared -> global; bytes % 16 == 0,
// both 16-byte aligned), completed through this thread's bulk groups.
__device__ __forceinline__ void bulk_red_add_f32(float* dst, unsigned src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}
// Bulk asynchronous tensor reduction: the box at (c0, c1, c2) of the tensor map (f32) += the box
// in shared memory at src (laid out as the map's swizzle says), completed through this thread's
// bulk groups; box elements outside the tensor are not written.
__device__ __forceinline__ void tma_red_add_3d(const TmaMap* map, unsigned src, int c0, int c1, int c2) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
            reinterpret_cast<unsigned long long>(map)),
        "r"(src), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk groups have finished reading shared memory (the source may be rewritten).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// This thread's bulk groups have completed (their writes are performed).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
