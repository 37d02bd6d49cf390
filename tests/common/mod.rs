//! Shared helpers of the facade's integration tests.
#![allow(dead_code)]

use rtx::{Buffer, Cost, ExecCx, Op, Plan, PlanCx, Result, Tensor, TensorSpec};

/// Whether a CUDA device is present (`rtx::cuda::present_for_tests`: skips with a
/// message without one, panics instead under `RTX_REQUIRE_CUDA=1`).
pub fn cuda_present() -> bool {
    rtx::cuda::present_for_tests()
}

/// Declares an output of `n` f32 elements (shape `[n]`) and allocates it on the
/// device, writing nothing (its contents are never read).
pub struct AllocF32(pub usize);

impl Op for AllocF32 {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "alloc"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan {
            outputs: vec![TensorSpec::new([self.0], rtx::DType::F32)],
            cost: Cost::default(),
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let y = cx.cuda()?.alloc::<f32>(self.0)?;
        cx.set_output(0, Buffer::from_cuda(y))
    }
}
