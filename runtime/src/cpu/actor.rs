//! The CPU actor: runs each job to completion on its thread (rayon inside the op).

use crate::actor::{describe, execute, observe, run_finisher, wait_declared, ActorCx};
use crate::job::{Envelope, Msg};
use crate::mailbox::Receiver;
use crate::op::BackendCx;
use crate::stats::Phase;
use crate::storage::{Mark, Ready};
use crate::sync::Arc;

/// The CPU actor: runs each job to completion on this thread (rayon inside the op).
pub(crate) fn cpu_actor(rx: Receiver<Msg>, actor: ActorCx) {
    actor.settings.enter();
    crate::reentry::enter_actor(actor.stream);
    loop {
        let mut t = actor.counters.clock();
        let Some(msg) = rx.recv() else { break };
        actor.counters.lap(Phase::Idle, &mut t);
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
    // The span's fields (a clock read among them) are evaluated only when a subscriber
    // wants the span.
    let span = tracing::debug_span!(
        "op",
        kind = env.name(),
        stream = actor.stream.0,
        queue_wait_us = env.submitted.elapsed().as_micros() as u64,
        run_us = tracing::field::Empty
    );
    let _enter = span.enter();
    let mut t = actor.counters.clock();
    // Each input's reference is dropped as soon as it is published: a donating op needs
    // to hold the only reference to its input's buffer.
    let waited = wait_declared(
        &env,
        || {},
        |ready| {
            drop(ready);
            Ok(())
        },
    );
    let mut began = None;
    let result = waited.and_then(|(declared, blocked)| {
        let phase = if blocked {
            Phase::Blocked
        } else {
            Phase::Inputs
        };
        actor.counters.lap(phase, &mut t);
        began = actor.counters.trace.on().then(std::time::Instant::now);
        execute(&mut env, actor, BackendCx::Cpu, declared)
    });
    if let (Some(start), Ok(_)) = (began, &result) {
        let end = std::time::Instant::now();
        let detail = describe(&env.specs);
        actor
            .counters
            .trace
            .push_host(actor.stream, env.name(), detail, start, end);
    }
    actor.counters.lap(Phase::Execute, &mut t);
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
    drop(env);
    actor.counters.lap(Phase::Publish, &mut t);
}
