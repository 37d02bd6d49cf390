//! Optimizers over a model's [`Parameters`]: one fused multi-tensor op per step,
//! updating the parameters in place by donation.

use rtx_ops::optim::{adamw, AdamW as AdamWConfig};
use rtx_runtime::{Error, Result, Runtime, Tensor};

use crate::param::Parameters;

/// AdamW (decoupled weight decay, bias correction; as `torch.optim.AdamW`) over a fixed
/// parameter list: the moments start at zero at the first [`AdamW::step`], which also
/// fixes the list's shapes.
#[derive(Debug)]
pub struct AdamW {
    cfg: AdamWConfig,
    t: u64,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl AdamW {
    /// An optimizer with these hyperparameters (`rtx_ops::optim::AdamW`, PyTorch's
    /// defaults by `Default`).
    pub fn new(cfg: AdamWConfig) -> Self {
        AdamW {
            cfg,
            t: 0,
            m: Vec::new(),
            v: Vec::new(),
        }
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.t
    }

    /// One step over `params` (each must have its gradient): one `adamw` submission
    /// that writes the parameters in place when their handles are unique. A rejected
    /// step leaves the parameters as they were.
    pub fn step(&mut self, rt: &Runtime, mut params: Parameters<'_>) -> Result<()> {
        let mut grads = Vec::with_capacity(params.len());
        for p in params.iter() {
            let g = p.grad().ok_or_else(|| {
                Error::invalid("AdamW::step", format!("{} has no gradient", p.name()))
            })?;
            grads.push(g.clone());
        }
        if self.t == 0 {
            for p in params.iter() {
                let z = || rt.run(rtx_ops::zeros(p.value().shape().clone(), p.value().dtype()));
                self.m.push(z()?);
                self.v.push(z()?);
            }
        } else if self.m.len() != params.len() {
            let msg = format!(
                "{} parameters, the optimizer has {}",
                params.len(),
                self.m.len()
            );
            return Err(Error::invalid("AdamW::step", msg));
        }
        let values: Vec<Tensor> = params
            .iter_mut()
            .map(|p| p.take_value().expect("a parameter has a value"))
            .collect();
        let (m, v) = (std::mem::take(&mut self.m), std::mem::take(&mut self.v));
        let op = adamw(self.cfg, self.t + 1, values, &grads, m, v);
        let layout = op.layout();
        match rt.submit(op) {
            Ok(sub) => {
                let outs = sub.into_outputs().expect("an op's outputs");
                let out = layout.split(outs);
                for (p, nv) in params.iter_mut().zip(out.params) {
                    p.restore_value(nv);
                }
                let mut states = out.states.into_iter();
                self.m = states.next().unwrap_or_default();
                self.v = states.next().unwrap_or_default();
                self.t += 1;
                Ok(())
            }
            Err(e) => {
                let (values, _, m, v) = e.op.into_tensors();
                for (p, old) in params.iter_mut().zip(values) {
                    p.restore_value(old);
                }
                (self.m, self.v) = (m, v);
                Err(e.error)
            }
        }
    }
}
