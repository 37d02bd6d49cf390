//! Regression tests for the shutdown hazards of issue 14 (CPU backend): a shutdown while
//! a submitter waits on a full mailbox and an op submits a child from `run` must never
//! hang; `shutdown()` itself never blocks its caller; uploads fail after shutdown like
//! submits and downloads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rtx_runtime::*;

/// Runs `f` on a thread of its own and returns its value, or panics naming `what` if it
/// has not finished within `secs` (a hang fails the test instead of hanging it).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} hung (no result within {secs} s)"))
}

/// How the children's submits came out.
#[derive(Default)]
struct Outcomes {
    ok: AtomicUsize,
    shutdown: AtomicUsize,
    would_block: AtomicUsize,
}

/// No inputs, no outputs; `plan` sleeps `plan_sleep`.
struct Child {
    plan_sleep: Duration,
}

impl Op for Child {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        "child"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        std::thread::sleep(self.plan_sleep);
        Ok(Plan {
            outputs: vec![],
            cost: Cost::default(),
        })
    }
    fn run(&mut self, _: &mut ExecCx<'_>) -> Result<()> {
        Ok(())
    }
}

/// Submits one [`Child`] to stream 1 from `run` and counts how that went.
struct Parent {
    rt: Runtime,
    child_plan_sleep: Duration,
    outcomes: Arc<Outcomes>,
}

impl Op for Parent {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        "parent"
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
    fn run(&mut self, _: &mut ExecCx<'_>) -> Result<()> {
        let child = Child {
            plan_sleep: self.child_plan_sleep,
        };
        let o = &self.outcomes;
        match self.rt.submit_on(StreamId::new(1), child) {
            Ok(_) => o.ok.fetch_add(1, Ordering::SeqCst),
            Err(e) => match e.error {
                Error::Shutdown => o.shutdown.fetch_add(1, Ordering::SeqCst),
                Error::ActorWouldBlock { .. } => o.would_block.fetch_add(1, Ordering::SeqCst),
                other => panic!("unexpected error from a nested submit: {other}"),
            },
        };
        Ok(())
    }
}

fn two_streams_mailbox_1() -> Runtime {
    Runtime::builder()
        .backend(Backend::Cpu)
        .streams(2)
        .mailbox(1)
        .build()
        .unwrap()
}

/// A thread keeping stream 0 full of parents until the runtime refuses; how many were
/// accepted.
fn feeder(
    rt: &Runtime,
    child_plan_sleep: Duration,
    o: &Arc<Outcomes>,
) -> std::thread::JoinHandle<usize> {
    let rt = rt.clone();
    let o = o.clone();
    std::thread::spawn(move || {
        let mut accepted = 0;
        loop {
            let p = Parent {
                rt: rt.clone(),
                child_plan_sleep,
                outcomes: o.clone(),
            };
            match rt.submit_on(StreamId::new(0), p) {
                Ok(_) => accepted += 1,
                Err(e) => {
                    assert_eq!(e.error, Error::Shutdown);
                    return accepted;
                }
            }
        }
    })
}

/// One round: feed stream 0, shut down after `shutdown_after`, await the shutdown; the
/// time `shutdown()` itself took.
fn round(child_plan_sleep: Duration, shutdown_after: Duration) -> (Duration, usize, Arc<Outcomes>) {
    let rt = two_streams_mailbox_1();
    let o = Arc::new(Outcomes::default());
    let f = feeder(&rt, child_plan_sleep, &o);
    std::thread::sleep(shutdown_after);
    let t = Instant::now();
    let sh = rt.shutdown();
    let call = t.elapsed();
    rtx_runtime::block_on(sh).expect("shutdown awaited off the actors");
    let accepted = f.join().expect("feeder");
    (call, accepted, o)
}

/// The deterministic form of the deadlock: the first parent's child sleeps 300 ms in
/// `plan` (on stream 0's actor, inside the parent's `run`) while the feeder waits for room
/// in stream 0's mailbox; the shutdown comes at 200 ms. With the old `RwLock` gate the
/// feeder held it shared, `close` queued for it exclusively, and the child's send then
/// blocked the actor: a hang. Now the child's submit fails with `Shutdown` and everything
/// drains.
#[test]
fn shutdown_while_actor_submits_child_does_not_hang() {
    let (call, accepted, o) = within(30, "the shutdown", || {
        round(Duration::from_millis(300), Duration::from_millis(200))
    });
    assert!(
        call < Duration::from_millis(100),
        "shutdown() blocked its caller for {call:?}"
    );
    assert!(
        accepted >= 2,
        "the feeder kept the mailbox full ({accepted} accepted)"
    );
    // The first child was planned across the shutdown: refused with `Shutdown`, as are
    // the children of every parent that ran after it.
    assert!(o.shutdown.load(Ordering::SeqCst) >= 1);
    let ran = o.ok.load(Ordering::SeqCst)
        + o.shutdown.load(Ordering::SeqCst)
        + o.would_block.load(Ordering::SeqCst);
    assert_eq!(
        ran, accepted,
        "every accepted parent ran before the drain ended"
    );
}

