//! The runtime: submission, placement, shutdown (`builder.rs`: the builder, its
//! settings, and the assembly of a runtime from what its backend's `start` returns: the
//! streams and their threads, and the backend's state, [`BackendState`]).

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc as StdArc;
use std::task::{Context, Poll};
use std::time::Instant;

use smallvec::SmallVec;

mod builder;
mod ergonomic;
pub(crate) mod graph;
mod info;

pub(crate) use builder::BackendState;
pub use builder::{Backend, BackendKind, Builder};
pub use ergonomic::Values;
pub use info::RuntimeInfo;

use crate::actor::{panic_message, spawn_named, StreamEntry};
use crate::completion::{Completion, CompletionGuard, Submission};
use crate::device::{Device, DeviceInfo, StreamId, StreamKind};
use crate::error::{Error, Result, SubmitError};
use crate::gate::Gate;
use crate::job::{Envelope, Msg, OpJob, OutputStorages};
use crate::mailbox::TrySendError;
use crate::op::{Op, Outputs, PlanCx};
use crate::placement::{rough_ns, OpInfo, Policy, StreamLoad};
use crate::reentry::current_actor;
use crate::settings::Settings;
use crate::stats::{Counters, Phase, Stats};
use crate::storage::Storage;
use crate::sync::{lock, thread, Arc, AtomicBool, Mutex, Ordering};
use crate::tensor::Tensor;

pub(crate) struct Inner {
    /// This runtime's id: tensors remember it, since stream ids and events are per runtime.
    pub(crate) id: u64,
    /// The backend and its state.
    pub(crate) backend: BackendState,
    pub(crate) devices: Vec<DeviceInfo>,
    pub(crate) streams: Vec<StreamEntry>,
    pub(crate) policy: Arc<dyn Policy>,
    /// The settings it runs with (builder values, environment overrides applied).
    pub(crate) settings: Settings,
    /// Its cache counters and phase timings.
    pub(crate) counters: StdArc<Counters>,
    /// Set once shutdown begins (a fast early check for `prepare`).
    pub(crate) closed: AtomicBool,
    /// The shutdown gate (`gate.rs`): every job send passes it; shutdown closes it, waits
    /// (off the caller's thread) for the senders inside to leave, then sends the shutdown
    /// messages. So every accepted job is in its mailbox before the shutdown message, and
    /// none can arrive after the actor has drained (it would sit in the channel forever
    /// and its waiter would hang).
    pub(crate) gate: Gate,
    pub(crate) threads: Mutex<Vec<thread::JoinHandle<()>>>,
    /// The collectives' group lock and the NCCL ids of the device groups seen so far
    /// (`collective.rs`): a collective submits all its members under it, so every
    /// communication stream receives the collectives in one order.
    pub(crate) collectives: std::sync::Mutex<Groups>,
}

/// Up to [`MAX_GROUP`] device ordinals of a collective's group, in member order, and how
/// many there are.
pub(crate) type GroupKey = ([u32; MAX_GROUP], usize);
/// The most devices an NCCL group of one runtime spans.
pub(crate) const MAX_GROUP: usize = 16;

/// The runtime-wide state of the collectives (`Inner::collectives`, used by
/// `collective.rs`): its lock is the group lock.
#[derive(Default)]
pub(crate) struct Groups {
    /// The NCCL id of each CUDA device group seen so far.
    pub(crate) ids: std::collections::HashMap<GroupKey, cudarc::nccl::safe::Id>,
}

