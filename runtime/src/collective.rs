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
//! and enqueues nothing there.
//!
//! On the CUDA backend every group runs through NCCL (loaded at run time, like the other
//! CUDA libraries: `libnccl.so` on the library path; a group of one too where NCCL is
//! found, else it is its own result as on the CPU): member `m`
//! is rank `m` of a communicator over the group's devices, made by that device's
//! communication actor the first time the group is used (cudarc's `Comm` is `!Send`: it
//! lives on its actor) from an id the runtime keeps per group, and reads only its own
//! device's tensors. NCCL requires every rank to issue a communicator's collectives in
//! one order: each collective submits all its members under the runtime's group lock,
//! and each communication actor runs its mailbox in order. Copies between CUDA devices
//! ([`Runtime::copy_to`], [`Runtime::broadcast`]) need peer copies, which are not built
//! yet (`docs/multi-gpu.md`): they fail at submit with [`Error::InvalidOp`].
//!
//! [`Backend::CpuDevices`]: crate::Backend::CpuDevices

use std::collections::HashMap;

use cudarc::driver::DeviceRepr;
use cudarc::nccl::safe::{Comm, Id, NcclType};
use rayon::prelude::*;

use crate::buffer::{Buffer, Element};
use crate::device::{Device, StreamId, StreamKind};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{BackendCx, Cost, ExecCx, Op, Plan, PlanCx, TensorSpec};
use crate::runtime::{BackendState, GroupKey, Runtime, MAX_GROUP};
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
/// tensor (`sources[member][k]`; through NCCL, only its own), writes one output per `k`.
struct Member {
    kind: Kind,
    /// Which member this is (its share, for `ReduceScatter`; its NCCL rank).
    index: usize,
    device: Device,
    sources: Vec<Vec<Tensor>>,
    specs: Vec<TensorSpec>,
    /// The NCCL group (CUDA backend).
    nccl: Option<NcclGroup>,
}

/// A group's devices in member order (its communicator's key on every communication
/// actor) and the id its communicators are made from.
#[derive(Clone, Copy)]
struct NcclGroup {
    key: GroupKey,
    id: Id,
}

/// The NCCL communicators of one communication actor, by group (`StreamCx::ext`).
#[derive(Default)]
struct Comms(HashMap<GroupKey, Comm>);

impl Drop for Comms {
    fn drop(&mut self) {
        // cudarc's `Comm` panics when `ncclCommAbort` fails (a device that faulted, say):
        // at the actor's teardown that must not unwind out of the actor.
        for (_, comm) in self.0.drain() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(comm)));
        }
    }
}

fn nccl_error(call: &str, e: impl std::fmt::Debug) -> Error {
    Error::Nccl {
        call: call.into(),
        message: format!("{e:?}"),
    }
}

fn nccl_op(op: ReduceOp) -> cudarc::nccl::safe::ReduceOp {
    match op {
        ReduceOp::Sum => cudarc::nccl::safe::ReduceOp::Sum,
        ReduceOp::Avg => cudarc::nccl::safe::ReduceOp::Avg,
        ReduceOp::Max => cudarc::nccl::safe::ReduceOp::Max,
    }
}

