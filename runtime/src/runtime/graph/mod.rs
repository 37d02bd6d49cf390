//! Graphs: record a sequence of submissions once, replay it again and again.
//!
//! ```
//! # fn main() -> rtx::Result<()> {
//! let rt = rtx::Runtime::cpu(2);
//! let x0 = rt.upload(&[1.0f32, 2.0, 3.0], [3])?;
//! let w = rt.upload(&[0.5f32, 0.5, 0.5], [3])?; // read by every launch, never written
//! let mut graph = rt.capture(|g| {
//!     let x = g.input(&x0)?;                    // a bound input
//!     let y = g.submit(rtx::ops::mul(&x, &w))?;
//!     let z = g.submit(rtx::ops::add(&y, &x))?;
//!     g.output(&z)?;
//!     Ok(())
//! })?;
//! for step in 0..3 {
//!     let x = rt.upload(&[step as f32, 1.0, 2.0], [3])?;
//!     let mut launch = graph.launch(&[&x])?;
//!     let z: Vec<f32> = launch.to_vec(0)?;      // read after this launch
//!     assert_eq!(z, [1.5 * step as f32, 1.5, 3.0]);
//! }
//! # Ok(()) }
//! ```
//!
//! # How a capture maps onto the actors
//!
//! 1. **Recording** (`record.rs`, on the calling thread): the closure's submissions are
//!    validated and placed as usual but not sent; their outputs are placeholders. The
//!    ops are cut into *segments*, runs of ops on one stream, wherever an op reads what
//!    another stream produced; the segments form an acyclic graph.
//! 2. **Warm-up and capture** (`segment.rs`, one op per segment on its stream's actor,
//!    ordered by tokens): the actor runs the segment's ops eagerly once — kernels'
//!    modules load, cuBLASLt plans and workspaces, cuDNN plans and library handles are
//!    made and cached, and the outputs are allocated: these become the graph's own
//!    buffers. Then, on CUDA, it captures the same ops on its own stream
//!    (`cuStreamBeginCapture`, thread-local mode, `cuda/graph.rs`), handing each op its
//!    warm-up outputs as its allocations (`driver/capture.rs`), and instantiates one CUDA
//!    graph per segment, kept in the actor's graph table: a `CudaGraph` never leaves
//!    its actor.
//! 3. **Launch** (one op per segment, again ordered by tokens): copy this launch's
//!    bound inputs into the graph's input buffers, then `cuGraphLaunch` on the
//!    segment's stream (CPU: run the recorded ops again on the graph's buffers). A
//!    segment that depends on another stream's segment waits for its token's event,
//!    like any op waits for an input: the per-segment graphs are launched in order with
//!    events between them. Each launch starts after the previous launch (and every
//!    output read from it) has finished on the device: the graph's buffers are reused.
//!
//! Why per-segment graphs with events between them, not one graph with forked capture
//! streams: each capture stays on one actor thread and one stream (no capture spans two
//! threads, which thread-local capture mode forbids), and the runtime's own event
//! machinery orders the segments. A workload of independent chains (one segment per
//! stream) launches one graph per stream, concurrently. Joining the segments' graphs
//! into one (child-graph nodes with the segments' edges) would save the launches and
//! events between segments: not done yet.
//!
//! # States: what a launch carries to the next
//!
//! A bound input is given anew to every launch; a **state** ([`Capture::state`]) is a
//! buffer the graph owns, initialized at capture from a tensor, read by every launch
//! and rewritten at its end with the value [`Capture::update`] names (on CUDA a device
//! copy captured at the end of the state's stream's last segment; on the CPU the new
//! buffer takes its place). The copies of a segment's states, and those of its bound
//! inputs at each launch, go in batched launches of one kernel
//! (`kernels/cuda/graph_copy.cu`, 32 copies each): a training step's 25 states are one
//! kernel node, not 25 memcpy nodes (on the H200 that took the sweep's smallest
//! captured step from 103 to 78 µs). Better still, a state is **updated in place** on
//! CUDA, with no copy, when the op producing its update donates the state
//! ([`ExecCx::donate`](crate::ExecCx::donate): the fused optimizers, the `_` forms of
//! the element-wise ops) and no later op of its segment reads it: the capture lends
//! that op the state's own buffer, so the op writes the new value there
//! ([`Graph::in_place_states`] counts them; `segment.rs`, `lend_plan`). Launch `k`
//! reads what launch `k - 1` left; the capture's warm-up run changes no state. [`Graph::state`] copies one out. All the readers of a
//! state and the producer of its update are on one stream, so the copy follows every
//! read of the launch. A captured training step keeps its parameters, optimizer moments
//! and step counter as states (`train/src/pipeline/graph.rs`).
//!
//! Code written against `&Runtime` (layers, models, optimizers) is captured unchanged
//! through [`Capture::runtime`]: a runtime handle whose submissions are recorded.
//!
//! # Capture safety, checked
//!
//! A submission that would be unsafe in a graph fails with [`Error::NotCapturable`]
//! naming the op and the [`CaptureHazard`](crate::CaptureHazard), and nothing of the
//! capture is kept (the runtime stays usable):
//!
//! - at submit, an op that declares a hazard ([`Op::capture_hazard`](crate::Op::capture_hazard): a download, a
//!   host synchronization, an algorithm search);
//! - while capturing, an allocation beyond the op's planned outputs (per-call scratch
//!   memory), a host synchronization or event query (CUDA invalidates the capture), a
//!   read-back to the host (a finisher; a download through [`Capture::runtime`]).
//!
//! Ops that need scratch memory while their kernels run take it from the stream's
//! persistent scratch ([`StreamCx::scratch`](crate::cuda::StreamCx::scratch)) or a
//! per-stream workspace made on first use: the warm-up run makes it, the capture reuses
//! it, and it outlives every graph of the stream.
//!
//! # Ownership across launches
//!
//! A [`Launch`] borrows its graph mutably, so the next launch — which rewrites the
//! graph's buffers — cannot start while anything of this one can be read:
//!
//! ```compile_fail,E0499
//! # fn f(rt: &rtx::Runtime, graph: &mut rtx::Graph, x: &rtx::Tensor) -> rtx::Result<()> {
//! let mut first = graph.launch(&[x])?;
//! let second = graph.launch(&[x])?; // error: `graph` is still borrowed by `first`
//! let out = first.output(0)?;
//! # Ok(()) }
//! ```
//!
//! What [`Launch::output`] gives is a fresh tensor (a copy made after the launch), owned
//! by the caller and untouched by later launches; nothing can hold the graph's own
//! buffers. Bound inputs are copied in at each launch from immutable tensors, into
//! buffers only the graph's launches touch, one launch at a time: nothing can write them
//! while a launch reads them. The graph cannot be dropped while a launch borrows it:
//!
//! ```compile_fail,E0505
//! # fn f(graph: rtx::Graph, x: &rtx::Tensor) -> rtx::Result<()> {
//! let mut graph = graph;
//! let mut launch = graph.launch(&[x])?;
//! drop(graph); // error: `graph` is borrowed by `launch`
//! let out = launch.output(0)?;
//! # Ok(()) }
//! ```
//!
//! On the CPU backend the same API replays the recorded ops (so programs and tests run
//! everywhere); what the CPU cannot check (allocations, host synchronization) is checked
//! on CUDA while capturing.

