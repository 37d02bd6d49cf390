//! Data parallel across devices: one replica of a model per device, each step's batch
//! split evenly among them, the gradients averaged by all-reduces in buckets, then every
//! replica's optimizer steps, so the parameters stay identical on every device.
//!
//! A step submits, per device, the forward and backward of its share of the batch (on
//! that device's first compute stream, `scale` = 1 / devices, so the sum of the
//! gradients is the mean over the whole batch), then the gradients in **reverse
//! parameter order** (the last layer's gradients are produced first) packed into buckets
//! of about [`DeviceParallel::bucket_bytes`] (25 MB by default, as PyTorch's DDP), each
//! bucket one [`Runtime::all_reduce_many`] (sum) whose members run on the devices'
//! communication streams: a bucket's reduction starts as soon as its gradients exist,
//! while the backward of earlier layers still runs. The reduction is bitwise the same on
//! every device and the optimizers are deterministic, so the replicas do not drift
//! ([`DeviceParallel::max_divergence`] checks it). No host round trip inside a step.
//!
//! On the CPU backend, [`Backend::CpuDevices`](rtx_runtime::Backend::CpuDevices) gives
//! the devices. Across CUDA devices the collectives run through NCCL, but copies
//! between CUDA devices (which set every replica to replica 0's parameters) are not
//! built yet (`docs/multi-gpu.md`), so a runtime over several GPUs fails at
//! construction with a typed error. On one device it is the single-device step (its
//! all-reduces those of a one-rank communicator on CUDA, where NCCL is found).

use rtx_ops::cast;
use rtx_runtime::{DType, Device, Error, ReduceOp, Result, Runtime, StreamId, Tensor};

use crate::pipeline::{Classifier, Optimizer, OptimizerConfig};

/// The default bucket size (bytes of gradients per all-reduce), PyTorch DDP's.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// One model trained data-parallel over several devices of one runtime (module docs).
pub struct DeviceParallel {
    rt: Runtime,
    /// The first compute stream of each device, in device order.
    streams: Vec<StreamId>,
    replicas: Vec<Box<dyn Classifier>>,
    opts: Vec<Optimizer>,
    bucket_bytes: usize,
    buckets: usize,
}

