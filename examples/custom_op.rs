//! An op of your own: implement [`rtx::Op`] and submit it like any library op.
//!
//! ```sh
//! cargo run --example custom_op
//! ```
//!
//! The op here, `axpb`, computes `y = a·x + b` element-wise on f32. It shows the parts of
//! the contract:
//!
//! - `inputs` names every tensor the op reads (the runtime waits for their producers);
//! - `plan` runs on the submitting thread, before anything is enqueued: it validates and
//!   declares the outputs, and a refusal gives the op back inside `SubmitError`;
//! - `run` runs on the stream's actor thread, reads inputs through `ExecCx::input` and
//!   sets every output;
//! - an in-place variant takes its input by value and asks `ExecCx::donate` for the
//!   memory (granted only when that handle was the last one).
//!
//! This op has a CPU implementation only; on the CUDA backend it reports a typed error.
//! `docs/writing-an-op.md` and the families under `ops/src/` (e.g. `ops/src/elementwise`)
//! show the CUDA side: a kernel from `kernels/cuda/`, launched on the actor's stream.

use rtx::{
    Backend, BackendCx, Buffer, Cost, DType, Error, ExecCx, Op, Plan, PlanCx, Runtime, Tensor,
    TensorSpec,
};

/// `y = a·x + b`, element-wise, f32.
struct Axpb {
    x: Tensor,
    a: f32,
    b: f32,
    /// Write into `x`'s memory when this is the last handle to it.
    in_place: bool,
}

/// `a·x + b`, into fresh memory; `x` stays usable.
fn axpb(x: &Tensor, a: f32, b: f32) -> Axpb {
    Axpb {
        x: x.clone(),
        a,
        b,
        in_place: false,
    }
}

/// `a·x + b`, in `x`'s memory when `x` is the last handle (the caller gives it up).
fn axpb_(x: Tensor, a: f32, b: f32) -> Axpb {
    Axpb {
        x,
        a,
        b,
        in_place: true,
    }
}

impl Op for Axpb {
    type Output = Tensor;

    fn name(&self) -> &'static str {
        "axpb"
    }

    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }

    fn plan(&self, _cx: &PlanCx) -> rtx::Result<Plan> {
        if self.x.dtype() != DType::F32 {
            return Err(Error::dtype(self.name(), DType::F32, self.x.dtype()));
        }
        if !self.a.is_finite() || !self.b.is_finite() {
            return Err(Error::invalid(self.name(), "a and b must be finite"));
        }
        let n = self.x.numel() as f64;
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.x.shape().clone(), DType::F32)],
            cost: Cost {
                flops: 2.0 * n,
                bytes: 8.0 * n,
            },
        })
    }

    fn run(&mut self, cx: &mut ExecCx<'_>) -> rtx::Result<()> {
        if !matches!(cx.backend(), BackendCx::Cpu) {
            return Err(Error::invalid(
                "axpb",
                "this example op has only a CPU implementation",
            ));
        }
        let (a, b) = (self.a, self.b);
        if self.in_place {
            if let Some(mut buf) = cx.donate(&mut self.x) {
                for v in buf.cpu_mut::<f32>()? {
                    *v = a * *v + b;
                }
                return cx.set_output(0, buf);
            }
        }
        let x = cx.input(&self.x)?;
        let y: Vec<f32> = x.cpu::<f32>()?.iter().map(|v| a * v + b).collect();
        cx.set_output(0, Buffer::from_vec(y))
    }
}

fn main() -> Result<(), rtx::Error> {
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(2)
        .build()?;
    let x = rt.upload(&[1.0f32, 2.0, 3.0, 4.0], [4])?;

    // A custom op mixes with library ops: the handles flow between them.
    let y = rt.submit(axpb(&x, 2.0, 1.0))?; // [3, 5, 7, 9]
    let z = rt.submit(rtx::ops::mul(y.outputs().expect("one output"), &x))?; // [3, 10, 21, 36]
    let z = z.wait()?;
    let zs: Vec<f32> = rt.to_vec(&z)?.wait()?;
    println!("(2x + 1)·x = {zs:?}");
    assert_eq!(zs, [3.0, 10.0, 21.0, 36.0]);

    // In place: `z` is given up, so the op may reuse its memory.
    let w = rt.submit(axpb_(z, 0.5, -1.0))?.wait()?;
    let ws: Vec<f32> = rt.to_vec(&w)?.wait()?;
    println!("0.5·z - 1 = {ws:?}");
    assert_eq!(ws, [0.5, 4.0, 9.5, 17.0]);

    // Refused at submit, with the op given back.
    let ints = rt.upload(&[1i32, 2, 3], [3])?;
    let rejected = rt.submit(axpb(&ints, 1.0, 0.0)).unwrap_err();
    println!("refused: {}", rejected.error);
    assert!(matches!(rejected.error, Error::DTypeMismatch { .. }));
    let op = rejected.into_op();
    assert_eq!(op.x.numel(), 3);
    Ok(())
}
