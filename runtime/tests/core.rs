//! Core protocol tests on the CPU backend, with test-local ops (the op library has its own).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rtx_runtime::*;

/// How many times `Add` wrote in place (only the donation test donates).
static DONATED: AtomicUsize = AtomicUsize::new(0);

/// y = a + b, or a in place when `a` is donated and unique.
struct Add {
    a: Tensor,
    b: Tensor,
    donate: bool,
    delay: Duration,
}

fn add(a: &Tensor, b: &Tensor) -> Add {
    Add {
        a: a.clone(),
        b: b.clone(),
        donate: false,
        delay: Duration::ZERO,
    }
}

impl Op for Add {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "test_add"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.a, &self.b]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        if self.a.shape() != self.b.shape() {
            return Err(Error::shape("test_add", self.a.shape(), self.b.shape(), ""));
        }
        if self.a.dtype() != DType::F32 || self.b.dtype() != DType::F32 {
            return Err(Error::dtype("test_add", DType::F32, self.b.dtype()));
        }
        Ok(Plan::like(&self.a))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        std::thread::sleep(self.delay);
        let b = cx.input(&self.b)?.cpu::<f32>()?.to_vec();
        if self.donate {
            if let Some(mut buf) = cx.donate(&mut self.a) {
                DONATED.fetch_add(1, Ordering::SeqCst);
                for (x, y) in buf.cpu_mut::<f32>()?.iter_mut().zip(&b) {
                    *x += y;
                }
                return cx.set_output(0, buf);
            }
        }
        let a = cx.input(&self.a)?;
        let y: Vec<f32> = a.cpu::<f32>()?.iter().zip(&b).map(|(x, y)| x + y).collect();
        cx.set_output(0, Buffer::from_vec(y))
    }
}

/// Panics when run.
struct Boom(Tensor);
impl Op for Boom {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "boom"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, _: &mut ExecCx<'_>) -> Result<()> {
        panic!("kaboom")
    }
}

/// Forgets to set its output.
struct Lazy(Tensor);
impl Op for Lazy {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "lazy"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, _: &mut ExecCx<'_>) -> Result<()> {
        Ok(())
    }
}

fn vals(rt: &Runtime, t: &Tensor) -> Vec<f32> {
    rt.to_vec::<f32>(t).unwrap().wait().unwrap()
}

#[test]
fn outputs_can_be_chained_before_completion() {
    let rt = Runtime::cpu(2);
    let a = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
    let mut slow = add(&a, &a);
    slow.delay = Duration::from_millis(50);
    let s = rt.submit(slow).unwrap();
    let x = s.outputs().unwrap().clone();
    assert!(!x.is_published(), "the slow op cannot have finished yet");
    let streams = rt.compute_streams(rt.device());
    let y = rt.submit_on(streams[1], add(&x, &a)).unwrap();
    let y = y.wait().unwrap();
    assert_eq!(vals(&rt, &y), [3.0, 6.0, 9.0]);
    // (The producer publishes its output before completing its submission, so the
    // consumer may finish first; the producer's result is still there.)
    assert!(s.wait().unwrap().same_storage(&x));
}

#[test]
fn rejected_ops_come_back_with_typed_errors() {
    let rt = Runtime::cpu(1);
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let b = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
    let h = rt.upload(&[f16::ONE, f16::ONE], [2]).unwrap();
    let e = rt.submit(add(&a, &b)).unwrap_err();
    match &e.error {
        Error::ShapeMismatch { lhs, rhs, .. } => {
            assert_eq!(lhs.dims(), [2]);
            assert_eq!(rhs.dims(), [3]);
        }
        other => panic!("expected a shape mismatch, got {other}"),
    }
    let op = e.into_op();
    assert!(
        op.b.same_storage(&b),
        "the op and its inputs come back untouched"
    );
    let e = rt.submit(add(&a, &h)).unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::DTypeMismatch {
                got: DType::F16,
                ..
            }
        ),
        "{}",
        e.error
    );
    // Pinning to a stream that does not exist.
    let e = rt.submit_on(StreamId::new(99), add(&a, &a)).unwrap_err();
    assert!(matches!(e.error, Error::InvalidOp { .. }), "{}", e.error);
    // Upload with the wrong element count.
    let e = rt.upload(&[1.0f32; 5], [2, 3]).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    // Download with the wrong dtype.
    assert!(matches!(
        rt.to_vec::<f16>(&a).unwrap_err(),
        Error::DTypeMismatch { .. }
    ));
}

