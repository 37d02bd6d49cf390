//! Moving data between devices: copies ([`Runtime::copy_to`]) and collectives over a
//! group of tensors, one per device ([`Runtime::all_reduce`], [`Runtime::all_gather`],
//! [`Runtime::reduce_scatter`], [`Runtime::broadcast`]).
//!
//! Each member of a collective is an op on its device's communication stream
//! ([`StreamKind::Comm`]; the first compute stream where a device has none), waiting for
//! the group's inputs like any op waits for its inputs, and ordered against the compute
//! streams by the same rules. On the CPU backend ([`Backend::CpuDevices`]) every member
//! reads the whole group's inputs and computes its own result, reducing in the order of
//! the group (member 0 first, in `f64`, rounded once), so the result is bitwise the same
//! on every device and no member ever waits for another. A group of one is its own result
//! and enqueues nothing. Groups over several CUDA devices need NCCL, which is not bound
//! yet (`docs/multi-gpu.md`): they fail at submit with [`Error::InvalidOp`].
//!
//! [`Backend::CpuDevices`]: crate::Backend::CpuDevices

use rayon::prelude::*;

use crate::buffer::{Buffer, Element};
use crate::device::{Device, StreamId, StreamKind};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{BackendCx, Cost, ExecCx, Op, Plan, PlanCx, TensorSpec};
use crate::runtime::{BackendState, Runtime};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// How a reducing collective combines the members' values, element by element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The mean (the sum divided by the group's size; integers truncate).
    Avg,
    /// The maximum.
    Max,
}

/// What one member of a group computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    AllReduce(ReduceOp),
    /// This member's share (the `index`-th slice along dim 0) of the reduction.
    ReduceScatter(ReduceOp),
    /// Every member's tensor, one after the other along dim 0.
    AllGather,
    /// Member 0's tensor (the only source).
    Broadcast,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce(_) => "all_reduce",
            Kind::ReduceScatter(_) => "reduce_scatter",
            Kind::AllGather => "all_gather",
            Kind::Broadcast => "broadcast",
        }
    }
}

/// One member of a collective (or one copy): runs on `device`, reads every source
/// tensor (`sources[member][k]`), writes one output per `k`.
struct Member {
    kind: Kind,
    /// Which member this is (its share, for `ReduceScatter`).
    index: usize,
    device: Device,
    sources: Vec<Vec<Tensor>>,
    specs: Vec<TensorSpec>,
}

