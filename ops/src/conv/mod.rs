//! 2-D convolution (NCHW and NHWC; stride, padding, dilation, groups): forward (with
//! optional bias + activation) and backward (data, filter).
//!
//! - `mod.rs` (here): [`Layout`], [`Conv2dParams`], and the [`Conv2d`],
//!   [`Conv2dBackwardData`] and [`Conv2dBackwardFilter`] ops — validation at submit, one
//!   `match` on the backend in `run`;
//! - `shape.rs`: [`Conv2dOpts`] and the shape rules checked at submit;
//! - `cpu.rs` (+ `cpu/`): the CPU kernels (im2col + GEMM);
//! - `cuda/`: per-stream cuDNN state, the algorithm cache and the workspace (`mod.rs`);
//!   cuDNN handles, descriptors, algorithm search and launches at the `sys` level
//!   (`dnn.rs`); cuDNN's graph (backend) API, engine plans for one convolution
//!   (`graph.rs`); reading cuDNN's search results, which algorithm and math type
//!   (`perf.rs`).
pub mod cpu;
mod cuda;
mod shape;

pub use self::cuda::{conv_algo_cache_stats, conv_engine_stats, conv_search_fallbacks, SEARCH_CAP};
pub use self::shape::{w_shape, x_shape, y_shape, Conv2dOpts};

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Element, ExecCx, Op, Plan, PlanCx, Result, Shape, Tensor,
    TensorSpec,
};

use self::cuda::dnn::Dir;
use self::shape::{check_params, expect_shape};
use crate::cpu_util::Float;
use crate::gemm::cuda::{self as gemm_cuda, GemmArgs};
use crate::gemm::epilogue;
use crate::gemm::shape::float_dtype;
use crate::gemm::shape::GemmDims;
use crate::gemm::Activation;
use crate::kernels::{cpu_out, float_dispatch};

/// Memory layout of activations (and, correspondingly, of the filter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Channels first: `[n, c, h, w]`.
    #[default]
    Nchw,
    /// Channels last: `[n, h, w, c]`.
    Nhwc,
}

/// The geometry of a 2-D convolution. `c_in` and `c_out` are multiples of `groups`;
/// all sizes, strides and dilations are at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    /// Batch size.
    pub n: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// (vertical, horizontal) stride.
    pub stride: (usize, usize),
    /// (top/bottom, left/right) zero padding.
    pub pad: (usize, usize),
    /// (vertical, horizontal) dilation.
    pub dilation: (usize, usize),
    /// Channel groups (`c_in` for depthwise).
    pub groups: usize,
    /// Activation and filter layout.
    pub layout: Layout,
}

impl Conv2dParams {
    /// Output `(oh, ow)`: `(h + 2·pad − dilation·(k − 1) − 1) / stride + 1`, or 0
    /// when the dilated kernel does not fit in the padded input, or when the geometry is
    /// degenerate (a zero kernel or stride) or its arithmetic overflows `usize`: the
    /// fields are public, so every step is checked (a submit rejects such parameters).
    pub fn out_hw(&self) -> (usize, usize) {
        let dim = |i: usize, k: usize, s: usize, p: usize, d: usize| {
            let padded = p.checked_mul(2).and_then(|p2| i.checked_add(p2))?;
            let span = k.checked_sub(1)?.checked_mul(d)?.checked_add(1)?;
            padded.checked_sub(span)?.checked_div(s)?.checked_add(1)
        };
        (
            dim(self.h, self.kh, self.stride.0, self.pad.0, self.dilation.0).unwrap_or(0),
            dim(self.w, self.kw, self.stride.1, self.pad.1, self.dilation.1).unwrap_or(0),
        )
    }

    /// Elements of x (and dx); `usize::MAX` if the product overflows.
    pub fn x_len(&self) -> usize {
        product(&[self.n, self.c_in, self.h, self.w])
    }

