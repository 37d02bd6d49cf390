//! The 2-D convolution layer.

use rtx_ops::conv::Conv2dParams;
use rtx_ops::conv::{conv2d, conv2d_backward_data, conv2d_backward_filter, Conv2dOpts, Layout};
use rtx_ops::gemm::Activation;
use rtx_runtime::{DType, Error, Result, Runtime, Tensor};

use crate::init;
use crate::param::{Module, Param, Parameters};

/// The shape and options of a [`Conv2d`] layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Input channels.
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel (height, width).
    pub kernel: (usize, usize),
    /// Stride, padding, dilation, groups and layout (default: stride 1, no padding,
    /// NCHW).
    pub opts: Conv2dOpts,
    /// Whether the layer adds a bias (default true).
    pub bias: bool,
    /// The activation: `None` or `Relu` (fused into the convolution's epilogue; its
    /// derivative is read from the output). Default none.
    pub act: Activation,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
}

impl Conv2dConfig {
    /// `c_in → c_out` channels with a square `k × k` kernel, bias, no activation, f32.
    pub fn new(c_in: usize, c_out: usize, k: usize) -> Self {
        Conv2dConfig {
            c_in,
            c_out,
            kernel: (k, k),
            opts: Conv2dOpts::default(),
            bias: true,
            act: Activation::None,
            dtype: DType::F32,
        }
    }
    /// The convolution options.
    pub fn opts(mut self, opts: Conv2dOpts) -> Self {
        self.opts = opts;
        self
    }
    /// With or without bias.
    pub fn bias(mut self, on: bool) -> Self {
        self.bias = on;
        self
    }
    /// The activation (`None` or `Relu`).
    pub fn act(mut self, act: Activation) -> Self {
        self.act = act;
        self
    }
    /// The parameters' dtype.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
}

/// What [`Conv2d::backward`] needs from the forward.
#[derive(Clone, Debug)]
pub struct Conv2dCtx {
    /// The forward's input.
    pub x: Tensor,
    /// The forward's output (its sign gives the ReLU derivative).
    pub y: Tensor,
    /// The geometry.
    pub params: Conv2dParams,
}

/// `y = act(conv(x, w) + b)`: NCHW x `[n, c_in, h, w]`, weight `[c_out, c_in/groups,
/// kh, kw]` (PyTorch's layout), bias `[c_out]`, y `[n, c_out, oh, ow]` (NHWC as in
/// `rtx_ops::conv`).
///
/// Backward: `dx` by `conv2d_backward_data`, `dw` by `conv2d_backward_filter` (cuDNN on
/// CUDA, im2col + GEMM on the CPU) and `db` as the sum of `dy` over all but the channel
/// dim (two `sum_dim` reductions). With ReLU, `dy` is first multiplied by `y > 0`
/// (`relu_backward` on the saved output: `y > 0` exactly where the pre-activation is).
#[derive(Debug)]
pub struct Conv2d {
    weight: Param,
    bias: Option<Param>,
    opts: Conv2dOpts,
    act: Activation,
}

impl Conv2d {
    /// A layer initialized as PyTorch's `nn.Conv2d`: weight and bias uniform in
    /// `±1/sqrt(c_in/groups · kh · kw)`, from `seed`.
    pub fn new(rt: &Runtime, cfg: Conv2dConfig, seed: u64) -> Result<Self> {
        let g = cfg.opts.groups.max(1);
        let (kh, kw) = cfg.kernel;
        if cfg.c_in == 0 || cfg.c_out == 0 || kh == 0 || kw == 0 || !cfg.c_in.is_multiple_of(g) {
            return Err(Error::invalid_dim(
                "Conv2d::new",
                format!(
                    "{} -> {} channels, kernel {kh}x{kw}, {g} groups: sizes must be at least 1 and c_in a multiple of groups",
                    cfg.c_in, cfg.c_out
                ),
            ));
        }
        let fan_in = cfg.c_in / g * kh * kw;
        let bound = 1.0 / (fan_in as f64).sqrt();
        let shape = match cfg.opts.layout {
            Layout::Nchw => [cfg.c_out, cfg.c_in / g, kh, kw],
            Layout::Nhwc => [cfg.c_out, kh, kw, cfg.c_in / g],
        };
        let w = init::uniform(rt, shape, cfg.dtype, bound, init::derive_seed(seed, 0))?;
        let b = cfg
            .bias
            .then(|| {
                let s = init::derive_seed(seed, 1);
                init::uniform(rt, [cfg.c_out], cfg.dtype, bound, s)
            })
            .transpose()?;
        Self::from_tensors(w, b, cfg.opts, cfg.act)
    }

