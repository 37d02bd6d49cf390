//! Cancellation and shutdown under load:
//!
//! - dropping a `Submission` before its op completes cancels nothing and frees nothing
//!   early (the op runs, its outputs hold the right values), and once the outputs are
//!   dropped nothing of the op is left (its token is released);
//! - dropping the runtime, or `shutdown().await` under tokio, with thousands of ops in
//!   flight: every op completes with the right value or fails with a typed error, none
//!   hangs, every thread of the runtime is joined (the process's thread count is back at
//!   its baseline) and nothing of the ops is left.
//!
//! No submitter is blocked on a full mailbox when the runtime goes (that hazard is
//! issue 14, item 5, with its own regression tests). The tests of this file run one at a
//! time (they read the process's thread count).

mod common;
#[path = "stress/dag.rs"]
mod dag;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rtx::ops::elementwise as ew;
use rtx::{Backend, Buffer, ExecCx, Op, Plan, PlanCx, Result, Runtime, Tensor};

/// One test at a time: each reads the process's thread count.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// `y = x + 1` on the CPU after `delay`, holding `token` while it lives and counting its
/// runs.
struct Tracked {
    x: Tensor,
    /// Held only to be counted: released when the op is dropped.
    _token: Arc<()>,
    runs: Arc<AtomicUsize>,
    delay: Duration,
}

impl Op for Tracked {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "tracked"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.x))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let y: Vec<f32> = cx
            .input(&self.x)?
            .cpu::<f32>()?
            .iter()
            .map(|v| v + 1.0)
            .collect();
        self.runs.fetch_add(1, Ordering::SeqCst);
        cx.set_output(0, Buffer::from_vec(y))
    }
}

/// Waits up to 10 s for `token` to be the only reference left.
fn released(token: &Arc<()>) -> usize {
    let t0 = Instant::now();
    while Arc::strong_count(token) > 1 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    Arc::strong_count(token) - 1
}

/// `f` on a watched thread: a result within `limit` or a failure naming the hang.
fn within<R: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} hung (more than {limit:?})"))
}

