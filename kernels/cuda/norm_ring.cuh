// norm_ring.cuh — layer norm's backward on a cp.async ring (ln_bwd_pipe), a part of
// norm.cu: included by it after its row helpers (ln_group, group_sum2, ln_dx_regs,
// ln_write_partials), whose unnamed namespace it reopens. norm.cu's header documents the
// kernel ln_bwd_pipe_{dt} and its launch; norm.cu defines the entry points.
#pragma once

#ifndef LN_BPIPE_NV
#define LN_BPIPE_NV 4  // ln_bwd_pipe: most 16-byte vectors per thread (LN_NV's role)
#endif
#ifndef LN_BPIPE_S
#define LN_BPIPE_S 3  // ln_bwd_pipe: ring stages (rows in flight per group: S - 1 ahead)
#endif
#ifndef LN_BPIPE_BLOCKS
#define LN_BPIPE_BLOCKS 1  // ln_bwd_pipe: launch bound, blocks per SM (its grid: SMs x it)
#endif

namespace {

// ---- the backward on a cp.async ring (ln_bwd_pipe) --------------------------------------
//
// ln_bwd_pipe takes the register path's rows with the same groups as ln_bwd_fused, but
// each thread stages the 16-byte vectors of dy and x it will read, and the row's mean and
// rstd, in its own slots of a ring of S stages in dynamic shared memory, S - 1 rows ahead
// (cp.async, sm_80 and newer): the loads of the next rows stay in flight through this
// row's reductions without costing registers. A thread reads only the slots it filled,
// so the ring needs no barrier (cp.async.wait_group orders a thread's own copies). gamma
// sits in the thread's own slots too (its columns are the same in every row).

__device__ __forceinline__ unsigned ln_smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ln_cp16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void ln_cp4(unsigned dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void ln_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void ln_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The fused backward (dx and the block's parameter partials, as ln_bwd_fused) on the
// ring: stage s holds [dy: NV x blockDim][x: NV x blockDim] vectors, and after all S
// stages of vectors, [mean, rstd] x blockDim floats per stage.
template <typename T, int NV, int S>
__device__ __forceinline__ void ln_bwd_pipe(const T* dy, const T* x, const float* mean, const float* rstd,
                                            const T* gamma, T* dx, float* part_g, float* part_b, size_t rows,
                                            size_t d) {
    constexpr int V = Ty<T>::V;
    const float inv_d = 1.0f / (float)d;
    const size_t nv = d / V;
    const bool ok = d % V == 0 && aligned16(dy) && aligned16(x) && aligned16(dx) && aligned16(gamma) &&
                    nv <= (size_t)blockDim.x * NV;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    const bool arch_ok = false;  // no cp.async: the launcher takes ln_bwd_fused there
#else
    const bool arch_ok = true;
#endif
    if (!ok || !arch_ok) {
        ln_nan_partials(part_g, part_b, d);
        return;
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    extern __shared__ uint4 ln_ring[];
    __shared__ float sm[64];
    const unsigned gn = ln_group(nv, NV), gpb = blockDim.x / gn, gi = threadIdx.x / gn, gl = threadIdx.x % gn;
    const size_t stride = (size_t)gridDim.x * gpb, row0 = (size_t)blockIdx.x * gpb + gi;
    const unsigned bd = blockDim.x;
    float ag[NV][V], ab[NV][V];
    // gamma: this thread's vectors in its own slots after the ring's vectors and floats.
    uint4* gslot = ln_ring + (size_t)S * 2 * NV * bd + (size_t)S * 2 * bd / 4;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const size_t i = gl + (size_t)k * gn;
        if (i < nv) gslot[k * bd + threadIdx.x] = ldg16(gamma + i * V);
#pragma unroll
        for (int e = 0; e < V; ++e) { ag[k][e] = 0.0f; ab[k][e] = 0.0f; }
    }
    const unsigned base = ln_smem_addr(ln_ring);
    float* fring = reinterpret_cast<float*>(ln_ring + (size_t)S * 2 * NV * bd);
    const unsigned fbase = ln_smem_addr(fring);
    auto vslot = [&](unsigned s, int w, int k) { return (((s * 2 + (unsigned)w) * NV + (unsigned)k) * bd + threadIdx.x); };
    auto fslot = [&](unsigned s, int w) { return ((s * 2 + (unsigned)w) * bd + threadIdx.x); };
    auto issue = [&](unsigned j) {
        const size_t row = row0 + (size_t)j * stride;
        if (row < rows) {
            const unsigned s = j % S;
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                const size_t i = gl + (size_t)k * gn;
                if (i < nv) {
                    ln_cp16(base + 16u * vslot(s, 0, k), dy + row * d + i * V);
                    ln_cp16(base + 16u * vslot(s, 1, k), x + row * d + i * V);
                }
            }
            ln_cp4(fbase + 4u * fslot(s, 0), mean + row);
            ln_cp4(fbase + 4u * fslot(s, 1), rstd + row);
        }
        ln_commit();
    };
#pragma unroll
    for (int j = 0; j < S - 1; ++j) issue(j);
    unsigned j = 0;
    for (size_t row = row0; row < rows; row += stride, ++j) {
        issue(j + S - 1);
        ln_wait<S - 1>();
        const unsigned s = j % S;
        uint4 rdy[NV], rx[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k)
            if (gl + (size_t)k * gn < nv) { rdy[k] = ln_ring[vslot(s, 0, k)]; rx[k] = ln_ring[vslot(s, 1, k)]; }
        const float m = fring[fslot(s, 0)], rs = fring[fslot(s, 1)];
        ln_dx_regs<T, true, NV, true>(rdy, rx, gamma, dx + row * d, nv, inv_d, m, rs, gl, gi, gn, sm, ag, ab,
                                      gslot + threadIdx.x);
    }
    ln_wait<0>();
    __syncthreads();  // every thread is done with the ring: it becomes the partials' row (d floats fit one stage)
    ln_write_partials<T, NV>(ag, ab, reinterpret_cast<float*>(ln_ring), part_g, part_b, nv, d, gl, gi, gn, gpb);
#endif
}

}  // namespace
