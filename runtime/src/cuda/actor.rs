//! The CUDA stream actor and its completion watcher (protocol in `cuda/mod.rs`).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc as StdArc;
use std::time::Duration;

use cudarc::driver::CudaStream;

use super::watcher::{watch, Watch};
use crate::actor::{execute, wait_declared, ActorCx};
use crate::burst::{Burst, OpenBurst};
use crate::driver::batch::LaunchBatch;
use crate::driver::event::{EventPool, PooledEvent};
use crate::driver::teardown::teardown_serialized;
use crate::driver::{alloc, DeviceShared, StreamCx};
use crate::error::{Error, Result};
use crate::job::{Envelope, Msg};
use crate::mailbox::{Receiver, Sender};
use crate::op::BackendCx;
use crate::stats::{Counters, Phase};
use crate::storage::{EventBurst, Mark, Ready};
use crate::sync::Arc;

/// Enqueued ops not yet handed to the watcher, and their burst's event, recorded when
/// they are handed over: when the mailbox runs empty, `WATCH_FLUSH` ops are pending, or
/// before the actor blocks on another stream (see `burst.rs` for why it cannot
/// deadlock). One event record and one wake-up of the watcher per burst, instead of per
/// op.
struct Outbox {
    wtx: crossbeam_channel::Sender<Vec<Watch>>,
    pool: StdArc<EventPool>,
    /// Timing events: the sampled ops' pairs and the timeline's (see `timing.rs`).
    timing: StdArc<EventPool>,
    pending: Vec<Watch>,
    open: Option<OpenBurst<Arc<PooledEvent>>>,
    counters: StdArc<Counters>,
    /// Ops run since the last one timed on the device (`Settings::device_timing`).
    since_sample: u32,
    /// The stream's deferred launches (`driver/batch.rs`), launched before the burst's
    /// event is recorded.
    batch: Rc<RefCell<LaunchBatch>>,
}

impl Outbox {
    /// The open burst (opened now if none is).
    fn burst(&mut self) -> Arc<EventBurst> {
        self.open
            .get_or_insert_with(|| OpenBurst(Arc::new(Burst::new())))
            .0
            .clone()
    }