/// The rtx runtime: stream actors, a scheduler, and the completion machinery.
///
/// Cheap to clone and `Send + Sync`. Dropping the last handle (or [`Runtime::shutdown`])
/// drains: every accepted op runs or fails with an error, and the actor threads are joined.
///
/// # Examples
///
/// ```
/// use rtx::{Runtime, Backend, block_on};
/// let rt = Runtime::builder().backend(Backend::Cpu).streams(2).build().unwrap();
/// let x = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
/// let v: Vec<f32> = block_on(rt.to_vec(&x).unwrap()).unwrap();
/// assert_eq!(v, [1.0, 2.0, 3.0]);
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
    /// The stream every unpinned submission through this handle goes to
    /// ([`Runtime::on`]); `None`: placed by the policy.
    pub(crate) pin: Option<StreamId>,
    /// Set on the handles of a capture ([`Capture::runtime`](crate::Capture::runtime)):
    /// submissions are recorded into it instead of sent.
    pub(crate) recording: Option<Arc<crate::sync::Mutex<Option<graph::Recording>>>>,
}

impl Runtime {
    /// The CPU backend with `streams` streams (a shorthand for tests and examples).
    pub fn cpu(streams: usize) -> Runtime {
        Runtime::builder()
            .backend(Backend::Cpu)
            .streams(streams)
            .build()
            .expect("the CPU backend always starts")
    }

    /// The settings this runtime runs with: the builder's, with the environment's
    /// overrides applied (see [`settings`](crate::settings)).
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// This runtime's counters: block and pinned cache hits and misses, and the phase
    /// timings when it profiles (setting `profile`). Counted since it started or since
    /// the last [`Runtime::reset_stats`].
    pub fn stats(&self) -> Stats {
        self.inner.counters.snapshot()
    }

    /// Clears this runtime's counters (for measuring one part of a run).
    pub fn reset_stats(&self) {
        self.inner.counters.reset()
    }

    /// The backend, devices and streams.
    pub fn info(&self) -> RuntimeInfo {
        RuntimeInfo {
            backend: self.inner.backend.kind(),
            devices: self.inner.devices.clone(),
            streams: self.inner.streams.iter().map(|s| s.info.clone()).collect(),
            policy: self.inner.policy.name(),
        }
    }

    /// The backend kind.
    pub fn backend(&self) -> BackendKind {
        self.inner.backend.kind()
    }

    /// The default device: that of the pinned stream on a handle from [`Runtime::on`],
    /// else the first. Uploads ([`Runtime::upload`]) and ops without inputs go there.
    pub fn device(&self) -> Device {
        self.pin
            .and_then(|s| self.inner.streams.get(s.0))
            .map_or(self.inner.devices[0].device, |e| e.info.device)
    }

    /// The compute streams of `device`.
    pub fn compute_streams(&self, device: Device) -> Vec<StreamId> {
        self.inner
            .streams
            .iter()
            .filter(|s| s.info.device == device && s.info.kind == StreamKind::Compute)
            .map(|s| s.info.id)
            .collect()
    }

    /// Submits an op, placed by the policy. Validation happens here, before anything is
    /// enqueued; a rejected op comes back in the error. Blocks while the chosen stream's
    /// mailbox is full (use [`Runtime::submit_async`] in async code to wait without
    /// blocking the executor).
    pub fn submit<O: Op>(&self, op: O) -> Result<Submission<O::Output>, SubmitError<O>> {
        self.submit_inner(self.pin, op)
    }

