//! The op contract: what the runtime asks of every op, at submit time and on the actor.

use crate::buffer::Buffer;
use crate::completion::Payload;
use crate::device::{Device, StreamId};
use crate::driver::StreamCx;
use crate::dtype::DType;
use crate::error::{CaptureHazard, Error, Result};
use crate::settings::Settings;
use crate::shape::Shape;
use crate::storage::Storage;
use crate::tensor::Tensor;

/// The storages an op declared in `inputs`, by address (inline up to 8: no allocation
/// per op for the common arities).
pub(crate) type Declared = smallvec::SmallVec<[usize; 8]>;

/// An op's outputs as `run` sets them (inline up to 2).
pub(crate) type OutputSlots = smallvec::SmallVec<[Option<Buffer>; 2]>;

/// The shape and dtype of one output.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    /// Output shape.
    pub shape: Shape,
    /// Output dtype.
    pub dtype: DType,
}

impl TensorSpec {
    /// A spec from shape and dtype.
    pub fn new(shape: impl Into<Shape>, dtype: DType) -> Self {
        TensorSpec {
            shape: shape.into(),
            dtype,
        }
    }
    /// The shape and dtype of `t`.
    pub fn like(t: &Tensor) -> Self {
        TensorSpec::new(t.shape().clone(), t.dtype())
    }
}

/// An op's estimated work, for the scheduler's cost model.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes moved through device memory (inputs read once, outputs written once).
    pub bytes: f64,
}

/// What an op declares at submit time: its outputs and its cost.
#[derive(Clone, Debug)]
pub struct Plan {
    /// One spec per output, in order.
    pub outputs: Vec<TensorSpec>,
    /// Estimated work.
    pub cost: Cost,
}

impl Plan {
    /// One output of `t`'s shape and dtype, no cost declared: the plan of most
    /// element-wise custom ops.
    ///
    /// ```
    /// use rtx_runtime::{Plan, Runtime, TensorSpec};
    /// let rt = Runtime::cpu(1);
    /// let x = rt.upload(&[1.0f32, 2.0], [2])?;
    /// assert_eq!(Plan::like(&x).outputs, vec![TensorSpec::like(&x)]);
    /// # Ok::<(), rtx_runtime::Error>(())
    /// ```
    pub fn like(t: &Tensor) -> Self {
        Plan {
            outputs: vec![TensorSpec::like(t)],
            cost: Cost::default(),
        }
    }
}

/// What validation may look at.
#[derive(Clone, Copy, Debug)]
pub struct PlanCx {
    /// The device the op will run on (that of its inputs).
    pub device: Device,
}

