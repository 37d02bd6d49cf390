//! Training pipelines: a model, its optimizer, a data source and a schedule, whose
//! steps are submissions only, so that many pipelines run at once on one runtime.
//!
//! A [`Pipeline`] step
//!
//! 1. takes the batch uploaded during an earlier step and uploads the ones ahead of it
//!    up to [`PipelineConfig::prefetch`] steps ahead (on CUDA the uploads run on the
//!    device's copy stream from pinned staging memory, so the copies of batches
//!    `k+1 ..= k+prefetch` run under the compute of batch `k`: with several pipelines
//!    sharing the copy stream, a batch's upload is long done when its step reads it);
//! 2. submits forward, cross-entropy, backward and the fused optimizer step, all pinned
//!    to the pipeline's stream ([`Runtime::on`]): the whole chain stays on one stream
//!    and needs no cross-stream event;
//! 3. every `loss_every` steps enqueues a timing marker behind the step on its stream
//!    (`Runtime::mark`); once the stream has passed it, the loss is downloaded (so the
//!    download, on CUDA on the copy stream shared by all pipelines, never holds up the
//!    other pipelines' uploads behind it while this one computes), and finished
//!    downloads are collected without waiting ([`Pipeline::losses`]). The host waits
//!    only when more than [`MAX_PENDING_LOSSES`] losses are outstanding (it is then that
//!    far ahead of the device: backpressure, not a round trip per step).
//!
//! Independent pipelines get different streams ([`assign_streams`] spreads them), and
//! [`run_concurrently`] drives each from a thread of its own: on CUDA each stream's actor
//! launches its pipeline's kernels while the others do the same.
//!
//! # Data parallel
//!
//! A pipeline given `K > 1` streams splits each batch into `K` micro-batches, one per
//! stream: the forward and backward of micro-batch `i` run on stream `i` (reading the
//! shared weights), each with the loss scaled by `1/K`; the gradients are summed on the
//! first stream, whose adds wait for the other streams' events on the device (no host
//! sync), and the optimizer step runs once, there. The result equals the single-stream
//! step on the whole batch within float rounding (the `pipeline` tests check it).

mod data;
mod graph;
mod model;
mod optim;
mod run;
pub mod sweep;

pub use data::{Batches, DataSource, Dataset, Task, TeacherTask};
pub(crate) use model::loss_and_grad;
pub use model::Classifier;
pub use optim::{Optimizer, OptimizerConfig};
pub use run::{assign_streams, run_concurrently, Progress, Report};

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rtx_ops::elementwise::add_;
use rtx_ops::{argmax_dim, cast, cross_entropy, eq, mean, mul_scalar_};
use rtx_runtime::{DType, Error, Graph, Marker, Result, Runtime, StreamId, Submission, Tensor};

/// Loss downloads a pipeline lets run ahead before its host thread waits for the oldest.
pub const MAX_PENDING_LOSSES: usize = 4;

/// The schedule and placement of a [`Pipeline`].
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineConfig {
    /// A name for progress and reports.
    pub name: String,
    /// Training steps.
    pub steps: u64,
    /// The loss is read back every this many steps (and after the last).
    pub loss_every: u64,
    /// The compute streams: one, or `K` for data parallel (the batch must divide by
    /// `K`).
    pub streams: Vec<StreamId>,
    /// Run the steps as a graph: capture one whole step at the first step, then
    /// launch it every step (`train/src/pipeline/graph.rs`). One stream only.
    pub graph: bool,
    /// Keep each batch on the device after its first upload, when the data source
    /// repeats ([`DataSource::period`]): from the second epoch on no batch is uploaded
    /// (the data stays on the GPU, as a dataset that fits in device memory is usually
    /// kept). Costs the epoch's batches in device memory; without a period, no effect.
    pub resident: bool,
    /// How many steps ahead the batches are uploaded (at least 1: double buffering;
    /// [`DEFAULT_PREFETCH`] in the sweep). Costs that many batches in device memory.
    pub prefetch: usize,
}

/// The sweep's [`PipelineConfig::prefetch`]: batches uploaded 3 steps ahead. With 8
/// pipelines uploading through one copy stream, one step ahead left a step's batch
/// often still queued behind the other pipelines' uploads when the step was launched.
pub const DEFAULT_PREFETCH: usize = 3;

