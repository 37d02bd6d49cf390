//! `K` MLPs of one shape trained as one ensemble: stacked weights, batched GEMMs.
//!
//! Training `K` models of one architecture at once (a hyperparameter sweep over seeds,
//! an ensemble) as `K` separate [`Mlp`]s costs `K` times the ops, each small. Stacked,
//! layer `l` of all `K` models is one weight tensor `[K, out, in]` and one bias
//! `[K, 1, out]`, and each step of the layer is one batched GEMM for all of them, as a
//! PyTorch user writes it with `bmm` (or `torch.func.stack_module_state`).
//!
//! Per layer, forward: `h = matmul(x, w)` with `w` transposed (`[K, N, out]`; the first
//! layer takes the shared batch `[N, in]` for every model), `pre = h + b` (broadcast),
//! `y = act(pre)`. Backward, from `dy`: `d = act'(pre) · dy`, `db = Σ_N d`,
//! `dw = dᵀ · x`, `dx = d · w`. Every op is an existing, tested `rtx-ops` op, so the
//! stacked model runs wherever those run (CPU, CUDA, inside a captured graph).
//!
//! The optimizers are element-wise, so one AdamW or SGD step over the stacked tensors
//! is exactly `K` separate steps with the same hyperparameters: a stacked ensemble
//! trains as its `K` members would alone (`tests/stacked.rs` checks it against `K`
//! separate [`Mlp`]s). Members differ in their initialization (seeds), not in their
//! learning rates.

use rtx_ops::activation::{gelu, gelu_backward, relu_backward};
use rtx_ops::gemm::Activation;
use rtx_ops::layout::{concat, narrow};
use rtx_ops::reduce::sum_dim;
use rtx_ops::{add, matmul, relu};
use rtx_runtime::{DType, Error, Result, Runtime, Tensor};

use crate::init::derive_seed;
use crate::param::{Module, Param, Parameters};
use crate::pipeline::{loss_and_grad, Classifier};
use crate::{Linear, Mlp, MlpConfig};

/// One layer of every member: weight `[K, out, in]`, bias `[K, 1, out]`.
#[derive(Debug)]
struct StackedLayer {
    weight: Param,
    bias: Option<Param>,
    act: Activation,
}

/// What [`StackedMlp::backward`] needs from the forward: each layer's input and
/// pre-activation.
#[derive(Clone, Debug)]
pub struct StackedCtx {
    /// Each layer's input (`[N, in]` for the first layer, `[K, N, in]` after), in order.
    pub inputs: Vec<Tensor>,
    /// Each layer's pre-activation `[K, N, out]` (`None` for a layer without one).
    pub pres: Vec<Option<Tensor>>,
}

/// `K` MLPs of one shape as one model: layer `l` of every member is one weight
/// `[K, out, in]` and one bias `[K, 1, out]`, and each direction of each layer is one
/// batched GEMM for all members. The optimizers being element-wise, one step over the
/// stacked tensors is `K` separate steps with the same hyperparameters: the members
/// train as each would alone (they differ in their initialization, not their learning
/// rates).
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// use rtx_train::{MlpConfig, StackedMlp};
///
/// let rt = Runtime::cpu(1);
/// let m = StackedMlp::new(&rt, &MlpConfig::new(&[4, 8, 3]), 5, 7)?;
/// let x = rt.upload(&[0.5f32; 2 * 4], [2, 4])?;   // one batch for all 5 members
/// let (y, _ctx) = m.forward(&rt, &x)?;
/// assert_eq!(y.dims(), &[5, 2, 3]);
/// # Ok::<(), rtx_runtime::Error>(())
/// ```
#[derive(Debug)]
pub struct StackedMlp {
    layers: Vec<StackedLayer>,
    members: usize,
}

impl StackedMlp {
    /// `members` MLPs of `cfg`, member `i` initialized as `Mlp::new(rt, cfg, s_i)` with
    /// `s_i = derive_seed(seed, i)`: the stack of exactly those models.
    pub fn new(rt: &Runtime, cfg: &MlpConfig, members: usize, seed: u64) -> Result<Self> {
        if members == 0 {
            return Err(Error::invalid("StackedMlp::new", "no members"));
        }
        let mlps = (0..members)
            .map(|i| Mlp::new(rt, cfg, derive_seed(seed, i as u64)))
            .collect::<Result<Vec<_>>>()?;
        Self::from_mlps(rt, &mlps)
    }

