//! Stream actors: one thread per stream, taking jobs from its mailbox in order.
//!
//! What the backends share lives here: running a job ([`execute`]), waiting for its
//! inputs, and what a backend's `start` returns to the runtime ([`Started`]). The CPU
//! actor (`cpu/`) and the CUDA actor (`cuda/actor.rs`) build on it; the CUDA one adds
//! events and the watcher.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use crate::buffer::Buffer;
use crate::completion::Payload;
use crate::device::{Device, DeviceInfo, StreamId, StreamInfo};
use crate::error::{Error, Result};
use crate::job::{Envelope, Msg};
use crate::mailbox::Sender;
use crate::op::{BackendCx, Declared, ExecCx};
use crate::placement::{LoadCounters, Policy};
use crate::settings::Settings;
use crate::stats::Counters;
use crate::storage::Ready;
use crate::sync::{thread, Arc};

/// What every actor knows about itself and its runtime.
pub(crate) struct ActorCx {
    pub(crate) stream: StreamId,
    pub(crate) device: Device,
    pub(crate) policy: Arc<dyn Policy>,
    pub(crate) settings: Settings,
    pub(crate) counters: StdArc<Counters>,
}

/// One stream as the runtime sees it.
pub(crate) struct StreamEntry {
    pub(crate) info: StreamInfo,
    pub(crate) tx: Sender<Msg>,
    pub(crate) load: Arc<LoadCounters>,
}

/// What a backend's `start` returns: its devices, its streams (ids numbered from 0 in
/// order), their actor threads, and the backend's own state.
pub(crate) struct Started<S> {
    pub(crate) devices: Vec<DeviceInfo>,
    pub(crate) streams: Vec<StreamEntry>,
    pub(crate) threads: Vec<thread::JoinHandle<()>>,
    pub(crate) state: S,
}

/// What a backend's `start` is given.
pub(crate) struct StartCx {
    /// Compute streams per device.
    pub(crate) streams: usize,
    /// Mailbox capacity per stream.
    pub(crate) mailbox: usize,
    pub(crate) policy: Arc<dyn Policy>,
    pub(crate) settings: Settings,
    pub(crate) counters: StdArc<Counters>,
}

impl StartCx {
    /// The context of the actor of `stream` on `device`.
    pub(crate) fn actor(&self, stream: StreamId, device: Device) -> ActorCx {
        ActorCx {
            stream,
            device,
            policy: self.policy.clone(),
            settings: self.settings,
            counters: self.counters.clone(),
        }
    }
}

/// Spawns a runtime thread named `name` (loom: an unnamed loom thread).
pub(crate) fn spawn_named(
    name: String,
    f: impl FnOnce() + Send + 'static,
) -> thread::JoinHandle<()> {
    #[cfg(not(loom))]
    {
        thread::Builder::new()
            .name(name)
            .spawn(f)
            .expect("spawning a stream actor thread")
    }
    #[cfg(loom)]
    {
        let _ = name;
        thread::spawn(f)
    }
}

/// The result of running an op: its output buffers and the completion-time finisher.
pub(crate) struct Executed {
    pub(crate) outputs: smallvec::SmallVec<[Buffer; 2]>,
    pub(crate) finisher: Option<Box<dyn FnOnce() -> Result<Payload> + Send>>,
    pub(crate) took: Duration,
}