    /// A layer from existing tensors (weight in the layout of `opts`, bias `[c_out]`).
    pub fn from_tensors(
        weight: Tensor,
        bias: Option<Tensor>,
        opts: Conv2dOpts,
        act: Activation,
    ) -> Result<Self> {
        let op = "Conv2d::from_tensors";
        if weight.rank() != 4 {
            let msg = format!("weight must have rank 4, got {}", weight.shape());
            return Err(Error::invalid_dim(op, msg));
        }
        if !weight.dtype().is_float() {
            return Err(Error::dtype(op, DType::F32, weight.dtype()));
        }
        if !matches!(act, Activation::None | Activation::Relu) {
            let msg = format!("activation {act:?}: only None and Relu are supported");
            return Err(Error::invalid(op, msg));
        }
        if let Some(b) = &bias {
            if b.dims() != [weight.dims()[0]] {
                let detail = "bias must be [c_out]";
                return Err(Error::shape(op, b.shape(), weight.shape(), detail));
            }
            if b.dtype() != weight.dtype() {
                return Err(Error::dtype(op, weight.dtype(), b.dtype()));
            }
        }
        Ok(Conv2d {
            weight: Param::new("weight", weight),
            bias: bias.map(|b| Param::new("bias", b)),
            opts,
            act,
        })
    }

    /// The weight and its gradient.
    pub fn weight(&self) -> &Param {
        &self.weight
    }
    /// The bias and its gradient, if the layer has one.
    pub fn bias(&self) -> Option<&Param> {
        self.bias.as_ref()
    }
    /// The convolution options.
    pub fn opts(&self) -> Conv2dOpts {
        self.opts
    }
    /// The activation.
    pub fn act(&self) -> Activation {
        self.act
    }

    /// `y = act(conv(x, w) + b)` and what the backward needs; submissions only. Bad
    /// shapes are the convolution's typed errors.
    pub fn forward(&self, rt: &Runtime, x: &Tensor) -> Result<(Tensor, Conv2dCtx)> {
        let w = self.weight.value();
        let params = self.opts.params(x.shape(), w.shape())?;
        let mut op = conv2d(x, w, self.opts).activation(self.act);
        if let Some(b) = &self.bias {
            op = op.bias(b.value());
        }
        let y = rt.run(op)?;
        let ctx = Conv2dCtx {
            x: x.clone(),
            y: y.clone(),
            params,
        };
        Ok((y, ctx))
    }

    /// Given `dy`, stores the weight's and bias's gradients and returns `dx`;
    /// submissions only.
    pub fn backward(&mut self, rt: &Runtime, dy: &Tensor, ctx: &Conv2dCtx) -> Result<Tensor> {
        if dy.shape() != ctx.y.shape() {
            let detail = "dy must have the forward output's shape";
            return Err(Error::shape(
                "Conv2d::backward",
                dy.shape(),
                ctx.y.shape(),
                detail,
            ));
        }
        let dz = match self.act {
            Activation::Relu => rt.run(rtx_ops::relu_backward(dy, &ctx.y))?,
            _ => dy.clone(),
        };
        let p = ctx.params;
        let dx = rt.run(conv2d_backward_data(&dz, self.weight.value(), p))?;
        let dw = rt.run(conv2d_backward_filter(&ctx.x, &dz, p))?;
        self.weight.set_grad(dw)?;
        if let Some(b) = self.bias.as_mut() {
            b.set_grad(channel_sum(rt, &dz, p)?)?;
        }
        Ok(dx)
    }
}

/// The sum of `dy` over batch and space: `[c_out]`.
fn channel_sum(rt: &Runtime, dy: &Tensor, p: Conv2dParams) -> Result<Tensor> {
    let (oh, ow) = p.out_hw();
    let hw = oh * ow;
    match p.layout {
        Layout::Nchw => {
            let s = rt.run(rtx_ops::sum_dim(&dy.reshape([p.n, p.c_out, hw])?, 2, false))?;
            rt.run(rtx_ops::sum_dim(&s, 0, false))
        }
        Layout::Nhwc => rt.run(rtx_ops::sum_dim(
            &dy.reshape([p.n * hw, p.c_out])?,
            0,
            false,
        )),
    }
}

impl Module for Conv2d {
    /// The weight, then the bias.
    fn parameters(&mut self) -> Parameters<'_> {
        let mut v = vec![&mut self.weight];
        v.extend(self.bias.as_mut());
        Parameters::new(v)
    }
}
