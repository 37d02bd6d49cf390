// optim.cu — fused optimizer steps (SGD, AdamW), the global gradient norm, and the
// on-device state of dynamic loss scaling. The CPU reference is ops/src/optim/cpu.rs
// (the same formulas, in f32).
//
// dt / p / g are f32 (float), f16 (__half) or bf16 (__nv_bfloat16); arithmetic in f32.
// Block: 256 threads (RTX_BLOCK, required by sumsq's shared-memory tree); grids are
// grid-stride (any size), best min(ceil(n / 256), resident blocks); sumsq_finish and
// scaler_* take one block.
//
// One tensor per launch:
//   struct Hyper { float lr, beta1, beta2, eps, wd, momentum, t, max_norm;
//                  int nesterov, copy_kind; };             // 40 bytes, by value
//   extern "C" __global__ void adamw_{p}_{g}(const P* p_in, P* p_out, const G* g,
//       const P* m_in, P* m_out, const P* v_in, P* v_out, void* copy, size_t n, Hyper h,
//       const float* norm, const float* scaler, const float* tstep)
//   extern "C" __global__ void sgd_{p}_{g}(... the same; m = the momentum buffer, v unused
//       (null); m null when h.momentum == 0)
//   *_in may equal *_out (in place, donated); no other overlap. copy (null when
//   copy_kind == 0) receives the new parameter rounded to f16 (copy_kind 1) or bf16 (2).
//   The gradient used is g * mult where mult = 1 / scaler[0] when scaler is not null,
//   times min(1, max_norm / (norm[0] / scaler[0] + 1e-6)) when norm is not null
//   (clipping by the global norm of the unscaled gradients, as torch's
//   clip_grad_norm_). When scaler[3] != 0 (an overflow was found) the step is a no-op:
//   the outputs get the inputs (and copy the parameter). AdamW's step for the bias
//   corrections is t - scaler[2] (skipped steps do not count), where t is tstep[0] when
//   tstep is not null (a step counter on the device, e.g. advanced inside a CUDA graph),
//   else h.t.
//   AdamW (Loshchilov & Hutter, decoupled weight decay, as torch.optim.AdamW):
//     p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//     p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), bc_k = 1 - b_k^t.
//   SGD (torch.optim.SGD, dampening 0): g += wd p; m = mu m + g;
//     d = nesterov ? g + mu m : m (d = g when mu == 0); p -= lr d.
//
// Many tensors per launch (the op groups its tensors of one gradient dtype, RTX_MT_MAX
// = 48 a launch: GPT-2 small's 148 tensors in 4 launches), the same arithmetic per element:
//   struct MtTensor { u64 p_in, p_out, g, m_in, m_out, v_in, v_out, copy, n; };  // 72 B
//   struct MtTable { MtTensor t[48]; u64 tile_end[48]; int count, pad_; };     // 3848 B
//   extern "C" __global__ void adamw_mt_{p}_{g}(MtTable tab, Hyper h, const float* norm,
//       const float* scaler, const float* tstep)   (and sgd_mt_{p}_{g}); tab by value: tensors t[0..count],
//   each with the one-tensor kernel's pointers (addresses; null as there) and n;
//   tile_end[k] = sum over tensors 0..=k of ceil(n / 4096) (tiles of RTX_MT_TILE = 4096
//   elements). Block b takes tiles b, b + grid, ...; any grid, best a block per tile.
//   (RTX_MT_MAX, RTX_MT_TILE and RTX_MT_U, the 4-element vectors a thread loads before
//   it stores, are compile-time knobs for kernels/checks/train_kernels_check.py; the
//   launcher, ops/src/optim/cuda.rs, matches the defaults. On the H200, 124M f32
//   parameters in 148 tensors: 7 launches of 24 ran 0.904 ms, 4 of 48 0.884, one of 160
//   (a 12.8 KB parameter table, past the classic 4 KiB) 0.864; RTX_MT_U = 2 no gain.)
//
//   extern "C" __global__ void nonfinite_{dt}(const T* g, size_t n, float* flag)
//     sets *flag = 1 when some g[i] is NaN or infinite (never clears it).
//   extern "C" __global__ void sumsq_{dt}(const T* x, size_t n, float* partials)
//     partials[blockIdx.x] = sum of x[i]^2 over the block's grid-stride share.
//   extern "C" __global__ void sumsq_finish(const float* partials, size_t count, float* out)
//     one block: out[0] = sqrt(sum of partials[0..count]) in a fixed order (deterministic).
//   extern "C" __global__ void scaler_begin(const float* in, float* out)
//     out[0..3] = in[0..3], out[3] = 0 (in may equal out). State: [scale, good steps,
//     skipped steps, overflow flag].
//   extern "C" __global__ void scaler_end(float* s, float growth_interval)
//     after the step: overflow -> scale /= 2, good = 0, skipped += 1; else good += 1 and
//     at growth_interval good steps scale *= 2, good = 0.

