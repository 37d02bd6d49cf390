//! The future of [`Runtime::submit_async`]: validates on first poll, then waits for
//! mailbox room without blocking the executor (protocol in `mailbox.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::completion::Submission;
use crate::device::StreamId;
use crate::error::{Error, SubmitError};
use crate::job::Msg;
use crate::mailbox::TrySendError;
use crate::op::Op;
use crate::reentry::refuse_on_actor;
use crate::runtime::Runtime;

pub(crate) enum AsyncState<O: Op> {
    Start(Option<O>, Option<StreamId>),
    Sending(Option<Msg>, Option<Submission<O::Output>>, StreamId),
    Done,
}

/// The future of [`Runtime::submit_async`].
pub struct SubmitAsync<O: Op> {
    rt: Runtime,
    state: AsyncState<O>,
}

impl Runtime {
    /// Like [`Runtime::submit`], but waits for mailbox room asynchronously.
    pub fn submit_async<O: Op>(&self, op: O) -> SubmitAsync<O> {
        SubmitAsync::new(self.clone(), op, self.pin)
    }

    /// Like [`Runtime::submit_on`], but waits for mailbox room asynchronously.
    pub fn submit_async_on<O: Op>(&self, stream: StreamId, op: O) -> SubmitAsync<O> {
        SubmitAsync::new(self.clone(), op, Some(stream))
    }
}

impl<O: Op> SubmitAsync<O> {
    pub(crate) fn new(rt: Runtime, op: O, pin: Option<StreamId>) -> Self {
        SubmitAsync {
            rt,
            state: AsyncState::Start(Some(op), pin),
        }
    }
}

// The op is never pinned structurally: it is moved into the envelope on the first poll.
impl<O: Op> Unpin for SubmitAsync<O> {}

impl<O: Op> Future for SubmitAsync<O> {
    type Output = Result<Submission<O::Output>, SubmitError<O>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                AsyncState::Start(op, pin) => {
                    let op = op.take().expect("polled after completion");
                    match this.rt.prepare(*pin, op) {
                        Ok((env, sub, s)) => {
                            this.state = AsyncState::Sending(Some(Msg::Job(env)), Some(sub), s)
                        }
                        Err(e) => {
                            this.state = AsyncState::Done;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                AsyncState::Sending(msg, sub, s) => {
                    let stream = *s;
                    let entry = &this.rt.inner.streams[stream.0];
                    let m = msg.take().expect("message present while sending");
                    // Inside the gate across the sends: see `Inner::gate`.
                    let pass = this.rt.inner.gate.enter();
                    let (error, m) = if pass.is_none() {
                        (Error::Shutdown, m)
                    } else {
                        match entry.tx.try_send(m) {
                            Ok(()) => {
                                let sub = sub.take().expect("submission present");
                                this.state = AsyncState::Done;
                                return Poll::Ready(Ok(sub));
                            }
                            Err(TrySendError::Closed(m)) => (Error::Shutdown, m),
                            Err(TrySendError::Full(m)) => {
                                // Register, then retry once (see mailbox.rs for why).
                                entry.tx.room.register(cx.waker());
                                match entry.tx.try_send(m) {
                                    Ok(()) => {
                                        let sub = sub.take().expect("submission present");
                                        this.state = AsyncState::Done;
                                        return Poll::Ready(Ok(sub));
                                    }
                                    Err(TrySendError::Full(m)) => {
                                        // On a stream actor (polled inside an op's run)
                                        // waiting for room could wait forever.
                                        match refuse_on_actor("submit_async", || {
                                            format!("the mailbox of {stream} is full")
                                        }) {
                                            Ok(()) => {
                                                *msg = Some(m);
                                                return Poll::Pending;
                                            }
                                            Err(e) => (e, m),
                                        }
                                    }
                                    Err(TrySendError::Closed(m)) => (Error::Shutdown, m),
                                }
                            }
                        }
                    };
                    drop(pass);
                    this.state = AsyncState::Done;
                    let Msg::Job(env) = m else {
                        unreachable!("only jobs are sent here")
                    };
                    return Poll::Ready(Err(SubmitError {
                        error,
                        op: env.recover(),
                    }));
                }
                AsyncState::Done => panic!("SubmitAsync polled after completion"),
            }
        }
    }
}
