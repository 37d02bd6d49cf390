//! A pipeline's steps as a graph ([`PipelineConfig::graph`](super::PipelineConfig)).
//!
//! At its first step the pipeline captures one whole training step — forward,
//! cross-entropy, backward, optimizer — through the capture's runtime handle
//! (`Capture::runtime`, so the model's and the optimizer's code is captured unchanged)
//! and then launches the graph once per step, the first included (the capture's own
//! warm-up run changes no state, so launch `k` is step `k`, with the same ops in the same
//! order as the eager step: equal losses).
//!
//! What a step carries to the next lives in the graph as **states**
//! (`Capture::state`), each updated at the end of a launch by the step's new value:
//! the parameters, the optimizer's moments (and f32 masters), and AdamW's step counter,
//! a one-element tensor the graph advances by one before the optimizer reads it
//! (`Step::step_count`), so the bias correction is right on every launch. The batch
//! (features and labels) are the graph's bound inputs, uploaded per step as in the
//! eager pipeline; the loss is its output, copied out only on the steps it is read.
//!
//! Ownership: while the graph runs, the model's and the optimizer's tensors are the
//! values they had before the first step (the graph holds its own copies);
//! `Pipeline::finish` copies the graph's states back into them (and the optimizer's step
//! count), so evaluation and reports see the trained model. Graphs need a single
//! stream (no data parallelism).

use rtx_ops::add_scalar_;
use rtx_runtime::{Graph, Result, Tensor};

use super::Pipeline;

impl Pipeline {
    /// Captures one training step on the pipeline's stream, with `x0`, `y0` (the first
    /// batch) as the examples of its bound inputs. The model and the optimizer hold
    /// their own tensors again afterwards, whether the capture succeeded or not.
    pub(super) fn capture_step(&mut self, x0: &Tensor, y0: &Tensor) -> Result<Graph> {
        let stream = self.cfg.streams[0];
        let rt = self.rt.clone();
        let t_before = self.opt.steps();
        let t0 = rt.upload(&[t_before as f32], [1])?;
        let (model, opt) = (&mut self.model, &mut self.opt);
        let mut saved_params: Vec<Tensor> = Vec::new();
        let mut saved_opt: Vec<Tensor> = Vec::new();
        let captured = rt.capture(|c| {
            let rc = c.runtime().on(stream);
            let x = c.input(x0)?;
            let y = c.input(y0)?;
            let mut pstates = Vec::new();
            for p in model.params().iter_mut() {
                let s = c.state(p.value())?;
                saved_params.push(p.value().clone());
                p.set_value(s.clone())?;
                pstates.push(s);
            }
            let mut ostates = Vec::new();
            for slot in opt.carried_mut() {
                let s = c.state(slot)?;
                saved_opt.push(std::mem::replace(slot, s.clone()));
                ostates.push(s);
            }
            let t = c.state(&t0)?;
            // In place: the counter, like every other state of the step, is rewritten by
            // its update's op and needs no copy at the launch's end.
            let t1 = rc.run(add_scalar_(t.clone(), 1.0))?;
            opt.set_device_step(Some(t1.clone()));
            let loss = model.loss_backward(&rc, &x, &y, 1.0)?;
            opt.step(&rc, &mut model.params())?;
            for (s, p) in pstates.iter().zip(model.params().iter()) {
                c.update(s, p.value())?;
            }
            for (s, slot) in ostates.iter().zip(opt.carried_mut()) {
                c.update(s, slot)?;
            }
            c.update(&t, &t1)?;
            c.output(&loss)?;
            Ok(())
        });
        // Whatever happened, the model and the optimizer get their own tensors back
        // (and the step count: the recorded step was not a step).
        self.opt.set_device_step(None);
        self.opt.set_steps(t_before);
        for (p, v) in self.model.params().iter_mut().zip(saved_params) {
            p.set_value(v)?;
            p.take_grad();
        }
        for (slot, v) in self.opt.carried_mut().into_iter().zip(saved_opt) {
            *slot = v;
        }
        let graph = captured?;
        self.graph_t0 = t_before;
        Ok(graph)
    }

    /// Launches the captured step on `x`, `y`; the loss when `read` (a fresh tensor).
    pub(super) fn launch_step(
        &mut self,
        x: &Tensor,
        y: &Tensor,
        read: bool,
    ) -> Result<Option<Tensor>> {
        let graph = self
            .graph
            .as_mut()
            .expect("captured before the first launch");
        let mut launch = graph.launch(&[x, y])?;
        if read {
            Ok(Some(launch.output(0)?))
        } else {
            Ok(None)
        }
    }

    /// Copies the graph's states back into the model and the optimizer (see the module
    /// docs); nothing without a graph.
    pub(super) fn sync_from_graph(&mut self) -> Result<()> {
        let Some(graph) = self.graph.as_mut() else {
            return Ok(());
        };
        let mut i = 0;
        for p in self.model.params().iter_mut() {
            p.set_value(graph.state(i)?)?;
            i += 1;
        }
        for slot in self.opt.carried_mut() {
            *slot = graph.state(i)?;
            i += 1;
        }
        self.opt.set_steps(self.graph_t0 + graph.launches());
        Ok(())
    }
}
