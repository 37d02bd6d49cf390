//! The sweep workload: 8 heterogeneous MLP classifiers (widths, depths, optimizers and
//! learning rates differ) trained at once on one synthetic teacher task
//! ([`TeacherTask`]). The same models, batch and steps are in
//! `benches/torch_sweep.py` (its `MODELS` list), for the comparison with PyTorch.

use std::sync::Arc;

use rtx_ops::optim::{AdamW, Sgd};
use rtx_runtime::{DType, Result, Runtime, StreamId};

use super::{
    assign_streams, Batches, OptimizerConfig, Pipeline, PipelineConfig, Task, TeacherTask,
};
use crate::init::derive_seed;
use crate::{Cnn, CnnConfig, Mlp, MlpConfig, StackedMlp};

/// One model of the sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// Its name, e.g. `mlp-512x3`.
    pub name: String,
    /// Hidden width.
    pub width: usize,
    /// Linear layers (hidden layers + the output layer).
    pub depth: usize,
    /// The optimizer.
    pub opt: OptimizerConfig,
}

/// The size of a sweep run.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepConfig {
    /// Input features.
    pub dim: usize,
    /// Classes.
    pub classes: usize,
    /// Rows per batch.
    pub batch: usize,
    /// Steps per model.
    pub steps: u64,
    /// Hidden widths are the full sweep's divided by this (1 on the GPU).
    pub width_div: usize,
    /// Loss read back every this many steps.
    pub loss_every: u64,
    /// The models' compute dtype: f32, or bf16 with f32 master weights (the
    /// optimizer keeps them).
    pub dtype: DType,
    /// The task's seed.
    pub seed: u64,
    /// Run each model's steps as a graph ([`PipelineConfig::graph`]).
    pub graphs: bool,
    /// Keep the batches on the device after the first epoch
    /// ([`PipelineConfig::resident`]).
    pub resident: bool,
    /// Batches uploaded this many steps ahead ([`PipelineConfig::prefetch`]).
    pub prefetch: usize,
}

impl SweepConfig {
    /// The full sweep (the GPU run): 256-d inputs, 10 classes, batch 512, 200 steps,
    /// widths 128-2048, bf16 compute with f32 masters.
    pub fn full() -> Self {
        SweepConfig {
            dim: 256,
            classes: 10,
            batch: 512,
            steps: 200,
            width_div: 1,
            loss_every: 10,
            dtype: DType::BF16,
            seed: 2026,
            graphs: false,
            resident: false,
            prefetch: super::DEFAULT_PREFETCH,
        }
    }
    /// The CPU run, scaled to finish in well under two minutes on two cores: 64-d
    /// inputs, batch 256, 300 steps, widths divided by 8 (16-256), f32.
    pub fn cpu() -> Self {
        SweepConfig {
            dim: 64,
            batch: 256,
            steps: 300,
            width_div: 8,
            dtype: DType::F32,
            ..SweepConfig::full()
        }
    }

    /// The teacher task of this sweep.
    pub fn task(&self) -> TeacherTask {
        TeacherTask {
            dim: self.dim,
            hidden: 64,
            classes: self.classes,
            noise: 0.05,
            seed: self.seed,
        }
    }

    /// The 8 models: widths 128-2048 (divided by `width_div`), depths 2-4, SGD with
    /// momentum and AdamW at several learning rates.
    pub fn models(&self) -> Vec<ModelSpec> {
        let adamw = |lr| {
            OptimizerConfig::AdamW(AdamW {
                lr,
                weight_decay: 0.0,
                ..AdamW::default()
            })
        };
        let sgd = |lr, momentum| {
            OptimizerConfig::Sgd(Sgd {
                lr,
                momentum,
                nesterov: false,
                weight_decay: 0.0,
            })
        };
        let list = [
            (128, 2, adamw(3e-3)),
            (256, 3, sgd(0.05, 0.9)),
            (512, 3, adamw(1e-3)),
            (512, 4, sgd(0.1, 0.9)),
            (1024, 2, adamw(1e-3)),
            (1024, 3, sgd(0.05, 0.9)),
            (2048, 2, adamw(5e-4)),
            (2048, 4, adamw(3e-4)),
        ];
        list.into_iter()
            .map(|(w, depth, opt)| {
                let width = (w / self.width_div.max(1)).max(4);
                ModelSpec {
                    name: format!("mlp-{width}x{depth}"),
                    width,
                    depth,
                    opt,
                }
            })
            .collect()
    }

