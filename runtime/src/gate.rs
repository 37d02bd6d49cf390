//! The shutdown gate: every job send passes it; shutdown closes it without waiting.
//!
//! # Protocol
//!
//! A sender [`enter`](Gate::enter)s the gate before it sends a job to a mailbox and
//! leaves it (drops its [`Pass`]) once the job is in the mailbox (or came back). Entering
//! a closed gate fails at once: nobody ever *waits* to enter. [`close`](Gate::close)
//! marks the gate closed and returns at once; [`wait_empty`](Gate::wait_empty) then waits
//! until every sender that entered before the close has left. Whoever sends the shutdown
//! messages does so only after `wait_empty`, so every accepted job is in its mailbox
//! ahead of its stream's shutdown message (none can land behind it and wait forever).
//!
//! The gate used to be a `RwLock<bool>`, senders holding it shared: a sender blocked on a
//! full mailbox kept it shared, `close` queued for it exclusively, and the
//! writer-preferring lock then blocked the *actor's* own shared lock (an op submitting a
//! child from `run`), so the actor stopped draining the mailbox the sender waited on: a
//! deadlock. Here the actor's nested submit sees the gate closed and fails with
//! `Error::Shutdown` instead, and `close` never blocks, so no thread, an actor or an
//! executor thread calling `shutdown()`, waits on it. Loom checks the protocol
//! (`loom_tests.rs`: `gate_*`).

use crate::sync::{lock, wait, Condvar, Mutex};

#[derive(Default)]
struct State {
    closed: bool,
    inside: usize,
}

/// See the module docs.
#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<State>,
    left: Condvar,
}

/// A sender inside the gate; dropping it leaves.
pub(crate) struct Pass<'a>(&'a Gate);

impl Gate {
    /// Enters, unless the gate is closed (`None`). Never blocks.
    pub(crate) fn enter(&self) -> Option<Pass<'_>> {
        let mut g = lock(&self.state);
        if g.closed {
            return None;
        }
        g.inside += 1;
        Some(Pass(self))
    }

    /// Closes the gate; later `enter`s fail. Never blocks (beyond the state lock, held by
    /// nobody for longer than a counter update). Returns whether this call closed it.
    pub(crate) fn close(&self) -> bool {
        let mut g = lock(&self.state);
        !std::mem::replace(&mut g.closed, true)
    }

    /// Blocks until every sender that entered has left (call after `close`: then no one
    /// enters any more, and this ends once the senders' sends complete).
    pub(crate) fn wait_empty(&self) {
        let mut g = lock(&self.state);
        while g.inside > 0 {
            g = wait(&self.left, g);
        }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut g = lock(&self.0.state);
        g.inside -= 1;
        let last = g.inside == 0;
        drop(g);
        if last {
            self.0.left.notify_all();
        }
    }
}
