//! The CUDA stream actor and its completion watcher (protocol in `cuda/mod.rs`).

use std::sync::mpsc;
use std::sync::Arc as StdArc;
use std::time::Duration;

use super::event::{EventPool, PooledEvent};
use super::{DeviceShared, StreamCx};
use crate::actor::{execute, wait_ready, ActorCx};
use crate::burst::{Burst, OpenBurst};
use crate::completion::Payload;
use crate::error::{Error, Result};
use crate::job::{Envelope, Msg};
use crate::mailbox::{Receiver, Sender, TrySendError};
use crate::op::BackendCx;
use crate::profile::{self, Phase};
use crate::storage::{Mark, Ready};
use crate::sync::Arc;

/// The ready event of a burst of ops on one stream (see `burst.rs`).
pub(crate) type EventBurst = Burst<Arc<PooledEvent>>;

/// An enqueued op waiting for its burst's event.
struct Watch {
    env: Envelope,
    burst: Arc<EventBurst>,
    finisher: Option<Box<dyn FnOnce() -> Result<Payload> + Send>>,
    took: Duration,
}

/// Enqueued ops not yet handed to the watcher, and their burst's event, recorded when
/// they are handed over: when the mailbox runs empty, `WATCH_FLUSH` ops are pending, or
/// before the actor blocks on another stream (see `burst.rs` for why it cannot
/// deadlock). One event record and one wake-up of the watcher per burst, instead of per
/// op.
struct Outbox {
    wtx: crossbeam_channel::Sender<Vec<Watch>>,
    pool: StdArc<EventPool>,
    pending: Vec<Watch>,
    open: Option<OpenBurst<Arc<PooledEvent>>>,
}

impl Outbox {
    /// The open burst (opened now if none is).
    fn burst(&mut self) -> Arc<EventBurst> {
        self.open
            .get_or_insert_with(|| OpenBurst(Arc::new(Burst::new())))
            .0
            .clone()
    }

    /// Records the open burst's event and hands its ops to the watcher. If recording
    /// fails, the burst's ops fail (after the stream has passed them) and so do the
    /// consumers waiting on it; if the watcher is gone (it never exits before the
    /// actor), the ops fail rather than hang.
    fn flush(&mut self, scx: &StreamCx) {
        let Some(open) = self.open.take() else {
            debug_assert!(self.pending.is_empty(), "pending ops always have a burst");
            return;
        };
        let mut t = profile::clock();
        let batch = std::mem::replace(&mut self.pending, Vec::with_capacity(WATCH_FLUSH));
        match self.pool.record(&scx.stream) {
            Ok(ev) => open.0.set(Ok(Arc::new(ev))),
            Err(e) => {
                let err = cuda_err("cuEventRecord", e);
                open.0.set(Err(err.clone()));
                for w in batch {
                    fail_after_enqueue(w.env, err.clone(), scx);
                }
                return;
            }
        }
        profile::lap(Phase::Record, &mut t);
        if let Err(crossbeam_channel::SendError(batch)) = self.wtx.send(batch) {
            for w in batch {
                fail_after_enqueue(
                    w.env,
                    Error::Synchronization {
                        code: None,
                        message: "the completion watcher is gone".into(),
                    },
                    scx,
                );
            }
        }
    }
}

fn cuda_err(call: &str, e: cudarc::driver::DriverError) -> Error {
    Error::cuda(call, e)
}