impl DeviceParallel {
    /// Builds a replica per device with `build` (given a handle pinned to that device's
    /// first compute stream, where its parameters are created), then replaces every
    /// replica's parameters by replica 0's (copied to each device), so all start equal
    /// whatever `build` does; one optimizer per replica from `opt`. `devices` must be
    /// distinct devices of `rt`, at least one.
    pub fn new(
        rt: &Runtime,
        devices: &[Device],
        mut build: impl FnMut(&Runtime) -> Result<Box<dyn Classifier>>,
        opt: OptimizerConfig,
    ) -> Result<Self> {
        if devices.is_empty() {
            return Err(Error::invalid("DeviceParallel::new", "no devices"));
        }
        let mut streams = Vec::with_capacity(devices.len());
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::invalid(
                    "DeviceParallel::new",
                    format!("{d} is listed twice"),
                ));
            }
            let s = rt.compute_streams(*d).first().copied().ok_or_else(|| {
                Error::DeviceNotFound(format!("{d} is not a device of this runtime"))
            })?;
            streams.push(s);
        }
        let mut replicas = Vec::with_capacity(devices.len());
        for s in &streams {
            replicas.push(build(&rt.on(*s))?);
        }
        // Replica 0's values everywhere.
        let values: Vec<Tensor> = replicas[0]
            .params()
            .iter_mut()
            .map(|p| p.value().clone())
            .collect();
        for (r, d) in replicas.iter_mut().zip(devices).skip(1) {
            let mut params = r.params();
            if params.len() != values.len() {
                return Err(Error::invalid(
                    "DeviceParallel::new",
                    format!(
                        "the replica on {d} has {} parameters, the first {}",
                        params.len(),
                        values.len()
                    ),
                ));
            }
            for (p, v) in params.iter_mut().zip(&values) {
                p.set_value(rt.copy_to(v, *d)?)?;
            }
        }
        let opts = replicas
            .iter_mut()
            .zip(&streams)
            .map(|(r, s)| Optimizer::new(&rt.on(*s), opt, &r.params()))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceParallel {
            rt: rt.clone(),
            streams,
            replicas,
            opts,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            buckets: 0,
        })
    }

    /// Sets the bucket size in bytes (at least 1: every gradient its own bucket).
    pub fn with_bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes.max(1);
        self
    }

    /// The bucket size in bytes.
    pub fn bucket_bytes(&self) -> usize {
        self.bucket_bytes
    }

    /// How many buckets the last step all-reduced.
    pub fn buckets(&self) -> usize {
        self.buckets
    }

    /// How many devices (replicas).
    pub fn devices(&self) -> usize {
        self.replicas.len()
    }

    /// Replica `i` (on the `i`-th device).
    pub fn replica(&mut self, i: usize) -> Option<&mut dyn Classifier> {
        self.replicas
            .get_mut(i)
            .map(|r| &mut **r as &mut dyn Classifier)
    }

    /// One step on a batch of `rows` rows of `dim` f32 features (`x`, row-major) and
    /// their labels (`y`): `rows` must divide evenly among the devices. Returns the mean
    /// loss over the whole batch (`[1]` f32, on the first device; read it when you
    /// like). Only submissions: the uploads go up on each device, nothing waits.
    pub fn step(&mut self, x: &[f32], y: &[u32], dim: usize) -> Result<Tensor> {
        let n = self.replicas.len();
        let rows = y.len();
        if rows == 0 || !rows.is_multiple_of(n) || rows.checked_mul(dim) != Some(x.len()) {
            return Err(Error::invalid(
                "DeviceParallel::step",
                format!(
                    "a batch of {rows} rows ({} features, {dim} per row) does not split evenly among {n} devices",
                    x.len()
                ),
            ));
        }
        let per = rows / n;
        let scale = 1.0 / n as f32;
        let mut losses = Vec::with_capacity(n);
        for (m, (r, s)) in self.replicas.iter_mut().zip(&self.streams).enumerate() {
            let rt = self.rt.on(*s);
            let xm = rt.upload(&x[m * per * dim..(m + 1) * per * dim], [per, dim])?;
            let ym = rt.upload(&y[m * per..(m + 1) * per], [per])?;
            losses.push(r.loss_backward(&rt, &xm, &ym, scale)?);
        }
        self.reduce_gradients()?;
        for ((r, o), s) in self
            .replicas
            .iter_mut()
            .zip(&mut self.opts)
            .zip(&self.streams)
        {
            o.step(&self.rt.on(*s), &mut r.params())?;
        }
        // The mean loss (each replica's is its share's mean), member 0's on the first
        // device.
        let mean = self.rt.all_reduce(&losses, ReduceOp::Avg)?;
        mean.into_iter()
            .next()
            .ok_or_else(|| Error::invalid("DeviceParallel::step", "no device"))
    }

    /// Sums every parameter's gradient across the replicas, bucket by bucket in reverse
    /// parameter order, and gives each replica the sum.
    fn reduce_gradients(&mut self) -> Result<()> {
        let n = self.replicas.len();
        let mut grads: Vec<Vec<Tensor>> = Vec::with_capacity(n);
        for (m, r) in self.replicas.iter_mut().enumerate() {
            let g = r
                .params()
                .iter_mut()
                .map(|p| p.take_grad())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    Error::invalid(
                        "DeviceParallel::step",
                        format!("the backward of replica {m} left a parameter without a gradient"),
                    )
                })?;
            grads.push(g);
        }
        let count = grads[0].len();
        let mut reduced: Vec<Vec<Option<Tensor>>> = vec![vec![None; count]; n];
        let mut bucket: Vec<usize> = Vec::new();
        let mut bytes = 0usize;
        let limit = self.bucket_bytes;
        self.buckets = 0;
        let mut flush = |bucket: &mut Vec<usize>, bytes: &mut usize| -> Result<()> {
            if bucket.is_empty() {
                return Ok(());
            }
            let group: Vec<Vec<Tensor>> = grads
                .iter()
                .map(|g| bucket.iter().map(|&k| g[k].clone()).collect())
                .collect();
            let out = self.rt.all_reduce_many(&group, ReduceOp::Sum)?;
            for (m, member) in out.into_iter().enumerate() {
                for (&k, t) in bucket.iter().zip(member) {
                    reduced[m][k] = Some(t);
                }
            }
            self.buckets += 1;
            bucket.clear();
            *bytes = 0;
            Ok(())
        };
        for k in (0..count).rev() {
            let t = &grads[0][k];
            bucket.push(k);
            bytes = bytes.saturating_add(t.numel().saturating_mul(t.dtype().size()));
            if bytes >= limit {
                flush(&mut bucket, &mut bytes)?;
            }
        }
        flush(&mut bucket, &mut bytes)?;
        drop(grads);
        for (r, red) in self.replicas.iter_mut().zip(reduced) {
            for (p, g) in r.params().iter_mut().zip(red) {
                let g = g.ok_or_else(|| {
                    Error::invalid("DeviceParallel::step", "a gradient was not reduced")
                })?;
                p.set_grad(g)?;
            }
        }
        Ok(())
    }

    /// The largest difference between any replica's parameter and replica 0's, element
    /// by element (0.0 when they are bitwise equal); downloads every parameter.
    pub fn max_divergence(&mut self) -> Result<f32> {
        let rt = self.rt.clone();
        let read = |r: &mut Box<dyn Classifier>, s: StreamId| -> Result<Vec<Vec<f32>>> {
            let rs = rt.on(s);
            r.params()
                .iter_mut()
                .map(|p| {
                    let v = p.value();
                    let v = if v.dtype() == DType::F32 {
                        v.clone()
                    } else {
                        rs.run(cast(v, DType::F32))?
                    };
                    rt.to_vec::<f32>(&v)?.wait()
                })
                .collect()
        };
        let mut worst = 0.0f32;
        let mut base: Option<Vec<Vec<f32>>> = None;
        for (r, s) in self.replicas.iter_mut().zip(&self.streams) {
            let vals = read(r, *s)?;
            let Some(b) = &base else {
                base = Some(vals);
                continue;
            };
            for (a, c) in b.iter().zip(&vals) {
                for (x, y) in a.iter().zip(c) {
                    if x.to_bits() != y.to_bits() {
                        worst = worst.max((x - y).abs()).max(f32::MIN_POSITIVE);
                    }
                }
            }
        }
        Ok(worst)
    }
}