    /// The stack of `mlps` (each layer's weights concatenated along a new first dim);
    /// the MLPs must agree in widths, activations, biases and dtype. Submissions only.
    pub fn from_mlps(rt: &Runtime, mlps: &[Mlp]) -> Result<Self> {
        let what = "StackedMlp::from_mlps";
        let Some(first) = mlps.first() else {
            return Err(Error::invalid(what, "no MLPs"));
        };
        let mut layers = Vec::with_capacity(first.layers().len());
        for (l, base) in first.layers().iter().enumerate() {
            let mut ws = Vec::with_capacity(mlps.len());
            let mut bs = Vec::with_capacity(mlps.len());
            for (i, m) in mlps.iter().enumerate() {
                let layer = m
                    .layers()
                    .get(l)
                    .filter(|_| m.layers().len() == first.layers().len());
                let Some(layer) = layer.filter(|x| same_layer(x, base)) else {
                    return Err(Error::invalid(
                        what,
                        format!(
                            "MLP {i} differs from MLP 0 at layer {l} (all must have one shape)"
                        ),
                    ));
                };
                let w = layer.weight().value();
                ws.push(w.reshape([1, w.dims()[0], w.dims()[1]])?);
                if let Some(b) = layer.bias() {
                    bs.push(b.value().reshape([1, 1, b.value().dims()[0]])?);
                }
            }
            let weight = Param::new(format!("{l}.weight"), rt.run(concat(&ws, 0))?);
            let bias = if bs.is_empty() {
                None
            } else {
                Some(Param::new(format!("{l}.bias"), rt.run(concat(&bs, 0))?))
            };
            layers.push(StackedLayer {
                weight,
                bias,
                act: base.act(),
            });
        }
        Ok(StackedMlp {
            layers,
            members: mlps.len(),
        })
    }

    /// How many models are stacked (`K`).
    pub fn members(&self) -> usize {
        self.members
    }

    /// The parameters' dtype.
    pub fn dtype(&self) -> DType {
        self.layers
            .first()
            .map_or(DType::F32, |l| l.weight.value().dtype())
    }

    /// Member `i` as an [`Mlp`] of its own (copies of its weights); submissions only.
    pub fn member(&self, rt: &Runtime, i: usize) -> Result<Mlp> {
        if i >= self.members {
            return Err(Error::invalid(
                "StackedMlp::member",
                format!("member {i} of {}", self.members),
            ));
        }
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let w = l.weight.value();
                let (o, n) = (w.dims()[1], w.dims()[2]);
                let wi = rt.run(narrow(w, 0, i, 1))?.reshape([o, n])?;
                let bi = match &l.bias {
                    Some(b) => Some(rt.run(narrow(b.value(), 0, i, 1))?.reshape([o])?),
                    None => None,
                };
                Linear::from_tensors(wi, bi, l.act)
            })
            .collect::<Result<Vec<_>>>()?;
        Mlp::from_layers(layers)
    }

    /// The outputs `[K, N, out]` of every member and what the backward needs, from one
    /// batch `x` `[N, in]` that every member sees, or one batch per member
    /// `[K, N, in]`; submissions only.
    pub fn forward(&self, rt: &Runtime, x: &Tensor) -> Result<(Tensor, StackedCtx)> {
        let k = self.members;
        let shared = x.rank() == 2;
        if !(shared || (x.rank() == 3 && x.dims()[0] == k)) {
            return Err(Error::invalid_dim(
                "StackedMlp::forward",
                format!("input {}: expected [N, in] or [{k}, N, in]", x.shape()),
            ));
        }
        let mut h = x.clone();
        let mut ctx = StackedCtx {
            inputs: Vec::with_capacity(self.layers.len()),
            pres: Vec::with_capacity(self.layers.len()),
        };
        for l in &self.layers {
            let z = rt.run(matmul(&h, l.weight.value()).trans_b())?;
            let pre = match &l.bias {
                Some(b) => rt.run(add(&z, b.value()))?,
                None => z,
            };
            let y = match l.act {
                Activation::None => pre.clone(),
                Activation::Relu => rt.run(relu(&pre))?,
                Activation::Gelu => rt.run(gelu(&pre))?,
            };
            ctx.inputs.push(std::mem::replace(&mut h, y));
            ctx.pres.push((l.act != Activation::None).then_some(pre));
        }
        Ok((h, ctx))
    }

    /// Given the outputs' gradient `[K, N, out]`, stores every parameter's gradient
    /// and returns the gradient of the input (`[K, N, in]`); submissions only.
    pub fn backward(&mut self, rt: &Runtime, dy: &Tensor, ctx: &StackedCtx) -> Result<Tensor> {
        self.backward_inner(rt, dy, ctx, true)
            .map(|d| d.expect("asked for the input gradient"))
    }

    /// The backward; the input gradient (one GEMM more) only `with_dx`.
    fn backward_inner(
        &mut self,
        rt: &Runtime,
        dy: &Tensor,
        ctx: &StackedCtx,
        with_dx: bool,
    ) -> Result<Option<Tensor>> {
        let n = self.layers.len();
        if ctx.inputs.len() != n || ctx.pres.len() != n {
            return Err(Error::invalid(
                "StackedMlp::backward",
                format!("context of {} layers for a stack of {n}", ctx.inputs.len()),
            ));
        }
        let mut d = dy.clone();
        for (i, l) in self.layers.iter_mut().enumerate().rev() {
            let dpre = match (l.act, &ctx.pres[i]) {
                (Activation::None, _) => d,
                (Activation::Relu, Some(p)) => rt.run(relu_backward(&d, p))?,
                (Activation::Gelu, Some(p)) => rt.run(gelu_backward(&d, p))?,
                (_, None) => {
                    return Err(Error::invalid(
                        "StackedMlp::backward",
                        format!("layer {i}: no saved pre-activation"),
                    ))
                }
            };
            let x = &ctx.inputs[i];
            l.weight.set_grad(rt.run(matmul(&dpre, x).trans_a())?)?;
            if let Some(b) = l.bias.as_mut() {
                b.set_grad(rt.run(sum_dim(&dpre, 1, true))?)?;
            }
            if i == 0 && !with_dx {
                return Ok(None);
            }
            // The first layer's input gradient is one per member (`[K, N, in]`), also
            // for a shared batch.
            d = rt.run(matmul(&dpre, l.weight.value()))?;
        }
        Ok(Some(d))
    }
}