/// An operation the runtime can run on any stream of a device.
///
/// `plan` runs at submit time, on the submitting thread, before anything is enqueued: it
/// validates the operands and declares the outputs. A rejected op is given back inside
/// [`crate::SubmitError`]. `run` executes on the stream's actor thread once every input is
/// ready (CPU) or enqueued with its ready event waited on (CUDA). The op object itself is
/// the keep-alive: it (with its input tensors) is dropped only after the op's completion
/// is observed, so memory is never freed under a running kernel.
///
/// A panic in `plan` or `run` is caught: the submit (for `plan`, the op comes back in the
/// [`crate::SubmitError`]) or the submission (for `run`) fails with
/// [`Error::OpPanicked`](crate::Error::OpPanicked).
///
/// # `run` never waits for the runtime
///
/// An actor runs one op at a time, so `run` must not wait for other work of the runtime:
/// the op waited for may sit behind this one on the same stream, or on an actor that
/// waits for this one. Inside `run`, these calls fail at once with
/// [`Error::ActorWouldBlock`](crate::Error::ActorWouldBlock) instead of blocking:
/// waiting for a submission that is not done (`Submission::wait`, `block_on`, `.await`
/// under any executor), so also `rt.to_vec(..)` followed by a wait; a submit (`submit`,
/// `submit_on`, `submit_async`, `to_vec`, `mark`) into a full mailbox; and awaiting
/// `rt.shutdown()`. Submitting a child op into a mailbox with room works (the submission
/// is returned, to be awaited outside `run`, or passed on); after shutdown has begun it
/// fails with [`Error::Shutdown`](crate::Error::Shutdown).
pub trait Op: Send + 'static {
    /// What the submission yields: one or more tensors.
    type Output: Outputs;
    /// A short name for errors, traces and the scheduler's cost model.
    fn name(&self) -> &'static str;
    /// The input tensors (their producers are waited for before `run`).
    fn inputs(&self) -> Vec<&Tensor>;
    /// Validates and declares outputs and cost.
    fn plan(&self, cx: &PlanCx) -> Result<Plan>;
    /// Executes (CPU) or enqueues (CUDA) the op, setting every output.
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()>;
    /// The device the op runs on, when that is not its inputs' device: an op that moves
    /// data between devices (a copy, a collective's member) names its destination here.
    /// Its inputs may then be on any device of the runtime (each is waited for as
    /// usual), its outputs are on this device, and a pinned stream must be of it. Such
    /// an op cannot be recorded into a graph (a capture is of one device). On CUDA the
    /// op may touch memory of another device only through peer-capable calls. The
    /// default, `None`: the inputs' device, which they must share.
    fn device(&self) -> Option<Device> {
        None
    }
    /// What would make this op unsafe to capture into a graph (`Runtime::capture`), if
    /// anything: an op that synchronizes with the host, reads data back or searches
    /// for algorithms by running them says so here, and its submission into a capture
    /// fails with [`Error::NotCapturable`] before anything is recorded. The default:
    /// nothing (what the op does on the device is also checked while it is captured).
    fn capture_hazard(&self) -> Option<CaptureHazard> {
        None
    }
    /// Whether this op's CUDA `run` may defer its kernel launch into its stream's
    /// launch batch ([`Settings::launch_batching`](crate::Settings::launch_batching);
    /// `runtime/src/driver/batch.rs`): true only for an op whose `run` does nothing to
    /// the stream but allocate its outputs and launch kernels (each through
    /// [`StreamCx::defer_launch`](crate::cuda::StreamCx::defer_launch) or, when that
    /// declines, after [`StreamCx::flush_launches`](crate::cuda::StreamCx::flush_launches)).
    /// The actor launches the pending batch before any op that says false, which is
    /// the default: library calls, copies, memsets and events must not overtake the
    /// deferred launches.
    fn batches_launches(&self) -> bool {
        false
    }
}

/// Builds an op's output value from its output tensors.
pub trait Outputs: Send + Sized + 'static {
    /// How many tensors, or `None` for any number.
    const COUNT: Option<usize>;
    /// Assembles the value; `tensors.len()` matches the plan.
    fn from_tensors(tensors: Vec<Tensor>) -> Self;
    /// The same from an iterator of the tensors (what `submit` calls). The default
    /// collects them into a `Vec` for [`Outputs::from_tensors`]; the fixed-arity forms
    /// take them one by one, so submitting their ops allocates no list.
    fn from_tensor_iter(tensors: impl Iterator<Item = Tensor>) -> Self {
        Self::from_tensors(tensors.collect())
    }
}

/// Whether a plan's `planned` outputs fit the op's output type `T` (the same check at
/// `submit` and in a graph's recording): else [`Error::InvalidOp`] naming op `name`.
pub(crate) fn check_output_count<T: Outputs>(name: &str, planned: usize) -> Result<()> {
    match T::COUNT {
        Some(n) if n != planned => Err(Error::invalid(
            name,
            format!("planned {planned} outputs, its output type takes {n}"),
        )),
        _ => Ok(()),
    }
}

impl Outputs for Tensor {
    const COUNT: Option<usize> = Some(1);
    fn from_tensors(t: Vec<Tensor>) -> Self {
        Self::from_tensor_iter(t.into_iter())
    }
    fn from_tensor_iter(mut t: impl Iterator<Item = Tensor>) -> Self {
        t.next().expect("one output")
    }
}
impl Outputs for (Tensor, Tensor) {
    const COUNT: Option<usize> = Some(2);
    fn from_tensors(t: Vec<Tensor>) -> Self {
        Self::from_tensor_iter(t.into_iter())
    }
    fn from_tensor_iter(mut it: impl Iterator<Item = Tensor>) -> Self {
        (
            it.next().expect("two outputs"),
            it.next().expect("two outputs"),
        )
    }
}
impl Outputs for (Tensor, Tensor, Tensor) {
    const COUNT: Option<usize> = Some(3);
    fn from_tensors(t: Vec<Tensor>) -> Self {
        Self::from_tensor_iter(t.into_iter())
    }
    fn from_tensor_iter(mut it: impl Iterator<Item = Tensor>) -> Self {
        let mut n = || it.next().expect("three outputs");
        (n(), n(), n())
    }
}
impl Outputs for Vec<Tensor> {
    const COUNT: Option<usize> = None;
    fn from_tensors(t: Vec<Tensor>) -> Self {
        t
    }
}

