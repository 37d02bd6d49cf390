//! A value set once by one thread and awaited by others: the ready event a CUDA stream
//! actor records once for a burst of ops (see `cuda/actor.rs`).
//!
//! Ops publish their outputs when they are enqueued, but the actor records one event per
//! burst (when it hands the burst to its watcher) instead of one per op, so an output's
//! ready mark may name an event that is not recorded yet. A consumer on another stream
//! waits for the recording ([`Burst::wait`]) before making its stream wait on the event.
//! The actor records (or fails) every burst it opens: before it waits for another actor
//! (a pending input, another burst's event), when its mailbox runs empty, after 16 ops,
//! and when it stops (or fails on drop). So the wait cannot deadlock: an actor waiting
//! on another actor has no open burst, and the other waits only on the device (stream
//! synchronizes in an op, e.g. the first cuDNN algorithm search of a shape, or the
//! out-of-memory retry), which needs nothing from any actor. The wait is bounded by the
//! producer's current op plus at most 15 more ops of its burst. An op that blocks the
//! actor's thread for long (the first search of a convolution shape: milliseconds) calls
//! `StreamCx::before_blocking` first, which records and hands over the burst of the ops
//! before it, so their consumers on other streams do not wait for the search. Loom
//! checks the primitive (`loom_tests.rs`).

use crate::error::{Error, Result};
use crate::sync::{lock, wait, Condvar, Mutex};

enum State<E> {
    Open,
    Set(E),
    Failed(Error),
}

/// A once-set value (an event) or the error that replaced it.
pub(crate) struct Burst<E> {
    state: Mutex<State<E>>,
    cv: Condvar,
}

impl<E: Clone> Burst<E> {
    /// An open burst: nothing recorded yet.
    pub(crate) fn new() -> Self {
        Burst {
            state: Mutex::new(State::Open),
            cv: Condvar::new(),
        }
    }

    /// Sets the value (or the failure) and wakes every waiter. Only the first call
    /// counts.
    pub(crate) fn set(&self, v: Result<E>) {
        let mut g = lock(&self.state);
        if matches!(*g, State::Open) {
            *g = match v {
                Ok(e) => State::Set(e),
                Err(e) => State::Failed(e),
            };
            drop(g);
            self.cv.notify_all();
        }
    }

    /// The value if set, without waiting.
    pub(crate) fn get(&self) -> Option<Result<E>> {
        match &*lock(&self.state) {
            State::Open => None,
            State::Set(e) => Some(Ok(e.clone())),
            State::Failed(e) => Some(Err(e.clone())),
        }
    }

    /// Blocks until the value is set (or failed).
    pub(crate) fn wait(&self) -> Result<E> {
        let mut g = lock(&self.state);
        loop {
            match &*g {
                State::Open => g = wait(&self.cv, g),
                State::Set(e) => return Ok(e.clone()),
                State::Failed(e) => return Err(e.clone()),
            }
        }
    }
}

/// The burst an actor has open; dropped while still open (the actor stopped or
/// panicked), it fails the burst so that no waiter hangs.
pub(crate) struct OpenBurst<E: Clone>(pub(crate) crate::sync::Arc<Burst<E>>);

impl<E: Clone> Drop for OpenBurst<E> {
    fn drop(&mut self) {
        self.0.set(Err(Error::Synchronization {
            code: None,
            message: "the stream actor stopped before recording this op's event".into(),
        }));
    }
}