#[test]
fn a_panicking_op_fails_alone_and_the_actor_lives_on() {
    let rt = Runtime::cpu(1);
    let a = rt.upload(&[1.0f32], [1]).unwrap();
    let bad = rt.submit(Boom(a.clone())).unwrap();
    let out = bad.outputs().unwrap().clone();
    match bad.wait() {
        Err(Error::OpPanicked { op, message }) => {
            assert_eq!(op, "boom");
            assert!(message.contains("kaboom"));
        }
        other => panic!("expected a panic error, got {other:?}"),
    }
    // A consumer of the failed output fails with the cause, not a hang.
    let dep = rt.submit(add(&out, &a)).unwrap();
    assert!(matches!(dep.wait(), Err(Error::Upstream { .. })));
    // The stream still works.
    let ok = rt.submit(add(&a, &a)).unwrap().wait().unwrap();
    assert_eq!(vals(&rt, &ok), [2.0]);
    // An op that forgets an output fails with a clear error.
    let e = rt.submit(Lazy(a.clone())).unwrap().wait().unwrap_err();
    assert!(e.to_string().contains("did not set output 0"), "{e}");
}

#[test]
fn donation_writes_in_place_only_when_unique() {
    let rt = Runtime::cpu(1);
    let b = rt.upload(&[10.0f32, 20.0], [2]).unwrap();
    // Unique: the memory is reused; the old handle is gone (moved into the op).
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    assert!(a.is_unique());
    let before = DONATED.load(Ordering::SeqCst);
    let y = rt
        .submit(Add {
            a,
            b: b.clone(),
            donate: true,
            delay: Duration::ZERO,
        })
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(vals(&rt, &y), [11.0, 22.0]);
    assert_eq!(
        DONATED.load(Ordering::SeqCst),
        before + 1,
        "the unique input was written in place"
    );
    // Shared: another handle sees the memory, so the op must allocate, and the other
    // handle still reads the old values.
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let keep = a.clone();
    let y = rt
        .submit(Add {
            a,
            b: b.clone(),
            donate: true,
            delay: Duration::ZERO,
        })
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(vals(&rt, &y), [11.0, 22.0]);
    assert_eq!(vals(&rt, &keep), [1.0, 2.0]);
    assert!(!y.same_storage(&keep));
    assert_eq!(
        DONATED.load(Ordering::SeqCst),
        before + 1,
        "a shared input is never written"
    );
}

#[test]
fn shutdown_drains_every_accepted_op() {
    let rt = Runtime::cpu(2);
    let a = rt.upload(&[1.0f32; 16], [16]).unwrap();
    let mut subs = Vec::new();
    for _ in 0..50 {
        let mut op = add(&a, &a);
        op.delay = Duration::from_micros(200);
        subs.push(rt.submit(op).unwrap());
    }
    block_on(rt.shutdown()).unwrap();
    for s in subs {
        assert!(
            s.is_done(),
            "shutdown returned before an accepted op finished"
        );
        let t = s.wait().unwrap();
        assert_eq!(t.numel(), 16);
    }
    let e = rt.submit(add(&a, &a)).unwrap_err();
    assert!(matches!(e.error, Error::Shutdown));
}

thread_local! {
    static HELD: std::cell::RefCell<Option<Arc<()>>> = const { std::cell::RefCell::new(None) };
}

/// Parks a clone of a token in its actor thread's thread-local storage, released only
/// when that thread exits.
struct Park(Tensor, Arc<()>);
impl Op for Park {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "park"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        HELD.with(|h| *h.borrow_mut() = Some(self.1.clone()));
        let v = cx.input(&self.0)?.cpu::<f32>()?.to_vec();
        cx.set_output(0, Buffer::from_vec(v))
    }
}

#[test]
fn dropping_the_runtime_joins_its_threads() {
    let token = Arc::new(());
    let rt = Runtime::cpu(4);
    let a = rt.upload(&[1.0f32], [1]).unwrap();
    let subs: Vec<_> = rt
        .compute_streams(rt.device())
        .into_iter()
        .map(|s| rt.submit_on(s, Park(a.clone(), token.clone())).unwrap())
        .collect();
    drop(rt);
    // Every accepted op completed...
    for s in subs {
        s.wait().unwrap();
    }
    // ...and every actor thread has exited (its thread-locals are destroyed only then),
    // because dropping the runtime joined them.
    assert_eq!(
        Arc::strong_count(&token),
        1,
        "an actor thread outlived its runtime"
    );
}

#[test]
fn full_mailbox_applies_backpressure_without_losing_ops() {
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(1)
        .mailbox(1)
        .build()
        .unwrap();
    let a = rt.upload(&[1.0f32], [1]).unwrap();
    let mut x = a.clone();
    let mut subs = Vec::new();
    for _ in 0..200 {
        let mut op = add(&x, &a);
        op.delay = Duration::from_micros(20);
        let s = rt.submit(op).unwrap();
        x = s.outputs().unwrap().clone();
        subs.push(s);
    }
    assert_eq!(vals(&rt, &x), [201.0]);
    // The async path waits for room instead of blocking.
    let out = block_on(async {
        let mut x = a.clone();
        for _ in 0..100 {
            let s = rt.submit_async(add(&x, &a)).await.unwrap();
            x = s.outputs().unwrap().clone();
        }
        x
    });
    assert_eq!(vals(&rt, &out), [101.0]);
    for s in subs {
        s.wait().unwrap();
    }
}