    /// Elements of the filter (and dw); `usize::MAX` if the product overflows.
    pub fn w_len(&self) -> usize {
        product(&[self.c_out, self.k_len()])
    }

    /// Filter taps per output channel: `c_in/groups · kh · kw` (the GEMM depth);
    /// `usize::MAX` if the product overflows (0 groups count as 1 here; a submit rejects
    /// them).
    fn k_len(&self) -> usize {
        product(&[self.c_in / self.groups.max(1), self.kh, self.kw])
    }

    /// Elements of y (and dy); `usize::MAX` if the product overflows.
    pub fn y_len(&self) -> usize {
        let (oh, ow) = self.out_hw();
        product(&[self.n, self.c_out, oh, ow])
    }
}

/// The product of `dims`, saturating at `usize::MAX` (no geometry that large passes
/// `check_params`, so a saturated length is never used for memory).
fn product(dims: &[usize]) -> usize {
    dims.iter()
        .try_fold(1usize, |a, d| a.checked_mul(*d))
        .unwrap_or(usize::MAX)
}

/// A 2-D convolution (cross-correlation), optionally followed by a per-channel bias
/// and an activation; build it with [`conv2d`].
///
/// Shapes by [`Layout`]: NCHW x `[n, c_in, h, w]`, w `[c_out, c_in/groups, kh, kw]`,
/// y `[n, c_out, oh, ow]`; NHWC x `[n, h, w, c_in]`, w `[c_out, kh, kw, c_in/groups]`,
/// y `[n, oh, ow, c_out]`; bias `[c_out]`. f32 (exact unless [`Conv2d::tf32`]), f16,
/// bf16 (f32 accumulation). On CUDA: cuDNN with an algorithm benchmarked once per
/// shape and stream, then (with a bias or an activation) one in-place epilogue kernel.
///
/// # Examples
///
/// ```
/// use rtx::ops::conv::{conv2d, Conv2dOpts};
/// use rtx::Runtime;
///
/// let rt = Runtime::cpu(1);
/// let x = rt.upload(&[1.0f32; 16], [1, 1, 4, 4])?;
/// let w = rt.upload(&[1.0f32; 9], [1, 1, 3, 3])?;
/// let y = rt.submit(conv2d(&x, &w, Conv2dOpts::default().pad(1))).map_err(|e| e.error)?.wait()?;
/// assert_eq!(y.dims(), [1, 1, 4, 4]);
/// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?[5], 9.0);
/// # Ok::<(), rtx::Error>(())
/// ```
pub struct Conv2d {
    x: Tensor,
    w: Tensor,
    bias: Option<Tensor>,
    act: Activation,
    opts: Conv2dOpts,
    tf32: bool,
}

/// `conv(x, w)` with `opts`; see [`Conv2d`].
pub fn conv2d(x: &Tensor, w: &Tensor, opts: Conv2dOpts) -> Conv2d {
    let (x, w) = (x.clone(), w.clone());
    Conv2d {
        x,
        w,
        bias: None,
        act: Activation::None,
        opts,
        tf32: false,
    }
}

impl Conv2d {
    /// Adds `bias[c]` to every output of channel `c`.
    pub fn bias(mut self, bias: &Tensor) -> Self {
        let bias = bias.clone();
        self.bias = Some(bias);
        self
    }
    /// Applies `act` after the bias.
    pub fn activation(mut self, act: Activation) -> Self {
        self.act = act;
        self
    }
    /// Allows TF32 tensor cores for f32 on CUDA.
    pub fn tf32(mut self) -> Self {
        self.tf32 = true;
        self
    }
    /// The operands, e.g. to take them back from a rejected submission.
    pub fn into_inputs(self) -> (Tensor, Tensor, Option<Tensor>) {
        (self.x, self.w, self.bias)
    }
    fn params(&self) -> Result<Conv2dParams> {
        self.opts.params(self.x.shape(), self.w.shape())
    }
}

