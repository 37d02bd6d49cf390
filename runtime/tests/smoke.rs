use rtx_runtime::*;

/// y = a + b (f32), a minimal op for protocol tests.
struct Add {
    a: Tensor,
    b: Tensor,
}
impl Op for Add {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "add"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.a, &self.b]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        if self.a.shape() != self.b.shape() {
            return Err(Error::shape("add", self.a.shape(), self.b.shape(), ""));
        }
        Ok(Plan::like(&self.a))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let a = cx.input(&self.a)?;
        let b = cx.input(&self.b)?;
        let y: Vec<f32> = a
            .cpu::<f32>()?
            .iter()
            .zip(b.cpu::<f32>()?)
            .map(|(x, y)| x + y)
            .collect();
        cx.set_output(0, Buffer::from_vec(y))
    }
}

#[test]
fn chain_across_streams() {
    let rt = Runtime::cpu(4);
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let mut x = a.clone();
    for i in 0..100 {
        let s = rt.compute_streams(rt.device())[i % 4];
        x = rt
            .submit_on(s, Add { a: x, b: a.clone() })
            .unwrap()
            .outputs()
            .unwrap()
            .clone();
    }
    let v = block_on(rt.to_vec::<f32>(&x).unwrap()).unwrap();
    assert_eq!(v, vec![101.0, 202.0]);
}

#[test]
fn bad_shape_gives_op_back() {
    let rt = Runtime::cpu(1);
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let b = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
    let e = rt.submit(Add { a, b }).unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{}",
        e.error
    );
    let op = e.into_op();
    assert_eq!(op.b.numel(), 3);
}