    /// Launches the stream's deferred launches (`driver/batch.rs`), records the open
    /// burst's event and hands its ops to the watcher. If a batch launch or recording
    /// fails, the burst's ops fail (after the stream has passed them) and so do the
    /// consumers waiting on it; if the watcher is gone (it never exits before the
    /// actor), the ops fail rather than hang.
    fn flush(&mut self, stream: &CudaStream) {
        // The deferred launches first: the event must stand behind them.
        let failed = {
            let mut b = self.batch.borrow_mut();
            b.flush(stream, &self.counters);
            b.take_failure()
        };
        let Some(open) = self.open.take() else {
            debug_assert!(self.pending.is_empty(), "pending ops always have a burst");
            debug_assert!(failed.is_none(), "deferred launches belong to pending ops");
            return;
        };
        let mut t = self.counters.clock();
        let batch = std::mem::replace(&mut self.pending, Vec::with_capacity(WATCH_FLUSH));
        let recorded = match failed {
            Some(err) => Err(err),
            None => self
                .pool
                .record(stream)
                .map_err(|e| cuda_err("cuEventRecord", e)),
        };
        match recorded {
            Ok(ev) => open.0.set(Ok(Arc::new(ev))),
            Err(err) => {
                open.0.set(Err(err.clone()));
                for w in batch {
                    fail_after_enqueue(w.env, err.clone(), stream);
                }
                return;
            }
        }
        self.counters.lap(Phase::Record, &mut t);
        if let Err(crossbeam_channel::SendError(batch)) = self.wtx.send(batch) {
            for w in batch {
                fail_after_enqueue(
                    w.env,
                    Error::Synchronization {
                        code: None,
                        message: "the completion watcher is gone".into(),
                    },
                    stream,
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
    // Ops on this thread see their runtime's settings (`Settings::current`).
    actor.settings.enter();
    crate::reentry::enter_actor(actor.stream);
    // The actor's own memory pool and block cache (see `driver/alloc.rs`).
    let mem = alloc::register(&dev.ctx, &stream, &dev.mem, actor.settings.stream_pools);
    let pool = EventPool::new(dev.ctx.clone());
    let timing = EventPool::timing(dev.ctx.clone());
    let mut scx = StreamCx::new(
        stream,
        dev.clone(),
        mem,
        actor.settings,
        actor.counters.clone(),
    );
    let (wtx, wrx) = crossbeam_channel::unbounded::<Vec<Watch>>();
    let wdev = dev.clone();
    let policy = actor.policy.clone();
    let counters = actor.counters.clone();
    let sid = actor.stream;
    let watcher = std::thread::Builder::new()
        .name(format!("rtx-watch-{}", sid.0))
        .spawn(move || {
            let _ = wdev.ctx.bind_to_thread();
            watch(&wrx, &release, &wdev, &*policy, sid, &counters);
        })
        .expect("spawning a completion watcher thread");
    let origin = super::timing::origin(&timing, &scx.stream, &actor.counters.trace);
    // Shared with the stream context's blocking hook: an op about to block the thread
    // (the first cuDNN search of a shape) hands over the burst of the ops before it
    // first, so their consumers on other streams do not wait for the search
    // (`StreamCx::before_blocking`). Never borrowed across an op's `run`.
    let out = Rc::new(RefCell::new(Outbox {
        wtx,
        pool,
        timing,
        pending: Vec::with_capacity(WATCH_FLUSH),
        open: None,
        counters: actor.counters.clone(),
        since_sample: 0,
        batch: scx.batch.clone(),
    }));
    let hook_out = out.clone();
    scx.set_before_blocking(Box::new(move |stream| hook_out.borrow_mut().flush(stream)));
    loop {
        let msg = match rx.try_recv() {
            Some(m) => m,
            None => {
                out.borrow_mut().flush(&scx.stream);
                let mut t = actor.counters.clock();
                let m = next_msg(&rx, spin);
                actor.counters.lap(Phase::Idle, &mut t);
                match m {
                    Some(m) => m,
                    None => break,
                }
            }
        };
        match msg {
            Msg::Job(env) => {
                run_cuda(env, &actor, &mut scx, &out, &dev, origin.as_ref());
                let mut o = out.borrow_mut();
                if o.pending.len() >= WATCH_FLUSH {
                    o.flush(&scx.stream);
                }
            }
            Msg::Release(done) => {
                let mut t = actor.counters.clock();
                drop(done);
                actor.counters.lap(Phase::Release, &mut t);
            }
            Msg::Shutdown => break,
        }
    }
    out.borrow_mut().flush(&scx.stream);
    while let Some(m) = rx.try_recv() {
        drop(m);
    }
    // The hook's clone goes too, so the watcher's channel closes.
    scx.clear_before_blocking();
    drop(out);
    let _ = watcher.join();
    // The watcher has waited for every op's work; frees may still be enqueued.
    let _ = scx.stream.synchronize();
    // One actor at a time, process-wide, gives back its memory and drops its library
    // handles and stream (see `driver/teardown.rs`).
    teardown_serialized(|| {
        let mem = scx.mem.take();
        let stream = scx.stream.clone();
        // `scx` (its library handles, plan caches and scratch: workspaces from this
        // stream's pool, freed into its cache while `mem` lives) drops first, on the
        // thread that created them; then the memory is given back, the pool trimmed
        // once those frees are done. In the other order the scratch's frees landed in
        // the pool after its trim and stayed in it as a spare (the stress test's
        // device-memory residue, `RELIABILITY.md` section 1).
        drop(scx);
        if let Some(mem) = mem {
            alloc::unregister(mem, &stream);
        }
    });
}

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

/// How long idle actors poll before sleeping: `setting` (`actor_spin`,
/// `RTX_ACTOR_SPIN_US`) if set, else 50 µs when the machine has a core for every actor
/// plus four to spare (the submitting threads, watchers), else 0 (polling actors would
/// take the cores the work needs).
pub(crate) fn idle_spin(setting: Option<Duration>, actors: usize) -> Duration {
    if let Some(d) = setting {
        return d;
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
    out: &RefCell<Outbox>,
    dev: &DeviceShared,
    origin: Option<&StdArc<super::timing::Origin>>,
) {
    let span = tracing::debug_span!(
        "op",
        kind = env.name(),
        stream = actor.stream.0,
        queue_wait_us = env.submitted.elapsed().as_micros() as u64,
        run_us = tracing::field::Empty
    );
    let _enter = span.enter();
    let mut t = actor.counters.clock();
    if let Some(e) = dev.poisoned() {
        env.fail(e);
        return;
    }
    // Whether this op's launch may join the stream's launch batch (`driver/batch.rs`);
    // any other op first launches what is deferred, so that nothing it enqueues
    // overtakes those launches. (An op timed on the device, below, does too.)
    let mut batching = actor.settings.launch_batching
        && origin.is_none()
        && env.batches_launches()
        && !crate::driver::capture::active();
    if !batching {
        scx.flush_launches();
    }
    // An input still pending means waiting for another actor: record this actor's open
    // burst first, so that the other actor never waits for this one (see `burst.rs`).
    // Each published input's event is waited on by this stream as it comes; the input
    // list is built once for the waits and the op's `run`.
    let waited = wait_declared(
        &env,
        || out.borrow_mut().flush(&scx.stream),
        |ready| {
            let Mark::Cuda { event, stream } = &ready.mark else {
                return Ok(());
            };
            if *stream == actor.stream {
                return Ok(());
            }
            let recorded = match event.get() {
                Some(r) => r,
                None => {
                    // Its burst is still open on the producer's actor: record ours,
                    // then wait (briefly) for theirs.
                    out.borrow_mut().flush(&scx.stream);
                    event.wait()
                }
            };
            recorded
                .and_then(|ev| {
                    ev.event()
                        .wait_on(&scx.stream)
                        .map_err(|e| cuda_err("cuStreamWaitEvent", e))
                })
                .map_err(|e| Error::Upstream {
                    op: env.name().to_string(),
                    cause: Box::new(e),
                })
        },
    );
    let (declared, blocked) = match waited {
        Ok(w) => w,
        Err(e) => return env.fail(e),
    };
    // Both phases now include the stream waits (they are taken input by input).
    actor.counters.lap(
        if blocked {
            Phase::Blocked
        } else {
            Phase::Inputs
        },
        &mut t,
    );
    let mut timing = origin.and_then(|o| {
        let detail = crate::actor::describe(&env.specs);
        let events = &out.borrow().timing;
        super::timing::OpTiming::start(o, events, &scx.stream, actor.stream, detail)
    });
    // One op in `device_timing` is timed on the device for the policy (every op is
    // when the timeline records: `timing`).
    let every = actor.settings.device_timing;
    let mut sample = None;
    if every > 0 && timing.is_none() {
        let mut o = out.borrow_mut();
        o.since_sample += 1;
        if o.since_sample >= every {
            o.since_sample = 0;
            if batching {
                // Timed alone: its events must bracket its own launch only.
                batching = false;
                scx.flush_launches();
            }
            sample = super::timing::Sample::start(&o.timing, &scx.stream);
        }
    }
    scx.batch.borrow_mut().set_open(batching);
    let ran = execute(&mut env, actor, BackendCx::Cuda(scx), declared);
    scx.batch.borrow_mut().set_open(false);
    let ex = match ran {
        Ok(x) => x,
        Err(e) => return fail_after_enqueue(env, e, &scx.stream),
    };
    // (Borrowed only here, not across `execute`: its blocking hook borrows `out`.)
    if let Some(t) = timing.as_mut() {
        t.end(&out.borrow().timing, &scx.stream);
    }
    if let Some(s) = sample.as_mut() {
        s.end(&out.borrow().timing, &scx.stream);
    }
    let mut out = out.borrow_mut();
    span.record("run_us", ex.took.as_micros() as u64);
    actor.counters.lap(Phase::Execute, &mut t);
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
    actor.counters.lap(Phase::Publish, &mut t);
    out.pending.push(Watch {
        env,
        burst,
        finisher: ex.finisher,
        took: ex.took,
        timing,
        sample,
    });
    actor.counters.lap(Phase::Send, &mut t);
}

/// Fails an op that may already have enqueued work (a later launch of a multi-kernel op
/// failed, or recording its event did): the stream is drained first, so the op's
/// keep-alives (its inputs, a donated buffer) are released only after every kernel it
/// enqueued has finished with them.
fn fail_after_enqueue(mut env: Envelope, e: Error, stream: &CudaStream) {
    if let Err(sync) = stream.synchronize() {
        tracing::error!(error = %sync, "stream synchronize failed while failing an op");
    }
    env.fail(e);
}
