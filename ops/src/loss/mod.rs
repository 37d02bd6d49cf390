//! Cross-entropy over class logits: [`cross_entropy`] (mean loss and the row log-sum-exp)
//! and [`cross_entropy_backward`] (the logits' gradient), each one fused kernel on CUDA.
//!
//! - `cpu.rs`: the CPU reference.
//! - `cuda.rs`: the launches of `kernels/cuda/loss.cu` and the forward's per-stream
//!   workspace (deterministic: per-block partials combined in block order by the last
//!   block; no float atomics).
//! - here: the public constructors, validation and backend dispatch.
//!
//! Logits are `[N, C]` f32, f16 or bf16 (computed in f32); labels `[N]` u32 or i32. A row
//! whose label equals the ignore index (optional, [`CrossEntropy::ignore_index`]) is left
//! out of the mean, which is over the counted rows (NaN when none counts, as PyTorch).
//!
//! # Out-of-range labels
//!
//! Labels live on the device, so a label outside `0..C` (and not the ignore index) cannot
//! be seen at submit time. On the CPU backend the op fails on completion with
//! [`Error::InvalidOp`] naming the row and label. On CUDA the kernels never read out of
//! bounds (the gather is clamped); the forward then gives a NaN loss and counts the bad
//! rows in its third output, [`CrossEntropyOutput::bad_labels`] (`[1]` u32, 0 when every
//! label is valid), and the backward writes NaN into those rows' gradients. Check it with
//! [`check_bad_labels`] (one download) when the labels are not trusted.

pub mod cpu;
mod cuda;

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Element, Error, ExecCx, Op, Outputs, Plan, PlanCx, Result,
    Runtime, Tensor, TensorSpec,
};

use cpu::Label;

use crate::cpu_util::Float;
use crate::kernels::{cpu_out, float_dispatch};

/// The outputs of [`cross_entropy`].
#[derive(Clone, Debug)]
pub struct CrossEntropyOutput {
    /// The mean loss over the counted rows, `[1]` f32.
    pub loss: Tensor,
    /// Each row's log-sum-exp, `[N]` f32 (what [`cross_entropy_backward`] needs).
    pub lse: Tensor,
    /// The number of rows with an out-of-range label, `[1]` u32 (always 0 on the CPU
    /// backend, which fails the op instead).
    pub bad_labels: Tensor,
}

impl Outputs for CrossEntropyOutput {
    const COUNT: Option<usize> = Some(3);
    fn from_tensors(t: Vec<Tensor>) -> Self {
        let mut it = t.into_iter();
        let mut n = || it.next().expect("three outputs");
        CrossEntropyOutput {
            loss: n(),
            lse: n(),
            bad_labels: n(),
        }
    }
}

/// Downloads `bad_labels` (from [`CrossEntropyOutput`]) and turns a nonzero count into
/// [`Error::InvalidOp`]. A host round trip: use it where the labels are not trusted.
pub fn check_bad_labels(rt: &Runtime, bad_labels: &Tensor) -> Result<()> {
    let n = rt.to_vec::<u32>(bad_labels)?.wait()?;
    match n.first() {
        Some(0) => Ok(()),
        Some(k) => Err(Error::invalid(
            "cross_entropy",
            format!("{k} labels outside 0..classes (and not the ignore index)"),
        )),
        None => Err(Error::invalid("cross_entropy", "empty bad-label count")),
    }
}

/// Cross-entropy forward, built by [`cross_entropy`].
pub struct CrossEntropy {
    logits: Tensor,
    labels: Tensor,
    ignore: Option<i64>,
}

/// Cross-entropy backward, built by [`cross_entropy_backward`].
pub struct CrossEntropyBackward {
    logits: Tensor,
    labels: Tensor,
    lse: Tensor,
    ignore: Option<i64>,
    scale: f32,
}

/// The mean cross-entropy of `logits [N, C]` against class indices `labels [N]` (u32 or
/// i32), with each row's log-sum-exp: `loss = mean_r (lse_r - logits[r, labels[r]])` over
/// the counted rows. See the module docs for ignored rows and out-of-range labels.
///
/// # Errors (at submit)
///
/// [`Error::InvalidDim`] unless logits are `[N, C]` and labels `[N]`,
/// [`Error::DTypeMismatch`] for non-float logits or labels that are not u32/i32,
/// [`Error::InvalidOp`] for sizes beyond the kernels' indices (`C`, `N` < 2^31).
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let logits = rt.upload(&[0.0f32, 0.0, 2.0, 0.0], [2, 2])?;
/// let labels = rt.upload(&[1u32, 0], [2])?;
/// let out = rt.submit(rtx_ops::cross_entropy(&logits, &labels))?.wait()?;
/// let loss = rt.to_vec::<f32>(&out.loss)?.wait()?[0];
/// let want = (2f32.ln() + (1.0 + (-2f32).exp()).ln()) / 2.0;
/// assert!((loss - want).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> CrossEntropy {
    CrossEntropy {
        logits: logits.clone(),
        labels: labels.clone(),
        ignore: None,
    }
}

