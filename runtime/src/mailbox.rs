//! Mailboxes: bounded channels from submitters to a stream actor.
//!
//! A full mailbox is backpressure. Synchronous submitters block in `send`; asynchronous
//! ones register a waker in the mailbox's [`Room`] and retry after the actor takes a
//! message. The registration protocol: push the waker under the room lock, *then* retry
//! `try_send`; the actor takes a message, *then* checks the waiter count and wakes
//! everyone. Either the retry sees the freed slot or the actor sees the waiter (both use
//! SeqCst on the count), so no submitter sleeps on a mailbox with room.
//!
//! Normally the channel is crossbeam's; under loom it is a small Mutex + Condvar channel,
//! since crossbeam is not loom-aware.

use std::task::Waker;

use crate::sync::{lock, Arc, AtomicUsize, Mutex, Ordering};

/// Async submitters waiting for room.
#[derive(Default)]
pub(crate) struct Room {
    waiting: AtomicUsize,
    wakers: Mutex<Vec<Waker>>,
}

impl Room {
    pub(crate) fn register(&self, w: &Waker) {
        let mut g = lock(&self.wakers);
        g.push(w.clone());
        self.waiting.store(g.len(), Ordering::SeqCst);
    }
    pub(crate) fn notify(&self) {
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        let ws = {
            let mut g = lock(&self.wakers);
            self.waiting.store(0, Ordering::SeqCst);
            std::mem::take(&mut *g)
        };
        for w in ws {
            w.wake();
        }
    }
}

/// Why a non-blocking send failed; the message comes back.
pub(crate) enum TrySendError<T> {
    Full(T),
    Closed(T),
}

#[cfg(not(loom))]
mod imp {
    use super::*;

    pub(crate) struct Sender<T> {
        tx: crossbeam_channel::Sender<T>,
        pub(crate) room: Arc<Room>,
    }
    pub(crate) struct Receiver<T> {
        rx: crossbeam_channel::Receiver<T>,
        room: Arc<Room>,
    }

    pub(crate) fn channel<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
        let (tx, rx) = crossbeam_channel::bounded(cap);
        let room = Arc::new(Room::default());
        (
            Sender {
                tx,
                room: room.clone(),
            },
            Receiver { rx, room },
        )
    }

    impl<T> Clone for Sender<T> {
        fn clone(&self) -> Self {
            Sender {
                tx: self.tx.clone(),
                room: self.room.clone(),
            }
        }
    }

    impl<T> Sender<T> {
        /// Blocks while the mailbox is full. `Err` gives the message back if the actor is gone.
        pub(crate) fn send(&self, m: T) -> Result<(), T> {
            self.tx.send(m).map_err(|e| e.into_inner())
        }
        pub(crate) fn try_send(&self, m: T) -> Result<(), TrySendError<T>> {
            self.tx.try_send(m).map_err(|e| match e {
                crossbeam_channel::TrySendError::Full(m) => TrySendError::Full(m),
                crossbeam_channel::TrySendError::Disconnected(m) => TrySendError::Closed(m),
            })
        }
    }

    impl<T> Receiver<T> {
        /// Blocks for the next message; `None` once every sender is gone.
        pub(crate) fn recv(&self) -> Option<T> {
            let m = self.rx.recv().ok();
            self.room.notify();
            m
        }
        pub(crate) fn try_recv(&self) -> Option<T> {
            let m = self.rx.try_recv().ok();
            if m.is_some() {
                self.room.notify();
            }
            m
        }
    }
}

#[cfg(loom)]
mod imp {
    use super::*;
    use crate::sync::{wait, Condvar};
    use std::collections::VecDeque;

    struct State<T> {
        q: VecDeque<T>,
        senders: usize,
        receiver: bool,
    }
    struct Chan<T> {
        cap: usize,
        state: Mutex<State<T>>,
        not_empty: Condvar,
        not_full: Condvar,
    }
    pub(crate) struct Sender<T> {
        chan: Arc<Chan<T>>,
        pub(crate) room: Arc<Room>,
    }
    pub(crate) struct Receiver<T> {
        chan: Arc<Chan<T>>,
        room: Arc<Room>,
    }

    pub(crate) fn channel<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
        let chan = Arc::new(Chan {
            cap,
            state: Mutex::new(State {
                q: VecDeque::new(),
                senders: 1,
                receiver: true,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
        });
        let room = Arc::new(Room::default());
        (
            Sender {
                chan: chan.clone(),
                room: room.clone(),
            },
            Receiver { chan, room },
        )
    }

    impl<T> Clone for Sender<T> {
        fn clone(&self) -> Self {
            lock(&self.chan.state).senders += 1;
            Sender {
                chan: self.chan.clone(),
                room: self.room.clone(),
            }
        }
    }
    impl<T> Drop for Sender<T> {
        fn drop(&mut self) {
            lock(&self.chan.state).senders -= 1;
            self.chan.not_empty.notify_all();
        }
    }
    impl<T> Drop for Receiver<T> {
        fn drop(&mut self) {
            lock(&self.chan.state).receiver = false;
            self.chan.not_full.notify_all();
        }
    }

    impl<T> Sender<T> {
        pub(crate) fn send(&self, m: T) -> Result<(), T> {
            let mut g = lock(&self.chan.state);
            loop {
                if !g.receiver {
                    return Err(m);
                }
                if g.q.len() < self.chan.cap {
                    g.q.push_back(m);
                    drop(g);
                    self.chan.not_empty.notify_one();
                    return Ok(());
                }
                g = wait(&self.chan.not_full, g);
            }
        }
        pub(crate) fn try_send(&self, m: T) -> Result<(), TrySendError<T>> {
            let mut g = lock(&self.chan.state);
            if !g.receiver {
                return Err(TrySendError::Closed(m));
            }
            if g.q.len() >= self.chan.cap {
                return Err(TrySendError::Full(m));
            }
            g.q.push_back(m);
            drop(g);
            self.chan.not_empty.notify_one();
            Ok(())
        }
    }

    impl<T> Receiver<T> {
        pub(crate) fn recv(&self) -> Option<T> {
            let mut g = lock(&self.chan.state);
            loop {
                if let Some(m) = g.q.pop_front() {
                    drop(g);
                    self.chan.not_full.notify_one();
                    self.room.notify();
                    return Some(m);
                }
                if g.senders == 0 {
                    return None;
                }
                g = wait(&self.chan.not_empty, g);
            }
        }
        pub(crate) fn try_recv(&self) -> Option<T> {
            let m = lock(&self.chan.state).q.pop_front();
            if m.is_some() {
                self.chan.not_full.notify_one();
                self.room.notify();
            }
            m
        }
    }
}

pub(crate) use imp::{channel, Receiver, Sender};
