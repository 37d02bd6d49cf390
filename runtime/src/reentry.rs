//! Which threads are stream actors: an op's `run` must not wait for the runtime's work.
//!
//! An actor runs one op at a time. An op that, inside `run`, waits for another op (a
//! submission's `wait` or `block_on`, a `to_vec(..).wait()`), for room in a full mailbox,
//! or for the runtime's shutdown can wait forever: the op it waits for may sit behind the
//! waiting op in this actor's own mailbox, or on another actor that waits for this one
//! (a full mailbox in a cycle, an input this op has not published yet). So every actor
//! thread carries a mark, and those calls check it: on an actor thread they fail at once
//! with [`Error::ActorWouldBlock`] instead of blocking (a submission already done is
//! still returned). The rule is documented on [`Op`](crate::Op).

use std::cell::Cell;

use crate::device::StreamId;
use crate::error::{Error, Result};

#[cfg(not(loom))]
thread_local! {
    static ACTOR: Cell<Option<StreamId>> = const { Cell::new(None) };
}
// Loom runs its threads on one OS thread: a std thread-local would be shared by them.
#[cfg(loom)]
loom::thread_local! {
    static ACTOR: Cell<Option<StreamId>> = Cell::new(None);
}

/// Marks this thread as the actor of `stream` (an actor, at its start).
pub(crate) fn enter_actor(stream: StreamId) {
    ACTOR.with(|a| a.set(Some(stream)));
}

/// The stream whose actor runs on this thread, if any.
pub(crate) fn current_actor() -> Option<StreamId> {
    ACTOR.with(Cell::get)
}

/// `Err(ActorWouldBlock)` for `call`, which would wait because of `reason`, when this
/// thread is a stream actor; `Ok` on any other thread.
pub(crate) fn refuse_on_actor(call: &str, reason: impl FnOnce() -> String) -> Result<()> {
    match current_actor() {
        None => Ok(()),
        Some(stream) => Err(Error::ActorWouldBlock {
            call: call.to_string(),
            stream,
            reason: reason(),
        }),
    }
}
