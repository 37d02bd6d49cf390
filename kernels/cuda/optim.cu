// optim.cu — fused optimizer steps (SGD, AdamW), the global gradient norm, and the
// on-device state of dynamic loss scaling. The CPU reference is ops/src/optim/cpu.rs
// (the same formulas, in f32).
//
// dt / p / g are f32 (float), f16 (__half) or bf16 (__nv_bfloat16); arithmetic in f32.
// Block: 256 threads (RTX_BLOCK, required by sumsq's shared-memory tree); grids are
// grid-stride (any size), best min(ceil(n / 256), resident blocks); sumsq_finish and
// scaler_* take one block.
//
// One tensor per launch (the op launches once per parameter tensor, all on one stream):
//   struct Hyper { float lr, beta1, beta2, eps, wd, momentum, t, max_norm;
//                  int nesterov, copy_kind; };             // 40 bytes, by value
//   extern "C" __global__ void adamw_{p}_{g}(const P* p_in, P* p_out, const G* g,
//       const P* m_in, P* m_out, const P* v_in, P* v_out, void* copy, size_t n, Hyper h,
//       const float* norm, const float* scaler)
//   extern "C" __global__ void sgd_{p}_{g}(... the same; m = the momentum buffer, v unused
//       (null); m null when h.momentum == 0)
//   *_in may equal *_out (in place, donated); no other overlap. copy (null when
//   copy_kind == 0) receives the new parameter rounded to f16 (copy_kind 1) or bf16 (2).
//   The gradient used is g * mult where mult = 1 / scaler[0] when scaler is not null,
//   times min(1, max_norm / (norm[0] / scaler[0] + 1e-6)) when norm is not null
//   (clipping by the global norm of the unscaled gradients, as torch's
//   clip_grad_norm_). When scaler[3] != 0 (an overflow was found) the step is a no-op:
//   the outputs get the inputs (and copy the parameter). AdamW's step for the bias
//   corrections is t - scaler[2] (skipped steps do not count).
//   AdamW (Loshchilov & Hutter, decoupled weight decay, as torch.optim.AdamW):
//     p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//     p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), bc_k = 1 - b_k^t.
//   SGD (torch.optim.SGD, dampening 0): g += wd p; m = mu m + g;
//     d = nesterov ? g + mu m : m (d = g when mu == 0); p -= lr d.
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

template <class R, typename P, typename G>
__device__ __forceinline__ void step(const P* p_in, P* p_out, const G* g, const P* m_in, P* m_out,
                                     const P* v_in, P* v_out, void* copy, size_t n, const Hyper& h,
                                     const float* norm, const float* scaler) {
    bool skip;
    float skipped;
    const float mult = grad_mult(h, norm, scaler, skip, skipped);
    const R rule(h, skipped);
    const bool has_m = m_in != nullptr, has_v = R::TWO;
    for (size_t i = global_thread(); i < n; i += global_threads()) {
        float p = Ty<P>::load(p_in + i);
        float m = has_m ? Ty<P>::load(m_in + i) : 0.0f;
        float v = has_v ? Ty<P>::load(v_in + i) : 0.0f;
        if (!skip) rule.apply(p, Ty<G>::load(g + i) * mult, m, v);
        Ty<P>::store(p_out + i, p);
        if (has_m) Ty<P>::store(m_out + i, m);
        if (has_v) Ty<P>::store(v_out + i, v);
        // The copy rounds the stored parameter (as a cast of p_out would).
        if (h.copy_kind != 0) store_copy(copy, h.copy_kind, i, rounded<P>(p));
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
        void* copy, size_t n, Hyper h, const float* norm, const float* scaler) {               \
        step<R, P, G>(p_in, p_out, g, m_in, m_out, v_in, v_out, copy, n, h, norm, scaler);      \
    }

#define RTX_STEP_G(rule, R, pn, P)                                                             \
    RTX_STEP(rule, R, pn, P, f32, float)                                                       \
    RTX_STEP(rule, R, pn, P, f16, __half)                                                      \
    RTX_STEP(rule, R, pn, P, bf16, __nv_bfloat16)

#define RTX_STEP_ALL(rule, R)                                                                  \
    RTX_STEP_G(rule, R, f32, float) RTX_STEP_G(rule, R, f16, __half) RTX_STEP_G(rule, R, bf16, __nv_bfloat16)

RTX_STEP_ALL(adamw, AdamWRule)
RTX_STEP_ALL(sgd, SgdRule)

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
