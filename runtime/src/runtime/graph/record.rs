//! Recording a capture: what [`Capture`](super::Capture) and its runtime handles record.
//!
//! Nothing runs while the closure records. Each submission is validated (`plan`, and
//! the op's declared [`capture_hazard`](crate::Op::capture_hazard)) and placed on a
//! stream, and its outputs are *placeholders*: tensors standing for the graph's own
//! buffers, readable only by later submissions of the same capture (an eager op given
//! one fails at once with an `Upstream` error instead of waiting forever).
//!
//! The recorded ops are cut into **segments**: runs of ops on one stream. An op joins
//! its stream's open segment unless it reads a buffer produced by a segment of another
//! stream that the open segment does not already wait for; then it opens a new segment
//! that depends on those producers, and each producer is closed (its later ops go into
//! a new segment, so the dependency is on exactly the work before it). Dependencies
//! only point at segments that exist when a segment is opened, so the segment graph is
//! acyclic and its creation order is a topological order.

use std::collections::HashMap;

use crate::device::{Device, StreamId};
use crate::error::{Error, Result, SubmitError};
use crate::job::{Job, OpJob};
use crate::op::{Op, Outputs, PlanCx, TensorSpec};
use crate::runtime::Runtime;
use crate::storage::Storage;
use crate::sync::Arc;
use crate::tensor::Tensor;

/// One recorded op: the op and what replaying it needs.
pub(crate) struct Recorded {
    pub(crate) job: Box<dyn Job>,
    pub(crate) name: &'static str,
    pub(crate) specs: Vec<TensorSpec>,
    /// The placeholder keys of its outputs.
    pub(crate) outs: Vec<usize>,
    /// The storages of its inputs (placeholders and eager tensors), by address.
    pub(crate) declared: Vec<usize>,
}

/// A run of recorded ops on one stream.
pub(crate) struct Segment {
    pub(crate) stream: StreamId,
    pub(crate) ops: Vec<Recorded>,
    /// The segments (indices) this one waits for.
    pub(crate) deps: Vec<usize>,
    /// Eager tensors its ops read (the graph keeps them alive and never writes them).
    pub(crate) externals: Vec<Tensor>,
    /// The bound inputs (indices) this segment copies in at each launch.
    pub(crate) inputs: Vec<usize>,
    /// The states (indices) whose initial values this segment copies in at capture.
    pub(crate) state_inits: Vec<usize>,
}

/// A bound input of the graph.
pub(crate) struct BoundInput {
    pub(crate) key: usize,
    pub(crate) spec: TensorSpec,
    pub(crate) example: Tensor,
}

/// A state of the graph ([`Capture::state`]): a buffer each launch reads and, once
/// [`Capture::update`]d, rewrites at its end.
pub(crate) struct StateSlot {
    pub(crate) key: usize,
    pub(crate) spec: TensorSpec,
    pub(crate) init: Tensor,
    /// The stream of every op that reads it and of its update's producer.
    pub(crate) stream: Option<StreamId>,
    /// The placeholder key of its new value.
    pub(crate) update: Option<usize>,
}

/// What a capture records (behind [`Capture`] and its [`Capture::runtime`] handles).
pub(crate) struct Recording {
    pub(crate) rt: Runtime,
    pub(crate) device: Device,
    pub(crate) streams: Vec<StreamId>,
    next: usize,
    /// Every placeholder (kept alive so that their addresses stay unique keys).
    pub(crate) placeholders: Vec<Tensor>,
    /// Which segment produces each placeholder (bound inputs: the first segment that
    /// reads them, which copies them in).
    producer: HashMap<usize, usize>,
    pub(crate) inputs: Vec<BoundInput>,
    input_of: HashMap<usize, usize>,
    pub(crate) states: Vec<StateSlot>,
    state_of: HashMap<usize, usize>,
    pub(crate) segments: Vec<Segment>,
    open: HashMap<StreamId, usize>,
    /// The graph's outputs: placeholder key, spec, producing segment.
    pub(crate) outputs: Vec<(usize, TensorSpec, usize)>,
}

fn key(t: &Tensor) -> usize {
    Arc::as_ptr(t.storage()) as usize
}

impl Recording {
    pub(crate) fn new(rt: &Runtime, device: Device) -> Self {
        Recording {
            rt: Runtime {
                inner: rt.inner.clone(),
                pin: None,
                recording: None,
            },
            device,
            streams: rt.compute_streams(device),
            next: 0,
            placeholders: Vec::new(),
            producer: HashMap::new(),
            inputs: Vec::new(),
            input_of: HashMap::new(),
            states: Vec::new(),
            state_of: HashMap::new(),
            segments: Vec::new(),
            open: HashMap::new(),
            outputs: Vec::new(),
        }
    }

