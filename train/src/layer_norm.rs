//! The layer normalization layer.

use rtx_runtime::{DType, Error, Result, Runtime, Tensor};

use crate::param::{Module, Param, Parameters};

/// What [`LayerNorm::backward`] needs from the forward: the input and the row mean and
/// rstd the forward saved.
#[derive(Clone, Debug)]
pub struct LayerNormCtx {
    /// The forward's input.
    pub x: Tensor,
    /// Row means, `[rows]` f32.
    pub mean: Tensor,
    /// Row `1 / sqrt(var + eps)`, `[rows]` f32.
    pub rstd: Tensor,
}

/// `y = (x - mean) / sqrt(var + eps) · weight + bias` over the last dim (`D`), as
/// PyTorch's `nn.LayerNorm(D, eps)` (biased variance); over `rtx_ops::layer_norm` and
/// `layer_norm_backward`.
#[derive(Debug)]
pub struct LayerNorm {
    weight: Param,
    bias: Param,
    eps: f32,
}

impl LayerNorm {
    /// A layer over `d` features initialized as PyTorch's: weight 1, bias 0 (filled on
    /// the device).
    pub fn new(rt: &Runtime, d: usize, eps: f32, dtype: DType) -> Result<Self> {
        if d == 0 {
            return Err(Error::invalid_dim("LayerNorm::new", "0 features"));
        }
        let w = rt.run(rtx_ops::ones([d], dtype))?;
        let b = rt.run(rtx_ops::zeros([d], dtype))?;
        Self::from_tensors(w, b, eps)
    }

    /// A layer from existing `[D]` weight and bias of one float dtype.
    pub fn from_tensors(weight: Tensor, bias: Tensor, eps: f32) -> Result<Self> {
        let op = "LayerNorm::from_tensors";
        if weight.rank() != 1 || bias.shape() != weight.shape() {
            let detail = "weight and bias must both be [D]";
            return Err(Error::shape(op, weight.shape(), bias.shape(), detail));
        }
        if !weight.dtype().is_float() || bias.dtype() != weight.dtype() {
            return Err(Error::dtype(op, weight.dtype(), bias.dtype()));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(Error::invalid(
                op,
                format!("eps {eps} must be finite and >= 0"),
            ));
        }
        Ok(LayerNorm {
            weight: Param::new("weight", weight),
            bias: Param::new("bias", bias),
            eps,
        })
    }

    /// The features (`D`).
    pub fn features(&self) -> usize {
        self.weight.value().numel()
    }
    /// The epsilon.
    pub fn eps(&self) -> f32 {
        self.eps
    }
    /// The weight (gamma) and its gradient.
    pub fn weight(&self) -> &Param {
        &self.weight
    }
    /// The bias (beta) and its gradient.
    pub fn bias(&self) -> &Param {
        &self.bias
    }

    /// The normalized `x` and what the backward needs; submissions only.
    pub fn forward(&self, rt: &Runtime, x: &Tensor) -> Result<(Tensor, LayerNormCtx)> {
        let op = rtx_ops::layer_norm(x, self.weight.value(), self.bias.value(), self.eps);
        let (y, mean, rstd) = rt.run(op)?;
        let ctx = LayerNormCtx {
            x: x.clone(),
            mean,
            rstd,
        };
        Ok((y, ctx))
    }

    /// Given `dy`, stores the weight's and bias's gradients and returns `dx`;
    /// submissions only.
    pub fn backward(&mut self, rt: &Runtime, dy: &Tensor, ctx: &LayerNormCtx) -> Result<Tensor> {
        let op =
            rtx_ops::layer_norm_backward(dy, &ctx.x, &ctx.mean, &ctx.rstd, self.weight.value());
        let (dx, dg, db) = rt.run(op)?;
        self.weight.set_grad(dg)?;
        self.bias.set_grad(db)?;
        Ok(dx)
    }
}

impl Module for LayerNorm {
    /// The weight, then the bias.
    fn parameters(&mut self) -> Parameters<'_> {
        Parameters::new(vec![&mut self.weight, &mut self.bias])
    }
}
