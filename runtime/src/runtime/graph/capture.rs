//! [`Capture`], the builder `Runtime::capture` lends its closure, and the recording
//! runtime handles it gives out ([`Capture::runtime`]): both record into one
//! [`Recording`] (`record.rs`).

use super::record::Recording;
use crate::device::{Device, StreamId};
use crate::error::{Error, Result, SubmitError};
use crate::op::Op;
use crate::runtime::Runtime;
use crate::sync::{lock, Arc, Mutex};
use crate::tensor::Tensor;

/// A graph's recording, handed to `Runtime::capture`'s closure: submit ops with
/// [`Capture::submit`] (or through [`Capture::runtime`], for code written against
/// `&Runtime`), declare inputs with [`Capture::input`], states with [`Capture::state`]
/// and outputs with [`Capture::output`]. See `runtime/src/runtime/graph/mod.rs` for the whole
/// picture.
pub struct Capture<'r> {
    pub(crate) rec: Arc<Mutex<Option<Recording>>>,
    streams: Vec<StreamId>,
    _rt: std::marker::PhantomData<&'r Runtime>,
}

fn ended() -> Error {
    Error::invalid("graph", "the capture has ended")
}

impl<'r> Capture<'r> {
    pub(crate) fn new(rt: &'r Runtime, device: Device) -> Self {
        let rec = Recording::new(rt, device);
        Capture {
            streams: rec.streams.clone(),
            rec: Arc::new(Mutex::new(Some(rec))),
            _rt: std::marker::PhantomData,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Recording) -> Result<T>) -> Result<T> {
        lock(&self.rec).as_mut().map_or_else(|| Err(ended()), f)
    }

    /// The recording, once the closure has returned.
    pub(crate) fn finish(self) -> Result<Recording> {
        lock(&self.rec).take().ok_or_else(ended)
    }

    /// The compute streams ops can be placed on (for [`Capture::submit_on`]).
    pub fn streams(&self) -> &[StreamId] {
        &self.streams
    }

    /// A runtime handle whose submissions (`submit`, `run`, also through
    /// [`Runtime::on`]) are recorded into this capture instead of sent: code written
    /// against `&Runtime` — a layer, a model's forward and backward, an optimizer step
    /// — is captured unchanged. Its submissions' outputs are placeholders (complete at
    /// once; readable only by later submissions of the capture); anything else it does
    /// (uploads, downloads) is eager, as on the runtime. Once the capture has ended, a
    /// submission through it fails with an invalid-argument error.
    ///
    /// ```
    /// # fn main() -> rtx::Result<()> {
    /// let rt = rtx::Runtime::cpu(1);
    /// let x0 = rt.upload(&[1.0f32, -2.0], [2])?;
    /// let layer = |rt: &rtx::Runtime, x: &rtx::Tensor| rt.run(rtx::ops::relu(x));
    /// let mut graph = rt.capture(|g| {
    ///     let x = g.input(&x0)?;
    ///     let y = layer(&g.runtime(), &x)?; // recorded, not run
    ///     g.output(&y)?;
    ///     Ok(())
    /// })?;
    /// assert_eq!(graph.launch(&[&x0])?.to_vec::<f32>(0)?, [1.0, 0.0]);
    /// # Ok(()) }
    /// ```
    pub fn runtime(&self) -> Runtime {
        let rt = self
            .with(|r| Ok(r.rt.clone()))
            .expect("the capture is open");
        Runtime {
            inner: rt.inner,
            pin: None,
            recording: Some(self.rec.clone()),
        }
    }

    /// Declares a bound input: a tensor whose contents each launch reads, given anew to
    /// every [`Graph::launch`](super::Graph::launch) (copied into the graph's own
    /// buffer, ordered by events). `example` gives its shape and dtype and the contents
    /// the capture's warm-up run computes with. Returns the placeholder to submit ops on.
    pub fn input(&mut self, example: &Tensor) -> Result<Tensor> {
        self.with(|r| r.input(example))
    }