#include "common.cuh"

using namespace rtx;

#ifndef RTX_MT_MAX
#define RTX_MT_MAX 48     // tensors per multi-tensor launch (the table: 3848 bytes, under 4 KiB)
#endif
#ifndef RTX_MT_TILE
#define RTX_MT_TILE 4096  // elements per tile of a multi-tensor launch
#endif
#ifndef RTX_MT_U
#define RTX_MT_U 1        // 4-element vectors per thread with their loads issued together
#endif

struct Hyper {
    float lr, beta1, beta2, eps, wd, momentum, t, max_norm;
    int nesterov, copy_kind;
};

// The gradient multiplier and whether the step is skipped (see the header).
__device__ __forceinline__ float grad_mult(const Hyper& h, const float* norm, const float* scaler, bool& skip,
                                           float& skipped) {
    float mult = 1.0f;
    skip = false;
    skipped = 0.0f;
    if (scaler) {
        mult = 1.0f / scaler[0];
        skip = scaler[3] != 0.0f;
        skipped = scaler[2];
    }
    if (norm) {
        const float c = h.max_norm / (norm[0] * mult + 1e-6f);
        mult *= fminf(1.0f, c);
    }
    return mult;
}

__device__ __forceinline__ void store_copy(void* copy, int kind, size_t i, float p) {
    if (kind == 1) Ty<__half>::store(static_cast<__half*>(copy) + i, p);
    else if (kind == 2) Ty<__nv_bfloat16>::store(static_cast<__nv_bfloat16*>(copy) + i, p);
}

