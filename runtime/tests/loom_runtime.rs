//! Loom models of the runtime's protocol (the protocol module docs listed in
//! `runtime/src/lib.rs`), end to end through the public API: submit → actor →
//! completion → wake; keep-alive release after
//! the last use; cross-stream ready waits; shutdown with ops in flight; a full mailbox.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p rtx-runtime --test 'loom*'`
//! (use a separate `CARGO_TARGET_DIR`: `--cfg loom` rebuilds every dependency). Under
//! loom the runtime's `sync` shim is loom's, so these models check the real protocol code.
//! Each model is small (1–2 streams, 1–3 ops) since loom allows 5 threads and explores
//! every interleaving. Waiting uses `Submission::wait` or a poll loop with a loom-aware
//! waker ([`drive`]), never `block_on` (which parks with std, invisible to loom).
//!
//! `docs/loom-plants.md` lists, for each model, a bug planted in the runtime (a patch in
//! `docs/loom-plants/`), the command that shows loom catching it, and what loom reports.
#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use rtx_runtime::*;

// ---- helpers ----------------------------------------------------------------------------

/// A waker that sets a flag under a loom mutex and notifies a loom condvar, so loom sees
/// both the wake-up and the wait (a lost wake-up is reported as a deadlock).
struct Signal {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Wake for Signal {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        *self.woken.lock().unwrap() = true;
        self.cv.notify_one();
    }
}

/// Polls `fut` to completion on this thread, sleeping on a [`Signal`] between polls.
fn drive<F: Future + Unpin>(mut fut: F) -> F::Output {
    let signal = std::sync::Arc::new(Signal {
        woken: Mutex::new(false),
        cv: Condvar::new(),
    });
    let waker = Waker::from(signal.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = Pin::new(&mut fut).poll(&mut cx) {
            return v;
        }
        let mut woken = signal.woken.lock().unwrap();
        while !*woken {
            woken = signal.cv.wait(woken).unwrap();
        }
        *woken = false;
    }
}

/// A one-shot flag a thread can block on (loom-visible).
#[derive(Clone)]
struct Latch(Arc<(Mutex<bool>, Condvar)>);

impl Latch {
    fn new() -> Self {
        Latch(Arc::new((Mutex::new(false), Condvar::new())))
    }
    fn set(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
    fn wait(&self) {
        let mut g = self.0 .0.lock().unwrap();
        while !*g {
            g = self.0 .1.wait(g).unwrap();
        }
    }
}

fn cpu(streams: usize, mailbox: usize) -> Runtime {
    Runtime::builder()
        .backend(Backend::Cpu)
        .streams(streams)
        .mailbox(mailbox)
        .build()
        .unwrap()
}

fn stream(rt: &Runtime, i: usize) -> StreamId {
    rt.compute_streams(rt.device())[i]
}

fn read(x: &BufferRef) -> Result<Vec<f32>> {
    Ok(x.cpu::<f32>()?.to_vec())
}

/// y = x + 1 (f32). Checks in `run` that its input has the value `expect`, so a consumer
/// that ran before its producer's data was there fails the submission.
struct AddOne {
    x: Tensor,
    expect: Option<f32>,
}

impl AddOne {
    fn new(x: Tensor) -> Self {
        AddOne { x, expect: None }
    }
    fn expecting(x: Tensor, v: f32) -> Self {
        AddOne { x, expect: Some(v) }
    }
}

impl Op for AddOne {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "add_one"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.x))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let x = read(&cx.input(&self.x)?)?;
        if let Some(e) = self.expect {
            if x.iter().any(|v| *v != e) {
                return Err(Error::invalid("add_one", format!("read {x:?}, wanted {e}")));
            }
        }
        cx.set_output(0, Buffer::from_vec(x.iter().map(|v| v + 1.0).collect()))
    }
}

fn values(rt: &Runtime, t: &Tensor) -> Vec<f32> {
    rt.to_vec::<f32>(t).unwrap().wait().unwrap()
}

// ---- 1. submit → actor → completion → wake ----------------------------------------------

/// The submitter blocks in `Submission::wait` while the actor runs the op.
#[test]
fn submit_then_wait() {
    loom::model(|| {
        let rt = cpu(1, 4);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let y = rt.submit(AddOne::new(x)).unwrap().wait().unwrap();
        // Completion is signalled after the outputs are published.
        assert!(y.is_published());
        drop(rt);
    });
}

/// The submitter polls the submission with a loom-aware waker while the actor runs it: the
/// waker registered by a `Pending` poll is always woken (no lost wake-up).
#[test]
fn submit_then_poll() {
    loom::model(|| {
        let rt = cpu(1, 4);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let sub = rt.submit(AddOne::new(x)).unwrap();
        let y = drive(sub).unwrap();
        assert!(y.is_published());
        drop(rt);
    });
}

