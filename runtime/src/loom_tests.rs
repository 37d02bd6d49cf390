//! Loom models of the protocols in `storage.rs`, `completion.rs`, `mailbox.rs`, `gate.rs`,
//! `driver/parking.rs` and `driver/block_cache.rs` (the block caches' lending), driven
//! directly (no actors), so each model is small and checks one protocol precisely. The end-to-end models are in
//! `runtime/tests/loom_runtime.rs`.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p rtx-runtime --lib loom`
//! (in a separate `CARGO_TARGET_DIR`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use crate::buffer::Buffer;
use crate::completion::{Completion, CompletionGuard, Submission};
use crate::device::{Device, StreamId};
use crate::dtype::DType;
use crate::error::Error;
use crate::mailbox::{channel, TrySendError};
use crate::storage::{Mark, Ready, Storage};
use crate::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// A waker that sets a flag under a loom mutex and notifies a loom condvar: loom sees the
/// wake-up and the wait, so a lost wake-up shows as a deadlock.
struct Signal {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Signal {
    fn new() -> std::sync::Arc<Signal> {
        std::sync::Arc::new(Signal {
            woken: Mutex::new(false),
            cv: Condvar::new(),
        })
    }
    /// Sleeps until woken, then re-arms.
    fn sleep(&self) {
        let mut w = self.woken.lock().unwrap();
        while !*w {
            w = self.cv.wait(w).unwrap();
        }
        *w = false;
    }
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

fn pending_storage() -> Storage {
    Storage::pending(DType::F32, 1, Device::Cpu(0), Some(StreamId(0)), 0)
}

fn pending() -> Arc<Storage> {
    Arc::new(pending_storage())
}

fn host(v: f32) -> Ready {
    Ready {
        buf: Arc::new(Buffer::from_vec(vec![v])),
        mark: Mark::Host,
    }
}

fn value(r: &Ready) -> f32 {
    r.buf.cpu::<f32>().unwrap()[0]
}

// ---- storage.rs: publish / fail / wait_ready / donation ------------------------------------

/// A consumer waiting on a pending storage sees the producer's data (rules 1–2).
#[test]
fn storage_publish_wakes_waiter() {
    loom::model(|| {
        let s = pending();
        let s2 = s.clone();
        let producer = thread::spawn(move || s2.publish(host(3.0)));
        let r = s.wait_ready().unwrap();
        assert_eq!(value(&r), 3.0);
        producer.join().unwrap();
    });
}

/// Two waiters (two consumer streams) and a failing producer: both see the error.
#[test]
fn storage_fail_wakes_every_waiter() {
    loom::model(|| {
        let s = pending();
        let s2 = s.clone();
        let s3 = s.clone();
        let other = thread::spawn(move || s2.wait_ready().map(|_| ()));
        let producer = thread::spawn(move || s3.fail(Error::Shutdown));
        assert_eq!(s.wait_ready().map(|_| ()), Err(Error::Shutdown));
        assert_eq!(other.join().unwrap(), Err(Error::Shutdown));
        producer.join().unwrap();
    });
}

/// Publish and the envelope's drop-time `fail` race: the first wins, the waiter sees it.
#[test]
fn storage_publish_races_fail() {
    loom::model(|| {
        let s = pending();
        let s2 = s.clone();
        let t = thread::spawn(move || s2.fail(Error::Shutdown));
        s.publish(host(1.0));
        t.join().unwrap();
        match s.wait_ready() {
            Ok(r) => assert_eq!(value(&r), 1.0),
            Err(e) => assert_eq!(e, Error::Shutdown),
        }
    });
}

/// Donation (rule 3) against a transient reader holding the published buffer: either the
/// reader got the memory and donation declines (the slot stays `Ready`), or donation took
/// it and the reader sees `Donated`; never both.
#[test]
fn storage_donation_races_reader() {
    loom::model(|| {
        let s = pending();
        s.publish(host(5.0));
        let s2 = s.clone();
        let reader = thread::spawn(move || s2.try_ready().unwrap().map(|r| value(&r)));
        let took = s.take_buffer_for_test();
        let read = reader.join().unwrap();
        match (took, read) {
            (Some(b), Err(_)) => assert_eq!(b.cpu::<f32>().unwrap()[0], 5.0),
            (None, Ok(v)) => {
                assert_eq!(v, 5.0);
                assert!(
                    matches!(s.try_ready(), Some(Ok(_))),
                    "declined donation lost the buffer"
                );
            }
            // The reader may finish (dropping its clone) before the donation.
            (Some(_), Ok(v)) => assert_eq!(v, 5.0),
            (None, Err(e)) => panic!("donation declined but the reader saw {e}"),
        }
    });
}

/// Donation while the producing op's envelope still holds the storage (rule 3): the
/// envelope's handle is not counted while its flag is set, and the envelope clears the
/// flag (under the slot's lock) before its handle goes. With another user handle alive
/// the whole time, no interleaving of the envelope's release with the donation check may
/// donate; once that handle and the envelope are gone, the donor's handle is the last
/// and donation takes the buffer.
#[test]
fn storage_donation_ignores_only_the_producer_handle() {
    loom::model(|| {
        let donor = Arc::new(pending_storage().held_by_producer());
        donor.publish(host(2.0));
        let envelope = donor.clone();
        let other = donor.clone();
        let producer = thread::spawn(move || {
            envelope.release_producer();
            drop(envelope);
        });
        let took = Storage::take_unique(&donor);
        assert!(
            took.is_none(),
            "donated while another handle to the storage was alive"
        );
        producer.join().unwrap();
        assert!(
            matches!(donor.try_ready(), Some(Ok(_))),
            "a declined donation lost the buffer"
        );
        drop(other);
        let took = Storage::take_unique(&donor).expect("the last handle donates");
        assert_eq!(took.cpu::<f32>().unwrap()[0], 2.0);
    });
}

/// With only the donor's handle and the producer's envelope, the donation succeeds while
/// the envelope holds its flag or after it has gone, and declines only in between; it
/// never loses the buffer.
#[test]
fn storage_donation_during_producer_release() {
    loom::model(|| {
        let donor = Arc::new(pending_storage().held_by_producer());
        donor.publish(host(4.0));
        let envelope = donor.clone();
        let producer = thread::spawn(move || {
            envelope.release_producer();
            drop(envelope);
        });
        match Storage::take_unique(&donor) {
            Some(b) => assert_eq!(b.cpu::<f32>().unwrap()[0], 4.0),
            None => assert!(matches!(donor.try_ready(), Some(Ok(_)))),
        }
        producer.join().unwrap();
    });
}

// ---- completion.rs: complete / poll / wait / guard -------------------------------------------

/// The poller registers its waker under the completion's lock after seeing no result, so
/// a completion on another thread always wakes it.
#[test]
fn completion_complete_wakes_poller() {
    loom::model(|| {
        let c = Completion::new();
        let c2 = c.clone();
        let t = thread::spawn(move || c2.complete(Ok(None)));
        let signal = Signal::new();
        let waker = Waker::from(signal.clone());
        let mut cx = Context::from_waker(&waker);
        loop {
            match c.poll_result(&mut cx) {
                Poll::Ready(r) => {
                    assert!(matches!(r, Ok(None)));
                    break;
                }
                Poll::Pending => signal.sleep(),
            }
        }
        t.join().unwrap();
    });
}

/// A submission polled with one waker, then another (moved between tasks): the latest
/// waker is the one woken.
#[test]
fn completion_rewake_with_new_waker() {
    loom::model(|| {
        let c = Completion::new();
        let mut sub = Submission::prebuilt(7u32, c.clone(), StreamId(0));
        let first = Signal::new();
        let w1 = Waker::from(first.clone());
        let pending = Pin::new(&mut sub).poll(&mut Context::from_waker(&w1));
        let t = thread::spawn(move || CompletionGuard::new(c).finish(Ok(None)));
        if pending.is_ready() {
            unreachable!("completed before the thread started");
        }
        let second = Signal::new();
        let w2 = Waker::from(second.clone());
        let mut cx = Context::from_waker(&w2);
        loop {
            match Pin::new(&mut sub).poll(&mut cx) {
                Poll::Ready(r) => {
                    assert_eq!(r.unwrap(), 7);
                    break;
                }
                Poll::Pending => second.sleep(),
            }
        }
        t.join().unwrap();
    });
}

/// A job dropped unexecuted (shutdown) completes its submission with `Shutdown` through
/// the guard, racing a blocking waiter.
#[test]
fn completion_guard_drop_resolves_waiter() {
    loom::model(|| {
        let c = Completion::new();
        let sub = Submission::prebuilt((), c.clone(), StreamId(0));
        let guard = CompletionGuard::new(c);
        let t = thread::spawn(move || drop(guard));
        assert_eq!(sub.wait(), Err(Error::Shutdown));
        t.join().unwrap();
    });
}

/// `finish` and a late error (the envelope's `fail`) race: only the first result counts.
#[test]
fn completion_first_result_wins() {
    loom::model(|| {
        let c = Completion::new();
        let sub = Submission::prebuilt((), c.clone(), StreamId(0));
        let c2 = c.clone();
        let t = thread::spawn(move || c2.complete(Err(Error::Shutdown)));
        c.complete(Ok(None));
        let r = sub.wait();
        t.join().unwrap();
        assert!(matches!(r, Ok(()) | Err(Error::Shutdown)));
        assert!(c.is_done());
    });
}

// ---- mailbox.rs: backpressure and the room --------------------------------------------------

/// Capacity 1. A blocking sender fills the mailbox; an async sender then follows the
/// `SubmitAsync` protocol (`try_send`; on `Full` register in the room, retry once; sleep
/// until woken) while the actor receives. Every message arrives, in order; no one sleeps
/// on a mailbox with room.
#[test]
fn mailbox_room_wakes_async_sender() {
    loom::model(|| {
        let (tx, rx) = channel::<u32>(1);
        let actor = thread::spawn(move || {
            let mut got = Vec::new();
            while let Some(m) = rx.recv() {
                got.push(m);
            }
            got
        });
        tx.send(1).map_err(|_| ()).unwrap();
        let signal = Signal::new();
        let waker = Waker::from(signal.clone());
        let mut m = 2;
        loop {
            m = match tx.try_send(m) {
                Ok(()) => break,
                Err(TrySendError::Closed(_)) => panic!("actor gone"),
                Err(TrySendError::Full(m)) => {
                    tx.room.register(&waker);
                    match tx.try_send(m) {
                        Ok(()) => break,
                        Err(TrySendError::Closed(_)) => panic!("actor gone"),
                        Err(TrySendError::Full(m)) => {
                            signal.sleep();
                            m
                        }
                    }
                }
            };
        }
        drop(tx);
        assert_eq!(actor.join().unwrap(), [1, 2]);
    });
}

/// A burst's event, set by the actor while a consumer on another stream waits for it:
/// the waiter wakes with the value (a lost wake-up shows as a deadlock).
#[test]
fn burst_set_wakes_waiter() {
    use crate::burst::Burst;
    loom::model(|| {
        let b = Arc::new(Burst::<u32>::new());
        let b2 = b.clone();
        let t = thread::spawn(move || b2.set(Ok(7)));
        assert_eq!(b.wait().ok(), Some(7));
        t.join().unwrap();
    });
}

/// An actor that stops with a burst still open fails it: the waiter gets an error
/// instead of hanging, and a later set does not overwrite it.
#[test]
fn burst_dropped_open_fails_waiter() {
    use crate::burst::{Burst, OpenBurst};
    loom::model(|| {
        let b = Arc::new(Burst::<u32>::new());
        let guard = OpenBurst(b.clone());
        let t = thread::spawn(move || drop(guard));
        assert!(b.wait().is_err());
        t.join().unwrap();
        b.set(Ok(1));
        assert!(matches!(b.get(), Some(Err(_))));
    });
}

/// Two settings race (the actor's record and its guard's failure): every waiter and every
/// later read see the same one.
#[test]
fn burst_first_set_wins() {
    use crate::burst::Burst;
    loom::model(|| {
        let b = Arc::new(Burst::<u32>::new());
        let (b1, b2) = (b.clone(), b.clone());
        let t1 = thread::spawn(move || b1.set(Ok(1)));
        let t2 = thread::spawn(move || {
            b2.set(Err(Error::Synchronization {
                code: None,
                message: "stopped".into(),
            }))
        });
        let seen = b.wait().ok();
        t1.join().unwrap();
        t2.join().unwrap();
        assert_eq!(b.get().and_then(|r| r.ok()), seen);
    });
}

// ---- gate.rs: the shutdown gate -------------------------------------------------------------

/// A sender races `close` + `wait_empty` + the shutdown message (the `rtx-shutdown`
/// thread's order), the main thread playing the actor: a send that entered the gate is
/// received before the shutdown message, and one refused never arrives.
#[test]
fn gate_accepted_send_lands_before_shutdown_message() {
    use crate::gate::Gate;
    loom::model(|| {
        let gate = Arc::new(Gate::default());
        let (tx, rx) = channel::<u32>(1);
        let (g1, tx1) = (gate.clone(), tx.clone());
        let sender = thread::spawn(move || match g1.enter() {
            Some(_pass) => {
                tx1.send(1).map_err(|_| ()).unwrap();
                true
            }
            None => false,
        });
        let g2 = gate.clone();
        let closer = thread::spawn(move || {
            assert!(g2.close(), "the first close closes");
            g2.wait_empty();
            tx.send(0).map_err(|_| ()).unwrap();
        });
        let mut got = Vec::new();
        loop {
            match rx.recv() {
                Some(0) => break,
                Some(m) => got.push(m),
                None => panic!("the shutdown message never came"),
            }
        }
        let accepted = sender.join().unwrap();
        closer.join().unwrap();
        let want: &[u32] = if accepted { &[1] } else { &[] };
        assert_eq!(
            got, want,
            "a send accepted by the gate landed behind the shutdown message"
        );
    });
}

/// `close` never waits for the senders inside: here the thread that closes is the one
/// that must drain the mailbox a sender inside waits on (an actor calling `shutdown()`,
/// or an executor thread that runs the drain's consumer). A blocking close deadlocks.
#[test]
fn gate_close_does_not_wait_for_a_sender_blocked_on_a_full_mailbox() {
    use crate::gate::Gate;
    loom::model(|| {
        let gate = Arc::new(Gate::default());
        let (tx, rx) = channel::<u32>(1);
        tx.send(1).map_err(|_| ()).unwrap();
        let g1 = gate.clone();
        let sender = thread::spawn(move || {
            let accepted = match g1.enter() {
                Some(_pass) => tx.send(2).is_ok(),
                None => false,
            };
            accepted
        });
        gate.close();
        // Now drain like an actor: the sender inside (if it entered) gets its room.
        let mut got = vec![rx.recv().unwrap()];
        let accepted = sender.join().unwrap();
        gate.wait_empty();
        if accepted {
            got.push(rx.recv().unwrap());
        }
        assert_eq!(got[0], 1);
        assert_eq!(got.len(), 1 + accepted as usize);
    });
}

/// `driver/parking.rs`: a free from another thread never lands on a stream while it is
/// being captured, and a parked free is done exactly once, after the capture. The
/// "stream" is a flag the actor sets after announcing its capture and clears before
/// ending the announcement, as the capture itself begins and ends between them.
#[test]
fn parking_free_never_lands_in_a_capture() {
    use crate::driver::parking::Parking;
    use crate::sync::AtomicBool;
    use crate::sync::AtomicUsize;
    use crate::sync::Ordering::SeqCst;
    loom::model(|| {
        let parking = Arc::new(Parking::<u32>::new());
        let capturing = Arc::new(AtomicBool::new(false));
        let freed = Arc::new(AtomicUsize::new(0));
        let (p, c, f) = (parking.clone(), capturing.clone(), freed.clone());
        let freer = thread::spawn(move || {
            p.free_or_park(
                7,
                1,
                |_| {
                    assert!(!c.load(SeqCst), "a free landed inside the capture");
                    f.fetch_add(1, SeqCst);
                },
                |v| v,
            );
        });
        parking.begin(7);
        capturing.store(true, SeqCst);
        // ... the capture ...
        capturing.store(false, SeqCst);
        let parked = parking.end(7);
        freed.fetch_add(parked.len(), SeqCst);
        freer.join().unwrap();
        assert_eq!(freed.load(SeqCst), 1, "freed once, not lost");
    });
}

/// `driver/block_cache.rs`: a stream short of a size class takes ("lends") an idle block from
/// another stream's cache. Stream A's cache holds two blocks of one class: one dropped
/// inside an op's run (kernels on A may still use it: A's alone) and one idle on every
/// stream. While stream B lends from A, A allocates twice for itself. B never gets A's
/// in-run block, no block is handed out twice, a lent block moves from A's classes to
/// B's, and A's byte count matches what it still holds.
#[test]
fn block_cache_lends_only_idle_blocks_once() {
    use crate::driver::block_cache::{lend, BlockCache, CacheLock};
    const G: usize = 512;
    const IN_RUN: u64 = 0x1000;
    const IDLE: u64 = 0x2000;
    loom::model(|| {
        let a = Arc::new(CacheLock::new(BlockCache::default()));
        let b = Arc::new(CacheLock::new(BlockCache::default()));
        {
            let mut g = crate::sync::lock(&a);
            g.classes.insert(IN_RUN, G);
            g.put(G, IN_RUN, false);
            g.classes.insert(IDLE, G);
            g.put(G, IDLE, true);
        }
        let (a2, b2) = (a.clone(), b.clone());
        let thief = thread::spawn(move || lend([&*a2], &b2, G));
        let mine: Vec<u64> = (0..2)
            .filter_map(|_| crate::sync::lock(&a).take(G))
            .collect();
        let lent = thief.join().unwrap();
        assert_ne!(
            lent,
            Some(IN_RUN),
            "a block dropped inside an op's run went to another stream"
        );
        assert!(mine.contains(&IN_RUN), "A gets its own in-run block back");
        let mut out = mine.clone();
        out.extend(lent);
        let n = out.len();
        out.sort_unstable();
        out.dedup();
        assert_eq!(
            out.len(),
            n,
            "a block handed out twice: {mine:?} and {lent:?}"
        );
        assert_eq!(n, 2, "both blocks handed out, none lost: {mine:?} {lent:?}");
        let (ga, gb) = (crate::sync::lock(&a), crate::sync::lock(&b));
        assert_eq!(ga.bytes, 0, "A's bytes match what it holds");
        if let Some(p) = lent {
            assert_eq!(gb.classes.get(&p), Some(&G), "the lent block is B's now");
            assert!(!ga.classes.contains_key(&p), "and no longer A's");
        }
    });
}
