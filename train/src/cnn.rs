//! A small convolutional network: conv-relu-conv-relu-flatten-linear.

use rtx_ops::conv::Conv2dOpts;
use rtx_ops::gemm::Activation;
use rtx_runtime::{DType, Error, Result, Runtime, Tensor};

use crate::conv::{Conv2d, Conv2dConfig, Conv2dCtx};
use crate::init;
use crate::linear::{Linear, LinearConfig, LinearCtx};
use crate::param::{Module, Parameters};

/// The sizes of a [`Cnn`] (NCHW input `[n, c_in, h, w]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CnnConfig {
    /// Input channels.
    pub c_in: usize,
    /// Input height and width.
    pub hw: (usize, usize),
    /// Channels after the first and the second convolution.
    pub channels: (usize, usize),
    /// Output features (classes).
    pub classes: usize,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
}

impl CnnConfig {
    /// `c_in` channels of `h × w`, convolutions to `c1` then `c2` channels, `classes`
    /// outputs, f32.
    pub fn new(c_in: usize, hw: (usize, usize), c1: usize, c2: usize, classes: usize) -> Self {
        CnnConfig {
            c_in,
            hw,
            channels: (c1, c2),
            classes,
            dtype: DType::F32,
        }
    }
}

/// What [`Cnn::backward`] needs from the forward.
#[derive(Clone, Debug)]
pub struct CnnCtx {
    /// The convolutions' contexts.
    pub convs: [Conv2dCtx; 2],
    /// The classifier's context.
    pub head: LinearCtx,
    /// The second convolution's output shape (to unflatten the gradient).
    pub feature_dims: Vec<usize>,
}

/// `x → relu(conv₁ x) → relu(conv₂ ·) → flatten → linear`: conv₁ is 3×3 with padding
/// 1 (same size), conv₂ 3×3 with padding 1 and stride 2 (half size, rounded up); the
/// ReLUs are fused into the convolutions; flattening is a reshape (free).
#[derive(Debug)]
pub struct Cnn {
    cfg: CnnConfig,
    convs: [Conv2d; 2],
    head: Linear,
}

impl Cnn {
    /// A network initialized layer by layer as PyTorch's defaults, from `seed`.
    pub fn new(rt: &Runtime, cfg: CnnConfig, seed: u64) -> Result<Self> {
        let (c1, c2) = cfg.channels;
        let (h, w) = cfg.hw;
        if h == 0 || w == 0 {
            return Err(Error::invalid_dim("Cnn::new", "empty input"));
        }
        let conv = |c_in, c_out, stride, i| {
            let cc = Conv2dConfig::new(c_in, c_out, 3)
                .opts(Conv2dOpts::default().pad(1).stride(stride))
                .act(Activation::Relu)
                .dtype(cfg.dtype);
            Conv2d::new(rt, cc, init::derive_seed(seed, i))
        };
        let convs = [conv(cfg.c_in, c1, 1, 0)?, conv(c1, c2, 2, 1)?];
        let (oh, ow) = (h.div_ceil(2), w.div_ceil(2));
        let features = c2 * oh * ow;
        let lc = LinearConfig::new(features, cfg.classes).dtype(cfg.dtype);
        let head = Linear::new(rt, lc, init::derive_seed(seed, 2))?;
        Ok(Cnn { cfg, convs, head })
    }

    /// The sizes it was built with.
    pub fn config(&self) -> &CnnConfig {
        &self.cfg
    }

    /// The two convolutions.
    pub fn convs(&self) -> &[Conv2d; 2] {
        &self.convs
    }
    /// The classifier.
    pub fn head(&self) -> &Linear {
        &self.head
    }

    /// The logits `[n, classes]` and what the backward needs; submissions only.
    pub fn forward(&self, rt: &Runtime, x: &Tensor) -> Result<(Tensor, CnnCtx)> {
        let (h1, c1) = self.convs[0].forward(rt, x)?;
        let (h2, c2) = self.convs[1].forward(rt, &h1)?;
        let n = h2.dims()[0];
        let flat = h2.reshape([n, h2.numel() / n])?;
        let (y, head) = self.head.forward(rt, &flat)?;
        let ctx = CnnCtx {
            convs: [c1, c2],
            head,
            feature_dims: h2.dims().to_vec(),
        };
        Ok((y, ctx))
    }

    /// Given the logits' gradient, stores every parameter's gradient and returns the
    /// input's; submissions only.
    pub fn backward(&mut self, rt: &Runtime, dy: &Tensor, ctx: &CnnCtx) -> Result<Tensor> {
        let dflat = self.head.backward(rt, dy, &ctx.head)?;
        let dh2 = dflat.reshape(ctx.feature_dims.clone())?;
        let dh1 = self.convs[1].backward(rt, &dh2, &ctx.convs[1])?;
        self.convs[0].backward(rt, &dh1, &ctx.convs[0])
    }
}

impl Module for Cnn {
    /// conv₁ (weight, bias), conv₂ (weight, bias), the classifier (weight, bias).
    fn parameters(&mut self) -> Parameters<'_> {
        let [a, b] = &mut self.convs;
        a.parameters()
            .chain(b.parameters())
            .chain(self.head.parameters())
    }
}
