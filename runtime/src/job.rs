//! Jobs: an op in flight, type-erased, with its outputs, completion and keep-alive.

use std::any::Any;
use std::time::Instant;

use crate::completion::CompletionGuard;
use crate::error::{Error, Result};
use crate::op::{Cost, ExecCx, Op, TensorSpec};
use crate::placement::LoadCounters;
use crate::storage::Storage;
use crate::sync::Arc;
use crate::tensor::Tensor;

/// An op's output storages (inline up to 2).
pub(crate) type OutputStorages = smallvec::SmallVec<[Arc<Storage>; 2]>;

/// An op behind a trait object.
pub(crate) trait Job: Send {
    fn name(&self) -> &'static str;
    fn inputs(&self) -> Vec<&Tensor>;
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()>;
    fn batches_launches(&self) -> bool;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

pub(crate) struct OpJob<O: Op>(pub(crate) O);

impl<O: Op> Job for OpJob<O> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn inputs(&self) -> Vec<&Tensor> {
        self.0.inputs()
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        self.0.run(cx)
    }
    fn batches_launches(&self) -> bool {
        self.0.batches_launches()
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// A job with everything the actor and the completion side need.
///
/// Dropping an envelope at any point (executed or not) fails its still-pending outputs
/// and completes its completion with an error if nothing else did, and releases the
/// stream's load counters: nothing waits forever on a job that was lost.
pub(crate) struct Envelope {
    pub(crate) job: Option<Box<dyn Job>>,
    pub(crate) specs: Vec<TensorSpec>,
    pub(crate) outputs: OutputStorages,
    pub(crate) completion: Option<CompletionGuard>,
    pub(crate) cost: Cost,
    pub(crate) est_ns: u64,
    pub(crate) submitted: Instant,
    pub(crate) load: Arc<LoadCounters>,
}

impl Envelope {
    pub(crate) fn name(&self) -> &'static str {
        self.job.as_ref().map(|j| j.name()).unwrap_or("?")
    }

    /// [`Op::batches_launches`] of the op.
    pub(crate) fn batches_launches(&self) -> bool {
        self.job.as_ref().is_some_and(|j| j.batches_launches())
    }

    /// Fails every output and the completion with `err`.
    pub(crate) fn fail(&mut self, err: Error) {
        for s in &self.outputs {
            s.fail(err.clone());
        }
        if let Some(c) = self.completion.take() {
            c.finish(Err(err));
        }
    }

    /// Takes the op back out of an envelope that never reached an actor.
    pub(crate) fn recover<O: Op>(mut self) -> O {
        let job = self
            .job
            .take()
            .expect("envelope holds its job until executed");
        match job.into_any().downcast::<OpJob<O>>() {
            Ok(j) => j.0,
            Err(_) => unreachable!("an envelope is recovered with the type it was built from"),
        }
    }
}

impl Drop for Envelope {
    fn drop(&mut self) {
        for s in &self.outputs {
            s.fail(Error::Shutdown);
            // Before the handles go (with the fields, after this): see `storage.rs`.
            s.release_producer();
        }
        self.load.sub(self.est_ns);
        // `completion` (a guard) completes with `Shutdown` if still held.
    }
}

/// A message to a stream actor.
pub(crate) enum Msg {
    /// Run this job.
    Job(Envelope),
    /// Finish: every message before this one has been handled.
    Shutdown,
    /// Completed ops whose keep-alives (inputs, temporaries) the actor drops on its own
    /// thread: on CUDA this keeps every driver call of a stream (frees included) on one
    /// thread instead of two contending for the driver.
    Release(Vec<Envelope>),
}
