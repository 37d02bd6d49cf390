//! Matrix products (batched, transposed, broadcast) and the linear epilogue (bias +
//! activation).
//!
//! - `mod.rs` (here): [`Activation`], the [`Matmul`] and [`Linear`] ops — validation
//!   at submit, one `match` on the backend in `run`;
//! - `shape.rs`: the shape rules (batch broadcast, transposes, 32-bit limits);
//! - `cpu.rs`: the CPU kernels (the `gemm` crate, then [`cpu::linear_epilogue`]);
//! - `cuda/`: per-stream cuBLAS / cuBLASLt state and the plan cache (`mod.rs`);
//!   cuBLASLt descriptors, layouts and plans at the `result`/`sys` level (`lt.rs`); the
//!   bias + activation kernel (`kernels/cuda/epilogue.cu`) where no library epilogue
//!   applies, cuBLAS fallback and convolution (`epilogue.rs`); what GEMM and
//!   convolution share: pointers, workspaces, library status codes to errors
//!   (`device.rs`); rtx's own kernel for small f16/bf16 `x·wᵀ` products
//!   (`kernels/cuda/small_gemm.cu`, launched by `small.rs` instead of cuBLASLt where
//!   [`Settings::small_gemm`](rtx_runtime::Settings::small_gemm) applies;
//!   [`small_gemm_launches`] counts them).
//! - `backward.rs` (+ `backward_cpu.rs`, `cuda/backward.rs`): the training forms,
//!   [`linear_train`] (forward saving the pre-activation) and [`linear_backward`]
//!   (`dx`, `dw`, `db`), with cuBLASLt's training epilogues on CUDA.
mod backward;
mod backward_cpu;
pub mod cpu;
pub(crate) mod cuda;
pub(crate) mod shape;

pub use backward::{
    linear_backward, linear_train, LinearBackward, LinearGrads, LinearSaved, LinearTrain,
};
pub use backward_cpu::activation_grad;
pub use cuda::backward::linear_fused_fallbacks;
// The CUDA helpers other families use, at their former paths.
pub(crate) use self::cuda::{device, epilogue};
pub use self::cuda::{
    gemm_lt_fallbacks, gemm_plan_cache_stats, gemm_tune_stats, small_gemm_launches,
};

use rtx_runtime::{
    BackendCx, Buffer, Cost, Element, ExecCx, Op, Plan, PlanCx, Result, Tensor, TensorSpec,
};

use self::cuda::GemmArgs;
use self::shape::{float_dtype, matmul_dims, stacked_linear_dims, GemmDims};
use crate::cpu_util::{to_f32_cow, with_f32_out, Float};
use crate::kernels::{cpu_out, float_dispatch};

/// The activation of a fused epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// Identity.
    #[default]
    None,
    /// `max(x, 0)` (NaN stays NaN).
    Relu,
    /// GELU, tanh approximation (PyTorch's `gelu(approximate="tanh")`):
    /// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
    Gelu,
}

impl Activation {
    /// Applies the activation to one value.
    #[inline(always)]
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Activation::None => v,
            Activation::Relu => {
                if v < 0.0 {
                    0.0
                } else {
                    v
                }
            }
            Activation::Gelu => {
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + 0.044_715 * v * v * v)).tanh())
            }
        }
    }
}

/// A (batched) matrix product; build it with [`matmul`].
///
/// `a` is `[.., m, k]` (or `[.., k, m]` with [`Matmul::trans_a`]), `b` is `[.., k, n]`
/// (or `[.., n, k]` with [`Matmul::trans_b`]). The batch dims (all but the last two)
/// are equal, or one operand is 2-D and is used for every batch. The output is
/// `[batch.., m, n]`. f32, f16 and bf16; f16/bf16 accumulate in f32. f32 is exact
/// IEEE by default (no TF32); [`Matmul::tf32`] opts in to TF32 tensor cores on CUDA.
///
/// # Examples
///
/// ```
/// use rtx::ops::gemm::matmul;
/// use rtx::Runtime;
///
/// let rt = Runtime::cpu(1);
/// let a = rt.upload(&[1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
/// let b = rt.upload(&[1.0f32, 0.0, 0.0, 1.0], [2, 2])?;
/// let c = rt.submit(matmul(&a, &b).trans_a()).map_err(|e| e.error)?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&c)?.wait()?, vec![1.0, 3.0, 2.0, 4.0]);
/// # Ok::<(), rtx::Error>(())
/// ```
pub struct Matmul {
    a: Tensor,
    b: Tensor,
    trans_a: bool,
    trans_b: bool,
    tf32: bool,
}

/// `a · b`; see [`Matmul`] for shapes and options.
pub fn matmul(a: &Tensor, b: &Tensor) -> Matmul {
    Matmul {
        a: a.clone(),
        b: b.clone(),
        trans_a: false,
        trans_b: false,
        tf32: false,
    }
}