/// The randomized form (the hang came about once in 4,500 rounds): bounded rounds, each
/// shutting down at a random moment (0–3 ms) with children that plan instantly. Rounds:
/// `RTX_HAZARD_ROUNDS` (default 300); the seed is printed.
#[test]
fn shutdown_at_random_moments_with_nested_submits_never_hangs() {
    let rounds: usize = std::env::var("RTX_HAZARD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let seed: u64 = rand::random();
    println!("seed {seed}, {rounds} rounds");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut totals = [0usize; 4];
    for r in 0..rounds {
        let after = Duration::from_micros(rng.gen_range(0..3000));
        let (call, accepted, o) = within(30, &format!("round {r} (seed {seed})"), move || {
            round(Duration::ZERO, after)
        });
        assert!(
            call < Duration::from_millis(200),
            "round {r}: shutdown() blocked its caller for {call:?}"
        );
        let ok = o.ok.load(Ordering::SeqCst);
        let sh = o.shutdown.load(Ordering::SeqCst);
        let wb = o.would_block.load(Ordering::SeqCst);
        assert_eq!(
            ok + sh + wb,
            accepted,
            "round {r}: every accepted parent ran"
        );
        totals[0] += accepted;
        totals[1] += ok;
        totals[2] += sh;
        totals[3] += wb;
    }
    println!(
        "parents {}, children accepted {}, refused (shutdown) {}, refused (full mailbox) {}",
        totals[0], totals[1], totals[2], totals[3]
    );
    assert!(totals[1] > 0, "some nested submissions went through");
}

/// Sleeps `0` when run (a slow op to back the mailbox up).
struct Slow(Duration);

impl Op for Slow {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        "slow"
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
    fn run(&mut self, _: &mut ExecCx<'_>) -> Result<()> {
        std::thread::sleep(self.0);
        Ok(())
    }
}

/// `shutdown()` returns a future and must not block the calling thread (an executor's)
/// while a submitter waits for mailbox room: it used to take 900 ms here.
#[test]
fn shutdown_call_does_not_block_while_a_submitter_waits_for_room() {
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(1)
        .mailbox(1)
        .build()
        .unwrap();
    let rt2 = rt.clone();
    let submitter = std::thread::spawn(move || {
        let mut subs = Vec::new();
        for _ in 0..3 {
            match rt2.submit(Slow(Duration::from_millis(300))) {
                Ok(s) => subs.push(s),
                Err(e) => assert_eq!(e.error, Error::Shutdown),
            }
        }
        subs.into_iter().map(|s| s.wait()).collect::<Vec<_>>()
    });
    // The first op runs, the second fills the mailbox, the third waits for room.
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let sh = rt.shutdown();
    let call = t.elapsed();
    assert!(
        call < Duration::from_millis(50),
        "shutdown() blocked for {call:?}"
    );
    assert!(rt.is_shut_down());
    // Awaited on a tokio current-thread runtime: the executor thread stays free.
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let drained_in = tokio_rt.block_on(async {
        // Another task on the same thread keeps running while the shutdown drains.
        let ticker = async {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let t = Instant::now();
        tokio::select! {
            r = sh => { r.expect("drained"); }
            _ = ticker => unreachable!(),
        }
        t.elapsed()
    });
    assert!(
        drained_in >= Duration::from_millis(300),
        "the drain ran the accepted ops"
    );
    let results = within(10, "the submitter", move || submitter.join().unwrap());
    assert_eq!(
        results.len(),
        3,
        "all three were accepted before the shutdown"
    );
    assert!(
        results.iter().all(|r| r.is_ok()),
        "accepted ops ran: {results:?}"
    );
}

/// After `shutdown()`, uploads fail like submits and downloads (they used to succeed on
/// the CPU backend).
#[test]
fn upload_after_shutdown_fails_like_submit_and_to_vec() {
    let rt = Runtime::cpu(1);
    let x = rt.upload(&[1.5f32, 2.5], [2]).unwrap();
    let sh = rt.shutdown();
    assert_eq!(rt.upload(&[1.0f32], [1]).unwrap_err(), Error::Shutdown);
    assert_eq!(
        rt.upload_vec(vec![1.0f32], [1]).unwrap_err(),
        Error::Shutdown
    );
    assert_eq!(
        rt.upload_to(Device::Cpu(0), &[1.0f32], [1]).unwrap_err(),
        Error::Shutdown
    );
    assert_eq!(rt.to_vec::<f32>(&x).unwrap_err(), Error::Shutdown);
    assert_eq!(
        rt.submit(Slow(Duration::ZERO)).unwrap_err().error,
        Error::Shutdown
    );
    block_on(sh).unwrap();
}