/// The actor thread of one CUDA stream.
pub(crate) fn cuda_actor(
    rx: Receiver<Msg>,
    release: Sender<Msg>,
    actor: ActorCx,
    dev: StdArc<DeviceShared>,
    ready: mpsc::Sender<Result<()>>,
    spin: Duration,
) {
    let stream = match dev.ctx.bind_to_thread().and_then(|_| dev.ctx.new_stream()) {
        Ok(s) => {
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            let _ = ready.send(Err(cuda_err("cuStreamCreate", e)));
            return;
        }
    };
    // The actor's own memory pool and block cache (see `alloc.rs`).
    super::alloc::register(&dev.ctx, &stream);
    let pool = EventPool::new(dev.ctx.clone());
    let mut scx = StreamCx::new(stream, dev.clone());
    let (wtx, wrx) = crossbeam_channel::unbounded::<Vec<Watch>>();
    let wdev = dev.clone();
    let policy = actor.policy.clone();
    let sid = actor.stream;
    let watcher = std::thread::Builder::new()
        .name(format!("rtx-watch-{}", sid.0))
        .spawn(move || {
            let _ = wdev.ctx.bind_to_thread();
            watch(&wrx, &release, &wdev, &*policy, sid);
        })
        .expect("spawning a completion watcher thread");
    let mut out = Outbox {
        wtx,
        pool,
        pending: Vec::with_capacity(WATCH_FLUSH),
        open: None,
    };
    loop {
        let msg = match rx.try_recv() {
            Some(m) => m,
            None => {
                out.flush(&scx);
                let mut t = profile::clock();
                let m = next_msg(&rx, spin);
                profile::lap(Phase::Idle, &mut t);
                match m {
                    Some(m) => m,
                    None => break,
                }
            }
        };
        match msg {
            Msg::Job(env) => {
                run_cuda(env, &actor, &mut scx, &mut out, &dev);
                if out.pending.len() >= WATCH_FLUSH {
                    out.flush(&scx);
                }
            }
            Msg::Release(done) => {
                let mut t = profile::clock();
                drop(done);
                profile::lap(Phase::Release, &mut t);
            }
            Msg::Shutdown => break,
        }
    }
    out.flush(&scx);
    while let Some(m) = rx.try_recv() {
        drop(m);
    }
    drop(out);
    let _ = watcher.join();
    // The watcher has waited for every op's work; frees may still be enqueued.
    let _ = scx.stream.synchronize();
    // One actor at a time, process-wide, gives back its memory and drops its library
    // handles and stream (see `TEARDOWN`).
    teardown_serialized(|| {
        super::alloc::unregister(&scx.stream);
        // `scx` (with its library handles) drops here, on the thread that created them.
        drop(scx);
    });
}