mod capture;
mod in_place;
mod record;
mod segment;

use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) use capture::record_submit;
pub use capture::Capture;
pub(crate) use record::Recording;
use segment::{CaptureSegment, LaunchSegment, ReadSlot, Release, Shared};

use crate::buffer::Element;
use crate::completion::Submission;
use crate::device::StreamId;
use crate::error::{Error, Result};
use crate::op::TensorSpec;
use crate::runtime::Runtime;
use crate::sync::{Arc, Mutex};
use crate::tensor::Tensor;

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// The cause behind a chain of `Upstream` errors.
fn root(e: Error) -> Error {
    match e {
        Error::Upstream { cause, .. } => root(*cause),
        e => e,
    }
}

/// Waits for every submission; the first failure's root cause.
fn wait_all(subs: Vec<Submission<Tensor>>) -> Result<()> {
    let mut first = None;
    for s in subs {
        if let Err(e) = s.wait() {
            let e = root(e);
            // An op's own error explains more than a chain of `Upstream`s behind it.
            if first.is_none() {
                first = Some(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

impl Runtime {
    /// Records the submissions `f` makes into a [`Graph`] on the default device, warms
    /// it up and captures it (see `runtime/src/runtime/graph/mod.rs`); returns once the capture
    /// has finished on every stream. A capture-unsafe op fails it with
    /// [`Error::NotCapturable`], leaving the runtime as it was.
    pub fn capture(&self, f: impl FnOnce(&mut Capture<'_>) -> Result<()>) -> Result<Graph> {
        let mut c = Capture::new(self, self.device());
        f(&mut c)?;
        Graph::build(self, c)
    }
}

struct SegInfo {
    stream: StreamId,
    /// The states this segment copies out at the end of each launch (their last
    /// segment on their stream).
    commits: Vec<usize>,
    deps: Vec<usize>,
    inputs: Vec<usize>,
    first_on_stream: bool,
}

/// A captured sequence of ops that launches again and again ([`Runtime::capture`]).
/// It owns its buffers (bound inputs, intermediates, outputs) and, on CUDA, one
/// instantiated CUDA graph per segment on its stream's actor; dropping it frees them
/// once its last launch has finished.
pub struct Graph {
    rt: Runtime,
    shared: Arc<Shared>,
    segs: Vec<SegInfo>,
    outputs: Vec<(usize, TensorSpec, usize)>,
    /// What the next launch (or the release) waits for: each stream's last segment of
    /// the last launch, and the copies of outputs made since.
    last: Vec<Tensor>,
    /// Each segment's token of the last launch (or of the capture).
    tokens: Vec<Tensor>,
    /// Each state's key, spec and the segment whose token follows its newest value.
    states: Vec<(usize, TensorSpec, usize)>,
    launches: u64,
}

impl Graph {
    fn build(rt: &Runtime, c: Capture<'_>) -> Result<Graph> {
        let c = c.finish()?;
        if c.segments.is_empty() {
            return Err(Error::invalid("graph", "the capture submitted no op"));
        }
        let Recording {
            mut segments,
            inputs,
            states,
            placeholders,
            outputs,
            ..
        } = c;
        // Each state is committed by (and initialized at the latest in) the last
        // segment of its stream.
        let mut commits: Vec<Vec<usize>> = vec![Vec::new(); segments.len()];
        let mut state_info = Vec::new();
        for (i, st) in states.iter().enumerate() {
            let Some(stream) = st.stream else {
                return Err(Error::invalid(
                    "graph state",
                    "a state that no op of the capture reads or updates",
                ));
            };
            let last = (0..segments.len())
                .rev()
                .find(|&s| segments[s].stream == stream)
                .expect("a segment on the state's stream");
            if !segments.iter().any(|s| s.state_inits.contains(&i)) {
                segments[last].state_inits.push(i);
            }
            if st.update.is_some() {
                commits[last].push(i);
            }
            state_info.push((st.key, st.spec.clone(), last));
        }
        let mut ops = Vec::new();
        let mut plans = Vec::new();
        for s in segments {
            ops.push(Mutex::new(s.ops));
            let inits: Vec<(usize, Tensor)> = s
                .state_inits
                .iter()
                .map(|&i| (states[i].key, states[i].init.clone()))
                .collect();
            plans.push((s.stream, s.deps, s.externals, s.inputs, inits));
        }
        let shared = Arc::new(Shared {
            id: NEXT_GRAPH.fetch_add(1, Ordering::Relaxed),
            slots: Mutex::new(Default::default()),
            ops,
            inputs: inputs.iter().map(|b| (b.key, b.spec.clone())).collect(),
            commits: states
                .iter()
                .map(|st| (st.key, st.update.unwrap_or(st.key)))
                .collect(),
            _placeholders: placeholders,
            in_place: Default::default(),
        });
        let mut graph = Graph {
            rt: rt.clone(),
            shared: shared.clone(),
            segs: Vec::new(),
            outputs,
            last: Vec::new(),
            tokens: Vec::new(),
            states: state_info,
            launches: 0,
        };
        let mut subs = Vec::new();
        let mut tokens: Vec<Tensor> = Vec::new();
        for (seg, (stream, deps, externals, seg_inputs, inits)) in plans.into_iter().enumerate() {
            let first_on_stream = !graph.segs.iter().any(|s| s.stream == stream);
            let op = CaptureSegment {
                shared: shared.clone(),
                seg,
                externals,
                examples: seg_inputs
                    .iter()
                    .map(|&i| (i, inputs[i].example.clone()))
                    .collect(),
                inits,
                commits: commits[seg].clone(),
                deps: deps.iter().map(|&d| tokens[d].clone()).collect(),
            };
            graph.segs.push(SegInfo {
                stream,
                commits: commits[seg].clone(),
                deps,
                inputs: seg_inputs,
                first_on_stream,
            });
            let sub = rt.submit_on(stream, op).map_err(|e| e.error)?;
            tokens.push(sub.outputs().cloned().expect("a token output"));
            subs.push(sub);
        }
        graph.last = graph.stream_sinks(&tokens);
        graph.tokens = tokens;
        wait_all(subs)?;
        Ok(graph)
    }

    /// The tokens of each stream's last segment.
    fn stream_sinks(&self, tokens: &[Tensor]) -> Vec<Tensor> {
        let mut sinks: Vec<(StreamId, Tensor)> = Vec::new();
        for (s, t) in self.segs.iter().zip(tokens) {
            match sinks.iter_mut().find(|(st, _)| *st == s.stream) {
                Some(e) => e.1 = t.clone(),
                None => sinks.push((s.stream, t.clone())),
            }
        }
        sinks.into_iter().map(|(_, t)| t).collect()
    }

    /// The bound inputs' shapes and dtypes, in declaration order.
    pub fn inputs(&self) -> Vec<TensorSpec> {
        self.shared.inputs.iter().map(|(_, s)| s.clone()).collect()
    }

    /// The outputs' shapes and dtypes, in declaration order.
    pub fn outputs(&self) -> Vec<TensorSpec> {
        self.outputs.iter().map(|(_, s, _)| s.clone()).collect()
    }

    /// The states' shapes and dtypes, in declaration order ([`Capture::state`]).
    pub fn states(&self) -> Vec<TensorSpec> {
        self.states.iter().map(|(_, s, _)| s.clone()).collect()
    }

    /// State `i`'s value after the last launch (before any, its initial value), as a
    /// fresh tensor the caller owns (a copy made on the device after that launch;
    /// later launches do not touch it). The next launch waits for the copy.
    pub fn state(&mut self, i: usize) -> Result<Tensor> {
        let (key, spec, seg) = self.states.get(i).cloned().ok_or_else(|| {
            Error::invalid(
                "graph state",
                format!("state {i} of a graph with {}", self.states.len()),
            )
        })?;
        let op = ReadSlot {
            shared: self.shared.clone(),
            key,
            spec,
            token: self.tokens[seg].clone(),
        };
        let t = self
            .rt
            .submit_on(self.segs[seg].stream, op)
            .map_err(|e| e.error)?
            .outputs()
            .cloned()
            .expect("one output");
        self.last.push(t.clone());
        Ok(t)
    }

    /// How many states the capture updates in place: their update's op, donating the
    /// state ([`ExecCx::donate`](crate::ExecCx::donate)), writes the new value into the
    /// state's own buffer, so a launch copies them no more (the fused optimizers do,
    /// for the parameters, moments and masters of a captured training step). The
    /// others are copied at the end of each launch. Always 0 on the CPU backend, whose
    /// launches hand the new value's buffer to the state and copy nothing.
    pub fn in_place_states(&self) -> usize {
        self.shared
            .in_place
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many segments (per-stream graphs) the capture was cut into.
    pub fn segments(&self) -> usize {
        self.segs.len()
    }

    /// Launches counted so far.
    pub fn launches(&self) -> u64 {
        self.launches
    }

    /// Launches the graph with `inputs` as its bound inputs (in declaration order, each
    /// of its declared shape and dtype; pending tensors are fine: the launch waits for
    /// them on the device). Returns at once; the [`Launch`] gives the outputs.
    pub fn launch(&mut self, inputs: &[&Tensor]) -> Result<Launch<'_>> {
        let want = &self.shared.inputs;
        if inputs.len() != want.len() {
            return Err(Error::invalid(
                "graph launch",
                format!(
                    "{} inputs given, the graph binds {}",
                    inputs.len(),
                    want.len()
                ),
            ));
        }
        for (t, (_, spec)) in inputs.iter().zip(want.iter()) {
            if t.dtype() != spec.dtype {
                return Err(Error::dtype("graph launch", spec.dtype, t.dtype()));
            }
            if t.shape() != &spec.shape {
                return Err(Error::ShapeMismatch {
                    op: "graph launch".into(),
                    lhs: spec.shape.clone(),
                    rhs: t.shape().clone(),
                    detail: "a bound input's shape is fixed at capture".into(),
                });
            }
        }
        let before = std::mem::take(&mut self.last);
        let mut subs: Vec<Submission<Tensor>> = Vec::with_capacity(self.segs.len());
        let mut tokens: Vec<Tensor> = Vec::with_capacity(self.segs.len());
        for (seg, info) in self.segs.iter().enumerate() {
            let mut deps: Vec<Tensor> = info.deps.iter().map(|&d| tokens[d].clone()).collect();
            if info.first_on_stream {
                deps.extend(before.iter().cloned());
            }
            let op = LaunchSegment {
                shared: self.shared.clone(),
                seg,
                inputs: info
                    .inputs
                    .iter()
                    .map(|&i| (i, inputs[i].clone()))
                    .collect(),
                commits: info.commits.clone(),
                deps,
            };
            match self.rt.submit_on(info.stream, op) {
                Ok(sub) => {
                    tokens.push(sub.outputs().cloned().expect("a token output"));
                    subs.push(sub);
                }
                Err(e) => {
                    // Later launches and the release still wait for what was sent.
                    self.last = before;
                    self.last.extend(tokens);
                    return Err(e.error);
                }
            }
        }
        self.last = self.stream_sinks(&tokens);
        self.tokens = tokens.clone();
        self.launches += 1;
        Ok(Launch {
            graph: self,
            tokens,
            subs,
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let mut streams: Vec<StreamId> = Vec::new();
        for s in &self.segs {
            if !streams.contains(&s.stream) {
                streams.push(s.stream);
            }
        }
        for stream in streams {
            let segs = (0..self.segs.len())
                .filter(|&i| self.segs[i].stream == stream)
                .collect();
            let op = Release {
                shared: self.shared.clone(),
                segs,
                deps: self.last.clone(),
            };
            // A runtime that is shutting down frees the graphs with its streams.
            let _ = self.rt.submit_on(stream, op);
        }
    }
}

/// One launch of a [`Graph`]: read its outputs here. It borrows the graph, so the next
/// launch cannot begin while this one's outputs can still be read (see the module docs).
pub struct Launch<'g> {
    graph: &'g mut Graph,
    tokens: Vec<Tensor>,
    subs: Vec<Submission<Tensor>>,
}

impl Launch<'_> {
    /// Output `i` of this launch, as a fresh tensor (copied from the graph's buffer on
    /// the device once the launch has produced it): the caller owns it, later launches
    /// do not touch it. Usable at once as an eager op's input.
    pub fn output(&mut self, i: usize) -> Result<Tensor> {
        let (key, spec, seg) = self.graph.outputs.get(i).cloned().ok_or_else(|| {
            Error::invalid(
                "graph output",
                format!("output {i} of a graph with {}", self.graph.outputs.len()),
            )
        })?;
        let op = ReadSlot {
            shared: self.graph.shared.clone(),
            key,
            spec,
            token: self.tokens[seg].clone(),
        };
        let stream = self.graph.segs[seg].stream;
        let t = self
            .graph
            .rt
            .submit_on(stream, op)
            .map_err(|e| e.error)?
            .outputs()
            .cloned()
            .expect("one output");
        // The next launch rewrites the buffer only after this copy.
        self.graph.last.push(t.clone());
        Ok(t)
    }

    /// Output `i` of this launch on the host (waits for it).
    pub fn to_vec<T: Element>(&mut self, i: usize) -> Result<Vec<T>> {
        let t = self.output(i)?;
        self.graph.rt.to_vec::<T>(&t)?.wait()
    }

    /// Waits until every segment of this launch has finished (its first error, by its
    /// root cause).
    pub fn wait(self) -> Result<()> {
        wait_all(self.subs)
    }
}
