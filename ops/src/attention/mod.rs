//! Scaled dot-product attention (causal, masks, grouped KV heads): forward and backward.
//!
//! - `mod.rs` (here): [`AttnParams`], [`MaskKind`], and the public ops [`attention`]
//!   and [`attention_backward`] — validation at submit (one `Geometry` for both
//!   directions), one `match` on the backend in `run`;
//! - `geometry.rs`: validation at submit shared by both directions (shapes, dtypes,
//!   mask layout, what CUDA supports);
//! - `cpu.rs` (+ `cpu/`): the f32-accumulating CPU reference, forward and backward;
//! - `cuda/`: the launches of `kernels/cuda/attention.cu` (FlashAttention-2 for
//!   f16/bf16, D 64 and 128) and, for the forward on compute capability 9.0, of
//!   `kernels/cuda/attention_wgmma.cu` (Hopper `wgmma`, sm_90a; the `mma.sync` forward
//!   is the fallback elsewhere, or if it cannot be loaded; `RTX_ATTN_WGMMA=0` forces the
//!   fallback): the forward and backward launches and the backward's workspace
//!   (`mod.rs`); the `FlashParams` mirror, the kernel table (blocks, shared memory,
//!   grids), which kernel runs on this device, per-stream function setup (`launch.rs`).
pub mod cpu;
mod cuda;
mod geometry;

/// How many times this process launched the TMA backward main kernel
/// (`flash_bwd_tma_d*`, the setting `attn_bwd_tma`): for tests that must know it ran
/// rather than a fallback. Not a stable API.
#[doc(hidden)]
pub fn tma_backward_launches() -> u64 {
    cuda::TMA_BWD_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many times this process launched the TMA forward (`flash_fwd_tma_d*`, for calls
/// with a mask) and its build without the mask's loads (`flash_fwd_tma_nm_d*`, for calls
/// without one): for tests that must know which ran. Not a stable API.
#[doc(hidden)]
pub fn tma_forward_launches() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (
        cuda::TMA_FWD_LAUNCHES[0].load(Relaxed),
        cuda::TMA_FWD_LAUNCHES[1].load(Relaxed),
    )
}

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Device, Element, Error, ExecCx, Op, Plan, PlanCx, Result,
    Tensor, TensorSpec,
};

use self::geometry::*;
use crate::cpu_util::Float;
use crate::kernels::{cpu_out, float_dispatch};

/// Which additive mask accompanies the call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MaskKind {
    /// No mask.
    #[default]
    None,
    /// `[lq, lk]`, shared by all batches and heads.
    Broadcast,
    /// `[b, h, lq, lk]`.
    Full,
}

/// The geometry of an attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Batch size.
    pub b: usize,
    /// Query heads.
    pub h: usize,
    /// Key/value heads (divides `h`).
    pub h_kv: usize,
    /// Query length.
    pub lq: usize,
    /// Key/value length.
    pub lk: usize,
    /// Head dimension.
    pub d: usize,
    /// Score scale, usually `1 / sqrt(d)`.
    pub scale: f32,
    /// Top-left causal masking (`j <= i`).
    pub causal: bool,
    /// The kind of additive mask passed with the call.
    pub mask: MaskKind,
}

impl AttnParams {
    /// Elements of q, o, dq and do.
    pub fn q_len(&self) -> usize {
        self.b * self.h * self.lq * self.d
    }

    /// Elements of k, v, dk and dv.
    pub fn kv_len(&self) -> usize {
        self.b * self.h_kv * self.lk * self.d
    }

    /// Elements of lse.
    pub fn lse_len(&self) -> usize {
        self.b * self.h * self.lq
    }

    /// Elements of the mask (0 for [`MaskKind::None`]).
    pub fn mask_len(&self) -> usize {
        match self.mask {
            MaskKind::None => 0,
            MaskKind::Broadcast => self.lq * self.lk,
            MaskKind::Full => self.b * self.h * self.lq * self.lk,
        }
    }
}

const FWD: &str = "attention";
const BWD: &str = "attention_backward";

// ---- forward ---------------------------------------------------------------------------