/// The gradient of `scale · cross_entropy(logits, labels)` with respect to the logits:
/// `dlogits[r, c] = (softmax(logits[r])[c] - [c == labels[r]]) · scale / count`, 0 for
/// ignored rows; `lse` is the forward's [`CrossEntropyOutput::lse`]. `scale` carries the
/// upstream gradient of the loss and any loss scaling. Use the same ignore index as the
/// forward. The output has the logits' dtype.
///
/// # Errors (at submit)
///
/// As [`cross_entropy`], and [`Error::ShapeMismatch`] / [`Error::DTypeMismatch`] unless
/// `lse` is `[N]` f32.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let logits = rt.upload(&[0.0f32, 0.0], [1, 2])?;
/// let labels = rt.upload(&[1u32], [1])?;
/// let out = rt.submit(rtx_ops::cross_entropy(&logits, &labels))?.wait()?;
/// let dx = rt.submit(rtx_ops::cross_entropy_backward(&logits, &labels, &out.lse, 1.0))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&dx)?.wait()?, vec![0.5, -0.5]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn cross_entropy_backward(
    logits: &Tensor,
    labels: &Tensor,
    lse: &Tensor,
    scale: f32,
) -> CrossEntropyBackward {
    CrossEntropyBackward {
        logits: logits.clone(),
        labels: labels.clone(),
        lse: lse.clone(),
        ignore: None,
        scale,
    }
}

impl CrossEntropy {
    /// Leaves rows whose label is `index` out of the loss (PyTorch's `ignore_index`, e.g.
    /// -100 with i32 labels).
    pub fn ignore_index(mut self, index: i64) -> Self {
        self.ignore = Some(index);
        self
    }
    /// Gives the inputs back, `(logits, labels)`.
    pub fn into_inputs(self) -> (Tensor, Tensor) {
        (self.logits, self.labels)
    }
}

impl CrossEntropyBackward {
    /// Rows whose label is `index` get a zero gradient and are not counted (use the
    /// forward's index).
    pub fn ignore_index(mut self, index: i64) -> Self {
        self.ignore = Some(index);
        self
    }
    /// Gives the inputs back, `(logits, labels, lse)`.
    pub fn into_inputs(self) -> (Tensor, Tensor, Tensor) {
        (self.logits, self.labels, self.lse)
    }
}

/// Checks logits `[N, C]` and labels `[N]`; returns `(N, C)`.
fn check(name: &str, logits: &Tensor, labels: &Tensor) -> Result<(usize, usize)> {
    let &[rows, cols] = logits.dims() else {
        return Err(Error::invalid_dim(
            name,
            format!("logits must be [N, C], got {}", logits.shape()),
        ));
    };
    if !logits.dtype().is_float() {
        return Err(Error::dtype(name, DType::F32, logits.dtype()));
    }
    if !matches!(labels.dtype(), DType::U32 | DType::I32) {
        return Err(Error::dtype(name, DType::U32, labels.dtype()));
    }
    if labels.dims() != [rows] {
        return Err(Error::invalid_dim(
            name,
            format!(
                "labels must be [{rows}] for logits {}, got {}",
                logits.shape(),
                labels.shape()
            ),
        ));
    }
    if rows == 0 || cols == 0 {
        return Err(Error::invalid(
            name,
            format!("empty logits {}", logits.shape()),
        ));
    }
    if rows > i32::MAX as usize || cols > i32::MAX as usize {
        return Err(Error::invalid(
            name,
            format!("logits {}: N and C must be below 2^31", logits.shape()),
        ));
    }
    Ok((rows, cols))
}

/// The CPU label check: the typed error for the first out-of-range label.
fn labels_ok<L: Label>(
    name: &str,
    labels: &[L],
    cols: usize,
    ignore: Option<i64>,
) -> Result<usize> {
    let c = cpu::check_labels(labels, cols, ignore);
    match c.first_bad {
        None => Ok(c.counted),
        Some((row, label)) => Err(Error::invalid(
            name,
            format!("label {label} at row {row} is outside 0..{cols} (and not the ignore index)"),
        )),
    }
}

const FWD: &str = "cross_entropy";
const BWD: &str = "cross_entropy_backward";