/// A shared, read-only reference to an input's memory, held while the op runs.
pub struct BufferRef(pub(crate) crate::sync::Arc<Buffer>);

impl std::ops::Deref for BufferRef {
    type Target = Buffer;
    fn deref(&self) -> &Buffer {
        &self.0
    }
}

/// The backend side of an execution.
pub enum BackendCx<'a> {
    /// The CPU backend: compute on this thread (rayon inside).
    Cpu,
    /// The CUDA backend: enqueue on this stream.
    Cuda(&'a mut StreamCx),
}

/// The context an op runs in on its stream actor.
pub struct ExecCx<'a> {
    pub(crate) name: &'static str,
    pub(crate) stream: StreamId,
    pub(crate) device: Device,
    pub(crate) backend: BackendCx<'a>,
    pub(crate) settings: &'a Settings,
    pub(crate) specs: &'a [TensorSpec],
    pub(crate) outputs: OutputSlots,
    pub(crate) finisher: Option<Box<dyn FnOnce() -> Result<Payload> + Send>>,
    /// The storages the op declared in `inputs` (by address): only those may be read,
    /// since only those were waited for.
    pub(crate) declared: Declared,
    /// Inside a graph (`runtime/src/runtime/graph/`): the graph's own buffers, by the address of
    /// the placeholder storage they stand for. Inputs found here are read from them.
    pub(crate) slots: Option<&'a std::collections::HashMap<usize, crate::sync::Arc<Buffer>>>,
    /// Whether the op took an input's memory ([`ExecCx::donate`]): if it then fails, the
    /// stream is drained before that memory is dropped (see `actor::execute`).
    pub(crate) donated: bool,
    /// Inside a graph's capture: graph states' buffers lent to this op for its
    /// donations, by placeholder address (`runtime/src/runtime/graph/segment.rs`,
    /// `lend_plan`); read like the slots while not donated. Empty elsewhere.
    pub(crate) lent: Vec<(usize, crate::sync::Arc<Buffer>)>,
}