    /// A handle to this runtime whose [`Runtime::submit`] (and `submit_async`) pins
    /// every op to `stream`: code written against `&Runtime` (a layer, a model's
    /// step) then keeps its whole chain on that stream without naming it. Everything
    /// else is shared with `self` (same actors, tensors, settings); `submit_on` still
    /// pins where it says. A stream of another device than an op's inputs rejects the
    /// op at submit, as `submit_on` does.
    ///
    /// ```
    /// use rtx::{ops, Runtime};
    /// let rt = Runtime::cpu(2);
    /// let s1 = rt.compute_streams(rt.device())[1];
    /// let a = rt.upload(&[1.0f32, 2.0], [2])?;
    /// let sub = rt.on(s1).submit(ops::relu(&a))?;
    /// assert_eq!(sub.stream(), s1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on(&self, stream: StreamId) -> Runtime {
        Runtime {
            inner: self.inner.clone(),
            pin: Some(stream),
            recording: self.recording.clone(),
        }
    }

    /// The stream this handle pins its submissions to ([`Runtime::on`]), if any.
    pub fn pinned(&self) -> Option<StreamId> {
        self.pin
    }

    /// Takes the timeline spans recorded since the last call (or since the runtime
    /// started), ordered by start; empty unless the runtime records (setting `trace`,
    /// [`Builder::trace`]). Spans of ops still running appear in a later call.
    pub fn take_trace(&self) -> Vec<crate::trace::TraceSpan> {
        self.inner.counters.trace.take()
    }

    /// `t` must belong to this runtime (checked for every input at submit, and by the
    /// collectives for every member before any is submitted).
    pub(crate) fn check_own(&self, t: &Tensor, name: &str) -> Result<()> {
        if t.storage().runtime != self.inner.id {
            return Err(Error::invalid(
                name,
                format!(
                    "{t:?} belongs to another runtime (stream ids and events are per \
                     runtime; download and upload it)"
                ),
            ));
        }
        Ok(())
    }

    /// Submits an op to a chosen stream (pinning).
    pub fn submit_on<O: Op>(
        &self,
        stream: StreamId,
        op: O,
    ) -> Result<Submission<O::Output>, SubmitError<O>> {
        self.submit_inner(Some(stream), op)
    }

    fn submit_inner<O: Op>(
        &self,
        pin: Option<StreamId>,
        op: O,
    ) -> Result<Submission<O::Output>, SubmitError<O>> {
        if let Some(rec) = &self.recording {
            return graph::record_submit(rec, pin, op);
        }
        let mut t = self.inner.counters.clock();
        let (env, sub, stream) = self.prepare(pin, op)?;
        let sent = match self.send_job(stream, env) {
            Ok(()) => Ok(sub),
            Err((error, env)) => Err(SubmitError {
                error,
                op: env.recover(),
            }),
        };
        self.inner.counters.lap(Phase::Submit, &mut t);
        sent
    }

    /// Sends a job to its stream's mailbox through the shutdown gate (see
    /// [`Inner::gate`]), blocking while the mailbox is full, except on a stream actor's
    /// thread (an op submitting from `run`): there a full mailbox fails with
    /// [`Error::ActorWouldBlock`] (blocking could wait forever, see `reentry.rs`). The
    /// envelope comes back with the error: [`Error::Shutdown`] once the runtime is
    /// shutting down.
    #[allow(clippy::result_large_err)] // the envelope comes back only on failure
    pub(crate) fn send_job(
        &self,
        stream: StreamId,
        env: Envelope,
    ) -> Result<(), (Error, Envelope)> {
        let Some(_pass) = self.inner.gate.enter() else {
            return Err((Error::Shutdown, env));
        };
        let tx = &self.inner.streams[stream.0].tx;
        let sent = match current_actor() {
            None => tx.send(Msg::Job(env)).map_err(|m| (Error::Shutdown, m)),
            Some(own) => tx.try_send(Msg::Job(env)).map_err(|e| match e {
                TrySendError::Full(m) => (
                    Error::ActorWouldBlock {
                        call: "submit".into(),
                        stream: own,
                        reason: format!(
                            "the mailbox of {stream} is full (a submit from an op's run never waits for room)"
                        ),
                    },
                    m,
                ),
                TrySendError::Closed(m) => (Error::Shutdown, m),
            }),
        };
        sent.map_err(|(e, m)| match m {
            Msg::Job(env) => (e, env),
            Msg::Shutdown | Msg::Release(_) => unreachable!("only jobs are sent here"),
        })
    }

    /// Submits an op whose value is produced at completion (`finish_with`).
    pub(crate) fn submit_payload<O: Op, T: Send + 'static>(
        &self,
        stream: StreamId,
        op: O,
    ) -> Result<Submission<T>> {
        if self.recording.is_some() {
            // A value for the host (a download) cannot be part of a graph.
            return Err(Error::NotCapturable {
                op: op.name().to_string(),
                hazard: crate::error::CaptureHazard::Readback,
            });
        }
        let (env, sub, stream) = self.prepare(Some(stream), op).map_err(|e| e.error)?;
        drop(sub);
        let completion = env
            .completion
            .as_ref()
            .map(|c| c.completion())
            .expect("fresh envelope has its completion");
        match self.send_job(stream, env) {
            Ok(()) => Ok(Submission::payload(completion, stream)),
            Err((e, _)) => Err(e),
        }
    }

    /// Validates, places and packages an op; nothing is enqueued yet.
    #[allow(clippy::type_complexity)]
    pub(crate) fn prepare<O: Op>(
        &self,
        pin: Option<StreamId>,
        op: O,
    ) -> Result<(Envelope, Submission<O::Output>, StreamId), SubmitError<O>> {
        let reject = |error: Error, op: O| Err(SubmitError { error, op });
        if self.inner.closed.load(Ordering::Acquire) {
            return reject(Error::Shutdown, op);
        }
        let name = op.name();
        // An op that moves data between devices names where it runs (`Op::device`).
        let target = op.device();
        // The device: that of the inputs, which must agree and belong to this runtime.
        let (device, input_streams, pending_inputs) = {
            let inputs = op.inputs();
            let mut device = None;
            // Inline: no allocation per submit for up to 4 producing streams.
            let mut producers: SmallVec<[StreamId; 4]> = SmallVec::new();
            let mut pending: SmallVec<[StreamId; 4]> = SmallVec::new();
            let mut bad = None;
            for t in &inputs {
                if let Err(e) = self.check_own(t, name) {
                    bad = Some(e);
                    break;
                }
                let d = t.device();
                match device {
                    _ if target.is_some() => {}
                    None => device = Some(d),
                    Some(d0) if d0 != d => {
                        bad = Some(Error::DeviceMismatch {
                            op: name.into(),
                            lhs: d0,
                            rhs: d,
                        });
                        break;
                    }
                    _ => {}
                }
                if let Some(p) = t.producer() {
                    if !producers.contains(&p) {
                        producers.push(p);
                    }
                    if !t.is_published() && !pending.contains(&p) {
                        pending.push(p);
                    }
                }
            }
            if let Some(e) = bad {
                drop(inputs);
                return reject(e, op);
            }
            // An op without inputs runs on its pinned stream's device, else the default.
            let pinned = pin
                .and_then(|s| self.inner.streams.get(s.0))
                .map(|e| e.info.device);
            (
                target
                    .or(device)
                    .or(pinned)
                    .unwrap_or_else(|| self.device()),
                producers,
                pending,
            )
        };
        if !self.has_device(device) {
            let own = self.device();
            return reject(
                Error::DeviceMismatch {
                    op: name.into(),
                    lhs: own,
                    rhs: device,
                },
                op,
            );
        }
        // User code: a panic comes back as an error with the op, like one in `run`.
        let planned = catch_unwind(AssertUnwindSafe(|| op.plan(&PlanCx { device })));
        let plan = match planned {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return reject(e, op),
            Err(panic) => {
                let message = panic_message(&*panic);
                drop(panic);
                return reject(
                    Error::OpPanicked {
                        op: name.to_string(),
                        message,
                    },
                    op,
                );
            }
        };
        if let Err(e) = crate::op::check_output_count::<O::Output>(name, plan.outputs.len()) {
            return reject(e, op);
        }
        for (i, o) in plan.outputs.iter().enumerate() {
            match o.shape.checked_numel() {
                Some(0) => {
                    let msg = format!(
                        "output {i} would be empty ({}); zero-size tensors are not supported",
                        o.shape
                    );
                    return reject(Error::invalid(name, msg), op);
                }
                None => {
                    let msg = format!(
                        "output {i} ({}) has more elements than fit in usize",
                        o.shape
                    );
                    return reject(Error::invalid_dim(name, msg), op);
                }
                Some(_) => {}
            }
        }
        // Host memory: outputs far larger than the machine has would abort the process
        // in the allocator (Rust's `vec!` does not fail). Checked only for large outputs,
        // so small ops never read /proc.
        if matches!(device, Device::Cpu(_)) {
            let requested = plan.outputs.iter().try_fold(0usize, |acc, o| {
                o.shape
                    .checked_numel()
                    .and_then(|n| n.checked_mul(o.dtype.size()))
                    .and_then(|b| acc.checked_add(b))
            });
            if let Some(e) = host_memory_check(device, requested) {
                return reject(e, op);
            }
        }
        // Placement.
        let stream = match pin {
            Some(s) => match self.inner.streams.get(s.0) {
                Some(e) if e.info.device == device => s,
                Some(e) => {
                    let msg = format!("{s} is on {}, the inputs on {device}", e.info.device);
                    return reject(Error::invalid(name, msg), op);
                }
                None => return reject(Error::invalid(name, format!("no {s} in this runtime")), op),
            },
            None => self.place(name, plan.cost, device, &input_streams, &pending_inputs),
        };
        let entry = &self.inner.streams[stream.0];
        let outputs: OutputStorages = plan
            .outputs
            .iter()
            .map(|s| {
                Arc::new(
                    Storage::pending(
                        s.dtype,
                        s.shape.numel(),
                        device,
                        Some(stream),
                        self.inner.id,
                    )
                    .held_by_producer(),
                )
            })
            .collect();
        let tensors = plan
            .outputs
            .iter()
            .zip(&outputs)
            .map(|(s, st)| Tensor::from_storage(s.shape.clone(), st.clone()));
        let value = O::Output::from_tensor_iter(tensors);
        let completion = Completion::new();
        let est_ns = rough_ns(plan.cost);
        entry.load.add(est_ns);
        let env = Envelope {
            job: Some(Box::new(OpJob(op))),
            specs: plan.outputs,
            outputs,
            completion: Some(CompletionGuard::new(completion.clone())),
            cost: plan.cost,
            est_ns,
            submitted: Instant::now(),
            load: entry.load.clone(),
        };
        Ok((env, Submission::prebuilt(value, completion, stream), stream))
    }

    fn place(
        &self,
        name: &str,
        cost: crate::op::Cost,
        device: Device,
        inputs: &[StreamId],
        pending_inputs: &[StreamId],
    ) -> StreamId {
        let loads: SmallVec<[StreamLoad; 8]> = self
            .inner
            .streams
            .iter()
            .filter(|s| s.info.device == device && s.info.kind == StreamKind::Compute)
            .map(|s| StreamLoad {
                id: s.info.id,
                queued_ops: s.load.ops.load(Ordering::Relaxed),
                queued_ns: s.load.ns.load(Ordering::Relaxed),
            })
            .collect();
        let info = OpInfo {
            name,
            cost,
            input_streams: inputs,
            pending_input_streams: pending_inputs,
        };
        // User code (a custom policy): a panic places the op on the first stream.
        let i = catch_unwind(AssertUnwindSafe(|| self.inner.policy.place(&info, &loads)))
            .unwrap_or_else(|_| {
                tracing::warn!(op = name, "the placement policy panicked in place");
                0
            });
        loads.get(i).map(|l| l.id).unwrap_or(loads[0].id)
    }

    /// Shuts down: stops accepting ops, lets every accepted op run (or fail), joins the
    /// actor threads. The returned future resolves once everything has drained; dropping
    /// the last runtime handle does the same synchronously.
    ///
    /// The call itself never blocks: from the moment it returns every submit, upload and
    /// download fails with [`Error::Shutdown`], and the waiting (for submitters blocked on
    /// a full mailbox, for the drain, for the threads) happens on a thread of its own, so
    /// calling it on an async executor's thread is fine. Awaiting the future inside an
    /// op's `run` fails with [`Error::ActorWouldBlock`] (the actor cannot drain while it
    /// waits); the shutdown still goes ahead once the op returns.
    pub fn shutdown(&self) -> Shutdown {
        let done = Completion::new();
        let first = self.inner.begin_close();
        let inner = self.inner.clone();
        let d = done.clone();
        spawn_named("rtx-shutdown".into(), move || {
            if first {
                inner.finish_close();
            }
            inner.join_all();
            d.complete(Ok(None));
        });
        Shutdown(done)
    }

    /// Whether shutdown has begun (every submit, upload and download then fails with
    /// [`Error::Shutdown`]).
    pub fn is_shut_down(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }
}

