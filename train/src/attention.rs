//! Causal multi-head self-attention: q/k/v/out projections around the flash attention
//! op.

use rtx_ops::attention::{attention, attention_backward};
use rtx_ops::layout::permute;
use rtx_runtime::{BackendKind, DType, Error, Result, Runtime, Tensor};

use crate::init;
use crate::linear::{Linear, LinearConfig, LinearCtx};
use crate::param::{Module, Parameters};

/// The sizes of a [`CausalSelfAttention`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionConfig {
    /// Model width (`D`, the last dim of `x`).
    pub d_model: usize,
    /// Heads (`H`, dividing `D`; the head width is `D / H`).
    pub heads: usize,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
    /// The dtype the attention op computes in; `None` (the default) is the
    /// parameters' dtype, except f32 on CUDA, where the flash attention kernels take f16
    /// or bf16 only: then q, k, v are cast to f16 (and the op's results back to f32).
    pub attn_dtype: Option<DType>,
}

impl AttentionConfig {
    /// `d_model` wide with `heads` heads, f32.
    pub fn new(d_model: usize, heads: usize) -> Self {
        AttentionConfig {
            d_model,
            heads,
            dtype: DType::F32,
            attn_dtype: None,
        }
    }
}

/// What [`CausalSelfAttention::backward`] needs from the forward.
#[derive(Clone, Debug)]
pub struct AttentionCtx {
    /// The q, k, v projections' contexts.
    pub proj: [LinearCtx; 3],
    /// The output projection's context.
    pub out: LinearCtx,
    /// q, k, v as the attention op took them: `[B, H, L, D/H]` in the attention dtype.
    pub qkv: [Tensor; 3],
    /// The attention op's output (`[B, H, L, D/H]`) and row log-sum-exp.
    pub o: Tensor,
    /// The row log-sum-exp, `[B, H, L]` f32.
    pub lse: Tensor,
}

/// `y = W_o · attn(W_q x, W_k x, W_v x)` over `x` `[B, L, D]`, causal (position `i`
/// attends to `j <= i`), scale `1/sqrt(D/H)`, as PyTorch's
/// `F.scaled_dot_product_attention(.., is_causal=True)` between four `nn.Linear(D, D)`.
/// Heads are split by a reshape `[B, L, H, D/H]` and `permute` to `[B, H, L, D/H]` (and
/// merged back the same way).
#[derive(Debug)]
pub struct CausalSelfAttention {
    /// q, k, v, out.
    proj: [Linear; 4],
    heads: usize,
    attn_dtype: Option<DType>,
}

impl CausalSelfAttention {
    /// Projections initialized as `nn.Linear` (from `seed`).
    pub fn new(rt: &Runtime, cfg: AttentionConfig, seed: u64) -> Result<Self> {
        let d = cfg.d_model;
        if cfg.heads == 0 || d == 0 || !d.is_multiple_of(cfg.heads) {
            let msg = format!(
                "{} heads over width {d}: heads must divide the width",
                cfg.heads
            );
            return Err(Error::invalid_dim("CausalSelfAttention::new", msg));
        }
        let lin = |i| {
            let lc = LinearConfig::new(d, d).dtype(cfg.dtype);
            Linear::new(rt, lc, init::derive_seed(seed, i))
        };
        Ok(CausalSelfAttention {
            proj: [lin(0)?, lin(1)?, lin(2)?, lin(3)?],
            heads: cfg.heads,
            attn_dtype: cfg.attn_dtype,
        })
    }

    /// The q, k, v and out projections.
    pub fn projections(&self) -> &[Linear; 4] {
        &self.proj
    }
    /// Heads.
    pub fn heads(&self) -> usize {
        self.heads
    }
    /// The dtype the attention op computes in on `rt` (see
    /// [`AttentionConfig::attn_dtype`]).
    pub fn attn_dtype(&self, rt: &Runtime) -> DType {
        let own = self.proj[0].weight().value().dtype();
        self.attn_dtype.unwrap_or(match (rt.backend(), own) {
            (BackendKind::Cuda, DType::F32) => DType::F16,
            _ => own,
        })
    }

