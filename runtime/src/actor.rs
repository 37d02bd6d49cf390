//! Stream actors: one thread per stream, taking jobs from its mailbox in order.
//!
//! The shared part of running a job lives here ([`execute`]); the CPU actor loop too.
//! The CUDA actor (`cuda/actor.rs`) reuses `execute` and adds events and the watcher.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crate::buffer::Buffer;
use crate::completion::Payload;
use crate::device::{Device, StreamId};
use crate::error::{Error, Result};
use crate::job::{Envelope, Msg};
use crate::mailbox::Receiver;
use crate::op::{BackendCx, ExecCx};
use crate::placement::Policy;
use crate::storage::{Mark, Ready};
use crate::sync::Arc;

/// What every actor knows about itself.
pub(crate) struct ActorCx {
    pub(crate) stream: StreamId,
    pub(crate) device: Device,
    pub(crate) policy: Arc<dyn Policy>,
}

/// The result of running an op: its output buffers and the completion-time finisher.
pub(crate) struct Executed {
    pub(crate) outputs: Vec<Buffer>,
    pub(crate) finisher: Option<Box<dyn FnOnce() -> Result<Payload> + Send>>,
    pub(crate) took: Duration,
}

/// Runs the envelope's op in `backend`, catching panics, and checks every output is set.
pub(crate) fn execute(
    env: &mut Envelope,
    actor: &ActorCx,
    backend: BackendCx<'_>,
) -> Result<Executed> {
    let name = env.name();
    let job = env
        .job
        .as_mut()
        .expect("envelope holds its job until executed");
    let declared = job
        .inputs()
        .iter()
        .map(|t| crate::sync::Arc::as_ptr(t.storage()) as usize)
        .collect();
    let mut cx = ExecCx {
        name,
        stream: actor.stream,
        device: actor.device,
        backend,
        specs: &env.specs,
        outputs: (0..env.specs.len()).map(|_| None).collect(),
        finisher: None,
        declared,
    };
    let start = Instant::now();
    let ran = catch_unwind(AssertUnwindSafe(|| job.run(&mut cx)));
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
        // Outputs already set may still be written by kernels the op enqueued: drain
        // the stream before dropping them (dropped device memory is reused at once on
        // its stream's next allocation).
        if let BackendCx::Cuda(scx) = &cx.backend {
            if cx.outputs.iter().any(Option::is_some) {
                if let Err(sync) = scx.stream().synchronize() {
                    tracing::error!(error = %sync, "stream synchronize failed after a failed op");
                }
            }
        }
        return Err(e);
    }
    let outputs: Vec<Buffer> = cx.outputs.into_iter().flatten().collect();
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

/// Waits (blocking, without spinning) until every input's producer has published, and
/// returns what it published. A failed producer fails this op.
pub(crate) fn wait_inputs(env: &Envelope) -> Result<Vec<Ready>> {
    let job = env
        .job
        .as_ref()
        .expect("envelope holds its job until executed");
    wait_ready(job.name(), &job.inputs())
}

/// Waits until each of op `name`'s `inputs` is published; their ready marks.
pub(crate) fn wait_ready(name: &str, inputs: &[&crate::Tensor]) -> Result<Vec<Ready>> {
    inputs
        .iter()
        .map(|t| {
            t.storage().wait_ready().map_err(|e| Error::Upstream {
                op: name.to_string(),
                cause: Box::new(e),
            })
        })
        .collect()
}

/// The CPU actor: runs each job to completion on this thread (rayon inside the op).
pub(crate) fn cpu_actor(rx: Receiver<Msg>, actor: ActorCx) {
    while let Some(msg) = rx.recv() {
        match msg {
            Msg::Job(env) => run_cpu(env, &actor),
            Msg::Release(done) => drop(done),
            Msg::Shutdown => break,
        }
    }
    // Anything sent after the shutdown message is failed by its envelope's drop.
    while let Some(m) = rx.try_recv() {
        drop(m);
    }
}

fn run_cpu(mut env: Envelope, actor: &ActorCx) {
    let queued = env.submitted.elapsed();
    let span = tracing::debug_span!(
        "op",
        kind = env.name(),
        stream = actor.stream.0,
        queue_wait_us = queued.as_micros() as u64,
        run_us = tracing::field::Empty
    );
    let _enter = span.enter();
    // Drop the input references before running: a donating op needs to hold the only
    // reference to its input's buffer.
    let result = wait_inputs(&env).and_then(|readies| {
        drop(readies);
        execute(&mut env, actor, BackendCx::Cpu)
    });
    match result {
        Ok(ex) => {
            span.record("run_us", ex.took.as_micros() as u64);
            observe(&*actor.policy, env.name(), env.cost, actor.stream, ex.took);
            for (s, b) in env.outputs.iter().zip(ex.outputs) {
                s.publish(Ready {
                    buf: Arc::new(b),
                    mark: Mark::Host,
                });
            }
            let payload = ex.finisher.map(|f| run_finisher(env.name(), f)).transpose();
            if let Some(c) = env.completion.take() {
                c.finish(payload);
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "op failed");
            env.fail(e);
        }
    }
    // Dropping the envelope releases the op's keep-alive (its inputs) and the load.
}

/// Calls the policy's `observe`, containing a panic in user code (the actor lives on).
pub(crate) fn observe(
    policy: &dyn Policy,
    name: &str,
    cost: crate::op::Cost,
    stream: StreamId,
    took: Duration,
) {
    if catch_unwind(AssertUnwindSafe(|| {
        policy.observe(name, cost, stream, took)
    }))
    .is_err()
    {
        tracing::warn!(op = name, "the placement policy panicked in observe");
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