impl Matmul {
    /// `a` is stored transposed: `[.., k, m]`.
    pub fn trans_a(mut self) -> Self {
        self.trans_a = true;
        self
    }
    /// `b` is stored transposed: `[.., n, k]`.
    pub fn trans_b(mut self) -> Self {
        self.trans_b = true;
        self
    }
    /// Allows TF32 tensor cores for f32 on CUDA (about 1e-3 relative error; the CPU
    /// backend stays exact). No effect on f16/bf16.
    pub fn tf32(mut self) -> Self {
        self.tf32 = true;
        self
    }
    /// The operands, e.g. to take them back from a rejected submission.
    pub fn into_inputs(self) -> (Tensor, Tensor) {
        (self.a, self.b)
    }

    fn dims(&self) -> Result<GemmDims> {
        matmul_dims(
            self.name(),
            self.a.shape(),
            self.b.shape(),
            self.trans_a,
            self.trans_b,
        )
    }
}

impl Op for Matmul {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "matmul"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.a, &self.b]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let dt = float_dtype(self.name(), &[self.a.dtype(), self.b.dtype()])?;
        let d = self.dims()?;
        let bytes = (self.a.numel() + self.b.numel() + d.out.numel()) * dt.size();
        Ok(Plan {
            outputs: vec![TensorSpec::new(d.out.clone(), dt)],
            cost: Cost {
                flops: d.flops(),
                bytes: bytes as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let d = self.dims()?;
        let (a, b) = (cx.input(&self.a)?, cx.input(&self.b)?);
        let g = Gemm {
            dims: &d,
            trans_a: self.trans_a,
            trans_b: self.trans_b,
            tf32: self.tf32,
            act: Activation::None,
        };
        let out = float_dispatch!(self.a.dtype(), self.name(), |T| g.run::<T>(
            cx.backend(),
            &a,
            &b,
            None
        ))?;
        cx.set_output(0, out)
    }
    /// f16/bf16 products may run rtx's small-GEMM kernel, whose eager launch can join
    /// the stream's launch batch; every other path of the CUDA run launches what is
    /// deferred first (`cuda::gemm`).
    fn batches_launches(&self) -> bool {
        matches!(
            self.a.dtype(),
            rtx_runtime::DType::F16 | rtx_runtime::DType::BF16
        )
    }
}

/// A fully connected layer `act(x · wᵀ + bias)`; build it with [`linear`].
///
/// `x` is `[.., in]`, `w` is `[out, in]` (PyTorch's `nn.Linear` layout), `bias` is
/// `[out]`; the output is `[.., out]`. On CUDA the bias and activation are a cuBLASLt
/// epilogue (`BIAS`, `RELU_BIAS`, `GELU_BIAS`, or `RELU`/`GELU` without bias) fused into
/// the GEMM. GELU is the tanh approximation.
///
/// **Stacked layers**: with `w` `[s, out, in]` and `x` `[s, rows, in]`, layer `i` is
/// `act(x[i] · w[i]ᵀ + bias)`, all `s` in one batched GEMM with the epilogue fused (the
/// bias `[out]` is shared by the layers); the output is `[s, rows, out]`. It is what
/// `torch.bmm` followed by the activation computes for same-shape models, in one op.
/// The training forms ([`linear_train`], [`linear_backward`]) take the 2-D `w` only.
///
/// # Examples
///
/// ```
/// use rtx::ops::gemm::{linear, Activation};
/// use rtx::Runtime;
///
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[1.0f32, -2.0], [1, 2])?;
/// let w = rt.upload(&[1.0f32, 1.0, 0.0, 1.0], [2, 2])?;
/// let b = rt.upload(&[0.5f32, 0.0], [2])?;
/// let y = rt.submit(linear(&x, &w, Some(&b), Activation::Relu)).map_err(|e| e.error)?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![0.0, 0.0]);
///
/// // Two stacked layers of one output each, one row each: [1, 2]·[1, 0] and [3, 4]·[0, -1].
/// let xs = rt.upload(&[1.0f32, 2.0, 3.0, 4.0], [2, 1, 2])?;
/// let ws = rt.upload(&[1.0f32, 0.0, 0.0, -1.0], [2, 1, 2])?;
/// let y = rt.submit(linear(&xs, &ws, None, Activation::Relu)).map_err(|e| e.error)?.wait()?;
/// assert_eq!(y.dims(), &[2, 1, 1]);
/// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![1.0, 0.0]);
/// # Ok::<(), rtx::Error>(())
/// ```
pub struct Linear {
    x: Tensor,
    w: Tensor,
    bias: Option<Tensor>,
    act: Activation,
    tf32: bool,
}

/// `act(x · wᵀ + bias)`; see [`Linear`].
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, act: Activation) -> Linear {
    let (x, w, bias) = (x.clone(), w.clone(), bias.cloned());
    Linear {
        x,
        w,
        bias,
        act,
        tf32: false,
    }
}