// v rounded to P and widened back: the value a store of v to P keeps.
template <typename P> __device__ __forceinline__ float rounded(float v);
template <> __device__ __forceinline__ float rounded<float>(float v) { return v; }
template <> __device__ __forceinline__ float rounded<__half>(float v) { return __half2float(__float2half_rn(v)); }
template <> __device__ __forceinline__ float rounded<__nv_bfloat16>(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

struct AdamWRule {
    float decay, b1, b2, c1, c2, step, bc2_sqrt, eps;
    __device__ __forceinline__ AdamWRule(const Hyper& h, float skipped) {
        const float t = h.t - skipped;
        b1 = h.beta1; b2 = h.beta2; c1 = 1.0f - h.beta1; c2 = 1.0f - h.beta2; eps = h.eps;
        decay = 1.0f - h.lr * h.wd;
        step = h.lr / (1.0f - powf(h.beta1, t));
        bc2_sqrt = sqrtf(1.0f - powf(h.beta2, t));
    }
    __device__ __forceinline__ void apply(float& p, float g, float& m, float& v) const {
        p = p * decay;
        m = b1 * m + c1 * g;
        v = b2 * v + c2 * (g * g);
        const float den = sqrtf(v) / bc2_sqrt + eps;
        p = p - step * (m / den);
    }
    static constexpr bool TWO = true;
};

struct SgdRule {
    float lr, wd, mu;
    bool nesterov;
    __device__ __forceinline__ SgdRule(const Hyper& h, float) : lr(h.lr), wd(h.wd), mu(h.momentum), nesterov(h.nesterov != 0) {}
    __device__ __forceinline__ void apply(float& p, float g, float& m, float&) const {
        g = g + wd * p;
        float d = g;
        if (mu != 0.0f) {
            m = mu * m + g;
            d = nesterov ? g + mu * m : m;
        }
        p = p - lr * d;
    }
    static constexpr bool TWO = false;
};

// 4 consecutive elements through one 16-byte (f32) or 8-byte (f16, bf16) access; p must
// be aligned to 4 elements (aligned4).
template <typename T> __device__ __forceinline__ bool aligned4(const void* p) {
    return ((u64)p & (4 * sizeof(T) - 1)) == 0;
}
template <typename T> __device__ __forceinline__ void load4(const T* p, float* f) {
    if constexpr (sizeof(T) == 4) {
        Ty<float>::unpack(ldg16(p), f);
    } else {
        const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
        Ty<T>::word(u.x, f);
        Ty<T>::word(u.y, f + 2);
    }
}
template <typename T> __device__ __forceinline__ void store4(T* p, const float* f) {
    if constexpr (sizeof(T) == 4) {
        st16(p, Ty<float>::pack(f));
    } else {
        *reinterpret_cast<uint2*>(p) = make_uint2(Ty<T>::pair(f[0], f[1]), Ty<T>::pair(f[2], f[3]));
    }
}

// Elements [i0, i0 + 4) of one tensor, through 4-element vector accesses.
template <class R, typename P, typename G>
__device__ __forceinline__ void step4(const P* p_in, P* p_out, const G* g, const P* m_in, P* m_out,
                                      const P* v_in, P* v_out, void* copy, size_t i0, const R& rule,
                                      float mult, bool skip, int copy_kind) {
    const bool has_m = m_in != nullptr, has_v = R::TWO;
    float p[4], gg[4], m[4] = {0.0f, 0.0f, 0.0f, 0.0f}, v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    load4<P>(p_in + i0, p);
    load4<G>(g + i0, gg);
    if (has_m) load4<P>(m_in + i0, m);
    if (has_v) load4<P>(v_in + i0, v);
    if (!skip) {
#pragma unroll
        for (int e = 0; e < 4; ++e) rule.apply(p[e], gg[e] * mult, m[e], v[e]);
    }
    store4<P>(p_out + i0, p);
    if (has_m) store4<P>(m_out + i0, m);
    if (has_v) store4<P>(v_out + i0, v);
    if (copy_kind != 0) {
        float c[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) c[e] = rounded<P>(p[e]);
        if (copy_kind == 1) store4<__half>(static_cast<__half*>(copy) + i0, c);
        else store4<__nv_bfloat16>(static_cast<__nv_bfloat16*>(copy) + i0, c);
    }
}

// U groups of 4 elements, at i0, i0 + stride, ...: every load issued before any store
// (the outputs may alias the inputs, so the compiler cannot reorder them itself).
template <class R, typename P, typename G, int U>
__device__ __forceinline__ void stepu(const P* p_in, P* p_out, const G* g, const P* m_in, P* m_out,
                                      const P* v_in, P* v_out, void* copy, size_t i0, size_t stride,
                                      const R& rule, float mult, bool skip, int copy_kind) {
    const bool has_m = m_in != nullptr, has_v = R::TWO;
    float p[U][4], gg[U][4], m[U][4], v[U][4];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const size_t i = i0 + u * stride;
        load4<P>(p_in + i, p[u]);
        load4<G>(g + i, gg[u]);
#pragma unroll
        for (int e = 0; e < 4; ++e) { m[u][e] = 0.0f; v[u][e] = 0.0f; }
        if (has_m) load4<P>(m_in + i, m[u]);
        if (has_v) load4<P>(v_in + i, v[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const size_t i = i0 + u * stride;
        if (!skip) {
#pragma unroll
            for (int e = 0; e < 4; ++e) rule.apply(p[u][e], gg[u][e] * mult, m[u][e], v[u][e]);
        }
        store4<P>(p_out + i, p[u]);
        if (has_m) store4<P>(m_out + i, m[u]);
        if (has_v) store4<P>(v_out + i, v[u]);
        if (copy_kind != 0) {
            float c[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) c[e] = rounded<P>(p[u][e]);
            if (copy_kind == 1) store4<__half>(static_cast<__half*>(copy) + i, c);
            else store4<__nv_bfloat16>(static_cast<__nv_bfloat16*>(copy) + i, c);
        }
    }
}

// Element i of one tensor, scalar.
template <class R, typename P, typename G>
__device__ __forceinline__ void step1(const P* p_in, P* p_out, const G* g, const P* m_in, P* m_out,
                                      const P* v_in, P* v_out, void* copy, size_t i, const R& rule,
                                      float mult, bool skip, int copy_kind) {
    const bool has_m = m_in != nullptr, has_v = R::TWO;
    float p = Ty<P>::load(p_in + i);
    float m = has_m ? Ty<P>::load(m_in + i) : 0.0f;
    float v = has_v ? Ty<P>::load(v_in + i) : 0.0f;
    if (!skip) rule.apply(p, Ty<G>::load(g + i) * mult, m, v);
    Ty<P>::store(p_out + i, p);
    if (has_m) Ty<P>::store(m_out + i, m);
    if (has_v) Ty<P>::store(v_out + i, v);
    // The copy rounds the stored parameter (as a cast of p_out would).
    if (copy_kind != 0) store_copy(copy, copy_kind, i, rounded<P>(p));
}

// Whether every pointer of a tensor allows 4-element vector access.
template <typename P, typename G>
__device__ __forceinline__ bool step_vec_ok(const P* p_in, const P* p_out, const G* g, const P* m_in,
                                            const P* m_out, const P* v_in, const P* v_out, const void* copy) {
    return aligned4<P>(p_in) && aligned4<P>(p_out) && aligned4<G>(g) && aligned4<P>(m_in) &&
           aligned4<P>(m_out) && aligned4<P>(v_in) && aligned4<P>(v_out) && aligned4<__half>(copy);
}

// One tensor: a vector of 4 elements per thread per step (its 4 loads issued together),
// then the n % 4 tail element by element.
template <class R, typename P, typename G>
__device__ __forceinline__ void step(const P* p_in, P* p_out, const G* g, const P* m_in, P* m_out,
                                     const P* v_in, P* v_out, void* copy, size_t n, const Hyper& h_in,
                                     const float* norm, const float* scaler, const float* tstep) {
    Hyper h = h_in;
    if (tstep) h.t = tstep[0];
    bool skip;
    float skipped;
    const float mult = grad_mult(h, norm, scaler, skip, skipped);
    const R rule(h, skipped);
    const size_t t = global_thread(), nt = global_threads();
    size_t done = 0;
    if (step_vec_ok<P, G>(p_in, p_out, g, m_in, m_out, v_in, v_out, copy)) {
        const size_t nv = n / 4;
        for (size_t i = t; i < nv; i += nt)
            step4<R, P, G>(p_in, p_out, g, m_in, m_out, v_in, v_out, copy, i * 4, rule, mult, skip, h.copy_kind);
        done = nv * 4;
    }
    for (size_t i = done + t; i < n; i += nt)
        step1<R, P, G>(p_in, p_out, g, m_in, m_out, v_in, v_out, copy, i, rule, mult, skip, h.copy_kind);
}

// ---- multi-tensor step ----------------------------------------------------------------

// One tensor of a multi-tensor launch (the pointers of the one-tensor kernel's
// arguments, as addresses; null where that kernel takes null).
struct MtTensor {
    u64 p_in, p_out, g, m_in, m_out, v_in, v_out, copy, n;
};

// The tensors of one launch: tile_end[k] = the tiles (of RTX_MT_TILE elements) of
// tensors 0..=k, so tensor k owns tiles [tile_end[k - 1], tile_end[k]).
struct MtTable {
    MtTensor t[RTX_MT_MAX];
    u64 tile_end[RTX_MT_MAX];
    int count, pad_;
};

template <class R, typename P, typename G>
__device__ __forceinline__ void step_mt(const MtTable& tab, const Hyper& h_in, const float* norm,
                                        const float* scaler, const float* tstep) {
    Hyper h = h_in;
    if (tstep) h.t = tstep[0];
    bool skip;
    float skipped;
    const float mult = grad_mult(h, norm, scaler, skip, skipped);
    const R rule(h, skipped);
    if (tab.count < 1 || tab.count > RTX_MT_MAX) return;
    const u64 total = tab.tile_end[tab.count - 1];
    int k = 0;
    for (u64 tile = blockIdx.x; tile < total; tile += gridDim.x) {
        while (tile >= tab.tile_end[k]) ++k;  // tiles only grow: k moves forward
        const MtTensor& e = tab.t[k];
        const P* p_in = reinterpret_cast<const P*>(e.p_in);
        P* p_out = reinterpret_cast<P*>(e.p_out);
        const G* g = reinterpret_cast<const G*>(e.g);
        const P* m_in = reinterpret_cast<const P*>(e.m_in);
        P* m_out = reinterpret_cast<P*>(e.m_out);
        const P* v_in = reinterpret_cast<const P*>(e.v_in);
        P* v_out = reinterpret_cast<P*>(e.v_out);
        void* copy = reinterpret_cast<void*>(e.copy);
        const size_t first = (size_t)(tile - (k == 0 ? 0 : tab.tile_end[k - 1])) * RTX_MT_TILE;
        const size_t end = first + RTX_MT_TILE < e.n ? first + RTX_MT_TILE : (size_t)e.n;
        size_t done = first;
        if (step_vec_ok<P, G>(p_in, p_out, g, m_in, m_out, v_in, v_out, copy)) {
            const size_t vend = first + (end - first) / 4 * 4;
            size_t i = first + 4 * (size_t)threadIdx.x;
#if RTX_MT_U > 1
            const size_t bs = 4 * (size_t)blockDim.x;
            for (; i + (RTX_MT_U - 1) * bs < vend; i += RTX_MT_U * bs)
                stepu<R, P, G, RTX_MT_U>(p_in, p_out, g, m_in, m_out, v_in, v_out, copy, i, bs, rule, mult, skip,
                                         h.copy_kind);
#endif
            for (; i < vend; i += 4 * (size_t)blockDim.x)
                step4<R, P, G>(p_in, p_out, g, m_in, m_out, v_in, v_out, copy, i, rule, mult, skip, h.copy_kind);
            done = vend;
        }
        for (size_t i = done + threadIdx.x; i < end; i += blockDim.x)
            step1<R, P, G>(p_in, p_out, g, m_in, m_out, v_in, v_out, copy, i, rule, mult, skip, h.copy_kind);
    }
}

template <typename T>
__device__ __forceinline__ void nonfinite(const T* g, size_t n, float* flag) {
    bool bad = false;
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        const float v = Ty<T>::load(g + i);
        bad |= !isfinite(v);
    }
    if (__any_sync(RTX_FULL_MASK, bad) && lane_id() == 0) *flag = 1.0f;
}

template <typename T>
__device__ __forceinline__ void sumsq(const T* x, size_t n, float* partials) {
    float s = 0.0f;
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        const float v = Ty<T>::load(x + i);
        s += v * v;
    }
    s = block_reduce(s, AddOp(), 0.0f);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

extern "C" __global__ void __launch_bounds__(RTX_BLOCK) sumsq_finish(const float* partials, size_t count, float* out) {
    float s = 0.0f;
    for (size_t i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
    s = block_reduce(s, AddOp(), 0.0f);
    if (threadIdx.x == 0) out[0] = sqrtf(s);
}

extern "C" __global__ void scaler_begin(const float* in, float* out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        const float s = in[0], good = in[1], skipped = in[2];
        out[0] = s; out[1] = good; out[2] = skipped; out[3] = 0.0f;
    }
}

extern "C" __global__ void scaler_end(float* s, float growth_interval) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        if (s[3] != 0.0f) {
            s[0] = s[0] * 0.5f; s[1] = 0.0f; s[2] = s[2] + 1.0f;
        } else {
            s[1] = s[1] + 1.0f;
            if (s[1] >= growth_interval) { s[0] = s[0] * 2.0f; s[1] = 0.0f; }
        }
    }
}

