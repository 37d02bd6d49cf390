//! Training forms of `linear`: [`linear_train`] (the forward that saves its
//! pre-activation) and [`linear_backward`] (`dx`, `dw`, `db`). Validation at submit;
//! CPU in `backward_cpu.rs`, CUDA (cuBLASLt training epilogues, and where they do not
//! apply the kernels of `kernels/cuda/linear_train.cu`) in `cuda/backward.rs`.

use rtx_runtime::{
    BackendCx, Buffer, Cost, Element, Error, ExecCx, Op, Outputs, Plan, PlanCx, Result, Shape,
    Tensor, TensorSpec,
};

use super::backward_cpu::{self as bcpu, BackwardCpu, LinearSizes};
use super::cuda::backward::{self as bcuda, BackwardArgs};
use super::shape::{float_dtype, linear_dims, GemmDims};
use super::Activation;
use crate::cpu_util::Float;
use crate::kernels::float_dispatch;

/// The outputs of [`linear_train`]: the layer's output and, for an activation other
/// than `None`, its pre-activation `x · wᵀ + bias` (what [`linear_backward`] needs).
#[derive(Clone, Debug)]
pub struct LinearSaved {
    /// `act(x · wᵀ + bias)`, `[.., out]`.
    pub y: Tensor,
    /// `x · wᵀ + bias`, `[.., out]`, same dtype; `None` when the activation is `None`
    /// (then it equals `y`).
    pub pre: Option<Tensor>,
}

impl Outputs for LinearSaved {
    const COUNT: Option<usize> = None;
    fn from_tensors(t: Vec<Tensor>) -> Self {
        let mut it = t.into_iter();
        LinearSaved {
            y: it.next().expect("linear_train has an output"),
            pre: it.next(),
        }
    }
}

/// `linear` that also returns its pre-activation; build it with [`linear_train`].
///
/// Shapes and dtypes as [`super::Linear`]: `x` `[.., in]`, `w` `[out, in]`, `bias`
/// `[out]`, f32/f16/bf16 (f16/bf16 computed in f32), all one dtype. `y` equals what
/// `linear(x, w, bias, act)` computes. The pre-activation is stored in the same dtype.
///
/// On CUDA, GELU is one GEMM with cuBLASLt's `GELU_AUX_BIAS` (or `GELU_AUX`) epilogue,
/// which writes `y` and the pre-activation together (when `out` is a multiple of 8 and
/// cuBLASLt has an algorithm; else a GEMM with `BIAS`, then an element-wise pass). ReLU
/// always takes the second path (see `cuda/backward.rs` for why).
///
/// # Examples
///
/// ```
/// use rtx_ops::gemm::{linear_train, Activation};
/// use rtx_runtime::Runtime;
///
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[1.0f32, -2.0], [1, 2])?;
/// let w = rt.upload(&[1.0f32, 1.0, 0.0, 1.0], [2, 2])?;
/// let s = rt.submit(linear_train(&x, &w, None, Activation::Relu)).map_err(|e| e.error)?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&s.y)?.wait()?, vec![0.0, 0.0]);
/// assert_eq!(rt.to_vec::<f32>(s.pre.as_ref().unwrap())?.wait()?, vec![-1.0, -2.0]);
/// # Ok::<(), rtx_runtime::Error>(())
/// ```
pub struct LinearTrain {
    x: Tensor,
    w: Tensor,
    bias: Option<Tensor>,
    act: Activation,
    tf32: bool,
}

/// `act(x · wᵀ + bias)` and its pre-activation; see [`LinearTrain`].
pub fn linear_train(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, act: Activation) -> LinearTrain {
    LinearTrain {
        x: x.clone(),
        w: w.clone(),
        bias: bias.cloned(),
        act,
        tf32: false,
    }
}

impl LinearTrain {
    /// Allows TF32 tensor cores for f32 on CUDA.
    pub fn tf32(mut self) -> Self {
        self.tf32 = true;
        self
    }
    /// Sets whether TF32 is allowed (for [`super::Linear::save_pre_activation`]).
    pub(crate) fn with_tf32(mut self, on: bool) -> Self {
        self.tf32 = on;
        self
    }
    /// The operands, e.g. to take them back from a rejected submission.
    pub fn into_inputs(self) -> (Tensor, Tensor, Option<Tensor>) {
        (self.x, self.w, self.bias)
    }
    fn dims(&self) -> Result<GemmDims> {
        let bias = self.bias.as_ref().map(|b| b.shape());
        linear_dims(self.name(), self.x.shape(), self.w.shape(), bias)
    }
}

