//! The pre-norm causal transformer block.

use rtx_ops::gemm::Activation;
use rtx_runtime::{DType, Result, Runtime, Tensor};

use crate::attention::{AttentionConfig, AttentionCtx, CausalSelfAttention};
use crate::init;
use crate::layer_norm::{LayerNorm, LayerNormCtx};
use crate::mlp::{Mlp, MlpConfig, MlpCtx};
use crate::param::{Module, Parameters};

/// The sizes of a [`TransformerBlock`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockConfig {
    /// Model width `D`.
    pub d_model: usize,
    /// Heads (dividing `D`).
    pub heads: usize,
    /// The MLP's hidden width (default `4 D`).
    pub hidden: usize,
    /// The layer norms' epsilon (default 1e-5, PyTorch's).
    pub eps: f32,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
    /// The attention op's dtype (see [`AttentionConfig::attn_dtype`]).
    pub attn_dtype: Option<DType>,
}

impl BlockConfig {
    /// Width `d_model`, `heads` heads, hidden `4 d_model`, eps 1e-5, f32.
    pub fn new(d_model: usize, heads: usize) -> Self {
        BlockConfig {
            d_model,
            heads,
            hidden: 4 * d_model,
            eps: 1e-5,
            dtype: DType::F32,
            attn_dtype: None,
        }
    }
    /// The MLP's hidden width.
    pub fn hidden(mut self, hidden: usize) -> Self {
        self.hidden = hidden;
        self
    }
}

/// What [`TransformerBlock::backward`] needs from the forward.
#[derive(Clone, Debug)]
pub struct BlockCtx {
    /// The first layer norm's context.
    pub ln1: LayerNormCtx,
    /// The attention's context.
    pub attn: AttentionCtx,
    /// The second layer norm's context.
    pub ln2: LayerNormCtx,
    /// The MLP's context.
    pub mlp: MlpCtx,
}

/// `h = x + attn(LN₁(x))`, `y = h + MLP(LN₂(h))` over `x` `[B, L, D]` (GPT-2's
/// pre-norm block): causal multi-head self-attention ([`CausalSelfAttention`]), the
/// MLP `D → hidden → D` with GELU (tanh form) between.
#[derive(Debug)]
pub struct TransformerBlock {
    ln1: LayerNorm,
    attn: CausalSelfAttention,
    ln2: LayerNorm,
    mlp: Mlp,
}

impl TransformerBlock {
    /// A block initialized as PyTorch's defaults (layer norms 1 and 0, linears as
    /// `nn.Linear`), from `seed`.
    pub fn new(rt: &Runtime, cfg: BlockConfig, seed: u64) -> Result<Self> {
        let d = cfg.d_model;
        let ac = AttentionConfig {
            d_model: d,
            heads: cfg.heads,
            dtype: cfg.dtype,
            attn_dtype: cfg.attn_dtype,
        };
        let mc = MlpConfig::new(&[d, cfg.hidden, d])
            .act(Activation::Gelu)
            .dtype(cfg.dtype);
        Ok(TransformerBlock {
            ln1: LayerNorm::new(rt, d, cfg.eps, cfg.dtype)?,
            attn: CausalSelfAttention::new(rt, ac, init::derive_seed(seed, 0))?,
            ln2: LayerNorm::new(rt, d, cfg.eps, cfg.dtype)?,
            mlp: Mlp::new(rt, &mc, init::derive_seed(seed, 1))?,
        })
    }

    /// The parts: layer norm 1, attention, layer norm 2, MLP.
    pub fn parts(&self) -> (&LayerNorm, &CausalSelfAttention, &LayerNorm, &Mlp) {
        (&self.ln1, &self.attn, &self.ln2, &self.mlp)
    }

    /// The parts, to replace their parameters (for example to load weights).
    pub fn parts_mut(
        &mut self,
    ) -> (
        &mut LayerNorm,
        &mut CausalSelfAttention,
        &mut LayerNorm,
        &mut Mlp,
    ) {
        (&mut self.ln1, &mut self.attn, &mut self.ln2, &mut self.mlp)
    }

    /// The output `[B, L, D]` and what the backward needs; submissions only.
    pub fn forward(&self, rt: &Runtime, x: &Tensor) -> Result<(Tensor, BlockCtx)> {
        let (n1, ln1) = self.ln1.forward(rt, x)?;
        let (a, attn) = self.attn.forward(rt, &n1)?;
        let h = crate::add(rt, x, &a)?;
        let (n2, ln2) = self.ln2.forward(rt, &h)?;
        let (m, mlp) = self.mlp.forward(rt, &n2)?;
        let y = crate::add(rt, &h, &m)?;
        Ok((
            y,
            BlockCtx {
                ln1,
                attn,
                ln2,
                mlp,
            },
        ))
    }

    /// Given `dy`, stores every parameter's gradient and returns `dx`; submissions only.
    pub fn backward(&mut self, rt: &Runtime, dy: &Tensor, ctx: &BlockCtx) -> Result<Tensor> {
        let dn2 = self.mlp.backward(rt, dy, &ctx.mlp)?;
        let dh = crate::add(rt, dy, &self.ln2.backward(rt, &dn2, &ctx.ln2)?)?;
        let dn1 = self.attn.backward(rt, &dh, &ctx.attn)?;
        crate::add(rt, &dh, &self.ln1.backward(rt, &dn1, &ctx.ln1)?)
    }
}

impl Module for TransformerBlock {
    /// ln1 (weight, bias), attention (q, k, v, out: weight, bias each), ln2, MLP (fc1,
    /// fc2: weight, bias each): 16 tensors.
    fn parameters(&mut self) -> Parameters<'_> {
        self.ln1
            .parameters()
            .chain(self.attn.parameters())
            .chain(self.ln2.parameters())
            .chain(self.mlp.parameters())
    }
}
