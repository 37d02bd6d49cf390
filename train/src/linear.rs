//! The fully connected layer.

use rtx_ops::gemm::{linear_backward, linear_train, Activation};
use rtx_runtime::{DType, Error, Result, Runtime, Tensor};

use crate::init;
use crate::param::{Module, Param, Parameters};

/// The shape and options of a [`Linear`] layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearConfig {
    /// Input features (the last dim of `x`).
    pub in_features: usize,
    /// Output features.
    pub out_features: usize,
    /// Whether the layer adds a bias (default true).
    pub bias: bool,
    /// The activation applied to `x · wᵀ + b` (default none).
    pub act: Activation,
    /// The parameters' dtype: f32, f16 or bf16 (default f32).
    pub dtype: DType,
}

impl LinearConfig {
    /// `in_features → out_features`, with bias, no activation, f32.
    pub fn new(in_features: usize, out_features: usize) -> Self {
        LinearConfig {
            in_features,
            out_features,
            bias: true,
            act: Activation::None,
            dtype: DType::F32,
        }
    }
    /// With or without bias.
    pub fn bias(mut self, on: bool) -> Self {
        self.bias = on;
        self
    }
    /// The activation.
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

/// What [`Linear::backward`] needs from the forward: the input and, for an
/// activation, the pre-activation `x · wᵀ + b`.
#[derive(Clone, Debug)]
pub struct LinearCtx {
    /// The forward's input.
    pub x: Tensor,
    /// The pre-activation (`None` without activation).
    pub pre: Option<Tensor>,
}

/// `y = act(x · wᵀ + b)`: `x` is `[.., in]`, the weight `[out, in]` (PyTorch's layout),
/// the bias `[out]`, `y` `[.., out]`.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// use rtx_train::{Linear, LinearConfig, Module};
///
/// let rt = Runtime::cpu(1);
/// let mut layer = Linear::new(&rt, LinearConfig::new(3, 2), 7)?;
/// let x = rt.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])?;
/// let (y, ctx) = layer.forward(&rt, &x)?;
/// let dy = rt.upload(&[1.0f32; 4], [2, 2])?;
/// let dx = layer.backward(&rt, &dy, &ctx)?;
/// assert_eq!((y.dims(), dx.dims()), (&[2usize, 2][..], &[2usize, 3][..]));
/// assert!(layer.parameters().iter().all(|p| p.grad().is_some()));
/// # Ok::<(), rtx_runtime::Error>(())
/// ```
#[derive(Debug)]
pub struct Linear {
    weight: Param,
    bias: Option<Param>,
    act: Activation,
}

impl Linear {
    /// A layer initialized as PyTorch's `nn.Linear`: weight and bias uniform in
    /// `±1/sqrt(in_features)`, from `seed` (see [`init::uniform`]).
    pub fn new(rt: &Runtime, cfg: LinearConfig, seed: u64) -> Result<Self> {
        if cfg.in_features == 0 || cfg.out_features == 0 {
            return Err(Error::invalid_dim(
                "Linear::new",
                format!(
                    "{} -> {} features: both must be at least 1",
                    cfg.in_features, cfg.out_features
                ),
            ));
        }
        let bound = 1.0 / (cfg.in_features as f64).sqrt();
        let shape = [cfg.out_features, cfg.in_features];
        let w = init::uniform(rt, shape, cfg.dtype, bound, init::derive_seed(seed, 0))?;
        let b = cfg
            .bias
            .then(|| {
                init::uniform(
                    rt,
                    [cfg.out_features],
                    cfg.dtype,
                    bound,
                    init::derive_seed(seed, 1),
                )
            })
            .transpose()?;
        Self::from_tensors(w, b, cfg.act)
    }

    /// A layer from existing tensors: `weight` `[out, in]`, `bias` `[out]`, one float
    /// dtype.
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>, act: Activation) -> Result<Self> {
        let op = "Linear::from_tensors";
        if weight.rank() != 2 {
            return Err(Error::invalid_dim(
                op,
                format!("weight must be [out, in], got {}", weight.shape()),
            ));
        }
        if !weight.dtype().is_float() {
            return Err(Error::dtype(op, DType::F32, weight.dtype()));
        }
        if let Some(b) = &bias {
            if b.dims() != [weight.dims()[0]] {
                return Err(Error::shape(
                    op,
                    b.shape(),
                    weight.shape(),
                    "bias must be [out_features]",
                ));
            }
            if b.dtype() != weight.dtype() {
                return Err(Error::dtype(op, weight.dtype(), b.dtype()));
            }
        }
        Ok(Linear {
            weight: Param::new("weight", weight),
            bias: bias.map(|b| Param::new("bias", b)),
            act,
        })
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.weight.value().dims()[1]
    }
    /// Output features.
    pub fn out_features(&self) -> usize {
        self.weight.value().dims()[0]
    }
    /// The activation.
    pub fn act(&self) -> Activation {
        self.act
    }
    /// The weight `[out, in]` and its gradient.
    pub fn weight(&self) -> &Param {
        &self.weight
    }
    /// The bias `[out]` and its gradient, if the layer has one.
    pub fn bias(&self) -> Option<&Param> {
        self.bias.as_ref()
    }

    /// `y = act(x · wᵀ + b)` and what the backward needs; submissions only.
    pub fn forward(&self, rt: &Runtime, x: &Tensor) -> Result<(Tensor, LinearCtx)> {
        let b = self.bias.as_ref().map(|p| p.value());
        let s = rt.run(linear_train(x, self.weight.value(), b, self.act))?;
        Ok((
            s.y,
            LinearCtx {
                x: x.clone(),
                pre: s.pre,
            },
        ))
    }

    /// Given `dy` (the gradient of the forward's `y`), stores the weight's and bias's
    /// gradients and returns the gradient of `x`; submissions only.
    pub fn backward(&mut self, rt: &Runtime, dy: &Tensor, ctx: &LinearCtx) -> Result<Tensor> {
        self.backward_with(rt, dy, ctx, self.act, None)
    }

    /// The backward with the activation derivative chosen by the caller: `act` is the
    /// activation whose derivative multiplies `dy` (`None` when `dy` is already the
    /// gradient of the pre-activation), and `input_act` (the layer below's activation
    /// and pre-activation) makes the returned gradient that of the layer below's
    /// pre-activation. Used by [`crate::Mlp`] to fuse each derivative into a GEMM.
    pub(crate) fn backward_with(
        &mut self,
        rt: &Runtime,
        dy: &Tensor,
        ctx: &LinearCtx,
        act: Activation,
        input_act: Option<(Activation, &Tensor)>,
    ) -> Result<Tensor> {
        let pre = if act == Activation::None {
            None
        } else {
            ctx.pre.as_ref()
        };
        let mut op = linear_backward(
            dy,
            &ctx.x,
            self.weight.value(),
            pre,
            act,
            self.bias.is_some(),
        );
        if let Some((a, pre_in)) = input_act {
            op = op.input_activation(a, pre_in);
        }
        let g = rt.run(op)?;
        self.weight.set_grad(g.dw)?;
        if let (Some(b), Some(db)) = (self.bias.as_mut(), g.db) {
            b.set_grad(db)?;
        }
        Ok(g.dx)
    }
}

impl Module for Linear {
    /// The weight, then the bias.
    fn parameters(&mut self) -> Parameters<'_> {
        let mut v = vec![&mut self.weight];
        v.extend(self.bias.as_mut());
        Parameters::new(v)
    }
}
