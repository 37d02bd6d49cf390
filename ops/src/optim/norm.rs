//! [`grad_norm`]: the global L2 norm of a list of tensors, as a one-element device tensor.

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Error, ExecCx, Op, Plan, PlanCx, Result, Tensor, TensorSpec,
};

use crate::kernels::float_dispatch;

/// The global norm of a list of tensors, built by [`grad_norm`].
pub struct GradNorm {
    xs: Vec<Tensor>,
}

impl GradNorm {
    /// Gives the inputs back (for instance from a rejected submission).
    pub fn into_inputs(self) -> Vec<Tensor> {
        self.xs
    }
}

/// `sqrt(sum over every element of every tensor of x^2)` as an f32 tensor of shape
/// `[1]`, computed on the device (f32 partial sums per block, combined in a fixed
/// order: deterministic; f64 on the CPU). Feed it to [`super::Step::clip_grad_norm`].
///
/// # Errors (at submit)
///
/// [`Error::InvalidOp`] for an empty list, [`Error::DTypeMismatch`] for a non-float
/// tensor.
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let a = rt.upload(&[3.0f32], [1])?;
/// let b = rt.upload(&[4.0f32, 0.0], [2])?;
/// let n = rt.submit(rtx_ops::optim::grad_norm(&[a, b]))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&n)?.wait()?, vec![5.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn grad_norm(xs: &[Tensor]) -> GradNorm {
    GradNorm { xs: xs.to_vec() }
}

const NAME: &str = "grad_norm";

impl Op for GradNorm {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        NAME
    }
    fn inputs(&self) -> Vec<&Tensor> {
        self.xs.iter().collect()
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        if self.xs.is_empty() {
            return Err(Error::invalid(NAME, "no tensors"));
        }
        let mut bytes = 0usize;
        for x in &self.xs {
            if !x.dtype().is_float() {
                return Err(Error::dtype(NAME, DType::F32, x.dtype()));
            }
            bytes = bytes
                .checked_add(x.numel() * x.dtype().size())
                .ok_or_else(|| Error::invalid(NAME, "sizes overflow usize"))?;
        }
        Ok(Plan {
            outputs: vec![TensorSpec::new([1], DType::F32)],
            cost: Cost {
                flops: bytes as f64,
                bytes: bytes as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let bufs = self
            .xs
            .iter()
            .map(|x| cx.input(x))
            .collect::<Result<Vec<_>>>()?;
        let parts: Vec<(&Buffer, DType)> = bufs
            .iter()
            .zip(&self.xs)
            .map(|(b, x)| (&**b, x.dtype()))
            .collect();
        let out = match cx.backend() {
            BackendCx::Cpu => {
                let mut s = 0f64;
                for (b, d) in &parts {
                    s += float_dispatch!(*d, NAME, |T| Ok(super::cpu::sumsq(b.cpu::<T>()?)))?;
                }
                Buffer::from_vec(vec![s.sqrt() as f32])
            }
            BackendCx::Cuda(scx) => super::cuda::grad_norm(scx, &parts)?,
        };
        cx.set_output(0, out)
    }
}