/// Whether two layers have one shape, activation, bias presence and dtype.
fn same_layer(a: &Linear, b: &Linear) -> bool {
    a.weight().value().dims() == b.weight().value().dims()
        && a.weight().value().dtype() == b.weight().value().dtype()
        && a.bias().is_some() == b.bias().is_some()
        && a.act() == b.act()
}

impl Module for StackedMlp {
    /// Each layer's stacked weight then bias, layer by layer.
    fn parameters(&mut self) -> Parameters<'_> {
        let v: Vec<&mut Param> = self
            .layers
            .iter_mut()
            .flat_map(|l| std::iter::once(&mut l.weight).chain(l.bias.as_mut()))
            .collect();
        Parameters::new(v)
    }
}

/// A stacked ensemble classifies one batch `[N, features]` with every member: its
/// logits are `[K·N, classes]` (member by member) and its labels the batch's, repeated
/// `K` times ([`Classifier::members`]). The loss it returns is the members' mean loss;
/// its gradient is that of their sum, so each member gets the gradient it would get
/// alone (as PyTorch's stacked form, `cross_entropy(..) * K`).
impl Classifier for StackedMlp {
    fn logits(&self, rt: &Runtime, x: &Tensor) -> Result<Tensor> {
        let x = self.as_dtype(rt, x)?;
        let (y, _) = self.forward(rt, &x)?;
        flat_logits(&y)
    }
    fn loss_backward(
        &mut self,
        rt: &Runtime,
        x: &Tensor,
        y: &Tensor,
        scale: f32,
    ) -> Result<Tensor> {
        let x = self.as_dtype(rt, x)?;
        let (out, ctx) = self.forward(rt, &x)?;
        let logits = flat_logits(&out)?;
        let labels = repeat_labels(rt, y, self.members)?;
        // The gradient of the members' summed losses: K times that of their mean.
        let k = self.members as f32;
        let (loss, dlogits) = loss_and_grad(rt, &logits, &labels, scale * k)?;
        let dout = dlogits.reshape(out.shape().clone())?;
        self.backward_inner(rt, &dout, &ctx, false)?;
        Ok(loss)
    }
    fn params(&mut self) -> Parameters<'_> {
        self.parameters()
    }
    fn members(&self) -> usize {
        self.members
    }
}

impl StackedMlp {
    /// `x` in the parameters' dtype (a cast on the device when it differs).
    fn as_dtype(&self, rt: &Runtime, x: &Tensor) -> Result<Tensor> {
        if x.dtype() == self.dtype() {
            Ok(x.clone())
        } else {
            rt.run(rtx_ops::cast(x, self.dtype()))
        }
    }
}

/// `[K, N, C]` as `[K·N, C]`.
fn flat_logits(y: &Tensor) -> Result<Tensor> {
    let d = y.dims();
    let rows = d[0]
        .checked_mul(d[1])
        .ok_or_else(|| Error::invalid("StackedMlp", "logits overflow"))?;
    y.reshape([rows, d[2]])
}

/// `y` `[N]` repeated `k` times (`[k·N]`), one op; `y` itself for `k = 1`.
pub(crate) fn repeat_labels(rt: &Runtime, y: &Tensor, k: usize) -> Result<Tensor> {
    if k == 1 {
        return Ok(y.clone());
    }
    rt.run(concat(&vec![y.clone(); k], 0))
}