    /// The task (`train_batches` batches of training rows, four batches of evaluation
    /// rows) and one pipeline per model, the models spread over `streams`
    /// (each pipeline on one stream; `per_model` streams each for data parallel).
    pub fn build(
        &self,
        rt: &Runtime,
        streams: &[StreamId],
        per_model: usize,
        train_batches: usize,
    ) -> Result<(Task, Vec<Pipeline>)> {
        let task = self
            .task()
            .generate(self.batch * train_batches.max(1), self.batch * 4);
        let models = self.models();
        let placed = assign_streams(streams, &vec![per_model; models.len()]);
        let pipelines = models
            .iter()
            .zip(placed)
            .enumerate()
            .map(|(i, (m, s))| {
                self.pipeline(
                    rt,
                    m,
                    s,
                    &task.train,
                    derive_seed(self.seed, 100 + i as u64),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((task, pipelines))
    }

    /// The pipeline of model `m` on `streams`, initialized from `seed`.
    pub fn pipeline(
        &self,
        rt: &Runtime,
        m: &ModelSpec,
        streams: Vec<StreamId>,
        train: &Arc<super::Dataset>,
        seed: u64,
    ) -> Result<Pipeline> {
        let r0 = rt.on(first_stream(&streams, "SweepConfig::pipeline", m)?);
        let model = Mlp::new(&r0, &self.mlp_config(m), seed)?;
        self.pipeline_of(rt, m, Box::new(model), streams, train)
    }

    /// The MLP of model `m`: `dim`, `depth - 1` hidden layers of `width`, `classes`,
    /// in the sweep's dtype.
    pub fn mlp_config(&self, m: &ModelSpec) -> MlpConfig {
        let mut sizes = vec![self.dim];
        sizes.extend(std::iter::repeat_n(m.width, m.depth.saturating_sub(1)));
        sizes.push(self.classes);
        MlpConfig::new(&sizes).dtype(self.dtype)
    }

    /// The models of one shape that the stacked forms train (PyTorch's `stacked` and
    /// `stacked_graph` in `benches/torch_sweep.py`): 8 MLPs 512 wide (divided by
    /// `width_div`), 3 deep, AdamW at 1e-3.
    pub fn stacked_spec(&self) -> (ModelSpec, usize) {
        let width = (512 / self.width_div.max(1)).max(4);
        let spec = ModelSpec {
            name: format!("mlp-{width}x3 x8 stacked"),
            width,
            depth: 3,
            opt: OptimizerConfig::AdamW(AdamW {
                lr: 1e-3,
                weight_decay: 0.0,
                ..AdamW::default()
            }),
        };
        (spec, 8)
    }

    /// One pipeline training `members` models of `m`'s shape stacked into one
    /// ([`StackedMlp`]): member `i` starts as `SweepConfig::pipeline`'s model of `m`
    /// with seed `derive_seed(seed, i)` would, and trains as it would alone.
    pub fn stacked_pipeline(
        &self,
        rt: &Runtime,
        m: &ModelSpec,
        members: usize,
        streams: Vec<StreamId>,
        train: &Arc<super::Dataset>,
        seed: u64,
    ) -> Result<Pipeline> {
        let r0 = rt.on(first_stream(&streams, "SweepConfig::stacked_pipeline", m)?);
        let model = StackedMlp::new(&r0, &self.mlp_config(m), members, seed)?;
        self.pipeline_of(rt, m, Box::new(model), streams, train)
    }

    /// The small CNN beside the MLPs (the main job trains it; the benchmark's sweep
    /// and PyTorch's forms are the 8 MLPs): each row's `dim` features as a one-channel
    /// square image, 3×3 convolutions to 16 and 32 channels (the second with stride 2),
    /// a linear classifier, AdamW at 1e-3; always eager (its convolutions' capture is
    /// not yet shown on the GPU). `dim` must be a square.
    pub fn cnn_pipeline(
        &self,
        rt: &Runtime,
        streams: Vec<StreamId>,
        train: &Arc<super::Dataset>,
        seed: u64,
    ) -> Result<Pipeline> {
        let side = (1..=self.dim).find(|s| s * s >= self.dim).unwrap_or(0);
        if side * side != self.dim {
            return Err(rtx_runtime::Error::invalid(
                "SweepConfig::cnn_pipeline",
                format!("{} features are not a square image", self.dim),
            ));
        }
        let m = ModelSpec {
            name: format!("cnn-{side}x{side}"),
            width: side,
            depth: 3,
            opt: OptimizerConfig::AdamW(AdamW {
                lr: 1e-3,
                weight_decay: 0.0,
                ..AdamW::default()
            }),
        };
        let r0 = rt.on(first_stream(&streams, "SweepConfig::cnn_pipeline", &m)?);
        let cfg = CnnConfig {
            dtype: self.dtype,
            ..CnnConfig::new(1, (side, side), 16, 32, self.classes)
        };
        let model = Cnn::new(&r0, cfg, seed)?;
        let eager = SweepConfig {
            graphs: false,
            ..self.clone()
        };
        eager.pipeline_of(rt, &m, Box::new(model), streams, train)
    }

    fn pipeline_of(
        &self,
        rt: &Runtime,
        m: &ModelSpec,
        model: Box<dyn super::Classifier>,
        streams: Vec<StreamId>,
        train: &Arc<super::Dataset>,
    ) -> Result<Pipeline> {
        let data = Batches::new(train.clone(), self.batch).ok_or_else(|| {
            rtx_runtime::Error::invalid("SweepConfig::pipeline", "fewer rows than a batch")
        })?;
        let cfg = PipelineConfig {
            name: m.name.clone(),
            steps: self.steps,
            loss_every: self.loss_every,
            streams,
            graph: self.graphs,
            resident: self.resident,
            prefetch: self.prefetch,
        };
        Pipeline::new(rt, cfg, model, m.opt, Box::new(data))
    }
}

/// The first of `streams` (the one a model is built on), or the error naming `what`.
fn first_stream(streams: &[StreamId], what: &str, m: &ModelSpec) -> Result<StreamId> {
    streams
        .first()
        .copied()
        .ok_or_else(|| rtx_runtime::Error::invalid(what, format!("{}: no stream given", m.name)))
}