/// Scaled dot-product attention, forward; build it with [`attention`].
///
/// `o = softmax(scale · q·kᵀ + mask) · v` per (batch, head), and the row log-sum-exp
/// `lse = ln Σ_j exp(scale · q·k_j + mask_j)` (natural log, f32) that
/// [`attention_backward`] takes. Shapes: q `[B, H, Lq, D]`, k and v `[B, Hkv, Lk, D]`
/// with `Hkv` dividing `H` (grouped-query attention: query head `h` reads kv head
/// `h / (H / Hkv)`); outputs o `[B, H, Lq, D]` in q's dtype and lse `[B, H, Lq]` f32.
///
/// Options: [`Attention::scale`] (default `1 / sqrt(D)`), [`Attention::causal`]
/// (top-left, as PyTorch's `is_causal`: query `i` sees key `j` iff `j <= i`, so with
/// `Lq > Lk` the last rows see every key), [`Attention::mask`] (additive, q's dtype,
/// `[Lq, Lk]` shared by every batch and head, or `[B, H, Lq, Lk]` where B or H may be
/// 1 to broadcast; `-inf` excludes a key). A row that sees no key gives `o = 0` and
/// `lse = -inf`.
///
/// Backends: the CPU computes in f32 for f32, f16 and bf16 and any D; CUDA runs the
/// FlashAttention-2 kernels of `kernels/cuda/attention.cu` for f16 and bf16 with D 64
/// or 128.
///
/// # Errors (at submit; the op comes back in the `SubmitError`)
///
/// [`Error::InvalidDim`] for an operand not of rank 4 (and, on CUDA, for D not 64 or
/// 128, or B, H above 65535); [`Error::ShapeMismatch`] when k and v differ, B or D do
/// not agree, Hkv does not divide H, or the mask's shape does not fit;
/// [`Error::DTypeMismatch`] when k, v or the mask have another dtype than q, for a
/// non-float q, and for f32 on CUDA; [`Error::InvalidOp`] for an empty operand or a
/// scale that is not finite and positive.
///
/// # Examples
///
/// ```
/// use rtx::ops::attention::attention;
/// use rtx::Runtime;
///
/// let rt = Runtime::cpu(1);
/// // One head, two queries, two keys, D = 2.
/// let q = rt.upload(&[1.0f32, 0.0, 0.0, 1.0], [1, 1, 2, 2])?;
/// let k = rt.upload(&[1.0f32, 0.0, 0.0, 1.0], [1, 1, 2, 2])?;
/// let v = rt.upload(&[1.0f32, 2.0, 3.0, 4.0], [1, 1, 2, 2])?;
/// let (o, lse) = rt.submit(attention(&q, &k, &v).causal(true))?.wait()?;
/// // Causal: the first query sees only the first key.
/// let o = rt.to_vec::<f32>(&o)?.wait()?;
/// assert_eq!(&o[..2], &[1.0, 2.0]);
/// let lse = rt.to_vec::<f32>(&lse)?.wait()?;
/// assert!((lse[0] - 0.5f32.sqrt()).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Attention {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Option<Tensor>,
    flags: Flags,
}

/// `softmax(scale · q·kᵀ + mask) · v` and its log-sum-exp; see [`Attention`].
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Attention {
    Attention {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        mask: None,
        flags: Flags::default(),
    }
}

impl Attention {
    /// The score scale (default `1 / sqrt(D)`); must be finite and positive.
    pub fn scale(mut self, scale: f32) -> Self {
        self.flags.scale = Some(scale);
        self
    }
    /// Top-left causal masking: query `i` sees key `j` only when `j <= i`.
    pub fn causal(mut self, causal: bool) -> Self {
        self.flags.causal = causal;
        self
    }
    /// An additive mask (q's dtype), `[Lq, Lk]` or `[B|1, H|1, Lq, Lk]`.
    pub fn mask(mut self, mask: &Tensor) -> Self {
        self.mask = Some(mask.clone());
        self
    }
    /// The operands (q, k, v, mask), e.g. to take them back from a rejected submission.
    pub fn into_inputs(self) -> (Tensor, Tensor, Tensor, Option<Tensor>) {
        (self.q, self.k, self.v, self.mask)
    }