impl<'a> ExecCx<'a> {
    /// The stream this op runs on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }
    /// The settings of the runtime this op runs in (e.g. `poison_outputs`).
    pub fn settings(&self) -> &Settings {
        self.settings
    }
    /// The backend context.
    pub fn backend(&mut self) -> &mut BackendCx<'a> {
        &mut self.backend
    }
    /// The CUDA stream context, or an error on the CPU backend.
    pub fn cuda(&mut self) -> Result<&mut StreamCx> {
        match &mut self.backend {
            BackendCx::Cuda(c) => Ok(c),
            BackendCx::Cpu => Err(Error::invalid(
                self.name,
                "CUDA context requested on the CPU backend",
            )),
        }
    }
    /// The declared spec of output `i`.
    pub fn output_spec(&self, i: usize) -> &TensorSpec {
        &self.specs[i]
    }
    /// The memory of an input (already ready, or waited on by this stream).
    pub fn input(&self, t: &Tensor) -> Result<BufferRef> {
        let addr = crate::sync::Arc::as_ptr(t.storage()) as usize;
        if !self.declared.contains(&addr) {
            return Err(Error::invalid(
                self.name,
                "input used that the op did not declare in `inputs`",
            ));
        }
        if let Some(b) = self.slots.and_then(|m| m.get(&addr)) {
            return Ok(BufferRef(b.clone()));
        }
        if let Some((_, b)) = self.lent.iter().find(|(k, _)| *k == addr) {
            return Ok(BufferRef(b.clone()));
        }
        match t.storage().try_ready() {
            Some(Ok(r)) => Ok(BufferRef(r.buf)),
            Some(Err(e)) => Err(e),
            None => Err(Error::invalid(
                self.name,
                "input used that the op did not declare in `inputs`",
            )),
        }
    }
    /// Takes a donated input's memory for in-place use, if `t` is the last handle to it
    /// (rule 3 of the storage protocol, `runtime/src/storage.rs`; the producing op's own
    /// keep-alive does not count, so this works while that op still runs). Returns `None`
    /// when another handle or a pending reader can still see it: then allocate instead. The
    /// tensor is unusable afterwards. The op must put the memory into the output that is
    /// `t`'s new value, and its kernels must allow that output to alias `t`. Inside a
    /// graph's capture it returns a graph state's own buffer when the capture lends it
    /// (the op's output here is the state's update, see
    /// [`Graph::in_place_states`](crate::Graph::in_place_states)), else `None`. On
    /// CUDA, memory produced on another stream is bound to this op's stream: dropped by
    /// the op (say, as it fails), it is freed stream-ordered after the kernels the op
    /// enqueued, never handed to another stream's next allocation while they may still
    /// use it.
    pub fn donate(&mut self, t: &mut Tensor) -> Option<Buffer> {
        // A graph replays its ops again and again: their inputs stay its own, except a
        // state's buffer the capture lends for the op's update of that state.
        if self.slots.is_some() {
            let addr = crate::sync::Arc::as_ptr(t.storage()) as usize;
            let at = self.lent.iter().position(|(k, _)| *k == addr)?;
            let (key, b) = self.lent.swap_remove(at);
            // As in eager: memory the op already reads through `input` is not taken.
            return match crate::sync::Arc::try_unwrap(b) {
                Ok(buf) => {
                    self.donated = true;
                    Some(buf)
                }
                Err(b) => {
                    self.lent.push((key, b));
                    None
                }
            };
        }
        let taken = Storage::take_unique(t.storage());
        self.donated |= taken.is_some();
        match (taken, &self.backend) {
            // Memory of another stream (its producer's) would go back to that stream's
            // cache when the op drops it, for that stream's next allocation, while
            // kernels this op enqueued on its own stream may still use it: bind it to
            // this op's stream, whose order puts its free after them (see
            // `actor::execute` for outputs and failures).
            (Some(Buffer::Cuda(d)), BackendCx::Cuda(scx))
                if d.stream_handle() != scx.stream().cu_stream() as usize =>
            {
                Some(Buffer::Cuda(d.rebind(scx.stream())))
            }
            (taken, _) => taken,
        }
    }
    /// Whether a failure of this op now would drain its stream (on CUDA) before the
    /// memory the op holds is dropped: true once it has set an output or taken a donated
    /// input, whose memory kernels it enqueued may still be using. (Dropped device
    /// memory is reused at once by its stream's next allocation; memory dropped inside
    /// an op's run is never handed to another stream, see `driver/alloc.rs`.)
    pub fn drain_pending(&self) -> bool {
        self.donated || self.outputs.iter().any(Option::is_some)
    }
    /// Sets output `i`. Its dtype, length and device must match the plan.
    pub fn set_output(&mut self, i: usize, mut buf: Buffer) -> Result<()> {
        let spec = self
            .specs
            .get(i)
            .ok_or_else(|| Error::invalid(self.name, format!("output {i} was not planned")))?;
        if buf.dtype() != spec.dtype {
            return Err(Error::dtype(self.name, spec.dtype, buf.dtype()));
        }
        if buf.len() != spec.shape.numel() {
            return Err(Error::invalid(
                self.name,
                format!(
                    "output {i} has {} elements, planned {} ({})",
                    buf.len(),
                    spec.shape.numel(),
                    spec.shape
                ),
            ));
        }
        let on_device = matches!(buf, Buffer::Cuda(_));
        if on_device != matches!(self.device, Device::Cuda(_)) {
            return Err(Error::invalid(
                self.name,
                format!("output {i} is not in {} memory", self.device),
            ));
        }
        // Fresh device memory of this stream goes back to this actor's block cache
        // when dropped (donated memory keeps the home it has).
        if let (Buffer::Cuda(d), BackendCx::Cuda(scx)) = (&mut buf, &self.backend) {
            d.adopt(scx.home(), scx.stream.cu_stream() as usize);
        }
        self.outputs[i] = Some(buf);
        Ok(())
    }
    /// Registers work that produces the op's host-side value once the device has finished
    /// (runs on the completion side).
    pub(crate) fn finish_with(&mut self, f: Box<dyn FnOnce() -> Result<Payload> + Send>) {
        self.finisher = Some(f);
    }
}