/// Runs `f` holding [`TEARDOWN`]; on a thread that already holds it (a teardown step
/// that drops the last reference to something that tears down too), just runs `f`.
pub(super) fn teardown_serialized<R>(f: impl FnOnce() -> R) -> R {
    thread_local! {
        static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    /// Clears `HELD` when the teardown step ends, also by unwinding.
    struct Held;
    impl Drop for Held {
        fn drop(&mut self) {
            HELD.with(|h| h.set(false));
        }
    }
    if HELD.with(|h| h.get()) {
        return f();
    }
    let _one = TEARDOWN.lock().unwrap_or_else(|p| p.into_inner());
    HELD.with(|h| h.set(true));
    let _held = Held;
    f()
}

/// Held by an exiting actor while it unregisters its memory and drops its stream and
/// library handles, and by a pinned staging cache while it frees its blocks
/// ([`teardown_serialized`]). Dropping a cuBLAS or cuDNN handle synchronizes the whole context
/// (`cuCtxSynchronize`); on the H200 (driver 580.159), with the actors of one runtime
/// doing that and destroying their streams and events all at once while other runtimes
/// ran, the driver deadlocked in GPU runs 20-21 (stacks in `benches/RESULTS.md`).
/// Teardown is rare and short, so serializing it costs nothing that matters.
static TEARDOWN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The next message for an idle actor: polls the mailbox for up to `spin` before it
/// sleeps in `recv`. A sleeping actor must be woken by the submitter's send (a futex
/// call, several µs on the submitting thread); an actor that polls for a little while
/// after each burst is found awake by the next submit. See [`idle_spin`].
fn next_msg(rx: &Receiver<Msg>, spin: Duration) -> Option<Msg> {
    if !spin.is_zero() {
        let start = std::time::Instant::now();
        let mut polls = 0u32;
        loop {
            if let Some(m) = rx.try_recv() {
                return Some(m);
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(64) && start.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
    }
    rx.recv()
}

/// How long idle actors poll before sleeping: `RTX_ACTOR_SPIN_US` if set, else 50 µs
/// when the machine has a core for every actor plus four to spare (the submitting
/// threads, watchers), else 0 (polling actors would take the cores the work needs).
pub(crate) fn idle_spin(actors: usize) -> Duration {
    if let Some(us) = std::env::var("RTX_ACTOR_SPIN_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        return Duration::from_micros(us);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= actors + 4 {
        Duration::from_micros(50)
    } else {
        Duration::ZERO
    }
}

/// Ops handed to the watcher at once at most (see the actor loop).
const WATCH_FLUSH: usize = 16;

fn run_cuda(
    mut env: Envelope,
    actor: &ActorCx,
    scx: &mut StreamCx,
    out: &mut Outbox,
    dev: &DeviceShared,
) {
    let span = tracing::debug_span!(
        "op",
        kind = env.name(),
        stream = actor.stream.0,
        queue_wait_us = env.submitted.elapsed().as_micros() as u64,
        run_us = tracing::field::Empty
    );
    let _enter = span.enter();
    let mut t = profile::clock();
    if let Some(e) = dev.poisoned() {
        env.fail(e);
        return;
    }
    // An input still pending means waiting for another actor: record this actor's open
    // burst first, so that the other actor never waits for this one (see `burst.rs`).
    // The input list is built once for both the check and the wait.
    let (blocked, readies) = {
        let job = env
            .job
            .as_ref()
            .expect("envelope holds its job until executed");
        let inputs = job.inputs();
        let blocked = inputs.iter().any(|i| !i.storage().is_settled());
        if blocked {
            out.flush(scx);
        }
        (blocked, wait_ready(job.name(), &inputs))
    };
    let readies = match readies {
        Ok(r) => r,
        Err(e) => return env.fail(e),
    };
    profile::lap(
        if blocked {
            Phase::Blocked
        } else {
            Phase::Inputs
        },
        &mut t,
    );
    for r in &readies {
        if let Mark::Cuda { event, stream } = &r.mark {
            if *stream == actor.stream {
                continue;
            }
            let recorded = match event.get() {
                Some(r) => r,
                None => {
                    // Its burst is still open on the producer's actor: record ours,
                    // then wait (briefly) for theirs.
                    out.flush(scx);
                    event.wait()
                }
            };
            let waited = recorded.and_then(|ev| {
                ev.event()
                    .wait_on(&scx.stream)
                    .map_err(|e| cuda_err("cuStreamWaitEvent", e))
            });
            if let Err(e) = waited {
                let op = env.name().to_string();
                return env.fail(Error::Upstream {
                    op,
                    cause: Box::new(e),
                });
            }
        }
    }
    drop(readies);
    profile::lap(Phase::StreamWait, &mut t);
    let ex = match execute(&mut env, actor, BackendCx::Cuda(scx)) {
        Ok(x) => x,
        Err(e) => return fail_after_enqueue(env, e, scx),
    };
    span.record("run_us", ex.took.as_micros() as u64);
    profile::lap(Phase::Execute, &mut t);
    let burst = out.burst();
    for (s, b) in env.outputs.iter().zip(ex.outputs) {
        s.publish(Ready {
            buf: Arc::new(b),
            mark: Mark::Cuda {
                event: burst.clone(),
                stream: actor.stream,
            },
        });
    }
    profile::lap(Phase::Publish, &mut t);
    out.pending.push(Watch {
        env,
        burst,
        finisher: ex.finisher,
        took: ex.took,
    });
    profile::lap(Phase::Send, &mut t);
}

/// Waits for one op's event, then completes it and releases its keep-alive.
/// Fails an op that may already have enqueued work (a later launch of a multi-kernel op
/// failed, or recording its event did): the stream is drained first, so the op's
/// keep-alives (its inputs, a donated buffer) are released only after every kernel it
/// enqueued has finished with them.
fn fail_after_enqueue(mut env: Envelope, e: Error, scx: &StreamCx) {
    if let Err(sync) = scx.stream.synchronize() {
        tracing::error!(error = %sync, "stream synchronize failed while failing an op");
    }
    env.fail(e);
}

/// Ops completed per synchronization at most (bounds how long the oldest op of a batch
/// waits for the newest).
const WATCH_BATCH: usize = 32;

/// The watcher loop: takes every watch queued so far (up to [`WATCH_BATCH`]), waits for
/// the newest one's event only — stream order means every earlier op on this stream has
/// finished once it has — then completes them all in FIFO order. Under load this makes
/// one driver call per batch instead of two per op; the actor shares the driver's locks
/// with this thread, so fewer calls here make its launches cheaper.
fn watch(
    wrx: &crossbeam_channel::Receiver<Vec<Watch>>,
    release: &Sender<Msg>,
    dev: &DeviceShared,
    policy: &dyn crate::placement::Policy,
    sid: crate::device::StreamId,
) {
    while let Ok(mut batch) = wrx.recv() {
        while batch.len() < WATCH_BATCH {
            match wrx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        let newest = batch.last().expect("one watch at least");
        let mut t = profile::clock();
        // The actor records a burst's event before handing its ops over.
        let r = match newest.burst.get() {
            Some(Ok(ev)) => wait_event(ev.event()),
            _ => Err(cudarc::driver::DriverError(
                cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NOT_READY,
            )),
        };
        profile::lap(Phase::WatchWait, &mut t);
        let mut done = Vec::with_capacity(batch.len());
        for w in batch.drain(..) {
            done.push(finish(w, r, dev, policy, sid));
            profile::lap(Phase::WatchFinish, &mut t);
        }
        // The keep-alives go back to the actor, which frees them between its own driver
        // calls; if its mailbox is full or gone, they are dropped here.
        match release.try_send(Msg::Release(done)) {
            Ok(()) => {}
            Err(TrySendError::Full(m) | TrySendError::Closed(m)) => drop(m),
        }
    }
}

/// Completes one op whose event (or a later one on its stream) was waited for with
/// result `r`, then releases its keep-alive.
fn finish(
    mut w: Watch,
    r: Result<(), cudarc::driver::DriverError>,
    dev: &DeviceShared,
    policy: &dyn crate::placement::Policy,
    sid: crate::device::StreamId,
) -> Envelope {
    match r {
        Ok(()) => {
            crate::actor::observe(policy, w.env.name(), w.env.cost, sid, w.took);
            let name = w.env.name();
            let payload = w
                .finisher
                .take()
                .map(|f| crate::actor::run_finisher(name, f))
                .transpose();
            for s in &w.env.outputs {
                s.mark_done();
            }
            if let Some(c) = w.env.completion.take() {
                c.finish(payload);
            }
        }
        Err(e) => {
            dev.poison(format!("{e} (detected after `{}`)", w.env.name()));
            let err = dev.poisoned().unwrap_or(Error::synchronization(e));
            w.env.fail(err);
        }
    }
    // The envelope (the op and its inputs) is released by the caller — after the device
    // has finished with them; the event goes back to its pool here.
    w.env
}

/// Waits for an event: one non-blocking query first (when the GPU is ahead of the
/// watcher, which is the common case under load, this skips a sleep and a wake-up per
/// op), then a blocking sync in the driver, without spinning: a spinning watcher would
/// contend with its actor for the driver's locks.
fn wait_event(e: &super::event::RawEvent) -> Result<(), cudarc::driver::DriverError> {
    match e.query() {
        Ok(true) => Ok(()),
        Ok(false) => e.synchronize(),
        Err(err) => Err(err),
    }
}