impl Op for Conv2d {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "conv2d"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        let mut v = vec![&self.x, &self.w];
        v.extend(self.bias.as_ref());
        v
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let dts: Vec<DType> = self.inputs().iter().map(|t| t.dtype()).collect();
        let dt = float_dtype(self.name(), &dts)?;
        let p = self.params()?;
        if let Some(b) = &self.bias {
            expect_shape(self.name(), "bias", b.shape(), &Shape::new(vec![p.c_out]))?;
        }
        Ok(plan_of(&p, dt, y_shape(&p), self.inputs()))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let p = self.params()?;
        let (x, w) = (cx.input(&self.x)?, cx.input(&self.w)?);
        let bias = self.bias.as_ref().map(|b| cx.input(b)).transpose()?;
        let c = Conv {
            dir: Dir::Forward,
            p: &p,
            act: self.act,
            tf32: self.tf32,
        };
        let out = float_dispatch!(self.x.dtype(), self.name(), |T| {
            c.run::<T>(cx.backend(), &x, &w, bias.as_deref())
        })?;
        cx.set_output(0, out)
    }
}

/// The data gradient of a convolution: `dx` from `dy` and `w`; build it with
/// [`conv2d_backward_data`]. The output has x's shape (`p`'s input geometry).
pub struct Conv2dBackwardData {
    dy: Tensor,
    w: Tensor,
    p: Conv2dParams,
    tf32: bool,
}

/// `dx = conv_transpose(dy, w)` for the convolution `p` (use [`Conv2dOpts::params`]
/// to get `p` from the forward shapes).
pub fn conv2d_backward_data(dy: &Tensor, w: &Tensor, p: Conv2dParams) -> Conv2dBackwardData {
    let (dy, w) = (dy.clone(), w.clone());
    Conv2dBackwardData {
        dy,
        w,
        p,
        tf32: false,
    }
}

impl Conv2dBackwardData {
    /// Allows TF32 tensor cores for f32 on CUDA.
    pub fn tf32(mut self) -> Self {
        self.tf32 = true;
        self
    }
    /// The operands `(dy, w)`.
    pub fn into_inputs(self) -> (Tensor, Tensor) {
        (self.dy, self.w)
    }
}

impl Op for Conv2dBackwardData {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "conv2d_backward_data"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.dy, &self.w]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let dt = float_dtype(self.name(), &[self.dy.dtype(), self.w.dtype()])?;
        check_params(self.name(), &self.p)?;
        expect_shape(self.name(), "dy", self.dy.shape(), &y_shape(&self.p))?;
        expect_shape(self.name(), "w", self.w.shape(), &w_shape(&self.p))?;
        Ok(plan_of(&self.p, dt, x_shape(&self.p), self.inputs()))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (dy, w) = (cx.input(&self.dy)?, cx.input(&self.w)?);
        let c = Conv {
            dir: Dir::BackwardData,
            p: &self.p,
            act: Activation::None,
            tf32: self.tf32,
        };
        let out = float_dispatch!(self.dy.dtype(), self.name(), |T| c.run::<T>(
            cx.backend(),
            &dy,
            &w,
            None
        ))?;
        cx.set_output(0, out)
    }
}

/// The filter gradient of a convolution: `dw` from `x` and `dy`; build it with
/// [`conv2d_backward_filter`]. The output has the filter's shape.
pub struct Conv2dBackwardFilter {
    x: Tensor,
    dy: Tensor,
    p: Conv2dParams,
    tf32: bool,
}

/// `dw = Σ dy ⊗ x-patches` for the convolution `p`.
pub fn conv2d_backward_filter(x: &Tensor, dy: &Tensor, p: Conv2dParams) -> Conv2dBackwardFilter {
    let (x, dy) = (x.clone(), dy.clone());
    Conv2dBackwardFilter {
        x,
        dy,
        p,
        tf32: false,
    }
}

