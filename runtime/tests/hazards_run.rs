//! Regression tests for waiting inside an op's `run` (issue 14, CPU backend): each of
//! these used to hang forever; now each fails at once with `Error::ActorWouldBlock`
//! (see the rule on `Op`). Also: a panic in `plan` comes back as a typed error with the
//! op, and a donating op that fails is failed cleanly.

use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use rtx_runtime::*;

/// Runs `f` on a thread of its own; panics naming `what` if it takes over `secs`.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} hung (no result within {secs} s)"))
}

type Body = Box<dyn FnMut(&mut ExecCx<'_>) -> Result<()> + Send>;

/// An op without inputs or outputs whose `run` is a closure.
struct Run(&'static str, Body);

impl Op for Run {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        self.0
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan {
            outputs: vec![],
            cost: Cost::default(),
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        (self.1)(cx)
    }
}

fn noop() -> Run {
    Run("noop", Box::new(|_| Ok(())))
}

fn rt(streams: usize, mailbox: usize) -> Runtime {
    Runtime::builder()
        .backend(Backend::Cpu)
        .streams(streams)
        .mailbox(mailbox)
        .build()
        .unwrap()
}

/// The error the op on `stream` failed with after doing `body`.
fn run_error(rt: &Runtime, stream: usize, body: Body) -> Error {
    let sub = rt
        .submit_on(StreamId::new(stream), Run("waiter", body))
        .unwrap();
    let r = within(20, "the op", move || sub.wait());
    r.expect_err("the op's wait was refused, failing the op")
}

fn assert_would_block(e: &Error, call: &str) {
    match e {
        Error::ActorWouldBlock { call: c, .. } => assert!(c.contains(call), "{e}"),
        other => panic!("expected ActorWouldBlock from {call}, got {other}"),
    }
}

#[test]
fn wait_on_a_submission_of_the_own_stream_fails() {
    let rt = rt(1, 16);
    let rt2 = rt.clone();
    let e = run_error(
        &rt,
        0,
        Box::new(move |cx| {
            let sub = rt2.submit_on(cx.stream(), noop()).map_err(Error::from)?;
            sub.wait().map(|_| ())
        }),
    );
    assert_would_block(&e, "Submission::wait");
    // The child still runs after the waiter; the runtime stays usable.
    within(20, "a later op", move || rt.submit(noop()).unwrap().wait()).unwrap();
}

#[test]
fn block_on_a_submission_placed_by_the_policy_fails() {
    let rt = rt(1, 16);
    let rt2 = rt.clone();
    let e = run_error(
        &rt,
        0,
        Box::new(move |_| {
            let sub = rt2.submit(noop()).map_err(Error::from)?;
            block_on(sub).map(|_| ())
        }),
    );
    assert_would_block(&e, "Submission (polled)");
}

/// A wait on another stream is refused too: it could wait on an actor that waits for
/// this one (through an input, or a full mailbox).
#[test]
fn wait_on_another_stream_fails() {
    let rt = rt(2, 16);
    let rt2 = rt.clone();
    let e = run_error(
        &rt,
        0,
        Box::new(move |_| {
            let sub = rt2
                .submit_on(
                    StreamId::new(1),
                    Run(
                        "slow",
                        Box::new(|_| {
                            std::thread::sleep(Duration::from_millis(50));
                            Ok(())
                        }),
                    ),
                )
                .map_err(Error::from)?;
            sub.wait().map(|_| ())
        }),
    );
    assert_would_block(&e, "Submission::wait");
}

#[test]
fn to_vec_wait_inside_run_fails() {
    let rt = rt(1, 16);
    let x = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
    let rt2 = rt.clone();
    let e = run_error(
        &rt,
        0,
        Box::new(move |_| rt2.to_vec::<f32>(&x)?.wait().map(|_| ())),
    );
    assert_would_block(&e, "Submission::wait");
}

/// A nested submit into the op's own full mailbox: the actor would wait for itself.
#[test]
fn nested_submit_into_own_full_mailbox_fails() {
    let rt = rt(1, 1);
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let rt2 = rt.clone();
    let waiter = rt
        .submit_on(
            StreamId::new(0),
            Run(
                "waiter",
                Box::new(move |cx| {
                    go_rx.recv_timeout(Duration::from_secs(10)).expect("go");
                    rt2.submit_on(cx.stream(), noop())
                        .map(|_| ())
                        .map_err(Error::from)
                }),
            ),
        )
        .unwrap();
    // Blocks until the actor has taken the waiter; then the mailbox (capacity 1) is full.
    let filler = rt.submit_on(StreamId::new(0), noop()).unwrap();
    go_tx.send(()).unwrap();
    let e = within(20, "the waiter", move || waiter.wait()).unwrap_err();
    assert_would_block(&e, "submit");
    within(20, "the filler", move || filler.wait()).unwrap();
}

/// Two actors each submitting into the other's full mailbox (a cycle): both refused.
#[test]
fn nested_submits_in_a_cycle_of_full_mailboxes_fail() {
    let rt = rt(2, 1);
    let barrier = Arc::new(Barrier::new(3));
    // Both submit before either returns (else an actor would take its filler first).
    let after = Arc::new(Barrier::new(2));
    let mut waiters = Vec::new();
    for (own, other) in [(0, 1), (1, 0)] {
        let rt2 = rt.clone();
        let (b, a) = (barrier.clone(), after.clone());
        let body: Body = Box::new(move |_| {
            b.wait();
            let r = rt2.submit_on(StreamId::new(other), noop());
            a.wait();
            r.map(|_| ()).map_err(Error::from)
        });
        waiters.push(
            rt.submit_on(StreamId::new(own), Run("waiter", body))
                .unwrap(),
        );
    }
    // Each blocks until its actor has taken its waiter: then both mailboxes are full.
    let fillers: Vec<_> = (0..2)
        .map(|s| rt.submit_on(StreamId::new(s), noop()).unwrap())
        .collect();
    barrier.wait();
    for w in waiters {
        let e = within(20, "a waiter", move || w.wait()).unwrap_err();
        assert_would_block(&e, "submit");
    }
    for f in fillers {
        within(20, "a filler", move || f.wait()).unwrap();
    }
}

/// A nested submit into a mailbox with room works; its submission is awaited outside.
#[test]
fn nested_submit_with_room_works() {
    let rt = rt(2, 16);
    let slot: Arc<Mutex<Option<Submission<Vec<Tensor>>>>> = Arc::default();
    let (rt2, s2) = (rt.clone(), slot.clone());
    let sub = rt
        .submit_on(
            StreamId::new(0),
            Run(
                "parent",
                Box::new(move |_| {
                    let child = rt2
                        .submit_on(StreamId::new(1), noop())
                        .map_err(Error::from)?;
                    *s2.lock().unwrap() = Some(child);
                    Ok(())
                }),
            ),
        )
        .unwrap();
    within(20, "the parent", move || sub.wait()).unwrap();
    let child = slot
        .lock()
        .unwrap()
        .take()
        .expect("the child was submitted");
    within(20, "the child", move || child.wait()).unwrap();
}

/// `block_on(rt.shutdown())` inside `run` is refused; the shutdown itself goes ahead.
#[test]
fn awaiting_shutdown_inside_run_fails_and_shutdown_completes() {
    let rt = rt(1, 16);
    let rt2 = rt.clone();
    let e = run_error(&rt, 0, Box::new(move |_| block_on(rt2.shutdown())));
    assert_would_block(&e, "shutdown");
    assert!(rt.is_shut_down());
    assert_eq!(rt.submit(noop()).unwrap_err().error, Error::Shutdown);
    let rt3 = rt.clone();
    within(20, "the shutdown", move || block_on(rt3.shutdown())).unwrap();
}

/// A submission already done can still be waited for inside `run` (nothing to wait on).
#[test]
fn waiting_for_a_done_submission_inside_run_works() {
    let rt = rt(2, 16);
    let done = rt.submit_on(StreamId::new(1), noop()).unwrap();
    let done = within(20, "the first op", move || {
        while !done.is_done() {
            std::thread::sleep(Duration::from_millis(1));
        }
        done
    });
    let mut done = Some(done);
    let sub = rt
        .submit_on(
            StreamId::new(0),
            Run(
                "waiter",
                Box::new(move |_| done.take().expect("run once").wait().map(|_| ())),
            ),
        )
        .unwrap();
    within(20, "the waiter", move || sub.wait()).unwrap();
}

/// Panics in `plan`.
struct PanicPlan {
    tag: u32,
}

impl Op for PanicPlan {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        "panic_plan"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        panic!("plan exploded ({})", self.tag)
    }
    fn run(&mut self, _: &mut ExecCx<'_>) -> Result<()> {
        Ok(())
    }
}

#[test]
fn panic_in_plan_is_a_typed_error_with_the_op_back() {
    let rt = rt(1, 4);
    let e = rt.submit(PanicPlan { tag: 7 }).unwrap_err();
    match &e.error {
        Error::OpPanicked { op, message } => {
            assert_eq!(op, "panic_plan");
            assert!(message.contains("plan exploded (7)"), "{message}");
        }
        other => panic!("expected OpPanicked, got {other}"),
    }
    assert_eq!(e.into_op().tag, 7, "the op came back");
    // submit_async too, and the runtime is unaffected.
    let e = block_on(rt.submit_async(PanicPlan { tag: 8 })).unwrap_err();
    assert!(matches!(e.error, Error::OpPanicked { .. }));
    assert_eq!(e.op.tag, 8);
    rt.submit(noop()).unwrap().wait().unwrap();
}

/// Donates its input, then fails: the submission fails with the op's error, the
/// donated tensor is gone, and the runtime goes on (on CUDA, where the order of the free
/// matters, see `a_donated_buffer_dropped_by_a_failing_op_is_freed_after_its_work_on_cuda`).
struct DonateThenFail(Tensor);

impl Op for DonateThenFail {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "donate_then_fail"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let buf = cx.donate(&mut self.0).expect("the only handle");
        assert!(
            cx.drain_pending(),
            "a donation marks the op for a drain if it fails"
        );
        drop(buf);
        Err(Error::invalid("donate_then_fail", "failed after donating"))
    }
}