    fn geometry(&self, device: Device) -> Result<Geometry> {
        let qkv = (&self.q, &self.k, &self.v);
        geometry(FWD, device, qkv, self.mask.as_ref(), self.flags)
    }
}

impl Op for Attention {
    type Output = (Tensor, Tensor);
    fn name(&self) -> &'static str {
        FWD
    }
    fn inputs(&self) -> Vec<&Tensor> {
        let mut v = vec![&self.q, &self.k, &self.v];
        v.extend(self.mask.as_ref());
        v
    }
    fn plan(&self, cx: &PlanCx) -> Result<Plan> {
        let g = self.geometry(cx.device)?;
        let p = &g.p;
        let dtype = self.q.dtype();
        let read: usize = self.inputs().iter().map(|t| t.numel()).sum();
        Ok(Plan {
            outputs: vec![
                TensorSpec::new(self.q.shape().clone(), dtype),
                TensorSpec::new([p.b, p.h, p.lq], DType::F32),
            ],
            cost: Cost {
                flops: 2.0 * g.matmul_flops(),
                bytes: ((read + p.q_len()) * dtype.size() + 4 * p.lse_len()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let g = self.geometry(cx.device())?;
        let dtype = self.q.dtype();
        let (q, k, v) = (cx.input(&self.q)?, cx.input(&self.k)?, cx.input(&self.v)?);
        let mask = self.mask.as_ref().map(|m| cx.input(m)).transpose()?;
        let mask = mask.as_deref();
        let (o, lse) = match cx.backend() {
            BackendCx::Cpu => {
                float_dispatch!(dtype, FWD, |T| forward_cpu::<T>(&g, &q, &k, &v, mask))
            }
            BackendCx::Cuda(scx) => cuda::forward(scx, &g, dtype, [&q, &k, &v], mask),
        }?;
        cx.set_output(0, o)?;
        cx.set_output(1, lse)
    }
}

fn forward_cpu<T: Float + Element>(
    g: &Geometry,
    q: &Buffer,
    k: &Buffer,
    v: &Buffer,
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer)> {
    let p = &g.p;
    let mask = cpu_mask::<T>(g, mask)?;
    let mut o = cpu_out::<T>(p.q_len());
    let mut lse = cpu_out::<f32>(p.lse_len());
    cpu::attention_forward(
        p,
        q.cpu::<T>()?,
        k.cpu::<T>()?,
        v.cpu::<T>()?,
        mask.as_deref(),
        &mut o,
        &mut lse,
    );
    Ok((Buffer::from_vec(o), Buffer::from_vec(lse)))
}

// ---- backward --------------------------------------------------------------------------

/// The gradients of [`Attention`] with respect to q, k and v; build it with
/// [`attention_backward`].
///
/// Takes the forward's inputs, its outputs `o` `[B, H, Lq, D]` (q's dtype) and `lse`
/// `[B, H, Lq]` (f32), and the output gradient `do_` `[B, H, Lq, D]` (q's dtype), with
/// the same options as the forward (scale, causal, mask: pass the same ones). Returns
/// `(dq, dk, dv)` in q's dtype, dq `[B, H, Lq, D]`, dk and dv `[B, Hkv, Lk, D]` (summed
/// over the query heads of each kv group). The mask gets no gradient.
///
/// FlashAttention-2's scheme from the saved lse: `P = exp(S - lse)`,
/// `D_i = rowsum(dO ∘ O)`, `dS = P ∘ (dO·vᵀ - D)`, `dq = scale · dS·k`,
/// `dk = scale · dSᵀ·q`, `dv = Pᵀ·dO`. On CUDA three kernels run in stream order
/// (preprocess, dq/dk/dv, convert dq) with an f32 workspace of `B·H·Lq·(D + 1)`
/// elements, kept per stream and reused (grown when too small, up to 256 MiB kept);
/// dq accumulates with f32 atomics, so its rounding may differ from run to run.
///
/// # Errors (at submit)
///
/// Those of [`Attention`], plus [`Error::ShapeMismatch`] when o or do_ are not q's
/// shape or lse is not `[B, H, Lq]`, and [`Error::DTypeMismatch`] when o or do_ are not
/// q's dtype or lse is not f32.
///
/// # Examples
///
/// ```
/// use rtx::ops::attention::{attention, attention_backward};
/// use rtx::Runtime;
///
/// let rt = Runtime::cpu(1);
/// let q = rt.upload(&[0.5f32, -1.0, 2.0, 0.0], [1, 1, 2, 2])?;
/// let k = rt.upload(&[1.0f32, 0.0, 0.0, 1.0], [1, 1, 2, 2])?;
/// let v = rt.upload(&[1.0f32, 2.0, 3.0, 4.0], [1, 1, 2, 2])?;
/// let (o, lse) = rt.submit(attention(&q, &k, &v))?.wait()?;
/// let do_ = rt.upload(&[1.0f32; 4], [1, 1, 2, 2])?;
/// let (dq, dk, dv) = rt.submit(attention_backward(&q, &k, &v, &o, &lse, &do_))?.wait()?;
/// // Every query's probabilities sum to 1, so dv's rows sum to the two queries' dO.
/// let dv = rt.to_vec::<f32>(&dv)?.wait()?;
/// assert!((dv[0] + dv[2] - 2.0).abs() < 1e-6);
/// # let _ = (dq, dk);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AttentionBackward {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    do_: Tensor,
    mask: Option<Tensor>,
    flags: Flags,
}

/// The operands of an [`AttentionBackward`], given back by
/// [`AttentionBackward::into_inputs`].
#[allow(missing_docs)] // named as the op's arguments
pub struct AttentionBackwardInputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    pub lse: Tensor,
    pub do_: Tensor,
    pub mask: Option<Tensor>,
}

/// `(dq, dk, dv)` of [`attention`] from its inputs, its outputs `o` and `lse`, and the
/// output gradient `do_`; see [`AttentionBackward`].
pub fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    do_: &Tensor,
) -> AttentionBackward {
    AttentionBackward {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        o: o.clone(),
        lse: lse.clone(),
        do_: do_.clone(),
        mask: None,
        flags: Flags::default(),
    }
}