impl Op for Member {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        self.kind.name()
    }
    fn device(&self) -> Option<Device> {
        Some(self.device)
    }
    fn inputs(&self) -> Vec<&Tensor> {
        self.sources.iter().flatten().collect()
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let bytes: usize = self
            .sources
            .iter()
            .flatten()
            .map(|t| t.numel() * t.dtype().size())
            .sum();
        Ok(Plan {
            outputs: self.specs.clone(),
            cost: Cost {
                flops: 0.0,
                bytes: bytes as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        if !matches!(cx.backend(), BackendCx::Cpu) {
            return Err(Error::invalid(
                self.kind.name(),
                "collectives across CUDA devices need NCCL, which rtx does not bind yet",
            ));
        }
        for k in 0..self.specs.len() {
            let bufs = self
                .sources
                .iter()
                .map(|m| cx.input(&m[k]))
                .collect::<Result<Vec<_>>>()?;
            let bufs: Vec<&Buffer> = bufs.iter().map(|b| &**b).collect();
            let n = self.specs[k].shape.numel();
            let out = match self.specs[k].dtype {
                DType::F32 => compute::<f32>(self.kind, self.index, self.device, &bufs, n)?,
                DType::F16 => compute::<half::f16>(self.kind, self.index, self.device, &bufs, n)?,
                DType::BF16 => compute::<half::bf16>(self.kind, self.index, self.device, &bufs, n)?,
                DType::I32 => compute::<i32>(self.kind, self.index, self.device, &bufs, n)?,
                DType::U32 => compute::<u32>(self.kind, self.index, self.device, &bufs, n)?,
            };
            cx.set_output(k, out)?;
        }
        Ok(())
    }
}

/// Elements per rayon task.
const CHUNK: usize = 1 << 14;

/// Member `index`'s output of `n` elements from the group's buffers (`bufs[member]`).
fn compute<T: Element>(
    kind: Kind,
    index: usize,
    device: Device,
    bufs: &[&Buffer],
    n: usize,
) -> Result<Buffer> {
    let src = bufs
        .iter()
        .map(|b| b.cpu::<T>())
        .collect::<Result<Vec<&[T]>>>()?;
    let members = src.len();
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        device,
        requested: n.saturating_mul(std::mem::size_of::<T>()),
        available: 0,
    })?;
    match kind {
        Kind::Broadcast => out.extend_from_slice(&src[0][..n]),
        Kind::AllGather => {
            for s in &src {
                out.extend_from_slice(s);
            }
        }
        Kind::AllReduce(op) | Kind::ReduceScatter(op) => {
            let offset = if matches!(kind, Kind::ReduceScatter(_)) {
                index * n
            } else {
                0
            };
            out.resize(n, T::from_f64(0.0));
            out.par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(c, chunk)| {
                    let base = offset + c * CHUNK;
                    for (i, o) in chunk.iter_mut().enumerate() {
                        *o = T::from_f64(reduce(op, members, |m| src[m][base + i].to_f64()));
                    }
                });
        }
    }
    Ok(Buffer::from_vec(out))
}

/// The reduction of `members` values (`value(m)`), in member order, in `f64`.
fn reduce(op: ReduceOp, members: usize, value: impl Fn(usize) -> f64) -> f64 {
    let mut acc = value(0);
    for m in 1..members {
        let v = value(m);
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc + v,
            ReduceOp::Max => acc.max(v),
        };
    }
    if op == ReduceOp::Avg {
        acc /= members as f64;
    }
    acc
}

impl Runtime {
    /// `t` on `device`: the same tensor when it is there already, else a copy made by an
    /// op on `device` (its communication stream) once `t` is ready. This is the only way
    /// data changes device: placement never moves it. On the CUDA backend copies between
    /// devices are not built yet (they fail with [`Error::InvalidOp`]).
    ///
    /// ```
    /// use rtx::{Backend, Device, Runtime};
    /// let rt = Runtime::builder().backend(Backend::CpuDevices(2)).build()?;
    /// let a = rt.upload(&[1.0f32, 2.0], [2])?;
    /// let b = rt.copy_to(&a, Device::Cpu(1))?;
    /// assert_eq!(b.device(), Device::Cpu(1));
    /// assert_eq!(rt.to_vec::<f32>(&b)?.wait()?, [1.0, 2.0]);
    /// # Ok::<(), rtx::Error>(())
    /// ```
    pub fn copy_to(&self, t: &Tensor, device: Device) -> Result<Tensor> {
        self.check_own(t, "copy_to")?;
        if t.device() == device {
            return Ok(t.clone());
        }
        let stream = self.comm_stream(device, "copy_to")?;
        self.cpu_only("copy_to", device)?;
        let op = Member {
            kind: Kind::Broadcast,
            index: 0,
            device,
            sources: vec![vec![t.clone()]],
            specs: vec![TensorSpec::like(t)],
        };
        let out = self
            .submit_on(stream, op)
            .map_err(|e| e.error)?
            .into_outputs();
        out.and_then(|v| v.into_iter().next())
            .ok_or_else(|| Error::invalid("copy_to", "the copy planned no output"))
    }