impl Op for CrossEntropy {
    type Output = CrossEntropyOutput;
    fn name(&self) -> &'static str {
        FWD
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.logits, &self.labels]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let (rows, cols) = check(FWD, &self.logits, &self.labels)?;
        let n = rows * cols;
        Ok(Plan {
            outputs: vec![
                TensorSpec::new([1], DType::F32),
                TensorSpec::new([rows], DType::F32),
                TensorSpec::new([1], DType::U32),
            ],
            cost: Cost {
                flops: 4.0 * n as f64,
                bytes: (n * self.logits.dtype().size() + 8 * rows) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (rows, cols) = (self.labels.numel(), self.logits.dims()[1]);
        let (dtype, ldtype, ignore) = (self.logits.dtype(), self.labels.dtype(), self.ignore);
        let x = cx.input(&self.logits)?;
        let labels = cx.input(&self.labels)?;
        let [loss, lse, bad] = match cx.backend() {
            BackendCx::Cpu => float_dispatch!(dtype, FWD, |T| match ldtype {
                DType::I32 => forward_cpu::<T, i32>(&x, &labels, cols, ignore),
                _ => forward_cpu::<T, u32>(&x, &labels, cols, ignore),
            }),
            BackendCx::Cuda(scx) => {
                cuda::forward(scx, dtype, ldtype, &x, &labels, rows, cols, ignore)
            }
        }?;
        cx.set_output(0, loss)?;
        cx.set_output(1, lse)?;
        cx.set_output(2, bad)
    }
}

fn forward_cpu<T: Float + Element, L: Label + Element>(
    x: &Buffer,
    labels: &Buffer,
    cols: usize,
    ignore: Option<i64>,
) -> Result<[Buffer; 3]> {
    let (x, labels) = (x.cpu::<T>()?, labels.cpu::<L>()?);
    labels_ok(FWD, labels, cols, ignore)?;
    let mut lse = cpu_out::<f32>(labels.len());
    let loss = cpu::forward(x, labels, cols, ignore, &mut lse);
    Ok([
        Buffer::from_vec(vec![loss as f32]),
        Buffer::from_vec(lse),
        Buffer::from_vec(vec![0u32]),
    ])
}

impl Op for CrossEntropyBackward {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        BWD
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.logits, &self.labels, &self.lse]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let (rows, cols) = check(BWD, &self.logits, &self.labels)?;
        if self.lse.dtype() != DType::F32 {
            return Err(Error::dtype(BWD, DType::F32, self.lse.dtype()));
        }
        if self.lse.dims() != [rows] {
            return Err(Error::shape(
                BWD,
                self.labels.shape(),
                self.lse.shape(),
                "lse must be [N], as the forward gives it",
            ));
        }
        let n = rows * cols;
        Ok(Plan {
            outputs: vec![TensorSpec::new(
                self.logits.shape().clone(),
                self.logits.dtype(),
            )],
            cost: Cost {
                flops: 4.0 * n as f64,
                bytes: (2 * n * self.logits.dtype().size() + 8 * rows) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (rows, cols) = (self.labels.numel(), self.logits.dims()[1]);
        let (dtype, ldtype) = (self.logits.dtype(), self.labels.dtype());
        let (ignore, scale) = (self.ignore, self.scale);
        let x = cx.input(&self.logits)?;
        let labels = cx.input(&self.labels)?;
        let lse = cx.input(&self.lse)?;
        let out = match cx.backend() {
            BackendCx::Cpu => float_dispatch!(dtype, BWD, |T| match ldtype {
                DType::I32 => backward_cpu::<T, i32>(&x, &labels, &lse, cols, ignore, scale),
                _ => backward_cpu::<T, u32>(&x, &labels, &lse, cols, ignore, scale),
            }),
            BackendCx::Cuda(scx) => cuda::backward(
                scx, dtype, ldtype, &x, &labels, &lse, rows, cols, ignore, scale,
            ),
        }?;
        cx.set_output(0, out)
    }
}

fn backward_cpu<T: Float + Element, L: Label + Element>(
    x: &Buffer,
    labels: &Buffer,
    lse: &Buffer,
    cols: usize,
    ignore: Option<i64>,
    scale: f32,
) -> Result<Buffer> {
    let (x, labels, lse) = (x.cpu::<T>()?, labels.cpu::<L>()?, lse.cpu::<f32>()?);
    let count = labels_ok(BWD, labels, cols, ignore)?;
    let mut dx = cpu_out::<T>(x.len());
    cpu::backward(x, labels, lse, cols, ignore, scale, count, &mut dx);
    Ok(Buffer::from_vec(dx))
}