#define RTX_STEP(rule, R, pn, P, gn, G)                                                        \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) rule##_##pn##_##gn(                 \
        const P* p_in, P* p_out, const G* g, const P* m_in, P* m_out, const P* v_in, P* v_out, \
        void* copy, size_t n, Hyper h, const float* norm, const float* scaler,                 \
        const float* tstep) {                                                                  \
        step<R, P, G>(p_in, p_out, g, m_in, m_out, v_in, v_out, copy, n, h, norm, scaler, tstep); \
    }

#define RTX_STEP_G(rule, R, pn, P)                                                             \
    RTX_STEP(rule, R, pn, P, f32, float)                                                       \
    RTX_STEP(rule, R, pn, P, f16, __half)                                                      \
    RTX_STEP(rule, R, pn, P, bf16, __nv_bfloat16)

#define RTX_STEP_ALL(rule, R)                                                                  \
    RTX_STEP_G(rule, R, f32, float) RTX_STEP_G(rule, R, f16, __half) RTX_STEP_G(rule, R, bf16, __nv_bfloat16)

#define RTX_STEP_MT(rule, R, pn, P, gn, G)                                                     \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK)                                    \
        rule##_mt_##pn##_##gn(MtTable tab, Hyper h, const float* norm, const float* scaler,    \
                              const float* tstep) {                                            \
        step_mt<R, P, G>(tab, h, norm, scaler, tstep);                                          \
    }

