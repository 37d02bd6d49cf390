//! Out-of-device-memory is a typed error with the requested and available bytes, the
//! runtime goes on afterwards. Runs only where a CUDA device is present (required under
//! `RTX_REQUIRE_CUDA=1`).

use rtx::ops::elementwise as ew;
use rtx::{
    Backend, Buffer, Cost, Error, ExecCx, Op, Plan, PlanCx, Result, Runtime, Tensor, TensorSpec,
};

/// Declares an output of `n` f32 elements (shape `[n]`) and allocates it.
struct Huge(usize);

impl Op for Huge {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "huge"
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

#[test]
fn out_of_memory_is_typed_and_recoverable() {
    match rtx::cuda::probe() {
        Ok(n) if n > 0 => {}
        other => {
            if std::env::var("RTX_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("RTX_REQUIRE_CUDA=1 but CUDA is unavailable: {other:?}");
            }
            eprintln!("cuda: skipped (no device)");
            return;
        }
    }
    let rt = Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(1)
        .build()
        .unwrap();
    let n = 1usize << 42; // 16 TiB of f32
    match rt.submit(Huge(n)).unwrap().wait() {
        Err(Error::OutOfMemory {
            requested,
            available,
            ..
        }) => {
            assert_eq!(requested, n * 4);
            assert!(available < requested, "available {available} bytes");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // The stream and the device still work.
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let y = rt.submit(ew::add(&a, &a)).unwrap().wait().unwrap();
    assert_eq!(rt.to_vec::<f32>(&y).unwrap().wait().unwrap(), [2.0, 4.0]);
}
