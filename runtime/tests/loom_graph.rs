//! Loom model of a graph's launches (`runtime/src/runtime/graph/`): the graph's buffers are
//! shared by its segments on two stream actors and rewritten by every launch, so a
//! launch must not begin before the previous one (and the copies of its outputs) are
//! done. The model captures a two-stream graph (`y = x + 1` on stream 0, `z = y + 10`
//! on stream 1: a cross-stream edge), launches it twice with different inputs without
//! waiting in between, and checks each launch's output. A launch that overtook the
//! previous one would hand stream 1's segment of launch 1 the `y` of launch 2.
//!
//! Run like the other models (`docs/loom-plants.md`); plant 13 removes the ordering.
#![cfg(loom)]

use rtx_runtime::*;

/// `x + add` (f32).
struct Plus {
    x: Tensor,
    add: f32,
}

impl Op for Plus {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "plus"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.x))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let x = cx.input(&self.x)?.cpu::<f32>()?.to_vec();
        cx.set_output(
            0,
            Buffer::from_vec(x.iter().map(|v| v + self.add).collect()),
        )
    }
}

#[test]
fn graph_launches_do_not_overlap() {
    let mut b = loom::model::Builder::new();
    // Two actors and a dozen ops: one preemption keeps the model small enough for CI (two
    // ran for many minutes); plant 16 is caught at this bound (docs/loom-plants.md).
    b.preemption_bound = Some(1);
    b.check(|| {
        let rt = Runtime::builder()
            .backend(Backend::Cpu)
            .streams(2)
            .mailbox(8)
            .build()
            .unwrap();
        let s = rt.compute_streams(rt.device());
        let x0 = rt.upload(&[0.0f32], [1]).unwrap();
        let mut graph = rt
            .capture(|c| {
                let x = c.input(&x0)?;
                let y = c.submit_on(s[0], Plus { x, add: 1.0 })?;
                let z = c.submit_on(s[1], Plus { x: y, add: 10.0 })?;
                c.output(&z)?;
                Ok(())
            })
            .unwrap();
        let a = rt.upload(&[1.0f32], [1]).unwrap();
        let b = rt.upload(&[100.0f32], [1]).unwrap();
        let first = graph.launch(&[&a]).unwrap().output(0).unwrap();
        let second = graph.launch(&[&b]).unwrap().output(0).unwrap();
        let v1 = rt.to_vec::<f32>(&first).unwrap().wait().unwrap();
        let v2 = rt.to_vec::<f32>(&second).unwrap().wait().unwrap();
        assert_eq!(v1, [12.0], "launch 1 read launch 2's buffers");
        assert_eq!(v2, [111.0]);
        drop(graph);
    });
}