impl Inner {
    /// Marks the runtime closed and closes the gate; never blocks. Whether this call
    /// closed it (then the caller must [`finish_close`](Inner::finish_close)).
    fn begin_close(&self) -> bool {
        self.closed.store(true, Ordering::Release);
        self.gate.close()
    }

    /// Waits for the senders inside the gate to leave, then sends every actor its
    /// shutdown message: blocks while the senders and the messages wait for room.
    fn finish_close(&self) {
        self.gate.wait_empty();
        for s in &self.streams {
            let _ = s.tx.send(Msg::Shutdown);
        }
    }

    /// Closes and sends the shutdown messages (once), on this thread.
    fn close(&self) {
        if self.begin_close() {
            self.finish_close();
        }
    }

    fn join_all(&self) {
        loop {
            let h = lock(&self.threads).pop();
            match h {
                Some(h) => {
                    // A runtime dropped on one of its own actors cannot join that actor;
                    // it exits by itself after the shutdown message.
                    #[cfg(not(loom))]
                    if h.thread().id() == thread::current().id() {
                        continue;
                    }
                    let _ = h.join();
                }
                None => break,
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropped on one of the runtime's own threads (an op or a keep-alive held the last
        // handle): joining from here could wait on this very thread (an actor joins its
        // watcher) or block in a full mailbox, so tear down from a detached thread.
        #[cfg(not(loom))]
        if thread::current()
            .name()
            .is_some_and(|n| n.starts_with("rtx-"))
        {
            self.begin_close();
            let streams = std::mem::take(&mut self.streams);
            let threads = std::mem::take(&mut *lock(&self.threads));
            let teardown = move || {
                for s in &streams {
                    let _ = s.tx.send(Msg::Shutdown);
                }
                for h in threads {
                    if h.thread().id() != thread::current().id() {
                        let _ = h.join();
                    }
                }
            };
            if thread::Builder::new()
                .name("rtx-teardown".into())
                .spawn(teardown)
                .is_err()
            {
                tracing::error!("could not spawn the runtime teardown thread");
            }
            return;
        }
        self.close();
        self.join_all();
    }
}

/// Resolves when a shutdown has drained every stream. See [`Runtime::shutdown`].
///
/// `Ok(())` once drained; `Err(`[`Error::ActorWouldBlock`]`)` when polled, before the
/// drain, inside an op's `run` (a stream actor's thread), where waiting for the drain
/// would wait for the actor itself.
pub struct Shutdown(Arc<Completion>);

impl Future for Shutdown {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        match self.0.poll_result(cx) {
            Poll::Ready(_) => Poll::Ready(Ok(())),
            Poll::Pending => match crate::reentry::refuse_on_actor("shutdown", || {
                "the shutdown waits for every actor to drain, this one included".into()
            }) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
        }
    }
}

/// `OutOfMemory` for host outputs of `requested` bytes (`None`: more than `usize`) when
/// that is over 1 GiB and more than the memory the system reports available; `None`
/// (no error) otherwise, or when the system does not say (`/proc/meminfo` absent).
fn host_memory_check(device: Device, requested: Option<usize>) -> Option<Error> {
    const LARGE: usize = 1 << 30;
    let requested = requested.unwrap_or(usize::MAX);
    if requested <= LARGE {
        return None;
    }
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
                .map(|kb| kb.saturating_mul(1024))
        })?;
    (requested > available).then_some(Error::OutOfMemory {
        device,
        requested,
        available,
    })
}
