//! Completions: how the device side tells the submitter that an op has finished.
//!
//! # Protocol
//!
//! `Completion` is shared by the submission (the future) and the job. The side that
//! observes the op finish (the CPU actor after running it, the CUDA watcher after its
//! event completes) calls `complete` exactly once; later calls are ignored. Under the
//! lock it stores the result and takes the registered waker; it wakes after unlocking.
//! A poller registers its waker under the same lock after seeing no result, so a
//! completion between the check and the registration is impossible (no lost wake-up).
//! Blocking waiters use the condvar. If a job is dropped without completing (shutdown
//! races, panics while unwinding), [`CompletionGuard`] completes it with an error: no
//! future ever hangs.

use std::any::Any;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::device::StreamId;
use crate::error::{Error, Result};
use crate::sync::{lock, Arc, Mutex, WaitCv};

/// A value produced at completion time (host data of a download).
pub(crate) type Payload = Box<dyn Any + Send>;

struct State {
    result: Option<Result<Option<Payload>>>,
    done: bool,
    waker: Option<Waker>,
}

pub(crate) struct Completion {
    state: Mutex<State>,
    cv: WaitCv,
}

impl Completion {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Completion {
            state: Mutex::new(State {
                result: None,
                done: false,
                waker: None,
            }),
            cv: WaitCv::new(),
        })
    }

    /// Records the result and wakes the waiter. Only the first call has an effect.
    pub(crate) fn complete(&self, result: Result<Option<Payload>>) {
        let waker = {
            let mut g = lock(&self.state);
            if g.done {
                return;
            }
            g.done = true;
            g.result = Some(result);
            g.waker.take()
        };
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        lock(&self.state).done
    }

    pub(crate) fn poll_result(&self, cx: &mut Context<'_>) -> Poll<Result<Option<Payload>>> {
        let mut g = lock(&self.state);
        if g.done {
            return Poll::Ready(g.result.take().unwrap_or_else(|| Err(already_taken())));
        }
        match &g.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => g.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn wait_result(&self) -> Result<Option<Payload>> {
        let mut g = lock(&self.state);
        while !g.done {
            g = self.cv.wait(g);
        }
        g.result.take().unwrap_or_else(|| Err(already_taken()))
    }
}

fn already_taken() -> Error {
    Error::ResultTaken
}

/// Completes its completion with an error if dropped before `finish` (see module docs).
pub(crate) struct CompletionGuard {
    completion: Option<Arc<Completion>>,
}

impl CompletionGuard {
    pub(crate) fn new(c: Arc<Completion>) -> Self {
        CompletionGuard {
            completion: Some(c),
        }
    }
    pub(crate) fn completion(&self) -> Arc<Completion> {
        self.completion.clone().expect("held until finished")
    }
    pub(crate) fn finish(mut self, result: Result<Option<Payload>>) {
        if let Some(c) = self.completion.take() {
            c.complete(result);
        }
    }
}

impl Drop for CompletionGuard {
    fn drop(&mut self) {
        if let Some(c) = self.completion.take() {
            c.complete(Err(Error::Shutdown));
        }
    }
}

/// How a submission turns into its value.
enum Value<T> {
    /// Built at submit time (output tensor handles); returned once the op completes.
    Prebuilt(Option<T>),
    /// Produced at completion (a download's host data).
    Payload(PhantomData<fn() -> T>),
}

/// A submitted op: `.await` it (or [`Submission::wait`]) for its output once the device
/// has finished, or take the output handles at once with [`Submission::outputs`] and pass
/// them to the next op.
///
/// The future needs only `std::task`: it runs under tokio, smol, `futures::executor` or a
/// plain `block_on`. Dropping a submission does not cancel the op. Waiting for one
/// inside an op's `run` fails with [`Error::ActorWouldBlock`] (see [`Op`](crate::Op)).
#[must_use = "an op runs whether or not it is awaited, but its errors are only seen by awaiting"]
pub struct Submission<T> {
    value: Value<T>,
    completion: Arc<Completion>,
    stream: StreamId,
}

impl<T> Unpin for Submission<T> {}

impl<T: Send + 'static> Submission<T> {
    pub(crate) fn prebuilt(value: T, completion: Arc<Completion>, stream: StreamId) -> Self {
        Submission {
            value: Value::Prebuilt(Some(value)),
            completion,
            stream,
        }
    }
    pub(crate) fn payload(completion: Arc<Completion>, stream: StreamId) -> Self {
        Submission {
            value: Value::Payload(PhantomData),
            completion,
            stream,
        }
    }

    /// The output handles, available at once (for ops with tensor outputs). `None` for
    /// values that only exist at completion, like a download's host data.
    pub fn outputs(&self) -> Option<&T> {
        match &self.value {
            Value::Prebuilt(v) => v.as_ref(),
            Value::Payload(_) => None,
        }
    }

    /// The output handles by value, at once (what [`Submission::outputs`] shows), giving
    /// up the submission (the op still runs: dropping it does not cancel). `None` for
    /// values that only exist at completion.
    pub fn into_outputs(mut self) -> Option<T> {
        match &mut self.value {
            Value::Prebuilt(v) => v.take(),
            Value::Payload(_) => None,
        }
    }

    /// The stream the op was placed on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Whether the op has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.completion.is_done()
    }

    /// Blocks the calling thread until the op has finished, then returns its output.
    /// For synchronous code; in async code `.await` instead.
    ///
    /// Inside an op's `run` (on a stream actor's thread) a submission not yet done fails
    /// at once with [`Error::ActorWouldBlock`] instead: the actor cannot run other ops
    /// while it waits, so the wait could last forever (see [`Op`](crate::Op)).
    pub fn wait(mut self) -> Result<T> {
        if !self.completion.is_done() {
            self.refuse_on_actor("Submission::wait")?;
        }
        let r = self.completion.wait_result();
        self.finish(r)
    }

    fn refuse_on_actor(&self, call: &str) -> Result<()> {
        let stream = self.stream;
        crate::reentry::refuse_on_actor(call, || {
            format!("waiting for an op on {stream} that is not done")
        })
    }

    fn finish(&mut self, r: Result<Option<Payload>>) -> Result<T> {
        let payload = r?;
        match &mut self.value {
            Value::Prebuilt(v) => v.take().ok_or_else(already_taken),
            Value::Payload(_) => payload
                .and_then(|p| p.downcast::<T>().ok())
                .map(|b| *b)
                .ok_or_else(|| {
                    Error::invalid(
                        "submission",
                        "completion carried no value of the expected type",
                    )
                }),
        }
    }
}

impl<T: Send + 'static> Future for Submission<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let this = self.get_mut();
        match this.completion.poll_result(cx) {
            // Polled on a stream actor (`block_on` inside an op's run): the wake-up could
            // never come (see `wait`).
            Poll::Pending => match this.refuse_on_actor("Submission (polled)") {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            Poll::Ready(r) => Poll::Ready(this.finish(r)),
        }
    }
}

impl<T> std::fmt::Debug for Submission<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submission")
            .field("stream", &self.stream)
            .field("done", &self.completion.is_done())
            .finish()
    }
}

/// Runs a future to completion on the current thread (parks between wake-ups).
/// A minimal executor for examples and synchronous callers.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    use std::task::Wake;
    struct Unparker(std::thread::Thread);
    impl Wake for Unparker {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(Unparker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}
