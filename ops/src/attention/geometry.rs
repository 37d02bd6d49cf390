//! Validation of attention calls, shared by both directions: shapes, dtypes, the mask's
//! layout, and what the CUDA kernels support. Everything here runs at submit time.

use std::borrow::Cow;

use rtx_runtime::{Buffer, DType, Device, Element, Error, Result, Shape, Tensor};

use super::{AttnParams, MaskKind};
use crate::cpu_util::Float;

/// Head dims the CUDA kernels are built for.
pub(super) const CUDA_HEAD_DIMS: [usize; 2] = [64, 128];

/// Largest batch / head count on CUDA (they are grid dims y and z).
pub(super) const CUDA_MAX_GRID_YZ: usize = 65_535;

/// The options both directions share.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Flags {
    /// `None`: `1 / sqrt(D)`.
    pub(super) scale: Option<f32>,
    pub(super) causal: bool,
}

impl Flags {
    pub(super) fn scale(&self, d: usize) -> f32 {
        self.scale.unwrap_or(1.0 / (d as f32).sqrt())
    }
}

/// Where the mask's `[Lq, Lk]` planes lie: element strides between batches and between
/// heads, 0 where the mask is broadcast (rows are `Lk` apart, keys contiguous).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MaskLayout {
    pub(super) stride_b: usize,
    pub(super) stride_h: usize,
}

/// A validated call: the sizes and flags (as the CPU reference takes them) and the
/// mask's layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Geometry {
    pub(super) p: AttnParams,
    pub(super) mask: Option<MaskLayout>,
}

impl Geometry {
    /// Query/key pairs not excluded by causality, per (batch, head).
    pub(super) fn pairs(&self) -> f64 {
        let (lq, lk) = (self.p.lq as f64, self.p.lk as f64);
        if !self.p.causal {
            lq * lk
        } else if lq <= lk {
            lq * (lq + 1.0) / 2.0
        } else {
            lk * (lk + 1.0) / 2.0 + (lq - lk) * lk
        }
    }

    /// Multiply-adds of one `[Lq, Lk] x D` product over all heads, times 2 (flops).
    pub(super) fn matmul_flops(&self) -> f64 {
        2.0 * (self.p.b * self.p.h * self.p.d) as f64 * self.pairs()
    }
}

pub(super) fn dims_shape(d: &[usize]) -> Shape {
    Shape::new(d.to_vec())
}

pub(super) fn check_rank(op: &str, what: &str, t: &Tensor, layout: &str) -> Result<()> {
    if t.rank() == 4 {
        Ok(())
    } else {
        Err(Error::invalid_dim(
            op,
            format!("{what} must be rank 4 {layout}, got {}", t.shape()),
        ))
    }
}

pub(super) fn check_dtype(op: &str, expected: DType, t: &Tensor) -> Result<()> {
    if t.dtype() == expected {
        Ok(())
    } else {
        Err(Error::dtype(op, expected, t.dtype()))
    }
}

/// Validates q, k, v, the mask and the flags (everything both directions share).
pub(super) fn geometry(
    op: &str,
    device: Device,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    mask: Option<&Tensor>,
    flags: Flags,
) -> Result<Geometry> {
    let dtype = q.dtype();
    if !dtype.is_float() {
        return Err(Error::dtype(op, DType::F16, dtype));
    }
    let cuda = matches!(device, Device::Cuda(_));
    if cuda && dtype == DType::F32 {
        // The CUDA kernels are f16/bf16 tensor-core kernels; f32 runs on the CPU only.
        return Err(Error::dtype(op, DType::F16, dtype));
    }
    for t in [k, v].into_iter().chain(mask) {
        check_dtype(op, dtype, t)?;
    }
    check_rank(op, "q", q, "[B, H, Lq, D]")?;
    check_rank(op, "k", k, "[B, Hkv, Lk, D]")?;
    check_rank(op, "v", v, "[B, Hkv, Lk, D]")?;
    if k.dims() != v.dims() {
        return Err(Error::shape(
            op,
            k.shape(),
            v.shape(),
            "k and v must have the same shape [B, Hkv, Lk, D]",
        ));
    }
    let (&[b, h, lq, d], &[kb, h_kv, lk, kd]) = (q.dims(), k.dims()) else {
        unreachable!("ranks checked above");
    };
    if kb != b || kd != d {
        return Err(Error::shape(
            op,
            q.shape(),
            k.shape(),
            "q [B, H, Lq, D] and k/v [B, Hkv, Lk, D] must agree on B and D",
        ));
    }
    if h_kv == 0 || h % h_kv != 0 {
        return Err(Error::shape(
            op,
            q.shape(),
            k.shape(),
            format!("the kv heads ({h_kv}) must divide the query heads ({h})"),
        ));
    }
    if [b, h, lq, lk, d].contains(&0) {
        return Err(Error::invalid(
            op,
            format!("empty attention: q {}, k {}", q.shape(), k.shape()),
        ));
    }
    let scale = flags.scale(d);
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::invalid(
            op,
            format!("the scale must be finite and > 0, got {scale}"),
        ));
    }
    if cuda {
        check_cuda_sizes(op, q, k)?;
    }
    let mask_layout = mask
        .map(|m| mask_layout(op, m, [b, h, lq, lk]))
        .transpose()?;
    let kind = match mask_layout {
        None => MaskKind::None,
        Some(MaskLayout {
            stride_b: 0,
            stride_h: 0,
        }) => MaskKind::Broadcast,
        Some(_) => MaskKind::Full,
    };
    Ok(Geometry {
        p: AttnParams {
            b,
            h,
            h_kv,
            lq,
            lk,
            d,
            scale,
            causal: flags.causal,
            mask: kind,
        },
        mask: mask_layout,
    })
}