impl Linear {
    /// Allows TF32 tensor cores for f32 on CUDA.
    pub fn tf32(mut self) -> Self {
        self.tf32 = true;
        self
    }
    /// The operands, e.g. to take them back from a rejected submission.
    pub fn into_inputs(self) -> (Tensor, Tensor, Option<Tensor>) {
        (self.x, self.w, self.bias)
    }
    /// The same layer, also returning its pre-activation (for the backward): see
    /// [`linear_train`].
    pub fn save_pre_activation(self) -> LinearTrain {
        let (act, tf32) = (self.act, self.tf32);
        linear_train(&self.x, &self.w, self.bias.as_ref(), act).with_tf32(tf32)
    }

    fn dims(&self) -> Result<GemmDims> {
        let bias = self.bias.as_ref().map(|b| b.shape());
        stacked_linear_dims(self.name(), self.x.shape(), self.w.shape(), bias)
    }
}

impl Op for Linear {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "linear"
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
        let inputs: usize = self.inputs().iter().map(|t| t.numel()).sum();
        Ok(Plan {
            outputs: vec![TensorSpec::new(d.out.clone(), dt)],
            cost: Cost {
                flops: d.flops() + d.out.numel() as f64,
                bytes: ((inputs + d.out.numel()) * dt.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let d = self.dims()?;
        let (x, w) = (cx.input(&self.x)?, cx.input(&self.w)?);
        let bias = self.bias.as_ref().map(|b| cx.input(b)).transpose()?;
        let g = Gemm {
            dims: &d,
            trans_a: false,
            trans_b: true,
            tf32: self.tf32,
            act: self.act,
        };
        let out = float_dispatch!(self.x.dtype(), self.name(), |T| {
            g.run::<T>(cx.backend(), &x, &w, bias.as_deref())
        })?;
        cx.set_output(0, out)
    }
    /// As [`Matmul`]'s: f16/bf16 products may join the stream's launch batch.
    fn batches_launches(&self) -> bool {
        matches!(
            self.x.dtype(),
            rtx_runtime::DType::F16 | rtx_runtime::DType::BF16
        )
    }
}

/// What both ops run: `act(op(a) · op(b) + bias)` on either backend.
struct Gemm<'a> {
    dims: &'a GemmDims,
    trans_a: bool,
    trans_b: bool,
    tf32: bool,
    act: Activation,
}

impl Gemm<'_> {
    fn run<T>(
        &self,
        be: &mut BackendCx<'_>,
        a: &Buffer,
        b: &Buffer,
        bias: Option<&Buffer>,
    ) -> Result<Buffer>
    where
        T: Float + Element,
        cudarc::cublas::CudaBlas: cudarc::cublas::Gemm<T>,
    {
        let d = self.dims;
        match be {
            BackendCx::Cpu => {
                let mut c = cpu_out::<T>(d.batch * d.m * d.n);
                let (a, b) = (a.cpu::<T>()?, b.cpu::<T>()?);
                let bias = bias.map(|b| b.cpu::<T>()).transpose()?;
                let mm = |a: &[f32], b: &[f32], c: &mut [f32]| {
                    cpu::matmul(
                        a,
                        b,
                        c,
                        d.batch,
                        d.m,
                        d.n,
                        d.k,
                        self.trans_a,
                        self.trans_b,
                        d.a_bs,
                        d.b_bs,
                    )
                };
                if bias.is_none() && matches!(self.act, Activation::None) {
                    cpu::matmul(
                        a,
                        b,
                        &mut c,
                        d.batch,
                        d.m,
                        d.n,
                        d.k,
                        self.trans_a,
                        self.trans_b,
                        d.a_bs,
                        d.b_bs,
                    );
                } else {
                    // Like cuBLASLt's fused epilogue: bias and activation on the f32
                    // accumulator, one rounding to T at the end (rounding the product
                    // first would amplify its error wherever the bias cancels it).
                    let (a32, b32) = (to_f32_cow(a), to_f32_cow(b));
                    let bias32 = bias.map(to_f32_cow);
                    with_f32_out(&mut c, |c32| {
                        mm(&a32, &b32, c32);
                        cpu::linear_epilogue(c32, bias32.as_deref(), d.n, self.act);
                    });
                }
                Ok(Buffer::from_vec(c))
            }
            BackendCx::Cuda(scx) => {
                let args = GemmArgs {
                    a: a.cuda::<T>()?,
                    b: b.cuda::<T>()?,
                    bias: bias.map(|b| b.cuda::<T>()).transpose()?,
                    dims: d,
                    trans_a: self.trans_a,
                    trans_b: self.trans_b,
                    tf32: self.tf32,
                    act: self.act,
                };
                cuda::gemm(scx, args).map(Buffer::from_cuda)
            }
        }
    }
}