#[test]
fn futures_work_under_tokio() {
    let rt = Runtime::cpu(2);
    let tokio_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let got = tokio_rt.block_on(async {
        let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
        let mut handles = Vec::new();
        for i in 0..8 {
            let rt = rt.clone();
            let a = a.clone();
            handles.push(tokio::spawn(async move {
                let mut x = a.clone();
                for _ in 0..i {
                    x = rt.submit_async(add(&x, &a)).await.unwrap().await.unwrap();
                }
                rt.to_vec::<f32>(&x).unwrap().await.unwrap()
            }));
        }
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    });
    for (i, v) in got.iter().enumerate() {
        let k = (i + 1) as f32;
        assert_eq!(v, &[k, 2.0 * k]);
    }
}

#[test]
fn keep_alive_holds_inputs_until_completion() {
    // The op holds its input; dropping the user's handle early does not free it.
    let rt = Runtime::cpu(1);
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let mut op = add(&a, &a);
    op.delay = Duration::from_millis(20);
    let s = rt.submit(op).unwrap();
    drop(a);
    let y = s.wait().unwrap();
    assert_eq!(vals(&rt, &y), [2.0, 4.0]);
}

#[test]
fn markers_time_a_stream() {
    let rt = Runtime::cpu(1);
    let s = rt.compute_streams(rt.device())[0];
    let a = rt.upload(&[1.0f32], [1]).unwrap();
    let m0 = rt.mark(s).unwrap();
    let mut op = add(&a, &a);
    op.delay = Duration::from_millis(5);
    let _y = rt.submit_on(s, op).unwrap();
    let m1 = rt.mark(s).unwrap();
    let (m0, m1) = (m0.wait().unwrap(), m1.wait().unwrap());
    let ms = m0.elapsed_ms(&m1).unwrap();
    assert!(ms >= 4.0, "the marked span covers the 5 ms op, got {ms} ms");
}

#[test]
fn policies_see_queued_load() {
    struct Spy(Arc<AtomicUsize>);
    impl placement::Policy for Spy {
        fn name(&self) -> &'static str {
            "spy"
        }
        fn place(&self, _op: &placement::OpInfo<'_>, streams: &[placement::StreamLoad]) -> usize {
            self.0.fetch_max(
                streams.iter().map(|s| s.queued_ops).sum(),
                Ordering::Relaxed,
            );
            streams.len() - 1
        }
    }
    let seen = Arc::new(AtomicUsize::new(0));
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(3)
        .policy(Spy(seen.clone()))
        .build()
        .unwrap();
    let a = rt.upload(&[1.0f32], [1]).unwrap();
    let mut subs = Vec::new();
    for _ in 0..10 {
        let mut op = add(&a, &a);
        op.delay = Duration::from_millis(2);
        subs.push(rt.submit(op).unwrap());
    }
    for s in subs {
        assert_eq!(
            s.stream(),
            StreamId::new(2),
            "the policy's choice is honoured"
        );
        s.wait().unwrap();
    }
    assert!(
        seen.load(Ordering::Relaxed) >= 1,
        "queued ops are visible to the policy"
    );
}

/// Reads a tensor it does not declare in `inputs`.
struct Sneaky {
    declared: Tensor,
    hidden: Tensor,
}
impl Op for Sneaky {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "sneaky"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.declared]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.declared))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let v = cx.input(&self.hidden)?.cpu::<f32>()?.to_vec();
        cx.set_output(0, Buffer::from_vec(v))
    }
}

#[test]
fn undeclared_inputs_foreign_tensors_and_empty_tensors_are_rejected() {
    let rt = Runtime::cpu(1);
    let a = rt.upload(&[1.0f32], [1]).unwrap();
    let b = rt.upload(&[2.0f32], [1]).unwrap();
    // An op may only read what it declared (only that was waited for).
    let e = rt
        .submit(Sneaky {
            declared: a.clone(),
            hidden: b,
        })
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(e.to_string().contains("did not declare"), "{e}");
    // Tensors of another runtime: stream ids and events are per runtime.
    let other = Runtime::cpu(1);
    let foreign = other.upload(&[3.0f32], [1]).unwrap();
    let e = rt.submit(add(&a, &foreign)).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidOp { .. })
            && e.error.to_string().contains("another runtime"),
        "{}",
        e.error
    );
    // Zero-size and overflowing shapes are typed errors, not panics.
    assert!(matches!(
        rt.upload::<f32>(&[], [0, 3]).unwrap_err(),
        Error::InvalidOp { .. }
    ));
    assert!(matches!(
        rt.upload::<f32>(&[], [1 << 62, 8]).unwrap_err(),
        Error::InvalidDim { .. }
    ));
}