impl Op for LinearTrain {
    type Output = LinearSaved;
    fn name(&self) -> &'static str {
        "linear_train"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        let mut v = vec![&self.x, &self.w];
        v.extend(self.bias.as_ref());
        v
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let dts: Vec<_> = self.inputs().iter().map(|t| t.dtype()).collect();
        let dt = float_dtype(self.name(), &dts)?;
        let d = self.dims()?;
        let mut outputs = vec![TensorSpec::new(d.out.clone(), dt)];
        if self.act != Activation::None {
            outputs.push(TensorSpec::new(d.out.clone(), dt));
        }
        let inputs: usize = self.inputs().iter().map(|t| t.numel()).sum();
        let written = outputs.len() * d.out.numel();
        Ok(Plan {
            outputs,
            cost: Cost {
                flops: d.flops() + d.out.numel() as f64,
                bytes: ((inputs + written) * dt.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let d = self.dims()?;
        let (x, w) = (cx.input(&self.x)?, cx.input(&self.w)?);
        let bias = self.bias.as_ref().map(|b| cx.input(b)).transpose()?;
        let (act, tf32) = (self.act, self.tf32);
        let (y, pre) = float_dispatch!(self.x.dtype(), self.name(), |T| {
            train_run::<T>(cx.backend(), &d, &x, &w, bias.as_deref(), act, tf32)
        })?;
        cx.set_output(0, y)?;
        if let Some(pre) = pre {
            cx.set_output(1, pre)?;
        }
        Ok(())
    }
}

fn sizes(d: &GemmDims) -> LinearSizes {
    LinearSizes {
        rows: d.m,
        inp: d.k,
        out: d.n,
    }
}

fn train_run<T>(
    be: &mut BackendCx<'_>,
    d: &GemmDims,
    x: &Buffer,
    w: &Buffer,
    bias: Option<&Buffer>,
    act: Activation,
    tf32: bool,
) -> Result<(Buffer, Option<Buffer>)>
where
    T: Float + Element,
    cudarc::cublas::CudaBlas: cudarc::cublas::Gemm<T>,
{
    match be {
        BackendCx::Cpu => {
            let bias = bias.map(|b| b.cpu::<T>()).transpose()?;
            let (y, pre) = bcpu::linear_train(sizes(d), x.cpu::<T>()?, w.cpu::<T>()?, bias, act);
            Ok((Buffer::from_vec(y), pre.map(Buffer::from_vec)))
        }
        BackendCx::Cuda(scx) => {
            let bias = bias.map(|b| b.cuda::<T>()).transpose()?;
            let (y, pre) =
                bcuda::linear_train(scx, x.cuda::<T>()?, w.cuda::<T>()?, bias, d, act, tf32)?;
            Ok((Buffer::from_cuda(y), pre.map(Buffer::from_cuda)))
        }
    }
}

/// The outputs of [`linear_backward`].
#[derive(Clone, Debug)]
pub struct LinearGrads {
    /// The gradient of `x` (`x`'s shape), or with
    /// [`LinearBackward::input_activation`] that of the input's pre-activation.
    pub dx: Tensor,
    /// The gradient of `w`, `[out, in]`.
    pub dw: Tensor,
    /// The gradient of the bias, `[out]`, when the layer has one.
    pub db: Option<Tensor>,
}

impl Outputs for LinearGrads {
    const COUNT: Option<usize> = None;
    fn from_tensors(t: Vec<Tensor>) -> Self {
        let mut it = t.into_iter();
        LinearGrads {
            dx: it.next().expect("linear_backward has dx"),
            dw: it.next().expect("linear_backward has dw"),
            db: it.next(),
        }
    }
}

/// The backward of `y = act(x · wᵀ + b)`; build it with [`linear_backward`].
///
/// Inputs: `dy` (`[.., out]`, the gradient of `y`), `x` (`[.., in]`), `w` (`[out, in]`),
/// and, for an activation other than `None`, the saved pre-activation `pre` (`[.., out]`,
/// from [`linear_train`]); all one float dtype (f32/f16/bf16, computed in f32). With
/// `dz = dy ⊙ act'(pre)` over the rows of the flattened leading dims:
/// `dx = dz · w`, `dw = dzᵀ · x`, `db = Σ_rows dz` (only when `has_bias`).
///
/// The ReLU derivative is 1 where `pre > 0`, else 0; the GELU derivative is that of the
/// tanh form the forward uses.
///
/// On CUDA `db` comes from the dw GEMM through cuBLASLt's `BGRADB` epilogue, and with
/// [`LinearBackward::input_activation`] the input's activation derivative from the dx GEMM
/// (`DGELU`); `dz` itself is an element-wise pass (an epilogue acts on a GEMM's output,
/// and `dy` is an input here). `cuda/backward.rs` documents every case and fallback.
///
/// # Examples
///
/// ```
/// use rtx_ops::gemm::{linear_backward, Activation};
/// use rtx_runtime::Runtime;
///
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[1.0f32, 2.0], [1, 2])?;
/// let w = rt.upload(&[3.0f32, 4.0], [1, 2])?;
/// let dy = rt.upload(&[0.5f32], [1, 1])?;
/// let g = rt.submit(linear_backward(&dy, &x, &w, None, Activation::None, true))
///     .map_err(|e| e.error)?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&g.dx)?.wait()?, vec![1.5, 2.0]);
/// assert_eq!(rt.to_vec::<f32>(&g.dw)?.wait()?, vec![0.5, 1.0]);
/// assert_eq!(rt.to_vec::<f32>(g.db.as_ref().unwrap())?.wait()?, vec![0.5]);
/// # Ok::<(), rtx_runtime::Error>(())
/// ```
pub struct LinearBackward {
    dy: Tensor,
    x: Tensor,
    w: Tensor,
    pre: Option<Tensor>,
    act: Activation,
    has_bias: bool,
    input_act: Option<(Activation, Tensor)>,
    tf32: bool,
}

/// `(dx, dw, db)` of `y = act(x · wᵀ + b)`; see [`LinearBackward`]. `pre` is needed
/// unless `act` is `None` (then it is ignored).
pub fn linear_backward(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    pre: Option<&Tensor>,
    act: Activation,
    has_bias: bool,
) -> LinearBackward {
    LinearBackward {
        dy: dy.clone(),
        x: x.clone(),
        w: w.clone(),
        pre: if act == Activation::None {
            None
        } else {
            pre.cloned()
        },
        act,
        has_bias,
        input_act: None,
        tf32: false,
    }
}

impl LinearBackward {
    /// `x` is `act(pre_in)` (the previous layer's output): `dx` becomes the gradient of
    /// `pre_in` instead, `(dz · w) ⊙ act'(pre_in)` — on CUDA fused into the dx GEMM for
    /// GELU. The previous layer's backward then takes `Activation::None`. `pre_in` has
    /// `x`'s shape and dtype. `Activation::None` leaves `dx` as it is.
    pub fn input_activation(mut self, act: Activation, pre_in: &Tensor) -> Self {
        self.input_act = (act != Activation::None).then(|| (act, pre_in.clone()));
        self
    }
    /// Allows TF32 tensor cores for f32 on CUDA.
    pub fn tf32(mut self) -> Self {
        self.tf32 = true;
        self
    }
    /// The operands `[dy, x, w, pre?, pre_in?]`, e.g. to take them back from a rejected
    /// submission.
    pub fn into_inputs(self) -> Vec<Tensor> {
        let mut v = vec![self.dy, self.x, self.w];
        v.extend(self.pre);
        v.extend(self.input_act.map(|(_, t)| t));
        v
    }

    /// The forward's dims (`m` rows, `n` out, `k` in), after checking every shape.
    fn dims(&self) -> Result<GemmDims> {
        let op = self.name();
        let d = linear_dims(op, self.x.shape(), self.w.shape(), None)?;
        let same = |t: &Tensor, want: &Shape, what: &str| -> Result<()> {
            if t.shape() == want {
                Ok(())
            } else {
                Err(Error::shape(
                    op,
                    t.shape(),
                    want,
                    format!("{what} must have this shape"),
                ))
            }
        };
        same(&self.dy, &d.out, "dy (x's leading dims, then out_features)")?;
        match (&self.pre, self.act) {
            (Some(pre), _) => same(
                pre,
                &d.out,
                "pre (the forward's pre-activation, dy's shape)",
            )?,
            (None, Activation::None) => {}
            (None, act) => {
                return Err(Error::invalid(
                    op,
                    format!("{act:?} needs the saved pre-activation (pre), from linear_train"),
                ))
            }
        }
        if let Some((_, pre_in)) = &self.input_act {
            same(
                pre_in,
                self.x.shape(),
                "pre_in (the input's pre-activation, x's shape)",
            )?;
        }
        Ok(d)
    }
}

impl Op for LinearBackward {
    type Output = LinearGrads;
    fn name(&self) -> &'static str {
        "linear_backward"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        let mut v = vec![&self.dy, &self.x, &self.w];
        v.extend(self.pre.as_ref());
        v.extend(self.input_act.as_ref().map(|(_, t)| t));
        v
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let dts: Vec<_> = self.inputs().iter().map(|t| t.dtype()).collect();
        let dt = float_dtype(self.name(), &dts)?;
        let d = self.dims()?;
        let mut outputs = vec![
            TensorSpec::new(self.x.shape().clone(), dt),
            TensorSpec::new(self.w.shape().clone(), dt),
        ];
        if self.has_bias {
            outputs.push(TensorSpec::new(Shape::new(vec![d.n]), dt));
        }
        let read: usize = self.inputs().iter().map(|t| t.numel()).sum();
        let written: usize = outputs.iter().map(|o| o.shape.numel()).sum();
        Ok(Plan {
            outputs,
            cost: Cost {
                flops: 2.0 * d.flops() + 2.0 * d.out.numel() as f64,
                bytes: ((read + written) * dt.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let d = self.dims()?;
        let dy = cx.input(&self.dy)?;
        let (x, w) = (cx.input(&self.x)?, cx.input(&self.w)?);
        let pre = self.pre.as_ref().map(|t| cx.input(t)).transpose()?;
        let pre_in = match &self.input_act {
            Some((a, t)) => Some((*a, cx.input(t)?)),
            None => None,
        };
        let b = Bufs {
            dy: &dy,
            x: &x,
            w: &w,
            pre: pre.as_deref(),
            input_act: pre_in.as_ref().map(|(a, t)| (*a, &**t)),
        };
        let cfg = (self.act, self.has_bias, self.tf32, self.x.shape());
        let (dx, dw, db) = float_dispatch!(self.x.dtype(), self.name(), |T| {
            backward_run::<T>(cx.backend(), &d, &b, cfg)
        })?;
        cx.set_output(0, dx)?;
        cx.set_output(1, dw)?;
        if let Some(db) = db {
            cx.set_output(2, db)?;
        }
        Ok(())
    }
}

/// The input buffers of one `linear_backward`.
struct Bufs<'a> {
    dy: &'a Buffer,
    x: &'a Buffer,
    w: &'a Buffer,
    pre: Option<&'a Buffer>,
    input_act: Option<(Activation, &'a Buffer)>,
}

type BufGrads = (Buffer, Buffer, Option<Buffer>);

fn backward_run<T>(
    be: &mut BackendCx<'_>,
    d: &GemmDims,
    b: &Bufs<'_>,
    (act, has_bias, tf32, x_shape): (Activation, bool, bool, &Shape),
) -> Result<BufGrads>
where
    T: Float + Element,
    cudarc::cublas::CudaBlas: cudarc::cublas::Gemm<T>,
{
    match be {
        BackendCx::Cpu => {
            let input_act = match b.input_act {
                Some((a, t)) => Some((a, t.cpu::<T>()?)),
                None => None,
            };
            let (dx, dw, db) = BackwardCpu {
                sizes: sizes(d),
                dy: b.dy.cpu::<T>()?,
                x: b.x.cpu::<T>()?,
                w: b.w.cpu::<T>()?,
                pre: b.pre.map(|t| t.cpu::<T>()).transpose()?,
                act,
                input_act,
                has_bias,
            }
            .run();
            Ok((
                Buffer::from_vec(dx),
                Buffer::from_vec(dw),
                db.map(Buffer::from_vec),
            ))
        }
        BackendCx::Cuda(scx) => {
            let input_act = match b.input_act {
                Some((a, t)) => Some((a, t.cuda::<T>()?)),
                None => None,
            };
            let args = BackwardArgs {
                dy: b.dy.cuda::<T>()?,
                x: b.x.cuda::<T>()?,
                w: b.w.cuda::<T>()?,
                pre: b.pre.map(|t| t.cuda::<T>()).transpose()?,
                act,
                input_act,
                has_bias,
                rows: d.m,
                inp: d.k,
                out: d.n,
                x_shape,
                tf32,
            };
            let (dx, dw, db) = bcuda::linear_backward(scx, args)?;
            Ok((
                Buffer::from_cuda(dx),
                Buffer::from_cuda(dw),
                db.map(Buffer::from_cuda),
            ))
        }
    }
}