/// Whether the NCCL library can be loaded (it is looked up at run time, not linked).
fn nccl_present() -> bool {
    // SAFETY: only tries to open the library by its usual names; no symbol is called.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

impl Member {
    /// Member `index`'s work through its device's communicator (CUDA backend).
    fn run_nccl(&mut self, cx: &mut ExecCx<'_>, g: NcclGroup) -> Result<()> {
        let scx = cx.cuda()?;
        let stream = scx.stream().clone();
        let taken = scx.ext::<Comms>(|_| Ok(Comms::default()))?.0.remove(&g.key);
        let comm = match taken {
            Some(c) => c,
            // The first collective of this group on this device: the communicator's
            // rank joins (NCCL returns once every rank of the group has).
            None => Comm::from_rank(stream, self.index, g.key.1, g.id)
                .map_err(|e| nccl_error("ncclCommInitRank", e))?,
        };
        let r = self.nccl_outputs(cx, &comm);
        cx.cuda()?
            .ext::<Comms>(|_| Ok(Comms::default()))?
            .0
            .insert(g.key, comm);
        r
    }

    fn nccl_outputs(&self, cx: &mut ExecCx<'_>, comm: &Comm) -> Result<()> {
        let own = &self.sources[self.index];
        for (k, t) in own.iter().enumerate() {
            let n = self.specs[k].shape.numel();
            let out = match self.specs[k].dtype {
                DType::F32 => nccl_one::<f32>(self.kind, comm, cx, t, n)?,
                DType::F16 => nccl_one::<half::f16>(self.kind, comm, cx, t, n)?,
                DType::BF16 => nccl_one::<half::bf16>(self.kind, comm, cx, t, n)?,
                DType::I32 => nccl_one::<i32>(self.kind, comm, cx, t, n)?,
                DType::U32 => nccl_one::<u32>(self.kind, comm, cx, t, n)?,
            };
            cx.set_output(k, out)?;
        }
        Ok(())
    }
}

/// One NCCL call: `t` (this member's tensor) into a new output of `n` elements, on the
/// communicator's stream (this actor's).
fn nccl_one<T: Element + NcclType + DeviceRepr>(
    kind: Kind,
    comm: &Comm,
    cx: &mut ExecCx<'_>,
    t: &Tensor,
    n: usize,
) -> Result<Buffer> {
    let mut out = cx.cuda()?.alloc::<T>(n)?;
    let input = cx.input(t)?;
    let src = input.cuda::<T>()?;
    let status = match kind {
        Kind::AllReduce(op) => comm.all_reduce(src, &mut out, &nccl_op(op)),
        Kind::ReduceScatter(op) => comm.reduce_scatter(src, &mut out, &nccl_op(op)),
        Kind::AllGather => comm.all_gather(src, &mut out),
        Kind::Broadcast => {
            return Err(Error::invalid(
                kind.name(),
                "copies between CUDA devices are not built yet",
            ))
        }
    };
    status.map_err(|e| nccl_error(kind.name(), e))?;
    Ok(Buffer::from_cuda(out))
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
        if self.nccl.is_some() {
            // Through NCCL a member reads only its own device's tensors.
            return self.sources[self.index].iter().collect();
        }
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
            let Some(g) = self.nccl else {
                return Err(Error::invalid(
                    self.kind.name(),
                    "copies between CUDA devices are not built yet",
                ));
            };
            return self.run_nccl(cx, g);
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
            nccl: None,
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
        let cuda = matches!(self.inner.backend, BackendState::Cuda(_));
        if n == 1 && (!cuda || !nccl_present()) {
            // A group of one is its own result (on CUDA with NCCL, a one-rank
            // communicator's: the same values, in new tensors).
            return Ok(vec![first.clone()]);
        }
        let streams = group
            .iter()
            .map(|m| self.comm_stream(m[0].device(), name))
            .collect::<Result<Vec<StreamId>>>()?;
        let mut key: GroupKey = ([0; MAX_GROUP], n);
        if cuda {
            if n > MAX_GROUP {
                return Err(Error::invalid(
                    name,
                    format!("a group of {n} devices: at most {MAX_GROUP}"),
                ));
            }
            for (m, tensors) in group.iter().enumerate() {
                match tensors[0].device() {
                    Device::Cuda(o) => key.0[m] = o as u32,
                    d => return Err(Error::invalid(name, format!("{d} is not a CUDA device"))),
                }
            }
            if !nccl_present() {
                return Err(nccl_error(
                    name,
                    "the NCCL library (libnccl.so) was not found on the library path",
                ));
            }
        }
        // The group lock, held while the members are submitted (module docs).
        let mut groups = self
            .inner
            .collectives
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let nccl = if cuda {
            let id = match groups.ids.get(&key) {
                Some(id) => *id,
                None => {
                    let id = Id::new().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
                    groups.ids.insert(key, id);
                    id
                }
            };
            Some(NcclGroup { key, id })
        } else {
            None
        };
        let mut out = Vec::with_capacity(n);
        for (index, stream) in streams.into_iter().enumerate() {
            let op = Member {
                kind,
                index,
                device: group[index][0].device(),
                sources: group.to_vec(),
                specs: specs.clone(),
                nccl,
            };
            let sub = self.submit_on(stream, op).map_err(|e| e.error)?;
            out.push(sub.into_outputs().unwrap_or_default());
        }
        drop(groups);
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