impl Conv2dBackwardFilter {
    /// Allows TF32 tensor cores for f32 on CUDA.
    pub fn tf32(mut self) -> Self {
        self.tf32 = true;
        self
    }
    /// The operands `(x, dy)`.
    pub fn into_inputs(self) -> (Tensor, Tensor) {
        (self.x, self.dy)
    }
}

impl Op for Conv2dBackwardFilter {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "conv2d_backward_filter"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x, &self.dy]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let dt = float_dtype(self.name(), &[self.x.dtype(), self.dy.dtype()])?;
        check_params(self.name(), &self.p)?;
        expect_shape(self.name(), "x", self.x.shape(), &x_shape(&self.p))?;
        expect_shape(self.name(), "dy", self.dy.shape(), &y_shape(&self.p))?;
        Ok(plan_of(&self.p, dt, w_shape(&self.p), self.inputs()))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (x, dy) = (cx.input(&self.x)?, cx.input(&self.dy)?);
        let c = Conv {
            dir: Dir::BackwardFilter,
            p: &self.p,
            act: Activation::None,
            tf32: self.tf32,
        };
        let out = float_dispatch!(self.x.dtype(), self.name(), |T| c.run::<T>(
            cx.backend(),
            &x,
            &dy,
            None
        ))?;
        cx.set_output(0, out)
    }
}

/// The plan of any direction: the output spec and the cost (the same multiply-adds).
fn plan_of(p: &Conv2dParams, dt: DType, out: Shape, inputs: Vec<&Tensor>) -> Plan {
    let macs = p.y_len() as f64 * (p.c_in / p.groups * p.kh * p.kw) as f64;
    let elems: usize = inputs.iter().map(|t| t.numel()).sum::<usize>() + out.numel();
    Plan {
        outputs: vec![TensorSpec::new(out, dt)],
        cost: Cost {
            flops: 2.0 * macs,
            bytes: (elems * dt.size()) as f64,
        },
    }
}

/// One direction on either backend. Operands: `(x, w)` forward, `(dy, w)` backward
/// data, `(x, dy)` backward filter.
struct Conv<'a> {
    dir: Dir,
    p: &'a Conv2dParams,
    act: Activation,
    tf32: bool,
}

/// Whether a convolution is a plain GEMM over NHWC pixels (see `Conv::run`).
fn is_pointwise_nhwc(p: &Conv2dParams) -> bool {
    p.layout == Layout::Nhwc
        && (p.kh, p.kw) == (1, 1)
        && p.stride == (1, 1)
        && p.pad == (0, 0)
        && p.groups == 1
}