#[test]
fn dropped_submissions_cancel_nothing_and_free_nothing_early() {
    let _one = serial();
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(4)
        .mailbox(4)
        .build()
        .unwrap();
    let token = Arc::new(());
    let runs = Arc::new(AtomicUsize::new(0));
    let (chains, len) = (8usize, 400usize);
    let t0 = Instant::now();
    let mut ends = Vec::new();
    for c in 0..chains {
        let mut x = rt.upload(&vec![c as f32; 64], [64]).unwrap();
        for i in 0..len {
            let s = rt
                .submit(Tracked {
                    x: x.clone(),
                    _token: token.clone(),
                    runs: runs.clone(),
                    delay: Duration::from_micros(if i % 50 == 0 { 500 } else { 0 }),
                })
                .unwrap();
            // Only the output handle is kept: the submission is dropped at once, the
            // input handle of the previous op too.
            x = s.outputs().unwrap().clone();
            drop(s);
            // Every tenth op also has a fire-and-forget sibling nobody reads.
            if i % 10 == 0 {
                drop(
                    rt.submit(Tracked {
                        x: x.clone(),
                        _token: token.clone(),
                        runs: runs.clone(),
                        delay: Duration::ZERO,
                    })
                    .unwrap(),
                );
            }
        }
        ends.push(x);
    }
    let submitted = chains * (len + len / 10);
    for (c, x) in ends.iter().enumerate() {
        let v = rt.to_vec::<f32>(x).unwrap().wait().unwrap();
        assert!(
            v.iter().all(|&y| y == c as f32 + len as f32),
            "chain {c}: {:?}",
            &v[..4]
        );
    }
    drop(ends);
    // The fire-and-forget ops ran too (dropping a submission cancels nothing)...
    let t1 = Instant::now();
    while runs.load(Ordering::SeqCst) < submitted && t1.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(runs.load(Ordering::SeqCst), submitted);
    // ...and nothing of any op is left once their outputs are gone.
    let left = released(&token);
    eprintln!(
        "cancel: {submitted} ops with their submissions dropped at once ({chains} chains of \
         {len} + {} unread): all ran, chains correct, {left} ops left after; {:.2} s",
        chains * len / 10,
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(left, 0, "ops still held after their outputs were dropped");
}

#[test]
fn dropping_the_runtime_with_thousands_in_flight_drains_or_fails_all_and_joins_every_thread() {
    let _one = serial();
    dag::warm_up(&Backend::Cpu);
    let threads0 = dag::threads();
    let token = Arc::new(());
    let runs = Arc::new(AtomicUsize::new(0));
    // Room for every op in the mailboxes: no submitter blocks when the runtime goes.
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(8)
        .mailbox(1024)
        .build()
        .unwrap();
    let n = 6000usize;
    let x = rt.upload(&[1.0f32; 16], [16]).unwrap();
    let subs: Vec<_> = (0..n)
        .map(|i| {
            // Chains of 6 across streams, the rest independent.
            rt.submit(Tracked {
                x: x.clone(),
                _token: token.clone(),
                runs: runs.clone(),
                delay: Duration::from_micros(if i % 3 == 0 { 100 } else { 0 }),
            })
            .unwrap()
        })
        .collect();
    let threads_live = dag::threads();
    let ran_before = runs.load(Ordering::SeqCst);
    let t0 = Instant::now();
    drop(rt);
    let dropped_in = t0.elapsed();
    let (done, failed) = within(Duration::from_secs(60), "waiting for the ops", move || {
        let (mut done, mut failed) = (0, 0);
        for s in subs {
            match s.wait() {
                Ok(y) => {
                    assert_eq!(y.dims(), [16]);
                    done += 1
                }
                Err(e) => {
                    assert!(matches!(e, rtx::Error::Shutdown), "a typed error: {e:?}");
                    failed += 1
                }
            }
        }
        (done, failed)
    });
    drop(x);
    let threads1 = dag::settle_threads(threads0);
    let left = released(&token);
    eprintln!(
        "cancel: runtime dropped with {n} ops submitted, {} of them not yet run: {done} \
         completed, {failed} failed typed, none hung; the drop took {:.1} ms; threads \
         {threads0} -> {threads_live} -> {threads1}; {left} ops left",
        n - ran_before,
        dropped_in.as_secs_f64() * 1e3
    );
    assert_eq!(done + failed, n);
    assert!(
        threads1 <= threads0,
        "threads joined: {threads0} -> {threads1}: {:?}",
        dag::thread_names()
    );
    assert_eq!(left, 0, "ops still held after the runtime dropped");
}

#[test]
fn shutdown_under_tokio_with_dags_in_flight_drains_them_and_joins_every_thread() {
    let _one = serial();
    let mut backends = vec![("cpu", Backend::Cpu)];
    if common::cuda_present() {
        backends.push(("cuda", Backend::Cuda(vec![0])));
    }
    for (label, backend) in backends {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        dag::warm_up(&backend);
        let threads0 = dag::threads();
        let rt = Runtime::builder()
            .backend(backend)
            .streams(8)
            .mailbox(4096)
            .build()
            .unwrap();
        let seed = dag::seed();
        let dags: Vec<_> = (0..60).map(|i| dag::Dag::random(seed ^ i, 24)).collect();
        let ops: usize = dags.iter().map(|d| d.ops()).sum();
        let rt2 = rt.clone();
        let (done, last) = tokio.block_on(async move {
            // Every DAG submitted, nothing awaited, then shutdown.
            let mut outs = Vec::new();
            for d in &dags {
                outs.push(dag::submit(&rt2, d, dag::Mode::Async).await);
            }
            rt2.shutdown().await.unwrap();
            // Accepted ops drained: every value is ready and finite where it should be.
            let mut done = 0;
            for o in &outs {
                for t in o {
                    assert_eq!(t.dims(), [dag::R, dag::C]);
                    done += 1;
                }
            }
            let a = rt2.upload(&[1.0f32], [1]);
            let late = rt2.submit(ew::add(&outs[0][0], &outs[0][0]));
            (done, (a.is_err(), late.err().map(|e| e.error)))
        });
        drop(tokio);
        drop(rt);
        let threads1 = dag::settle_threads(threads0);
        eprintln!(
            "cancel {label}: shutdown().await under tokio with 60 DAGs ({ops} ops) in \
             flight: {done} values settled; later submit: {:?}, later upload refused: {}; \
             threads {threads0} -> {threads1}",
            last.1, last.0
        );
        assert!(matches!(last.1, Some(rtx::Error::Shutdown)), "{:?}", last.1);
        assert!(
            threads1 <= threads0,
            "{label}: threads joined: {threads0} -> {threads1}: {:?}",
            dag::thread_names()
        );
    }
}