    /// `[B, L, D]` → `[B, H, L, D/H]` in `dtype`.
    fn split(&self, rt: &Runtime, t: &Tensor, dtype: DType) -> Result<Tensor> {
        let &[b, l, d] = t.dims() else {
            let msg = format!("x must be [B, L, D], got {}", t.shape());
            return Err(Error::invalid_dim("CausalSelfAttention", msg));
        };
        let t = t.reshape([b, l, self.heads, d / self.heads])?;
        let t = rt.run(permute(&t, &[0, 2, 1, 3]))?;
        cast(rt, t, dtype)
    }

    /// `[B, H, L, D/H]` → `[B, L, D]` in `dtype`.
    fn merge(&self, rt: &Runtime, t: &Tensor, dtype: DType) -> Result<Tensor> {
        let &[b, h, l, dh] = t.dims() else {
            return Err(Error::invalid_dim(
                "CausalSelfAttention",
                "heads must be rank 4",
            ));
        };
        let t = cast(rt, t.clone(), dtype)?;
        let t = rt.run(permute(&t, &[0, 2, 1, 3]))?;
        t.reshape([b, l, h * dh])
    }

    /// The output `[B, L, D]` and what the backward needs; submissions only.
    pub fn forward(&self, rt: &Runtime, x: &Tensor) -> Result<(Tensor, AttentionCtx)> {
        let dtype = x.dtype();
        let ad = self.attn_dtype(rt);
        let mut proj = Vec::with_capacity(3);
        let mut qkv = Vec::with_capacity(3);
        for l in &self.proj[..3] {
            let (t, c) = l.forward(rt, x)?;
            qkv.push(self.split(rt, &t, ad)?);
            proj.push(c);
        }
        let (o, lse) = rt.run(attention(&qkv[0], &qkv[1], &qkv[2]).causal(true))?;
        let merged = self.merge(rt, &o, dtype)?;
        let (y, out) = self.proj[3].forward(rt, &merged)?;
        let [q, k, v] = <[Tensor; 3]>::try_from(qkv).expect("three");
        let proj = <[LinearCtx; 3]>::try_from(proj).expect("three");
        let ctx = AttentionCtx {
            proj,
            out,
            qkv: [q, k, v],
            o,
            lse,
        };
        Ok((y, ctx))
    }

    /// Given `dy`, stores the projections' gradients and returns `dx`; submissions
    /// only.
    pub fn backward(&mut self, rt: &Runtime, dy: &Tensor, ctx: &AttentionCtx) -> Result<Tensor> {
        let dtype = dy.dtype();
        let ad = ctx.o.dtype();
        let dmerged = self.proj[3].backward(rt, dy, &ctx.out)?;
        let do_ = self.split(rt, &dmerged, ad)?;
        let [q, k, v] = &ctx.qkv;
        let op = attention_backward(q, k, v, &ctx.o, &ctx.lse, &do_).causal(true);
        let (dq, dk, dv) = rt.run(op)?;
        let mut dx: Option<Tensor> = None;
        for (i, g) in [dq, dk, dv].iter().enumerate() {
            let g = self.merge(rt, g, dtype)?;
            let d = self.proj[i].backward(rt, &g, &ctx.proj[i])?;
            dx = Some(match dx {
                None => d,
                Some(acc) => crate::add(rt, &acc, &d)?,
            });
        }
        Ok(dx.expect("three projections"))
    }
}

fn cast(rt: &Runtime, t: Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t)
    } else {
        rt.run(rtx_ops::cast(&t, dtype))
    }
}

impl Module for CausalSelfAttention {
    /// q (weight, bias), k, v, out.
    fn parameters(&mut self) -> Parameters<'_> {
        self.proj
            .iter_mut()
            .fold(Parameters::default(), |acc, l| acc.chain(l.parameters()))
    }
}