// ---- 2. keep-alive release after the last use --------------------------------------------

/// Records that the op ran; on drop (the op's keep-alive ending) checks that it ran first
/// and tells the test.
struct Probe {
    ran: Arc<AtomicBool>,
    released: Latch,
}

impl Drop for Probe {
    fn drop(&mut self) {
        assert!(
            self.ran.load(Ordering::SeqCst),
            "the op's keep-alive was released before the op ran"
        );
        self.released.set();
    }
}

/// Holds its input (the keep-alive) and a probe. Fields drop in order: the input first,
/// so when the probe reports, the op no longer holds the input.
struct Hold {
    x: Tensor,
    probe: Probe,
}

impl Op for Hold {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "hold"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan {
            outputs: vec![TensorSpec::new([1], DType::F32)],
            cost: Cost::default(),
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let x = read(&cx.input(&self.x)?)?;
        self.probe.ran.store(true, Ordering::SeqCst);
        cx.set_output(0, Buffer::from_vec(vec![x[0]]))
    }
}

/// The user drops its handle right after submitting; the op still reads the input (its
/// own handle keeps the storage alive), and once its completion is observed the keep-alive
/// goes: a watcher's handle becomes the only one. At the end nothing is leaked (loom
/// reports leaked `Arc`s).
#[test]
fn keep_alive_released_after_last_use() {
    loom::model(|| {
        let rt = cpu(1, 4);
        let x = rt.upload(&[7.0f32], [1]).unwrap();
        let watch = x.clone();
        let ran = Arc::new(AtomicBool::new(false));
        let released = Latch::new();
        let probe = Probe {
            ran: ran.clone(),
            released: released.clone(),
        };
        let sub = rt.submit(Hold { x, probe }).unwrap();
        let y = sub.wait().unwrap();
        assert!(ran.load(Ordering::SeqCst), "completed before the op ran");
        // The keep-alive is released after the completion, by the actor: wait for it.
        released.wait();
        assert!(
            watch.is_unique(),
            "the op still holds its input after release"
        );
        drop(rt); // joins the actor
        assert!(
            y.is_unique(),
            "the job still holds its output after shutdown"
        );
        assert!(watch.is_unique());
    });
}

// ---- 3. cross-stream ready waits -----------------------------------------------------------

/// B on stream 1 consumes A's output from stream 0; B waits for A's storage to be
/// published and sees its data in every interleaving.
#[test]
fn cross_stream_consumer_sees_producer_data() {
    loom::model(|| {
        let rt = cpu(2, 2);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let a = rt.submit_on(stream(&rt, 0), AddOne::new(x)).unwrap();
        let ya = a.outputs().unwrap().clone();
        drop(a);
        let b = rt
            .submit_on(stream(&rt, 1), AddOne::expecting(ya, 2.0))
            .unwrap();
        let yb = b.wait().unwrap();
        assert!(yb.is_published());
        drop(rt);
    });
}

/// As above, and the consumer's output is read back on stream 1 (a third op) to check
/// the value end to end.
#[test]
fn cross_stream_chain_value() {
    let mut b = loom::model::Builder::new();
    // Two actors, three ops: more branches than loom's default bound allows.
    b.max_branches = 20_000;
    b.check(|| {
        let rt = cpu(2, 2);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let ya = rt
            .submit_on(stream(&rt, 0), AddOne::new(x))
            .unwrap()
            .outputs()
            .unwrap()
            .clone();
        let yb = rt
            .submit_on(stream(&rt, 1), AddOne::new(ya))
            .unwrap()
            .outputs()
            .unwrap()
            .clone();
        assert_eq!(values(&rt, &yb), [3.0]);
        drop(rt);
    });
}

/// y + 1, in place when `x` is the last handle to its storage (donation), else into a new
/// buffer; the answer must not depend on which.
struct AddOneInPlace {
    x: Tensor,
}

impl Op for AddOneInPlace {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "add_one_"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.x))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        if let Some(mut b) = cx.donate(&mut self.x) {
            b.cpu_mut::<f32>()?.iter_mut().for_each(|v| *v += 1.0);
            return cx.set_output(0, b);
        }
        let x = read(&cx.input(&self.x)?)?;
        cx.set_output(0, Buffer::from_vec(x.iter().map(|v| v + 1.0).collect()))
    }
}