#[test]
fn failing_donating_op_is_marked_for_the_drain() {
    let rt = rt(1, 4);
    let x = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let sub = rt.submit(DonateThenFail(x)).unwrap();
    let e = within(20, "the op", move || sub.wait()).unwrap_err();
    assert!(matches!(e, Error::InvalidOp { .. }), "{e}");
    rt.submit(noop()).unwrap().wait().unwrap();
}

/// A copy of its input made on the stream it runs on (CUDA: allocated there).
struct CopyOn(Tensor);

impl Op for CopyOn {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "copy_on"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let x = cx.input(&self.0)?;
        let out = match cx.backend() {
            BackendCx::Cpu => Buffer::from_vec(x.cpu::<f32>()?.to_vec()),
            BackendCx::Cuda(scx) => {
                let mut y = scx.alloc::<f32>(x.len())?;
                scx.stream()
                    .memcpy_dtod(x.cuda::<f32>()?, &mut y)
                    .map_err(|e| Error::cuda("cuMemcpyDtoDAsync", e))?;
                Buffer::from_cuda(y)
            }
        };
        cx.set_output(0, out)
    }
}

/// Donates its input (produced on another stream), reads it with a copy enqueued on its
/// own stream, drops it and fails. On CUDA the donated buffer must come bound to this
/// op's stream, so that dropping it here frees it after the copy instead of handing it
/// to the producer's stream's next allocation while the copy may still read it.
struct DonateReadDropFail(Tensor);