/// What the CUDA kernels support beyond the op's contract: D of 64 or 128, sizes that
/// fit their `int` fields and grid dims.
pub(super) fn check_cuda_sizes(op: &str, q: &Tensor, k: &Tensor) -> Result<()> {
    let (&[b, h, lq, d], &[_, h_kv, lk, _]) = (q.dims(), k.dims()) else {
        unreachable!("ranks checked before");
    };
    if !CUDA_HEAD_DIMS.contains(&d) {
        return Err(Error::invalid_dim(
            op,
            format!(
                "head dim D = {d} is not supported on CUDA (q {}): the kernels are built \
                 for D in {CUDA_HEAD_DIMS:?}; the CPU backend takes any D",
                q.shape()
            ),
        ));
    }
    if b.max(h).max(h_kv) > CUDA_MAX_GRID_YZ {
        return Err(Error::invalid_dim(
            op,
            format!("B = {b}, H = {h}, Hkv = {h_kv}: at most {CUDA_MAX_GRID_YZ} each on CUDA"),
        ));
    }
    if lq.max(lk) > i32::MAX as usize {
        return Err(Error::invalid_dim(
            op,
            format!("Lq = {lq}, Lk = {lk}: at most {} on CUDA", i32::MAX),
        ));
    }
    Ok(())
}

/// The layout of an additive mask `[Lq, Lk]` or `[B|1, H|1, Lq, Lk]`.
pub(super) fn mask_layout(op: &str, m: &Tensor, [b, h, lq, lk]: [usize; 4]) -> Result<MaskLayout> {
    let plane = lq * lk;
    let bad = || {
        Error::shape(
            op,
            m.shape(),
            &dims_shape(&[b, h, lq, lk]),
            "the mask must be [Lq, Lk] or [B, H, Lq, Lk] (B and H may be 1: broadcast)",
        )
    };
    match *m.dims() {
        [mq, mk] if (mq, mk) == (lq, lk) => Ok(MaskLayout {
            stride_b: 0,
            stride_h: 0,
        }),
        [mb, mh, mq, mk]
            if (mq, mk) == (lq, lk) && (mb == b || mb == 1) && (mh == h || mh == 1) =>
        {
            let stride_h = if mh == 1 { 0 } else { plane };
            let stride_b = if mb == 1 { 0 } else { mh * plane };
            Ok(MaskLayout { stride_b, stride_h })
        }
        _ => Err(bad()),
    }
}

/// The mask as the CPU reference takes it: the tensor's own memory for `[Lq, Lk]` and
/// full masks, a `[B, H, Lq, Lk]` copy for one broadcast over only batches or heads.
pub(super) fn cpu_mask<'a, T: Float + Element>(
    g: &Geometry,
    mask: Option<&'a Buffer>,
) -> Result<Option<Cow<'a, [T]>>> {
    let (Some(m), Some(layout)) = (mask, g.mask) else {
        return Ok(None);
    };
    let m = m.cpu::<T>()?;
    let p = &g.p;
    let plane = p.lq * p.lk;
    if g.p.mask == MaskKind::Broadcast || m.len() == p.b * p.h * plane {
        return Ok(Some(Cow::Borrowed(m)));
    }
    let mut full = Vec::with_capacity(p.b * p.h * plane);
    for bi in 0..p.b {
        for hi in 0..p.h {
            let at = bi * layout.stride_b + hi * layout.stride_h;
            full.extend_from_slice(&m[at..at + plane]);
        }
    }
    Ok(Some(Cow::Owned(full)))
}