/// Runs the envelope's op in `backend`, catching panics, and checks every output is set.
/// `declared` is the op's input list by address, as [`wait_declared`] returned it (the
/// list is built once per op, on the actor).
pub(crate) fn execute(
    env: &mut Envelope,
    actor: &ActorCx,
    backend: BackendCx<'_>,
    declared: Declared,
) -> Result<Executed> {
    let name = env.name();
    let job = env
        .job
        .as_mut()
        .expect("envelope holds its job until executed");
    let mut cx = ExecCx {
        name,
        stream: actor.stream,
        device: actor.device,
        backend,
        settings: &actor.settings,
        specs: &env.specs,
        outputs: (0..env.specs.len()).map(|_| None).collect(),
        finisher: None,
        declared,
        slots: None,
        donated: false,
        lent: Vec::new(),
    };
    let start = Instant::now();
    // Marked as inside an op (`driver/alloc.rs`): device memory the op drops may still
    // be used by kernels it enqueued, and is not handed to other streams.
    let ran = catch_unwind(AssertUnwindSafe(|| {
        crate::driver::alloc::in_op_run(|| job.run(&mut cx))
    }));
    let took = start.elapsed();
    let err = match ran {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(panic) => Some(Error::OpPanicked {
            op: name.to_string(),
            message: panic_message(&*panic),
        }),
    };
    let err = err.or_else(|| {
        let unset = cx.outputs.iter().position(Option::is_none)?;
        Some(Error::invalid(
            name,
            format!("op did not set output {unset}"),
        ))
    });
    if let Some(e) = err {
        // Outputs already set, and a donated input's memory (dropped with the op), may
        // still be used by kernels the op enqueued: drain the stream before dropping
        // them (dropped device memory is reused at once on its stream's next
        // allocation). Donated memory the op dropped itself was bound to this stream
        // by `ExecCx::donate`, so its free is ordered after those kernels already.
        if let BackendCx::Cuda(scx) = &cx.backend {
            // Launches the op deferred (`driver/batch.rs`) are launched first, so that
            // the drain covers them.
            let deferred = scx.batch.borrow().pending();
            if cx.drain_pending() || deferred {
                scx.flush_launches();
                if let Err(sync) = scx.stream().synchronize() {
                    tracing::error!(error = %sync, "stream synchronize failed after a failed op");
                }
            }
        }
        return Err(e);
    }
    let outputs = cx.outputs.into_iter().flatten().collect();
    Ok(Executed {
        outputs,
        finisher: cx.finisher,
        took,
    })
}

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Waits (blocking, without spinning) until every input of the envelope's op has been
/// published, handing each one's ready mark to `each` (the CUDA actor makes its stream
/// wait on it) and dropping it before the next: a donating op needs to hold the only
/// reference to its input's buffer when it runs. Returns the op's input list by address
/// for [`execute`]: the op's `inputs` is called once per op on the actor. A failed
/// producer fails this op (as does an error from `each`, returned as it is).
///
/// `before_block` is called once, before the first wait for an input that is not
/// published yet (the CUDA actor hands over its open burst there, see `burst.rs`); the
/// returned flag says whether it was.
pub(crate) fn wait_declared(
    env: &Envelope,
    mut before_block: impl FnMut(),
    mut each: impl FnMut(Ready) -> Result<()>,
) -> Result<(Declared, bool)> {
    let job = env
        .job
        .as_ref()
        .expect("envelope holds its job until executed");
    let inputs = job.inputs();
    let mut declared = Declared::new();
    let mut blocked = false;
    for t in &inputs {
        if !blocked && !t.storage().is_settled() {
            blocked = true;
            before_block();
        }
        let ready = t.storage().wait_ready().map_err(|e| Error::Upstream {
            op: job.name().to_string(),
            cause: Box::new(e),
        })?;
        each(ready)?;
        declared.push(crate::sync::Arc::as_ptr(t.storage()) as usize);
    }
    Ok((declared, blocked))
}

/// Calls the policy's `observe`, containing a panic in user code (the actor lives on).
pub(crate) fn observe(
    policy: &dyn Policy,
    name: &str,
    cost: crate::op::Cost,
    stream: StreamId,
    took: Duration,
) {
    policy_call(name, "observe", || policy.observe(name, cost, stream, took));
}

/// Runs `call`, a call of the placement policy (user code) about op `name`, containing
/// a panic: it is logged as the policy's, and the actor lives on.
pub(crate) fn policy_call(name: &str, what: &'static str, call: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(call)).is_err() {
        tracing::warn!(op = name, call = what, "the placement policy panicked");
    }
}

/// Runs an op's completion-time finisher, turning a panic into the op's error.
pub(crate) fn run_finisher(
    name: &str,
    f: Box<dyn FnOnce() -> Result<Payload> + Send>,
) -> Result<Payload> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::OpPanicked {
            op: name.to_string(),
            message: panic_message(&*p),
        })
    })
}

/// `[512, 10] f32, [512] f32`: the shapes and dtypes of an op's outputs (for the
/// timeline recorder, `trace.rs`).
pub(crate) fn describe(specs: &[crate::op::TensorSpec]) -> String {
    let mut s = String::new();
    for (i, o) in specs.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&format!("{} {}", o.shape, o.dtype.name()));
    }
    s
}