    fn placeholder(&mut self, spec: &TensorSpec, producer: Option<StreamId>) -> Tensor {
        let s = Storage::pending(
            spec.dtype,
            spec.shape.numel(),
            self.device,
            producer,
            self.rt.inner.id,
        );
        s.fail(Error::invalid(
            "graph",
            "this tensor stands for a graph's buffer: read it through a launch \
             (`Launch::output`), not as an eager input",
        ));
        let t = Tensor::from_storage(spec.shape.clone(), Arc::new(s));
        self.placeholders.push(t.clone());
        t
    }

    /// Declares a bound input: a tensor whose contents each launch reads, given anew to
    /// every [`Graph::launch`](super::Graph::launch) (copied into the graph's own
    /// buffer, ordered by events). `example` gives its shape and dtype and the contents
    /// the capture's warm-up run computes with. Returns the placeholder to submit ops on.
    pub(crate) fn input(&mut self, example: &Tensor) -> Result<Tensor> {
        self.check_tensor("graph input", example)?;
        let spec = TensorSpec::new(example.shape().clone(), example.dtype());
        let t = self.placeholder(&spec, None);
        self.input_of.insert(key(&t), self.inputs.len());
        self.inputs.push(BoundInput {
            key: key(&t),
            spec,
            example: example.clone(),
        });
        Ok(t)
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
    pub(crate) fn state(&mut self, init: &Tensor) -> Result<Tensor> {
        self.check_tensor("graph state", init)?;
        let spec = TensorSpec::new(init.shape().clone(), init.dtype());
        let t = self.placeholder(&spec, None);
        self.state_of.insert(key(&t), self.states.len());
        self.states.push(StateSlot {
            key: key(&t),
            spec,
            init: init.clone(),
            stream: None,
            update: None,
        });
        Ok(t)
    }

    /// Makes `value` (an op output of this capture, of the state's shape and dtype, on
    /// the stream of the state's readers) the new value of `state` after each launch:
    /// it is copied into the state's buffer after every op of the launch on that stream
    /// (on CUDA, a copy captured at the end of that stream's last segment). A state is
    /// updated at most once.
    pub(crate) fn update(&mut self, state: &Tensor, value: &Tensor) -> Result<()> {
        let bad = |m: &str| Err(Error::invalid("graph state update", m.to_string()));
        let Some(&i) = self.state_of.get(&key(state)) else {
            return bad("the first argument is not a state of this capture");
        };
        let vk = key(value);
        let seg = match self.producer.get(&vk) {
            Some(&s) if !self.input_of.contains_key(&vk) && !self.state_of.contains_key(&vk) => s,
            _ => return bad("the new value must be the output of an op submitted in this capture"),
        };
        let st = &mut self.states[i];
        if st.update.is_some() {
            return bad("this state already has an update");
        }
        if value.shape() != &st.spec.shape || value.dtype() != st.spec.dtype {
            return Err(Error::invalid(
                "graph state update",
                format!(
                    "the new value is {} {:?}, the state {} {:?}",
                    value.shape(),
                    value.dtype(),
                    st.spec.shape,
                    st.spec.dtype
                ),
            ));
        }
        let stream = self.segments[seg].stream;
        if st.stream.is_some_and(|s| s != stream) {
            return bad("the new value is produced on another stream than the state's readers");
        }
        st.stream = Some(stream);
        st.update = Some(vk);
        Ok(())
    }

    /// Declares `t`, an output of an op of this capture, as an output of the graph:
    /// readable after each launch ([`Launch::output`](super::Launch::output)). Returns
    /// its index.
    pub(crate) fn output(&mut self, t: &Tensor) -> Result<usize> {
        let k = key(t);
        match self.producer.get(&k) {
            Some(&seg) if !self.input_of.contains_key(&k) && !self.state_of.contains_key(&k) => {
                let spec = TensorSpec::new(t.shape().clone(), t.dtype());
                self.outputs.push((k, spec, seg));
                Ok(self.outputs.len() - 1)
            }
            _ => Err(Error::invalid(
                "graph output",
                "only the output of an op submitted in this capture can be a graph output",
            )),
        }
    }

    /// Records an op, on the stream of its first input produced in this capture (else
    /// the next compute stream in turn). Validation is that of `Runtime::submit`, plus
    /// the op's capture hazard ([`Error::NotCapturable`]); a rejected op comes back.
    pub(crate) fn submit<O: Op>(&mut self, op: O) -> Result<(O::Output, StreamId), SubmitError<O>> {
        let inherited = op
            .inputs()
            .iter()
            .find_map(|t| self.producer.get(&key(t)).map(|&s| self.segments[s].stream));
        let stream = match inherited {
            Some(s) => s,
            None => {
                let s = self.streams[self.next % self.streams.len()];
                self.next += 1;
                s
            }
        };
        self.submit_on(stream, op)
    }

    fn check_tensor(&self, name: &str, t: &Tensor) -> Result<()> {
        if t.storage().runtime != self.rt.inner.id {
            return Err(Error::invalid(
                name,
                format!("{t:?} belongs to another runtime"),
            ));
        }
        if t.device() != self.device {
            return Err(Error::DeviceMismatch {
                op: name.into(),
                lhs: self.device,
                rhs: t.device(),
            });
        }
        Ok(())
    }

    /// Records an op on `stream` (one of [`Capture::streams`]).
    pub(crate) fn submit_on<O: Op>(
        &mut self,
        stream: StreamId,
        op: O,
    ) -> Result<(O::Output, StreamId), SubmitError<O>> {
        let name = op.name();
        let reject = |error: Error, op: O| Err(SubmitError { error, op });
        if !self.streams.contains(&stream) {
            let msg = format!("{stream} is not a compute stream of {}", self.device);
            return reject(Error::invalid(name, msg), op);
        }
        if let Some(d) = op.device().filter(|d| *d != self.device) {
            let msg = format!(
                "it runs on {d}, and a graph is of one device ({})",
                self.device
            );
            return reject(Error::invalid(name, msg), op);
        }
        if let Some(hazard) = op.capture_hazard() {
            let error = Error::NotCapturable {
                op: name.to_string(),
                hazard,
            };
            return reject(error, op);
        }
        let checked = op
            .inputs()
            .iter()
            .try_for_each(|t| self.check_tensor(name, t));
        if let Err(e) = checked {
            return reject(e, op);
        }
        let plan = match op.plan(&PlanCx {
            device: self.device,
        }) {
            Ok(p) => p,
            Err(e) => return reject(e, op),
        };
        if let Err(e) = crate::op::check_output_count::<O::Output>(name, plan.outputs.len()) {
            return reject(e, op);
        }
        if let Some(o) = plan
            .outputs
            .iter()
            .find(|o| !matches!(o.shape.checked_numel(), Some(n) if n > 0))
        {
            let msg = format!(
                "output {} is empty or too large for a graph buffer",
                o.shape
            );
            return reject(Error::invalid(name, msg), op);
        }
        // A state is read on one stream only (its update is copied in there).
        let mut first_reads = Vec::new();
        for t in op.inputs() {
            if let Some(&i) = self.state_of.get(&key(t)) {
                let st = &self.states[i];
                if st.stream.is_some_and(|s| s != stream) {
                    let msg = format!(
                        "reads a graph state on {stream}, which is read or updated on {}",
                        st.stream.expect("checked")
                    );
                    return reject(Error::invalid(name, msg), op);
                }
                if !self.producer.contains_key(&st.key) && !first_reads.contains(&i) {
                    first_reads.push(i);
                }
            }
        }
        // Where its inputs come from.
        let (declared, cross, unwritten, externals) = {
            let inputs = op.inputs();
            let mut cross: Vec<usize> = Vec::new();
            let mut unwritten = Vec::new();
            let mut externals = Vec::new();
            for t in &inputs {
                let k = key(t);
                match self.producer.get(&k) {
                    Some(&s) if self.segments[s].stream != stream => {
                        if !cross.contains(&s) {
                            cross.push(s);
                        }
                    }
                    Some(_) => {}
                    None => match self.input_of.get(&k) {
                        Some(&i) => unwritten.push(i),
                        None if self.state_of.contains_key(&k) => {}
                        None => externals.push((*t).clone()),
                    },
                }
            }
            (
                inputs.iter().map(|t| key(t)).collect::<Vec<_>>(),
                cross,
                unwritten,
                externals,
            )
        };
        let seg = match self.open.get(&stream) {
            Some(&s) if cross.iter().all(|c| self.segments[s].deps.contains(c)) => s,
            _ => {
                self.segments.push(Segment {
                    stream,
                    ops: Vec::new(),
                    deps: cross.clone(),
                    externals: Vec::new(),
                    inputs: Vec::new(),
                    state_inits: Vec::new(),
                });
                let s = self.segments.len() - 1;
                self.open.insert(stream, s);
                s
            }
        };
        for c in &cross {
            let st = self.segments[*c].stream;
            if self.open.get(&st) == Some(c) {
                self.open.remove(&st);
            }
        }
        for i in unwritten {
            if !self.segments[seg].inputs.contains(&i) {
                self.segments[seg].inputs.push(i);
                self.producer.insert(self.inputs[i].key, seg);
            }
        }
        for i in first_reads {
            self.states[i].stream = Some(stream);
            self.segments[seg].state_inits.push(i);
            self.producer.insert(self.states[i].key, seg);
        }
        for t in externals {
            if !self.segments[seg]
                .externals
                .iter()
                .any(|e| e.same_storage(&t))
            {
                self.segments[seg].externals.push(t);
            }
        }
        let tensors: Vec<Tensor> = plan
            .outputs
            .iter()
            .map(|s| self.placeholder(s, Some(stream)))
            .collect();
        let outs: Vec<usize> = tensors.iter().map(key).collect();
        for &k in &outs {
            self.producer.insert(k, seg);
        }
        self.segments[seg].ops.push(Recorded {
            job: Box::new(OpJob(op)),
            name,
            specs: plan.outputs,
            outs,
            declared,
        });
        Ok((O::Output::from_tensors(tensors), stream))
    }
}