    /// Reduces a group of tensors, one per device (distinct devices, equal shapes and
    /// dtypes), element by element with `op`: one result per member, on its device,
    /// equal on every device. See the module docs for how and where it runs.
    ///
    /// ```
    /// use rtx::{Backend, Device, ReduceOp, Runtime};
    /// let rt = Runtime::builder().backend(Backend::CpuDevices(2)).build()?;
    /// let a = rt.upload_to(Device::Cpu(0), &[1.0f32, 5.0], [2])?;
    /// let b = rt.upload_to(Device::Cpu(1), &[3.0f32, -1.0], [2])?;
    /// let r = rt.all_reduce(&[a, b], ReduceOp::Avg)?;
    /// assert_eq!(r[1].device(), Device::Cpu(1));
    /// assert_eq!(rt.to_vec::<f32>(&r[1])?.wait()?, [2.0, 2.0]);
    /// # Ok::<(), rtx::Error>(())
    /// ```
    pub fn all_reduce(&self, group: &[Tensor], op: ReduceOp) -> Result<Vec<Tensor>> {
        let group: Vec<Vec<Tensor>> = group.iter().map(|t| vec![t.clone()]).collect();
        Ok(flatten(self.collective(Kind::AllReduce(op), &group)?))
    }

    /// [`Runtime::all_reduce`] of several tensors per member at once (a bucket of
    /// gradients, say): `group[m]` are member `m`'s tensors, the same count, shapes and
    /// dtypes on every member; one op per member. Returns `[member][tensor]`.
    pub fn all_reduce_many(&self, group: &[Vec<Tensor>], op: ReduceOp) -> Result<Vec<Vec<Tensor>>> {
        self.collective(Kind::AllReduce(op), group)
    }

    /// Reduces the group as [`Runtime::all_reduce`] does, member `m` keeping only the
    /// `m`-th of the group's size equal slices along dim 0 (whose length must divide
    /// evenly).
    pub fn reduce_scatter(&self, group: &[Tensor], op: ReduceOp) -> Result<Vec<Tensor>> {
        let group: Vec<Vec<Tensor>> = group.iter().map(|t| vec![t.clone()]).collect();
        Ok(flatten(self.collective(Kind::ReduceScatter(op), &group)?))
    }

    /// Every member's tensor, one after the other along dim 0 (member 0 first), on
    /// every member's device.
    pub fn all_gather(&self, group: &[Tensor]) -> Result<Vec<Tensor>> {
        let group: Vec<Vec<Tensor>> = group.iter().map(|t| vec![t.clone()]).collect();
        Ok(flatten(self.collective(Kind::AllGather, &group)?))
    }

    /// `t` on each of `devices` (distinct devices of this runtime), in that order; on
    /// `t`'s own device, `t` itself.
    pub fn broadcast(&self, t: &Tensor, devices: &[Device]) -> Result<Vec<Tensor>> {
        self.check_own(t, "broadcast")?;
        check_distinct("broadcast", devices.iter().copied())?;
        for d in devices {
            self.comm_stream(*d, "broadcast")?;
        }
        devices.iter().map(|d| self.copy_to(t, *d)).collect()
    }