/// One training job. See the [module docs](self).
pub struct Pipeline {
    cfg: PipelineConfig,
    rt: Runtime,
    model: Box<dyn Classifier>,
    opt: Optimizer,
    data: Box<dyn DataSource>,
    step: u64,
    /// The batches uploaded ahead, by step.
    next: VecDeque<(u64, Vec<(Tensor, Tensor)>)>,
    /// The uploaded batches by `k mod period` ([`PipelineConfig::resident`]).
    kept: std::collections::HashMap<u64, Vec<(Tensor, Tensor)>>,
    /// Losses whose step the stream has not passed yet, with the marker behind it.
    unread: VecDeque<(u64, Tensor, Submission<Marker>)>,
    pending: VecDeque<(u64, Submission<Vec<f32>>)>,
    losses: Vec<(u64, f32)>,
    params: usize,
    started: Option<Instant>,
    took: Option<Duration>,
    /// The captured step ([`PipelineConfig::graph`]).
    graph: Option<Graph>,
    /// The optimizer's step count when the graph was captured.
    graph_t0: u64,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("cfg", &self.cfg)
            .field("step", &self.step)
            .field("losses", &self.losses.len())
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// A pipeline training `model` with an optimizer of `opt` on `data`. Errors: no
    /// stream, a stream not of `rt`, `steps` or `loss_every` zero, or a batch that does
    /// not split into the streams.
    pub fn new(
        rt: &Runtime,
        cfg: PipelineConfig,
        mut model: Box<dyn Classifier>,
        opt: OptimizerConfig,
        data: Box<dyn DataSource>,
    ) -> Result<Self> {
        let what = "Pipeline::new";
        let k = cfg.streams.len();
        if k == 0 || cfg.steps == 0 || cfg.loss_every == 0 {
            return Err(Error::invalid(
                what,
                format!(
                    "{}: needs a stream, steps and loss_every (got {k}, {}, {})",
                    cfg.name, cfg.steps, cfg.loss_every
                ),
            ));
        }
        let own = rt.compute_streams(rt.device());
        if let Some(s) = cfg.streams.iter().find(|s| !own.contains(s)) {
            return Err(Error::invalid(
                what,
                format!("{s} is not a compute stream of the runtime's default device"),
            ));
        }
        if cfg.graph && k != 1 {
            return Err(Error::invalid(
                what,
                format!(
                    "{}: a pipeline run as a graph takes one stream, not {k}",
                    cfg.name
                ),
            ));
        }
        if !data.batch().is_multiple_of(k) {
            return Err(Error::invalid(
                what,
                format!(
                    "a batch of {} does not split into {k} streams",
                    data.batch()
                ),
            ));
        }
        let r0 = rt.on(cfg.streams[0]);
        let opt = Optimizer::new(&r0, opt, &model.params())?;
        let params = model.params().numel();
        Ok(Pipeline {
            cfg,
            rt: rt.clone(),
            model,
            opt,
            data,
            step: 0,
            next: VecDeque::new(),
            kept: std::collections::HashMap::new(),
            unread: VecDeque::new(),
            pending: VecDeque::new(),
            losses: Vec::new(),
            params,
            started: None,
            took: None,
            graph: None,
            graph_t0: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.cfg
    }
    /// Steps submitted so far.
    pub fn steps_done(&self) -> u64 {
        self.step
    }
    /// Whether every step has been submitted.
    pub fn is_done(&self) -> bool {
        self.step >= self.cfg.steps
    }
    /// Number of trainable elements.
    pub fn num_params(&self) -> usize {
        self.params
    }
    /// The optimizer.
    pub fn optimizer(&self) -> &Optimizer {
        &self.opt
    }
    /// The losses read back so far: `(step, loss)`, step counted from 0.
    pub fn losses(&self) -> &[(u64, f32)] {
        &self.losses
    }
    /// The captured step ([`PipelineConfig::graph`]), once the first step has run:
    /// its states, launches and how many states it updates in place
    /// (`rtx_runtime::Graph::in_place_states`; every one, for the built-in models and
    /// optimizers on CUDA).
    pub fn graph(&self) -> Option<&Graph> {
        self.graph.as_ref()
    }
    /// The model.
    pub fn model_mut(&mut self) -> &mut dyn Classifier {
        &mut *self.model
    }

    /// Uploads batch `k` as one micro-batch per stream (or finds it on the device:
    /// [`PipelineConfig::resident`]).
    fn upload(&mut self, k: u64) -> Result<Vec<(Tensor, Tensor)>> {
        let slot = match (self.cfg.resident, self.data.period()) {
            (true, Some(p)) if p > 0 => Some(k % p),
            _ => None,
        };
        if let Some(b) = slot.and_then(|s| self.kept.get(&s)) {
            return Ok(b.clone());
        }
        let b = self.upload_new(k)?;
        if let Some(s) = slot {
            self.kept.insert(s, b.clone());
        }
        Ok(b)
    }

    /// With [`PipelineConfig::resident`] and a data source that repeats, uploads every
    /// batch of its period now and keeps them, returning once they are on the device:
    /// the steps then upload nothing, as when a framework's data is on the GPU before
    /// its first step (the sweep bench's resident rows against PyTorch's forms).
    /// Returns how many batches it uploaded (0 without `resident` or a period, or when
    /// every batch is kept already).
    pub fn preload(&mut self) -> Result<usize> {
        let period = match (self.cfg.resident, self.data.period()) {
            (true, Some(p)) if p > 0 => p,
            _ => return Ok(0),
        };
        let mut n = 0;
        let mut last = None;
        for s in 0..period {
            if self.kept.contains_key(&s) {
                continue;
            }
            let b = self.upload_new(s)?;
            last = b.last().map(|(_, y)| y.clone());
            self.kept.insert(s, b);
            n += 1;
        }
        // The copy stream runs its copies in order: once the last labels are read back,
        // every upload before them has landed.
        if let Some(y) = last {
            self.rt.to_vec::<u32>(&y)?.wait()?;
        }
        Ok(n)
    }

    fn upload_new(&self, k: u64) -> Result<Vec<(Tensor, Tensor)>> {
        let (x, y) = self.data.get(k);
        let n = self.cfg.streams.len();
        let (b, d) = (self.data.batch(), self.data.dim());
        let mb = b / n;
        (0..n)
            .map(|i| {
                let xs = self.rt.upload(&x[i * mb * d..(i + 1) * mb * d], [mb, d])?;
                let ys = self.rt.upload(&y[i * mb..(i + 1) * mb], [mb])?;
                Ok((xs, ys))
            })
            .collect()
    }

    /// Submits one training step (see the module docs); returns at once unless more
    /// than [`MAX_PENDING_LOSSES`] loss downloads are outstanding.
    pub fn step(&mut self) -> Result<()> {
        if self.is_done() {
            return Ok(());
        }
        self.started.get_or_insert_with(Instant::now);
        let batch = match self.next.front() {
            Some((k, _)) if *k == self.step => self.next.pop_front().expect("front exists").1,
            _ => self.upload(self.step)?,
        };
        // Batches k+1 ..= k+prefetch go up (the copy stream, on CUDA) while batch k
        // computes.
        let depth = self.cfg.prefetch.max(1) as u64;
        let mut ahead = self.next.back().map_or(self.step, |(k, _)| *k);
        while ahead < self.step + depth && ahead + 1 < self.cfg.steps {
            ahead += 1;
            let b = self.upload(ahead)?;
            self.next.push_back((ahead, b));
        }
        let streams = self.cfg.streams.clone();
        let k = self.step;
        let read = (k + 1).is_multiple_of(self.cfg.loss_every) || k + 1 >= self.cfg.steps;
        if self.cfg.graph {
            let (x, y) = &batch[0];
            if self.graph.is_none() {
                self.graph = Some(self.capture_step(x, y)?);
            }
            let loss = self.launch_step(x, y, read)?;
            self.step += 1;
            if let Some(loss) = loss {
                let mark = self.rt.mark(streams[0])?;
                self.unread.push_back((k, loss, mark));
            }
            return self.collect(false);
        }
        let r0 = self.rt.on(streams[0]);
        let loss = if streams.len() == 1 {
            let (x, y) = &batch[0];
            self.model.loss_backward(&r0, x, y, 1.0)?
        } else {
            self.data_parallel(&batch, &streams)?
        };
        self.opt.step(&r0, &mut self.model.params())?;
        self.step += 1;
        if read {
            let mark = self.rt.mark(streams[0])?;
            self.unread.push_back((k, loss, mark));
        }
        self.collect(false)
    }

    /// The micro-batches' forward and backward on their streams, the gradients summed
    /// on the first; the mean loss.
    fn data_parallel(
        &mut self,
        batch: &[(Tensor, Tensor)],
        streams: &[StreamId],
    ) -> Result<Tensor> {
        let r0 = self.rt.on(streams[0]);
        let scale = 1.0 / streams.len() as f32;
        let mut acc: Option<Vec<Tensor>> = None;
        let mut loss: Option<Tensor> = None;
        for ((x, y), s) in batch.iter().zip(streams) {
            let rs = self.rt.on(*s);
            let l = self.model.loss_backward(&rs, x, y, scale)?;
            let mut params = self.model.params();
            let g = params
                .iter_mut()
                .map(|p| p.take_grad())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Error::invalid("Pipeline::step", "a backward left no gradient"))?;
            acc = Some(match acc {
                None => g,
                Some(a) => a
                    .into_iter()
                    .zip(&g)
                    .map(|(a, g)| r0.run(add_(a, g)))
                    .collect::<Result<_>>()?,
            });
            loss = Some(match loss {
                None => l,
                Some(a) => r0.run(add_(a, &l))?,
            });
        }
        let (acc, loss) = acc
            .zip(loss)
            .ok_or_else(|| Error::invalid("Pipeline::step", "no stream"))?;
        for (p, g) in self.model.params().iter_mut().zip(acc) {
            p.set_grad(g)?;
        }
        r0.run(mul_scalar_(loss, scale))
    }

    /// Moves completed loss downloads into [`Pipeline::losses`]; with `all`, waits for
    /// every one, else only while more than [`MAX_PENDING_LOSSES`] are outstanding.
    fn collect(&mut self, all: bool) -> Result<()> {
        while let Some((_, _, mark)) = self.unread.front() {
            let must = all || self.unread.len() + self.pending.len() > MAX_PENDING_LOSSES;
            if !must && !mark.is_done() {
                break;
            }
            let (k, loss, mark) = self.unread.pop_front().expect("front exists");
            mark.wait()?;
            self.pending.push_back((k, self.rt.to_vec::<f32>(&loss)?));
        }
        while let Some((_, sub)) = self.pending.front() {
            let must = all || self.pending.len() > MAX_PENDING_LOSSES;
            if !must && !sub.is_done() {
                break;
            }
            let (k, sub) = self.pending.pop_front().expect("front exists");
            let v = sub.wait()?;
            self.losses
                .push((k, v.first().copied().unwrap_or(f32::NAN)));
        }
        Ok(())
    }

    /// Waits for every outstanding loss and stops the clock.
    pub fn finish(&mut self) -> Result<()> {
        self.collect(true)?;
        self.sync_from_graph()?;
        if let (Some(t), None) = (self.started, self.took) {
            self.took = Some(t.elapsed());
        }
        Ok(())
    }

    /// Samples per second from the first step to [`Pipeline::finish`] (or to now).
    pub fn samples_per_s(&self) -> f64 {
        let took = self
            .took
            .or_else(|| self.started.map(|t| t.elapsed()))
            .unwrap_or_default();
        let samples = (self.step * self.data.batch() as u64 * self.model.members() as u64) as f64;
        if took.is_zero() {
            0.0
        } else {
            samples / took.as_secs_f64()
        }
    }

    /// Mean loss and accuracy on `data` (all rows at once), computed on the device
    /// (`argmax` of the logits, `eq` with the labels, `mean`); two small downloads.
    pub fn evaluate(&self, data: &Dataset) -> Result<(f32, f32)> {
        let r0 = self.rt.on(self.cfg.streams[0]);
        let x = self.rt.upload(&data.x, [data.len(), data.dim])?;
        let y = self.rt.upload(&data.y, [data.len()])?;
        let logits = self.model.logits(&r0, &x)?;
        let y = crate::stacked::repeat_labels(&r0, &y, self.model.members())?;
        let ce = r0.run(cross_entropy(&logits, &y))?;
        let pred = r0.run(argmax_dim(&logits, 1, false))?;
        let hit = r0.run(eq(&pred, &y))?;
        let hit = r0.run(cast(&hit, DType::F32))?;
        let acc = r0.run(mean(&hit))?;
        let loss = self.rt.to_vec::<f32>(&ce.loss)?;
        let acc = self.rt.to_vec::<f32>(&acc)?;
        let first = |v: Vec<f32>| v.first().copied().unwrap_or(f32::NAN);
        Ok((first(loss.wait()?), first(acc.wait()?)))
    }

    /// The report of a finished pipeline, with its evaluation on `eval`.
    pub fn report(&self, eval: &Dataset) -> Result<Report> {
        let (eval_loss, accuracy) = self.evaluate(eval)?;
        Ok(Report {
            name: self.cfg.name.clone(),
            params: self.params,
            optimizer: self.opt.config().label(),
            final_loss: self.losses.last().map_or(f32::NAN, |l| l.1),
            eval_loss,
            accuracy,
            samples_per_s: self.samples_per_s(),
            streams: self.cfg.streams.clone(),
        })
    }
}