#define RTX_STEP_MT_G(rule, R, pn, P)                                                          \
    RTX_STEP_MT(rule, R, pn, P, f32, float)                                                    \
    RTX_STEP_MT(rule, R, pn, P, f16, __half)                                                   \
    RTX_STEP_MT(rule, R, pn, P, bf16, __nv_bfloat16)

#define RTX_STEP_MT_ALL(rule, R)                                                               \
    RTX_STEP_MT_G(rule, R, f32, float) RTX_STEP_MT_G(rule, R, f16, __half) RTX_STEP_MT_G(rule, R, bf16, __nv_bfloat16)

RTX_STEP_ALL(adamw, AdamWRule)
RTX_STEP_ALL(sgd, SgdRule)
RTX_STEP_MT_ALL(adamw, AdamWRule)
RTX_STEP_MT_ALL(sgd, SgdRule)

#define RTX_PER_DT(dt, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) nonfinite_##dt(const T* g, size_t n, float* flag) { \
        nonfinite<T>(g, n, flag);                                                              \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(RTX_BLOCK) sumsq_##dt(const T* x, size_t n, float* partials) { \
        sumsq<T>(x, n, partials);                                                              \
    }

RTX_PER_DT(f32, float)
RTX_PER_DT(f16, __half)
RTX_PER_DT(bf16, __nv_bfloat16)