    /// Validates a group, then submits one member per device.
    fn collective(&self, kind: Kind, group: &[Vec<Tensor>]) -> Result<Vec<Vec<Tensor>>> {
        let name = kind.name();
        let first = group
            .first()
            .ok_or_else(|| Error::invalid(name, "the group is empty"))?;
        if first.is_empty() {
            return Err(Error::invalid(name, "member 0 has no tensors"));
        }
        let n = group.len();
        check_distinct(
            name,
            group
                .iter()
                .map(|m| m.first().map_or(Device::Cpu(0), Tensor::device)),
        )?;
        for (m, tensors) in group.iter().enumerate() {
            if tensors.len() != first.len() {
                return Err(Error::invalid(
                    name,
                    format!(
                        "member {m} has {} tensors, member 0 has {}",
                        tensors.len(),
                        first.len()
                    ),
                ));
            }
            let device = tensors[0].device();
            for (k, t) in tensors.iter().enumerate() {
                self.check_own(t, name)?;
                if t.device() != device {
                    return Err(Error::DeviceMismatch {
                        op: name.into(),
                        lhs: device,
                        rhs: t.device(),
                    });
                }
                let f = &first[k];
                if t.dtype() != f.dtype() {
                    return Err(Error::dtype(name, f.dtype(), t.dtype()));
                }
                if t.shape() != f.shape() {
                    return Err(Error::ShapeMismatch {
                        op: name.into(),
                        lhs: f.shape().clone(),
                        rhs: t.shape().clone(),
                        detail: format!("tensor {k} of member {m} differs from member 0's"),
                    });
                }
            }
        }
        // The outputs, the same for every member.
        let specs = first
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let mut dims = t.dims().to_vec();
                match kind {
                    Kind::ReduceScatter(_) => {
                        if !dims[0].is_multiple_of(n) {
                            return Err(Error::invalid_dim(
                                name,
                                format!(
                                    "tensor {k}'s dim 0 ({}) does not divide among {n} members",
                                    dims[0]
                                ),
                            ));
                        }
                        dims[0] /= n;
                    }
                    Kind::AllGather => {
                        dims[0] = dims[0].checked_mul(n).ok_or_else(|| {
                            Error::invalid_dim(name, format!("{n} × dim 0 of tensor {k} overflows"))
                        })?;
                    }
                    _ => {}
                }
                Ok(TensorSpec::new(Shape::new(dims), t.dtype()))
            })
            .collect::<Result<Vec<_>>>()?;
        if n == 1 {
            // A group of one is its own result.
            return Ok(vec![first.clone()]);
        }
        let streams = group
            .iter()
            .map(|m| {
                let d = m[0].device();
                self.cpu_only(name, d)?;
                self.comm_stream(d, name)
            })
            .collect::<Result<Vec<StreamId>>>()?;
        let mut out = Vec::with_capacity(n);
        for (index, stream) in streams.into_iter().enumerate() {
            let op = Member {
                kind,
                index,
                device: group[index][0].device(),
                sources: group.to_vec(),
                specs: specs.clone(),
            };
            let sub = self.submit_on(stream, op).map_err(|e| e.error)?;
            out.push(sub.into_outputs().unwrap_or_default());
        }
        Ok(out)
    }

    /// The stream collectives of `device` run on: its communication stream, else its
    /// first compute stream.
    fn comm_stream(&self, device: Device, name: &str) -> Result<StreamId> {
        let mut compute = None;
        for s in &self.inner.streams {
            if s.info.device != device {
                continue;
            }
            match s.info.kind {
                StreamKind::Comm => return Ok(s.info.id),
                StreamKind::Compute if compute.is_none() => compute = Some(s.info.id),
                _ => {}
            }
        }
        compute.ok_or_else(|| Error::DeviceMismatch {
            op: name.into(),
            lhs: self.device(),
            rhs: device,
        })
    }

    /// Moving data between CUDA devices is not built yet.
    fn cpu_only(&self, name: &str, device: Device) -> Result<()> {
        match (&self.inner.backend, device) {
            (BackendState::Cpu, _) => Ok(()),
            _ => Err(Error::invalid(
                name,
                format!("moving data to {device}: copies and collectives between CUDA devices need NCCL and peer copies, which rtx does not bind yet"),
            )),
        }
    }
}

fn flatten(v: Vec<Vec<Tensor>>) -> Vec<Tensor> {
    v.into_iter().flatten().collect()
}

/// The devices must be distinct.
fn check_distinct(name: &str, devices: impl Iterator<Item = Device>) -> Result<()> {
    let mut seen = Vec::new();
    for d in devices {
        if seen.contains(&d) {
            return Err(Error::invalid(
                name,
                format!("{d} appears twice in the group (one member per device)"),
            ));
        }
        seen.push(d);
    }
    Ok(())
}
