//! A multi-layer perceptron: a stack of [`Linear`] layers.

use rtx_ops::gemm::Activation;
use rtx_runtime::{DType, Error, Result, Runtime, Tensor};

use crate::init;
use crate::linear::{Linear, LinearConfig, LinearCtx};
use crate::param::{Module, Parameters};

/// The widths and options of an [`Mlp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpConfig {
    /// Feature widths: input, hidden.., output (at least two entries).
    pub sizes: Vec<usize>,
    /// The activation after every layer but the last (default GELU).
    pub act: Activation,
    /// The activation after the last layer (default none, e.g. logits).
    pub out_act: Activation,
    /// Whether the layers add biases (default true).
    pub bias: bool,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
}

impl MlpConfig {
    /// Layers between consecutive `sizes`, GELU between them, bias, f32.
    pub fn new(sizes: &[usize]) -> Self {
        MlpConfig {
            sizes: sizes.to_vec(),
            act: Activation::Gelu,
            out_act: Activation::None,
            bias: true,
            dtype: DType::F32,
        }
    }
    /// The hidden activation.
    pub fn act(mut self, act: Activation) -> Self {
        self.act = act;
        self
    }
    /// The output activation.
    pub fn out_act(mut self, act: Activation) -> Self {
        self.out_act = act;
        self
    }
    /// With or without biases.
    pub fn bias(mut self, on: bool) -> Self {
        self.bias = on;
        self
    }
    /// The parameters' dtype.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
}

/// What [`Mlp::backward`] needs from the forward: each layer's context.
#[derive(Clone, Debug)]
pub struct MlpCtx {
    /// One per layer, in order.
    pub layers: Vec<LinearCtx>,
}

/// `x → act(L₀ x) → act(L₁ ·) → … → out_act(Lₙ ·)`.
///
/// The backward chains the layers: layer `i` returns the gradient of layer `i-1`'s
/// *pre-activation* (`LinearBackward::input_activation`, fused into its dx GEMM on CUDA
/// for GELU), and layer `i-1` then runs without an activation derivative, its bias
/// gradient fused into its dw GEMM. The last layer's own activation (if any) costs one
/// element-wise pass.
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    /// An MLP initialized layer by layer as [`Linear::new`], each layer seeded from
    /// `seed` and its index.
    pub fn new(rt: &Runtime, cfg: &MlpConfig, seed: u64) -> Result<Self> {
        if cfg.sizes.len() < 2 {
            return Err(Error::invalid(
                "Mlp::new",
                format!(
                    "sizes {:?}: need the input and output widths at least",
                    cfg.sizes
                ),
            ));
        }
        let n = cfg.sizes.len() - 1;
        let layers = cfg
            .sizes
            .windows(2)
            .enumerate()
            .map(|(i, io)| {
                let act = if i + 1 == n { cfg.out_act } else { cfg.act };
                let lc = LinearConfig::new(io[0], io[1])
                    .bias(cfg.bias)
                    .act(act)
                    .dtype(cfg.dtype);
                Linear::new(rt, lc, init::derive_seed(seed, i as u64))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Mlp { layers })
    }

    /// An MLP from layers whose widths chain (`out` of each = `in` of the next) and whose
    /// dtypes agree.
    pub fn from_layers(layers: Vec<Linear>) -> Result<Self> {
        if layers.is_empty() {
            return Err(Error::invalid("Mlp::from_layers", "no layers"));
        }
        for (i, pair) in layers.windows(2).enumerate() {
            let (a, b) = (&pair[0], &pair[1]);
            if a.out_features() != b.in_features() {
                let detail = format!(
                    "layer {i} gives {} features, layer {} takes {}",
                    a.out_features(),
                    i + 1,
                    b.in_features()
                );
                return Err(Error::shape(
                    "Mlp::from_layers",
                    a.weight().value().shape(),
                    b.weight().value().shape(),
                    detail,
                ));
            }
            let (da, db) = (a.weight().value().dtype(), b.weight().value().dtype());
            if da != db {
                return Err(Error::dtype("Mlp::from_layers", da, db));
            }
        }
        Ok(Mlp { layers })
    }

    /// The layers.
    pub fn layers(&self) -> &[Linear] {
        &self.layers
    }

    /// The output and what the backward needs; submissions only.
    pub fn forward(&self, rt: &Runtime, x: &Tensor) -> Result<(Tensor, MlpCtx)> {
        let mut h = x.clone();
        let mut ctxs = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let (y, c) = l.forward(rt, &h)?;
            ctxs.push(c);
            h = y;
        }
        Ok((h, MlpCtx { layers: ctxs }))
    }

    /// Given the output's gradient, stores every parameter's gradient and returns the
    /// input's; submissions only.
    pub fn backward(&mut self, rt: &Runtime, dy: &Tensor, ctx: &MlpCtx) -> Result<Tensor> {
        let n = self.layers.len();
        if ctx.layers.len() != n {
            return Err(Error::invalid(
                "Mlp::backward",
                format!("context of {} layers for an MLP of {n}", ctx.layers.len()),
            ));
        }
        let acts: Vec<Activation> = self.layers.iter().map(|l| l.act()).collect();
        let mut d = dy.clone();
        for i in (0..n).rev() {
            // The last layer applies its own derivative; every other one receives the
            // gradient of its pre-activation from the layer above.
            let act = if i + 1 == n {
                acts[i]
            } else {
                Activation::None
            };
            let input_act = if i > 0 {
                ctx.layers[i - 1].pre.as_ref().map(|p| (acts[i - 1], p))
            } else {
                None
            };
            d = self.layers[i].backward_with(rt, &d, &ctx.layers[i], act, input_act)?;
        }
        Ok(d)
    }
}

impl Module for Mlp {
    /// Each layer's weight then bias, layer by layer.
    fn parameters(&mut self) -> Parameters<'_> {
        self.layers
            .iter_mut()
            .fold(Parameters::default(), |acc, l| acc.chain(l.parameters()))
    }
}