impl Op for DonateReadDropFail {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "donate_read_drop_fail"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let name = "donate_read_drop_fail";
        let buf = cx
            .donate(&mut self.0)
            .ok_or_else(|| Error::invalid(name, "the donation was declined"))?;
        let BackendCx::Cuda(scx) = cx.backend() else {
            return Err(Error::invalid(name, "not on CUDA"));
        };
        let src = buf.cuda::<f32>()?;
        let mut scratch = scx.alloc::<f32>(src.len())?;
        scx.stream()
            .memcpy_dtod(src, &mut scratch)
            .map_err(|e| Error::cuda("cuMemcpyDtoDAsync", e))?;
        let bound = src.stream().cu_stream() == scx.stream().cu_stream();
        drop(buf);
        drop(scratch);
        if bound {
            Err(Error::invalid(name, "failed after donating"))
        } else {
            Err(Error::invalid(
                name,
                "the donated buffer is still bound to its producer's stream",
            ))
        }
    }
}

/// Issue 14: "a donated buffer dropped inside a failing op skips the drain". Skips
/// without a CUDA device.
#[test]
fn a_donated_buffer_dropped_by_a_failing_op_is_freed_after_its_work_on_cuda() {
    if !rtx_runtime::cuda::probe().is_ok_and(|n| n > 0) {
        eprintln!("skipped: no CUDA device");
        return;
    }
    let rt = Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(2)
        .build()
        .unwrap();
    let s = rt.compute_streams(rt.device());
    for round in 0..20 {
        let vals: Vec<f32> = (0..4096)
            .map(|_| rand::random::<f32>() * 2.0 - 1.0)
            .collect();
        let x = rt.upload(&vals, [vals.len()]).unwrap();
        let y = rt
            .submit_on(s[0], CopyOn(x.clone()))
            .unwrap()
            .wait()
            .unwrap();
        // `wait` returns at completion; the producer's actor drops its envelope (and its
        // handle on y) just after: donation needs the last handle.
        let t0 = std::time::Instant::now();
        while !y.is_unique() {
            assert!(
                t0.elapsed().as_secs() < 10,
                "round {round}: y never became unique"
            );
            std::thread::yield_now();
        }
        let sub = rt.submit_on(s[1], DonateReadDropFail(y)).unwrap();
        let e = within(20, "the op", move || sub.wait()).unwrap_err();
        match &e {
            Error::InvalidOp { message, .. } => {
                assert_eq!(message, "failed after donating", "round {round}")
            }
            other => panic!("round {round}: {other}"),
        }
        // Stream 0 allocates again (the size the donated block had) and computes right.
        let z = rt.submit_on(s[0], CopyOn(x)).unwrap().wait().unwrap();
        assert_eq!(rt.to_vec::<f32>(&z).unwrap().wait().unwrap(), vals);
    }
}