impl AttentionBackward {
    /// The score scale the forward used (default `1 / sqrt(D)`).
    pub fn scale(mut self, scale: f32) -> Self {
        self.flags.scale = Some(scale);
        self
    }
    /// Whether the forward was causal.
    pub fn causal(mut self, causal: bool) -> Self {
        self.flags.causal = causal;
        self
    }
    /// The forward's additive mask.
    pub fn mask(mut self, mask: &Tensor) -> Self {
        self.mask = Some(mask.clone());
        self
    }
    /// The operands, e.g. to take them back from a rejected submission.
    pub fn into_inputs(self) -> AttentionBackwardInputs {
        AttentionBackwardInputs {
            q: self.q,
            k: self.k,
            v: self.v,
            o: self.o,
            lse: self.lse,
            do_: self.do_,
            mask: self.mask,
        }
    }

    fn geometry(&self, device: Device) -> Result<Geometry> {
        let qkv = (&self.q, &self.k, &self.v);
        let g = geometry(BWD, device, qkv, self.mask.as_ref(), self.flags)?;
        let dtype = self.q.dtype();
        for t in [&self.o, &self.do_] {
            check_dtype(BWD, dtype, t)?;
            if t.dims() != self.q.dims() {
                return Err(Error::shape(
                    BWD,
                    self.q.shape(),
                    t.shape(),
                    "o and do_ must have q's shape [B, H, Lq, D]",
                ));
            }
        }
        check_dtype(BWD, DType::F32, &self.lse)?;
        let lse_dims = [g.p.b, g.p.h, g.p.lq];
        if self.lse.dims() != lse_dims {
            return Err(Error::shape(
                BWD,
                &dims_shape(&lse_dims),
                self.lse.shape(),
                "lse must be [B, H, Lq] (the forward's second output)",
            ));
        }
        Ok(g)
    }
}