impl Conv<'_> {
    fn run<T: Float + Element>(
        &self,
        be: &mut BackendCx<'_>,
        a: &Buffer,
        b: &Buffer,
        bias: Option<&Buffer>,
    ) -> Result<Buffer>
    where
        cudarc::cublas::CudaBlas: cudarc::cublas::Gemm<T>,
    {
        let p = self.p;
        match be {
            BackendCx::Cpu => {
                let (a, b) = (a.cpu::<T>()?, b.cpu::<T>()?);
                let out = match self.dir {
                    Dir::Forward => {
                        let mut y = cpu_out::<T>(p.y_len());
                        let bias = bias.map(|b| b.cpu::<T>()).transpose()?;
                        cpu::conv2d_forward(p, a, b, bias, self.act, &mut y);
                        y
                    }
                    Dir::BackwardData => {
                        let mut dx = cpu_out::<T>(p.x_len());
                        cpu::conv2d_backward_data(p, a, b, &mut dx);
                        dx
                    }
                    Dir::BackwardFilter => {
                        let mut dw = cpu_out::<T>(p.w_len());
                        cpu::conv2d_backward_filter(p, a, b, &mut dw);
                        dw
                    }
                };
                Ok(Buffer::from_vec(out))
            }
            BackendCx::Cuda(scx) if self.dir == Dir::Forward && is_pointwise_nhwc(p) => {
                // A 1x1, stride-1, unpadded, ungrouped NHWC convolution is a GEMM:
                // y[n*h*w, c_out] = x[n*h*w, c_in] · w[c_out, c_in]ᵀ, with bias and
                // activation fused by cuBLASLt's epilogue. Measured on the H200, cuDNN's
                // legacy find API ran these layers at 0.12-0.15x PyTorch.
                let m = p.n * p.h * p.w;
                let dims = GemmDims {
                    batch: 1,
                    m,
                    n: p.c_out,
                    k: p.c_in,
                    a_bs: 0,
                    b_bs: 0,
                    out: Shape::new(vec![m, p.c_out]),
                };
                let args = GemmArgs {
                    a: a.cuda::<T>()?,
                    b: b.cuda::<T>()?,
                    bias: bias.map(|b| b.cuda::<T>()).transpose()?,
                    dims: &dims,
                    trans_a: false,
                    trans_b: true,
                    tf32: self.tf32,
                    act: self.act,
                };
                gemm_cuda::gemm(scx, args).map(Buffer::from_cuda)
            }
            BackendCx::Cuda(scx) => {
                let mut out =
                    cuda::conv::<T>(scx, self.dir, p, a.cuda::<T>()?, b.cuda::<T>()?, self.tf32)?;
                if self.dir == Dir::Forward {
                    let (oh, ow) = p.out_hw();
                    let inner = match p.layout {
                        Layout::Nchw => oh * ow,
                        Layout::Nhwc => 1,
                    };
                    let bias = bias.map(|b| b.cuda::<T>()).transpose()?;
                    epilogue::bias_act(scx, &mut out, bias, p.c_out, inner, self.act)?;
                }
                Ok(Buffer::from_cuda(out))
            }
        }
    }
}

#[cfg(test)]
mod overflow_tests {
    use super::*;

    /// Public fields with values whose size arithmetic overflows, or that are degenerate:
    /// no panic (debug) and no wrap (release) in the size methods.
    #[test]
    fn size_methods_never_wrap_or_panic() {
        let base = Conv2dParams {
            n: 2,
            c_in: 4,
            h: 9,
            w: 7,
            c_out: 6,
            kh: 3,
            kw: 3,
            stride: (2, 1),
            pad: (1, 0),
            dilation: (1, 2),
            groups: 2,
            layout: Layout::Nchw,
        };
        assert_eq!(base.out_hw(), (5, 3));
        assert_eq!(base.x_len(), 2 * 4 * 9 * 7);
        assert_eq!(base.w_len(), 6 * 2 * 3 * 3);
        assert_eq!(base.y_len(), 2 * 6 * 5 * 3);
        let huge = usize::MAX / 2 + 1;
        let cases = [
            Conv2dParams {
                pad: (huge, 0),
                ..base
            },
            Conv2dParams {
                h: usize::MAX,
                pad: (1, 0),
                ..base
            },
            Conv2dParams { kh: 0, ..base },
            Conv2dParams {
                stride: (0, 1),
                ..base
            },
            Conv2dParams {
                dilation: (huge, 1),
                ..base
            },
        ];
        for p in cases {
            let (oh, _) = p.out_hw();
            assert_eq!(oh, 0, "{p:?}");
            assert_eq!(p.y_len(), 0, "{p:?}");
        }
        // Zero groups: no division by zero (a submit rejects them).
        let g0 = Conv2dParams { groups: 0, ..base };
        assert_eq!(g0.w_len(), 6 * 4 * 3 * 3);
        assert!(shape::check_params("conv2d", &g0).is_err());
        let big = Conv2dParams {
            n: 1 << 40,
            c_in: 1 << 40,
            c_out: 1 << 40,
            kh: 1 << 30,
            ..base
        };
        assert_eq!(big.x_len(), usize::MAX);
        assert_eq!(big.w_len(), usize::MAX);
        assert!(shape::check_params("conv2d", &big).is_err());
    }
}