    /// Declares a **state**: a buffer the graph owns, starting as a copy of `init`
    /// (copied at capture; `init` itself is never written), which every launch reads
    /// and, once [`Capture::update`] names its new value, rewrites at the launch's end.
    /// So launch `k` reads the value launch `k - 1` left (the first launch, the initial
    /// value: the capture's warm-up run changes no state). Parameters, optimizer
    /// moments and step counters of a captured training step are states. Every op that
    /// reads a state, and the op producing its update, must run on one stream (else
    /// an invalid-argument error at submit). Read it with
    /// [`Graph::state`](super::Graph::state). Returns the placeholder to submit ops on.
    ///
    /// ```
    /// # fn main() -> rtx::Result<()> {
    /// let rt = rtx::Runtime::cpu(2);
    /// let w0 = rt.upload(&[1.0f32, 2.0], [2])?;
    /// let d0 = rt.upload(&[0.5f32, 0.5], [2])?;
    /// let mut graph = rt.capture(|g| {
    ///     let d = g.input(&d0)?;
    ///     let w = g.state(&w0)?;                    // the graph's own copy of w0
    ///     let w1 = g.submit(rtx::ops::add(&w, &d))?;
    ///     g.update(&w, &w1)?;                       // w <- w + d after each launch
    ///     Ok(())
    /// })?;
    /// for _ in 0..3 {
    ///     graph.launch(&[&d0])?.wait()?;
    /// }
    /// let w = graph.state(0)?;
    /// assert_eq!(rt.to_vec::<f32>(&w)?.wait()?, [2.5, 3.5]);
    /// assert_eq!(rt.to_vec::<f32>(&w0)?.wait()?, [1.0, 2.0]); // never written
    /// # Ok(()) }
    /// ```
    pub fn state(&mut self, init: &Tensor) -> Result<Tensor> {
        self.with(|r| r.state(init))
    }

    /// Makes `value` (an op output of this capture, of the state's shape and dtype, on
    /// the stream of the state's readers) the new value of `state` after each launch:
    /// it is copied into the state's buffer after every op of the launch on that stream
    /// (on CUDA, a copy captured at the end of that stream's last segment), or, on CUDA,
    /// written there directly by `value`'s op when that op donates `state` (an
    /// optimizer step, `add_scalar_`, …) and no op after it reads `state`
    /// ([`Graph::in_place_states`](super::Graph::in_place_states)). A state is updated
    /// at most once.
    pub fn update(&mut self, state: &Tensor, value: &Tensor) -> Result<()> {
        self.with(|r| r.update(state, value))
    }

    /// Declares `t`, an output of an op submitted in this capture, as an output of the
    /// graph: readable after each launch ([`Launch::output`](super::Launch::output)).
    /// Returns its index.
    pub fn output(&mut self, t: &Tensor) -> Result<usize> {
        self.with(|r| r.output(t))
    }

    /// Records an op, on the stream of its first input produced in this capture (else
    /// the next compute stream in turn). Validation is that of `Runtime::submit`, plus
    /// the op's capture hazard ([`Error::NotCapturable`]); a rejected op comes back.
    pub fn submit<O: Op>(&mut self, op: O) -> Result<O::Output, SubmitError<O>> {
        let mut g = lock(&self.rec);
        match g.as_mut() {
            Some(r) => r.submit(op).map(|(o, _)| o),
            None => Err(SubmitError { error: ended(), op }),
        }
    }

    /// Records an op on `stream` (one of [`Capture::streams`]).
    pub fn submit_on<O: Op>(
        &mut self,
        stream: StreamId,
        op: O,
    ) -> Result<O::Output, SubmitError<O>> {
        let mut g = lock(&self.rec);
        match g.as_mut() {
            Some(r) => r.submit_on(stream, op).map(|(o, _)| o),
            None => Err(SubmitError { error: ended(), op }),
        }
    }
}

/// A submission through a recording runtime handle ([`Capture::runtime`]): recorded,
/// its outputs complete at once.
pub(crate) fn record_submit<O: Op>(
    rec: &Mutex<Option<Recording>>,
    pin: Option<StreamId>,
    op: O,
) -> Result<crate::completion::Submission<O::Output>, SubmitError<O>> {
    let mut g = lock(rec);
    let Some(r) = g.as_mut() else {
        return Err(SubmitError { error: ended(), op });
    };
    let (out, stream) = match pin {
        Some(s) => r.submit_on(s, op)?,
        None => r.submit(op)?,
    };
    let done = crate::completion::Completion::new();
    done.complete(Ok(None));
    Ok(crate::completion::Submission::prebuilt(out, done, stream))
}
