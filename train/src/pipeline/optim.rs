//! The optimizer of a pipeline: SGD or AdamW as one fused multi-tensor step per
//! training step (`rtx_ops::optim`), its states owned here, and for mixed precision the
//! f32 master weights of a bf16 / f16 model.

use rtx_ops::convert::{cast, zeros};
use rtx_ops::optim::{adamw, sgd, AdamW, Sgd};
use rtx_runtime::{DType, Error, Result, Runtime, Tensor};

use crate::param::Parameters;

/// Which rule and its hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerConfig {
    /// SGD (with momentum when `momentum > 0`).
    Sgd(Sgd),
    /// AdamW.
    AdamW(AdamW),
}

impl OptimizerConfig {
    /// A short name with the learning rate, e.g. `adamw lr=0.003`.
    pub fn label(&self) -> String {
        match self {
            OptimizerConfig::Sgd(s) if s.momentum > 0.0 => {
                format!("sgd+m lr={}", s.lr)
            }
            OptimizerConfig::Sgd(s) => format!("sgd lr={}", s.lr),
            OptimizerConfig::AdamW(a) => format!("adamw lr={}", a.lr),
        }
    }
    fn states(&self) -> usize {
        match self {
            OptimizerConfig::Sgd(s) if s.momentum > 0.0 => 1,
            OptimizerConfig::Sgd(_) => 0,
            OptimizerConfig::AdamW(_) => 2,
        }
    }
}

/// An optimizer bound to one model's parameters: its step count, its states (zeros at
/// the start) and, when the model computes in f16 / bf16, the f32 master weights the
/// step updates (writing the model's low-precision copies in the same kernel).
#[derive(Debug)]
pub struct Optimizer {
    cfg: OptimizerConfig,
    t: u64,
    /// `states[k][i]`: state `k` (SGD: momentum; AdamW: m, v) of parameter `i`.
    states: Vec<Vec<Tensor>>,
    /// The f32 masters, for a low-precision model.
    master: Option<Vec<Tensor>>,
    /// AdamW's step number on the device, when the step is captured into a graph
    /// (`Step::step_count`): then the host count `t` is not what the kernel reads.
    device_step: Option<Tensor>,
}

impl Optimizer {
    /// An optimizer for `params` (their current values start the masters when they are
    /// f16 / bf16); the states are allocated on `rt` (zeros, submitted).
    pub fn new(rt: &Runtime, cfg: OptimizerConfig, params: &Parameters<'_>) -> Result<Self> {
        let values: Vec<&Tensor> = params.iter().map(|p| p.value()).collect();
        let low = values.iter().any(|v| v.dtype() != DType::F32);
        let master = if low {
            Some(
                values
                    .iter()
                    .map(|v| rt.run(cast(v, DType::F32)))
                    .collect::<Result<Vec<_>>>()?,
            )
        } else {
            None
        };
        let states = (0..cfg.states())
            .map(|_| {
                values
                    .iter()
                    .map(|v| rt.run(zeros(v.shape().clone(), DType::F32)))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Optimizer {
            cfg,
            t: 0,
            states,
            master,
            device_step: None,
        })
    }

    /// The tensors the optimizer carries from step to step (the states, then the f32
    /// masters), in a fixed order: a captured step makes each a graph state.
    pub(crate) fn carried_mut(&mut self) -> Vec<&mut Tensor> {
        let mut v: Vec<&mut Tensor> = self.states.iter_mut().flatten().collect();
        if let Some(m) = self.master.as_mut() {
            v.extend(m.iter_mut());
        }
        v
    }

    /// Makes the steps read AdamW's step number from `t` (a one-element f32 tensor on
    /// the device), or from the host count again with `None`.
    pub(crate) fn set_device_step(&mut self, t: Option<Tensor>) {
        self.device_step = t;
    }

    /// Sets the count of steps taken (after steps run by a graph).
    pub(crate) fn set_steps(&mut self, t: u64) {
        self.t = t;
    }

    /// The configuration.
    pub fn config(&self) -> OptimizerConfig {
        self.cfg
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.t
    }

    /// One step over `params` with the gradients their last backward stored;
    /// submissions only. The parameters (or the masters) and the states are donated to
    /// the step, which writes them in place.
    pub fn step(&mut self, rt: &Runtime, params: &mut Parameters<'_>) -> Result<()> {
        let grads: Vec<Tensor> = params
            .iter()
            .map(|p| {
                p.grad().cloned().ok_or_else(|| {
                    Error::invalid("Optimizer::step", format!("{} has no gradient", p.name()))
                })
            })
            .collect::<Result<_>>()?;
        let t = self.t + 1;
        let mut states = std::mem::take(&mut self.states).into_iter();
        let cfg = self.cfg;
        let device_step = self.device_step.clone();
        let build = move |p: Vec<Tensor>, s: &mut std::vec::IntoIter<Vec<Tensor>>| match cfg {
            OptimizerConfig::Sgd(c) => sgd(c, p, &grads, s.next().unwrap_or_default()),
            OptimizerConfig::AdamW(c) => {
                let m = s.next().unwrap_or_default();
                let v = s.next().unwrap_or_default();
                let step = adamw(c, t, p, &grads, m, v);
                match &device_step {
                    Some(d) => step.step_count(d),
                    None => step,
                }
            }
        };
        let result = match self.master.take() {
            Some(master) => {
                let dtype = params
                    .iter()
                    .next()
                    .map_or(DType::F32, |p| p.value().dtype());
                // The low-precision values are donated as the copies' destinations: the
                // step rewrites them in place (in a captured step too, where they are
                // graph states).
                let olds: Vec<Tensor> = params
                    .iter_mut()
                    .map(|p| p.take_value().expect("a parameter has a value"))
                    .collect();
                let op = build(master, &mut states).with_copy(dtype).copy_into(olds);
                let layout = op.layout();
                match rt.submit(op) {
                    Ok(sub) => {
                        let out = layout.split(sub.outputs().cloned().unwrap_or_default());
                        self.master = Some(out.params);
                        self.states = out.states;
                        for (p, c) in params.iter_mut().zip(out.copies) {
                            p.restore_value(c);
                        }
                        Ok(())
                    }
                    Err(mut e) => {
                        // Everything goes back, so the optimizer and the model stay usable.
                        for (p, old) in params.iter_mut().zip(e.op.take_copy_dsts()) {
                            p.restore_value(old);
                        }
                        let (master, _, m, v) = e.op.into_tensors();
                        self.master = Some(master);
                        self.states = [m, v].into_iter().filter(|s| !s.is_empty()).collect();
                        Err(e.error)
                    }
                }
            }
            None => {
                let mut states_out = Vec::new();
                let r = params.update_all(|p| {
                    let op = build(p, &mut states);
                    let layout = op.layout();
                    match rt.submit(op) {
                        Ok(sub) => {
                            let out = layout.split(sub.outputs().cloned().unwrap_or_default());
                            states_out = out.states;
                            Ok(out.params)
                        }
                        Err(e) => {
                            // The states go back too, so the optimizer stays usable.
                            let (p, _, m, v) = e.op.into_tensors();
                            states_out = [m, v].into_iter().filter(|s| !s.is_empty()).collect();
                            Err(Box::new((e.error, p)))
                        }
                    }
                });
                self.states = states_out;
                r
            }
        };
        if result.is_ok() {
            self.t = t;
        }
        result
    }
}