/// A's output is donated to B on the other stream (the user keeps no handle). Whether B
/// finds it unique depends on when stream 0 drops A's envelope; either way B computes the
/// right value and nothing else sees the buffer change.
#[test]
fn cross_stream_donation() {
    let mut b = loom::model::Builder::new();
    b.max_branches = 20_000;
    b.check(|| {
        let rt = cpu(2, 2);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let ya = rt
            .submit_on(stream(&rt, 0), AddOne::new(x.clone()))
            .unwrap()
            .outputs()
            .unwrap()
            .clone();
        let yb = rt
            .submit_on(stream(&rt, 1), AddOneInPlace { x: ya })
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(values(&rt, &yb), [3.0]);
        assert_eq!(values(&rt, &x), [1.0]);
        drop(rt);
    });
}

// ---- 4. shutdown with ops in flight --------------------------------------------------------

/// Ops queued when the last runtime handle is dropped still run; the drop joins the actor.
#[test]
fn drop_runtime_with_ops_queued() {
    loom::model(|| {
        let rt = cpu(1, 2);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let a = rt.submit(AddOne::new(x)).unwrap();
        let ya = a.outputs().unwrap().clone();
        let b = rt.submit(AddOne::expecting(ya, 2.0)).unwrap();
        drop(rt);
        assert!(a.is_done() && b.is_done(), "drop returned before draining");
        a.wait().unwrap();
        b.wait().unwrap();
    });
}

/// A submitter on another thread races `shutdown`: its op is rejected (`Shutdown`, op
/// given back), or accepted and then runs or fails with `Shutdown`; the shutdown future
/// resolves once the actor is joined. Both threads drop their runtime handles before the
/// racing submission is waited on (see [`shutdown_races_submitter_holding_runtime`]).
/// (Ops accepted before a shutdown run: [`drop_runtime_with_ops_queued`].)
#[test]
fn shutdown_races_submit() {
    loom::model(|| {
        let rt = cpu(1, 2);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let rt2 = rt.clone();
        let t = thread::spawn(move || {
            let r = rt2.submit(AddOne::new(x));
            drop(rt2);
            match r {
                Ok(sub) => {
                    let y = sub.outputs().unwrap().clone();
                    match sub.wait() {
                        Ok(_) => {}
                        // A lost job fails its outputs too, so consumers do not hang.
                        Err(Error::Shutdown) => assert!(y.is_published(), "output left pending"),
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
                Err(e) => assert!(matches!(e.error, Error::Shutdown), "{}", e.error),
            }
        });
        drive(rt.shutdown()).unwrap();
        // The last handle drops any op still queued (failing it with `Shutdown`).
        drop(rt);
        t.join().unwrap();
    });
}

/// Like [`shutdown_races_submit`], but the racing submitter keeps its runtime handle while
/// it waits (a server thread that owns a runtime clone). Without the shutdown gate
/// (`Inner::gate` in `runtime/src/runtime.rs`) loom finds a hang here: the op is sent
/// after the actor's post-shutdown drain saw an empty mailbox but before the actor
/// dropped its receiver, so it stays queued until the last runtime handle goes, and that
/// handle is the waiter's. See `docs/loom-plants.md` (plant 12).
#[test]
fn shutdown_races_submitter_holding_runtime() {
    loom::model(|| {
        let rt = cpu(1, 2);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let rt2 = rt.clone();
        let t = thread::spawn(move || {
            if let Ok(sub) = rt2.submit(AddOne::new(x)) {
                match sub.wait() {
                    Ok(_) | Err(Error::Shutdown) => {}
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            drop(rt2);
        });
        drive(rt.shutdown()).unwrap();
        t.join().unwrap();
        drop(rt);
    });
}

// ---- 5. a full mailbox -----------------------------------------------------------------------

/// Capacity 1: a blocking submit waits for room, then an async submit (polled with a
/// loom-aware waker) finds the mailbox full, registers, and is woken when the actor takes
/// a message. Everything completes; nothing deadlocks.
#[test]
fn full_mailbox_blocking_and_async() {
    loom::model(|| {
        let rt = cpu(1, 1);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let a = rt.submit(AddOne::new(x.clone())).unwrap();
        let b = drive(rt.submit_async(AddOne::new(x))).unwrap();
        a.wait().unwrap();
        b.wait().unwrap();
        drop(rt);
    });
}

/// Capacity 1, two async submitters on two threads: the second to arrive finds the
/// mailbox full (or both do, if the actor is slow), waits on the mailbox's room wakers,
/// and is woken when the actor takes a message. Both ops complete.
#[test]
fn full_mailbox_two_async_submitters() {
    loom::model(|| {
        let rt = cpu(1, 1);
        let x = rt.upload(&[1.0f32], [1]).unwrap();
        let rt2 = rt.clone();
        let x2 = x.clone();
        let t = thread::spawn(move || {
            let s = drive(rt2.submit_async(AddOne::new(x2))).unwrap();
            s.wait().unwrap();
        });
        let b = drive(rt.submit_async(AddOne::new(x))).unwrap();
        b.wait().unwrap();
        t.join().unwrap();
        drop(rt);
    });
}