impl Op for AttentionBackward {
    type Output = (Tensor, Tensor, Tensor);
    fn name(&self) -> &'static str {
        BWD
    }
    fn inputs(&self) -> Vec<&Tensor> {
        let mut v = vec![&self.q, &self.k, &self.v, &self.o, &self.lse, &self.do_];
        v.extend(self.mask.as_ref());
        v
    }
    fn plan(&self, cx: &PlanCx) -> Result<Plan> {
        let g = self.geometry(cx.device)?;
        let dtype = self.q.dtype();
        let read: usize = self.inputs().iter().map(|t| t.numel()).sum();
        let written = self.q.numel() + 2 * self.k.numel();
        Ok(Plan {
            outputs: vec![
                TensorSpec::new(self.q.shape().clone(), dtype),
                TensorSpec::new(self.k.shape().clone(), dtype),
                TensorSpec::new(self.v.shape().clone(), dtype),
            ],
            cost: Cost {
                // Recomputed scores, dP, dq, dk, dv: five products.
                flops: 5.0 * g.matmul_flops(),
                bytes: ((read + written) * dtype.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let g = self.geometry(cx.device())?;
        let dtype = self.q.dtype();
        let ins = BackwardBuffers {
            q: cx.input(&self.q)?,
            k: cx.input(&self.k)?,
            v: cx.input(&self.v)?,
            o: cx.input(&self.o)?,
            lse: cx.input(&self.lse)?,
            do_: cx.input(&self.do_)?,
        };
        let mask = self.mask.as_ref().map(|m| cx.input(m)).transpose()?;
        let mask = mask.as_deref();
        let (dq, dk, dv) = match cx.backend() {
            BackendCx::Cpu => {
                float_dispatch!(dtype, BWD, |T| backward_cpu::<T>(&g, &ins, mask))
            }
            BackendCx::Cuda(scx) => cuda::backward(
                scx,
                &g,
                dtype,
                [&ins.q, &ins.k, &ins.v, &ins.o, &ins.do_],
                &ins.lse,
                mask,
            ),
        }?;
        cx.set_output(0, dq)?;
        cx.set_output(1, dk)?;
        cx.set_output(2, dv)
    }
}

/// The backward's input memory.
struct BackwardBuffers {
    q: rtx_runtime::BufferRef,
    k: rtx_runtime::BufferRef,
    v: rtx_runtime::BufferRef,
    o: rtx_runtime::BufferRef,
    lse: rtx_runtime::BufferRef,
    do_: rtx_runtime::BufferRef,
}

fn backward_cpu<T: Float + Element>(
    g: &Geometry,
    b: &BackwardBuffers,
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer, Buffer)> {
    let p = &g.p;
    let mask = cpu_mask::<T>(g, mask)?;
    let mut dq = cpu_out::<T>(p.q_len());
    let mut dk = cpu_out::<T>(p.kv_len());
    let mut dv = cpu_out::<T>(p.kv_len());
    cpu::attention_backward(
        p,
        b.q.cpu::<T>()?,
        b.k.cpu::<T>()?,
        b.v.cpu::<T>()?,
        mask.as_deref(),
        b.o.cpu::<T>()?,
        b.do_.cpu::<T>()?,
        b.lse.cpu::<f32>()?,
        &mut dq,
        &mut dk,
        &mut dv,
    );
    Ok((
        Buffer::from_vec(dq),
        Buffer::from_vec(dk),
        Buffer::from_vec(dv),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::cpu::{AttnParams, MaskKind};

    #[test]
    fn causal_pairs() {
        let g = |lq, lk, causal| Geometry {
            p: AttnParams {
                b: 1,
                h: 1,
                h_kv: 1,
                lq,
                lk,
                d: 1,
                scale: 1.0,
                causal,
                mask: MaskKind::None,
            },
            mask: None,
        };
        let brute = |lq: usize, lk: usize| (0..lq).map(|i| (i + 1).min(lk)).sum::<usize>() as f64;
        for (lq, lk) in [(1, 1), (5, 9), (9, 5), (17, 17), (1, 1000)] {
            assert_eq!(g(lq, lk, true).pairs(), brute(lq, lk), "{lq}x{lk}");
            assert_eq!(g(lq, lk, false).pairs(), (lq * lk) as f64);
        }
    }
}
