//! The ops a graph is made of on the actors: per segment one [`CaptureSegment`] (warm-up
//! and capture), then per launch one [`LaunchSegment`]; [`ReadSlot`] copies an output
//! out after a launch, and [`Release`] frees a stream's graphs when the graph is
//! dropped. They go through the ordinary submission path (`submit_on` the segment's
//! stream), so inputs, events, bursts and keep-alives are those of any op; the segments'
//! order is carried by one-element *token* outputs that later segments take as inputs.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc as StdArc;

use cudarc::driver::{CudaStream, DevicePtr};

use super::in_place::lend_plan;
use super::record::Recorded;
use crate::actor::panic_message;
use crate::buffer::{Buffer, CudaData};
use crate::cuda::graph::{
    abort_capture, begin_capture, copy_dtod, copy_kernel, copy_many, end_capture,
    map_capture_error, GraphTable,
};
use crate::driver::{capture, StreamCx};
use crate::dtype::DType;
use crate::error::{CaptureHazard, Error, Result};
use crate::op::{BackendCx, Cost, ExecCx, Op, Plan, PlanCx, TensorSpec};
use crate::sync::{lock, Arc, Mutex};
use crate::tensor::Tensor;

/// Buffers by placeholder key.
pub(crate) type Slots = HashMap<usize, Arc<Buffer>>;

/// What the ops of one graph share across its segments and launches.
pub(crate) struct Shared {
    pub(crate) id: u64,
    /// The graph's buffers: bound inputs, intermediates, outputs.
    pub(crate) slots: Mutex<Slots>,
    /// The recorded ops of each segment (replayed by the CPU backend; kept alive on
    /// CUDA, with the eager tensors they read).
    pub(crate) ops: Vec<Mutex<Vec<Recorded>>>,
    /// Each bound input's placeholder key and spec.
    pub(crate) inputs: Vec<(usize, TensorSpec)>,
    /// Each state's key and the key of its new value (its own key when never updated).
    pub(crate) commits: Vec<(usize, usize)>,
    /// The placeholders (their addresses are the slots' keys: kept alive, unique).
    pub(crate) _placeholders: Vec<Tensor>,
    /// How many states the captures updated in place (see `in_place.rs`).
    pub(crate) in_place: AtomicUsize,
}

fn token_plan() -> Result<Plan> {
    Ok(Plan {
        outputs: vec![TensorSpec::new(vec![1], DType::U32)],
        cost: Cost::default(),
    })
}

fn set_token(cx: &mut ExecCx<'_>) -> Result<()> {
    let buf = match cx.backend() {
        BackendCx::Cpu => Buffer::from_vec(vec![0u32]),
        BackendCx::Cuda(scx) => Buffer::from_cuda(scx.alloc::<u32>(1)?),
    };
    cx.set_output(0, buf)
}

/// Runs one recorded op inside `parent`'s context, its inputs read from `slots` (or
/// their eager storages), returning its outputs.
/// `lent` holds state buffers the op may take by donation ([`ExecCx::donate`]) or read
/// as inputs; what it did not take is left there.
fn run_recorded(
    parent: &mut ExecCx<'_>,
    rec: &mut Recorded,
    slots: &Slots,
    lent: &mut Vec<(usize, Arc<Buffer>)>,
) -> Result<Vec<Buffer>> {
    let backend = match &mut parent.backend {
        BackendCx::Cpu => BackendCx::Cpu,
        BackendCx::Cuda(s) => BackendCx::Cuda(s),
    };
    let mut cx = ExecCx {
        name: rec.name,
        stream: parent.stream,
        device: parent.device,
        backend,
        settings: parent.settings,
        specs: &rec.specs,
        outputs: (0..rec.specs.len()).map(|_| None).collect(),
        finisher: None,
        declared: rec.declared.iter().copied().collect(),
        slots: Some(slots),
        donated: false,
        lent: std::mem::take(lent),
    };
    let job = &mut rec.job;
    let ran = catch_unwind(AssertUnwindSafe(|| job.run(&mut cx)));
    *lent = std::mem::take(&mut cx.lent);
    match ran {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(p) => {
            return Err(Error::OpPanicked {
                op: rec.name.to_string(),
                message: panic_message(&*p),
            })
        }
    }
    if cx.finisher.is_some() {
        return Err(Error::NotCapturable {
            op: rec.name.to_string(),
            hazard: CaptureHazard::Readback,
        });
    }
    if let Some(i) = cx.outputs.iter().position(Option::is_none) {
        return Err(Error::invalid(
            rec.name,
            format!("op did not set output {i}"),
        ));
    }
    Ok(cx.outputs.into_iter().flatten().collect())
}

macro_rules! by_dtype {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F16 => {
                type $T = half::f16;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::U32 => {
                type $T = u32;
                $body
            }
        }
    };
}

/// Fresh device memory of `dtype` and `n` elements from this stream's allocator.
fn alloc_like(scx: &StreamCx, dtype: DType, n: usize) -> Result<Buffer> {
    by_dtype!(dtype, T => Ok(Buffer::from_cuda(scx.alloc::<T>(n)?)))
}

/// A device buffer's address and size in bytes.
fn raw(buf: &Buffer, scx: &StreamCx) -> Result<(u64, usize)> {
    let bytes = buf.len() * buf.dtype().size();
    by_dtype!(buf.dtype(), T => Ok((buf.cuda::<T>()?.device_ptr(scx.stream()).0, bytes)))
}

/// Copies `src` into `dst` (same dtype and length) on the stream.
fn copy_into(dst: &Buffer, src: &Buffer, scx: &StreamCx) -> Result<()> {
    let (d, bytes) = raw(dst, scx)?;
    let (s, _) = raw(src, scx)?;
    // SAFETY: both are live device buffers of `bytes` bytes (same dtype and length,
    // checked by the callers' specs); `dst` is the graph's own buffer, which only this
    // graph's ops on the device touch, ordered by the segments' tokens; `src` is kept
    // alive by the op holding it until its completion.
    unsafe { copy_dtod(d, s, bytes, scx.stream()) }
}

/// An output buffer as the typed slice `StreamCx::alloc` hands out during capture,
/// bound to `side` (see `GraphTable::side_stream`).
fn into_any_slice(buf: Buffer, side: &StdArc<CudaStream>) -> Result<Box<dyn Any>> {
    let Buffer::Cuda(d) = buf else {
        return Err(Error::invalid(
            "graph",
            "a graph buffer is not device memory",
        ));
    };
    let d = d.rebind(side);
    let dt = d.dtype();
    by_dtype!(dt, T => d
        .into_slice::<T>()
        .map(|s| Box::new(s) as Box<dyn Any>)
        .map_err(|_: CudaData| Error::invalid("graph", "buffer dtype changed")))
}

/// Warm-up and capture of one segment (see `mod.rs`). Its output is a token.
pub(crate) struct CaptureSegment {
    pub(crate) shared: Arc<Shared>,
    pub(crate) seg: usize,
    /// Eager tensors the segment's ops read, and the bound inputs' examples.
    pub(crate) externals: Vec<Tensor>,
    pub(crate) examples: Vec<(usize, Tensor)>,
    /// The states this segment initializes: (key, initial value).
    pub(crate) inits: Vec<(usize, Tensor)>,
    /// The states (indices) it commits at the end of each launch.
    pub(crate) commits: Vec<usize>,
    pub(crate) deps: Vec<Tensor>,
}

/// Runs `ops` eagerly in order on `local`'s buffers, each op's outputs put into `local`
/// under their keys (also listed in `mine`): the warm-up before a capture, and a CPU
/// launch.
fn run_all(
    cx: &mut ExecCx<'_>,
    ops: &mut [Recorded],
    local: &mut Slots,
    mine: &mut Vec<usize>,
) -> Result<()> {
    for rec in ops.iter_mut() {
        let outs = run_recorded(cx, rec, local, &mut Vec::new())?;
        for (k, b) in rec.outs.iter().zip(outs) {
            local.insert(*k, Arc::new(b));
            mine.push(*k);
        }
    }
    Ok(())
}

/// Copies the committed states' new values into their buffers (`local`, CPU: the new
/// value's immutable buffer becomes the state's; CUDA: device copies, captured or not,
/// batched into `copy_many` launches: one kernel node per 32 states, not a memcpy node
/// each).
fn commit(
    cx: &mut ExecCx<'_>,
    shared: &Shared,
    states: &[usize],
    local: &mut Slots,
) -> Result<Vec<usize>> {
    let mut done = Vec::with_capacity(states.len());
    let mut pairs = Vec::new();
    for &i in states {
        let (key, new) = shared.commits[i];
        let value = local
            .get(&new)
            .cloned()
            .ok_or_else(|| Error::invalid("graph state", "a state's new value was not computed"))?;
        match cx.backend() {
            BackendCx::Cpu => {
                local.insert(key, value);
            }
            BackendCx::Cuda(_) => {
                let dst = local
                    .get(&key)
                    .cloned()
                    .ok_or_else(|| Error::invalid("graph state", "a state has no buffer"))?;
                // Updated in place (its update's op wrote the state's own buffer).
                if !Arc::ptr_eq(&dst, &value) {
                    pairs.push((dst, value));
                }
            }
        }
        done.push(key);
    }
    if let BackendCx::Cuda(scx) = cx.backend() {
        copy_pairs(scx, &pairs)?;
    }
    Ok(done)
}

/// Copies each `src` into its `dst` (same dtype and length: the callers' specs), in
/// batched launches (`copy_many`).
fn copy_pairs(scx: &mut StreamCx, pairs: &[(Arc<Buffer>, Arc<Buffer>)]) -> Result<()> {
    let mut raw_pairs = Vec::with_capacity(pairs.len());
    for (dst, src) in pairs {
        let (d, bytes) = raw(dst, scx)?;
        let (s, _) = raw(src, scx)?;
        raw_pairs.push((d, s, bytes));
    }
    // SAFETY: every pair is two live device buffers of `bytes` bytes; each `dst` is the
    // graph's own buffer (a state's or a bound input's), distinct from every other
    // `dst` and from every `src` (a state's new value and a bound input's tensor are
    // other buffers), which only this graph's ops touch, ordered by the segments'
    // tokens; each `src` is kept alive by the op holding it until its completion.
    unsafe { copy_many(scx, &raw_pairs) }
}

impl Op for CaptureSegment {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "graph capture"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        let ex = self.examples.iter().map(|(_, t)| t);
        let init = self.inits.iter().map(|(_, t)| t);
        self.externals
            .iter()
            .chain(ex)
            .chain(init)
            .chain(&self.deps)
            .collect()
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        token_plan()
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let mut local = lock(&self.shared.slots).clone();
        let mut mine: Vec<usize> = Vec::new();
        // The bound inputs this segment copies in: graph-owned buffers holding the
        // examples' contents (on the CPU, the examples' own immutable buffers).
        for (i, ex) in &self.examples {
            let src = cx.input(ex)?;
            let key = self.shared.inputs[*i].0;
            let slot = match cx.backend() {
                BackendCx::Cpu => src.0.clone(),
                BackendCx::Cuda(scx) => {
                    let dst = alloc_like(scx, src.dtype(), src.len())?;
                    copy_into(&dst, &src, scx)?;
                    Arc::new(dst)
                }
            };
            local.insert(key, slot);
            mine.push(key);
        }
        // The states' buffers, copies of their initial values (the graph's own: a
        // launch's commit rewrites them).
        for (key, init) in &self.inits {
            let src = cx.input(init)?;
            let slot = match (cx.backend(), &*src.0) {
                (BackendCx::Cpu, Buffer::Cpu(d)) => Arc::new(Buffer::Cpu(d.clone())),
                (BackendCx::Cuda(scx), _) => {
                    let dst = alloc_like(scx, src.dtype(), src.len())?;
                    copy_into(&dst, &src, scx)?;
                    Arc::new(dst)
                }
                _ => {
                    return Err(Error::invalid(
                        "graph state",
                        "a state is not in this device's memory",
                    ))
                }
            };
            local.insert(*key, slot);
            mine.push(*key);
        }
        let mut ops = lock(&self.shared.ops[self.seg]);
        // Warm-up: run every op eagerly once. Modules load, library handles, plans and
        // workspaces are made and cached, and the outputs are allocated: from now on
        // they are the graph's buffers.
        run_all(cx, &mut ops, &mut local, &mut mine)?;
        if let BackendCx::Cuda(_) = cx.backend() {
            self.capture(cx, &mut ops, &mut local)?;
        }
        drop(ops);
        let mut slots = lock(&self.shared.slots);
        for k in mine {
            if let Some(b) = local.remove(&k) {
                slots.insert(k, b);
            }
        }
        drop(slots);
        set_token(cx)
    }
}

impl CaptureSegment {
    /// Captures the segment's ops into one CUDA graph of this stream, each op handed
    /// its warm-up outputs as its allocations; on any failure the capture is ended and
    /// discarded before anything it handed out is freed (a free inside the capture
    /// would be recorded, not done).
    fn capture(&self, cx: &mut ExecCx<'_>, ops: &mut [Recorded], local: &mut Slots) -> Result<()> {
        if let BackendCx::Cpu = cx.backend() {
            return Ok(());
        }
        let side = match cx.backend() {
            BackendCx::Cuda(scx) => GraphTable::side_stream(scx)?,
            BackendCx::Cpu => unreachable!("checked above"),
        };
        // The batched copy kernel (the commits) is loaded before the capture begins.
        match cx.backend() {
            BackendCx::Cuda(scx) => drop(copy_kernel(scx)?),
            BackendCx::Cpu => unreachable!("checked above"),
        }
        begin_capture(cuda_of(cx))?;
        let mut unused: Vec<Box<dyn Any>> = Vec::new();
        let lend = lend_plan(ops, &self.shared, &self.commits);
        // The ops, then the states' commits (device copies, captured as `copy_many`
        // kernel nodes) of the states not updated in place.
        let captured =
            capture_ops(cx, ops, local, &mut unused, &side, &lend).and_then(|(last, n)| {
                commit(cx, &self.shared, &self.commits, local)?;
                Ok((last, n))
            });
        let graph = match captured {
            Ok((last, n)) => {
                self.shared.in_place.fetch_add(n, Ordering::Relaxed);
                end_capture(cuda_of(cx), last)
            }
            Err(e) => {
                abort_capture(cuda_of(cx));
                Err(e)
            }
        };
        // Freed on `side` after the warm-up; what an op dropped during the capture as
        // well (`capture::defer`), now on the actor's stream, which no longer captures.
        drop(unused);
        drop(capture::take_deferred());
        let graph = graph?;
        let key = (self.shared.id, self.seg);
        match cx.backend() {
            BackendCx::Cuda(scx) => {
                GraphTable::of(scx)?.graphs.insert(key, graph);
            }
            BackendCx::Cpu => unreachable!("captured on CUDA"),
        }
        Ok(())
    }
}

/// The capture proper (the stream is capturing): each op in order, with its outputs
/// queued for `StreamCx::alloc`, bound to `side` until the op's run is accepted (then
/// bound to the actor's stream again, with its home), and the state buffers `lend`
/// gives it for donation. Returns the last op's name and how many states were updated
/// in place; what an op left of its queue goes to `unused`, freed by the caller once
/// the capture has ended. Nothing is freed on the capturing stream.
fn capture_ops(
    cx: &mut ExecCx<'_>,
    ops: &mut [Recorded],
    local: &mut Slots,
    unused: &mut Vec<Box<dyn Any>>,
    side: &StdArc<CudaStream>,
    lend: &HashMap<usize, Vec<(usize, usize)>>,
) -> Result<(&'static str, usize)> {
    let mut last = "graph capture";
    let mut in_place = 0;
    for (n, rec) in ops.iter_mut().enumerate() {
        last = rec.name;
        let mut queue = VecDeque::new();
        for k in &rec.outs {
            let b = local.remove(k).expect("the warm-up set every output");
            let b = Arc::try_unwrap(b).map_err(|_| {
                Error::invalid(rec.name, "an op kept its input's buffer past its run")
            })?;
            queue.push_back(into_any_slice(b, side)?);
        }
        // The states lent to this op: their buffers moved out of `local` (only when no
        // other handle holds one: a state initialized by an earlier segment is shared
        // with the graph's slots, and keeps its copy). The op reads them as inputs
        // until it takes them.
        let mut lent: Vec<(usize, Arc<Buffer>)> = Vec::new();
        let mut expect: Vec<(usize, usize, u64)> = Vec::new();
        for &(state, j) in lend.get(&n).map(Vec::as_slice).unwrap_or_default() {
            match local.remove(&state) {
                Some(b) if Arc::strong_count(&b) == 1 => {
                    let (ptr, _) = raw(&b, cuda_of(cx))?;
                    expect.push((state, j, ptr));
                    lent.push((state, b));
                }
                Some(b) => {
                    local.insert(state, b);
                }
                None => {}
            }
        }
        capture::enter(rec.name, queue);
        let ran = run_recorded(cx, rec, local, &mut lent);
        let left = capture::leave();
        let status = cuda_of(cx).stream().capture_status();
        let active = matches!(
            status,
            Ok(cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
        );
        // Each state buffer the op took stands for one of its planned outputs, whose
        // warm-up buffer it left in the queue.
        let taken = expect.len() - lent.len();
        for (state, buf) in lent {
            local.insert(state, buf);
        }
        let clean = left.len() == taken;
        unused.extend(left);
        let outs = ran.map_err(|e| map_capture_error(rec.name, e))?;
        if !active {
            // CUDA invalidated the capture: the op made a call a capture forbids.
            return Err(Error::NotCapturable {
                op: rec.name.to_string(),
                hazard: CaptureHazard::HostSync,
            });
        }
        if !clean {
            // It got its output memory some other way than `StreamCx::alloc`.
            return Err(Error::NotCapturable {
                op: rec.name.to_string(),
                hazard: CaptureHazard::Allocation,
            });
        }
        let scx = cuda_of(cx);
        // A state buffer the op took is the update's output: then the state's key and
        // the update's name one buffer.
        let mut aliased = Vec::new();
        for &(state, j, ptr) in &expect {
            if local.contains_key(&state) {
                continue;
            }
            let at = outs.get(j).map(|b| raw(b, scx)).transpose()?;
            if at.map(|(p, _)| p) != Some(ptr) {
                return Err(Error::invalid(
                    rec.name,
                    "the op donated a graph state's buffer to another output than the state's update",
                ));
            }
            aliased.push((state, rec.outs[j]));
        }
        for (k, b) in rec.outs.iter().zip(outs) {
            let b = match b {
                Buffer::Cuda(d) => {
                    let mut d = d.rebind(scx.stream());
                    d.adopt(scx.home(), scx.stream().cu_stream() as usize);
                    Buffer::Cuda(d)
                }
                cpu => cpu,
            };
            local.insert(*k, Arc::new(b));
        }
        for (state, value) in aliased {
            let b = local.get(&value).cloned().expect("inserted above");
            local.insert(state, b);
            in_place += 1;
        }
    }
    Ok((last, in_place))
}

fn cuda_of<'c>(cx: &'c mut ExecCx<'_>) -> &'c StreamCx {
    match cx.backend() {
        BackendCx::Cuda(scx) => scx,
        BackendCx::Cpu => unreachable!("only called on the CUDA backend"),
    }
}

/// One segment of one launch: copy in its bound inputs, then replay (CPU: run its ops
/// again; CUDA: launch its graph). Its output is a token.
pub(crate) struct LaunchSegment {
    pub(crate) shared: Arc<Shared>,
    pub(crate) seg: usize,
    /// (bound input index, the tensor this launch reads for it).
    pub(crate) inputs: Vec<(usize, Tensor)>,
    /// The states (indices) it commits after its ops (on CUDA, inside its graph).
    pub(crate) commits: Vec<usize>,
    pub(crate) deps: Vec<Tensor>,
}

impl Op for LaunchSegment {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "graph launch"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        self.inputs
            .iter()
            .map(|(_, t)| t)
            .chain(&self.deps)
            .collect()
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        token_plan()
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        if let BackendCx::Cpu = cx.backend() {
            let mut local = lock(&self.shared.slots).clone();
            let mut mine = Vec::new();
            for (i, t) in &self.inputs {
                let key = self.shared.inputs[*i].0;
                local.insert(key, cx.input(t)?.0);
                mine.push(key);
            }
            let mut ops = lock(&self.shared.ops[self.seg]);
            run_all(cx, &mut ops, &mut local, &mut mine)?;
            drop(ops);
            mine.extend(commit(cx, &self.shared, &self.commits, &mut local)?);
            let mut slots = lock(&self.shared.slots);
            for k in mine {
                if let Some(b) = local.remove(&k) {
                    slots.insert(k, b);
                }
            }
        } else {
            let mut copies = Vec::with_capacity(self.inputs.len());
            if !self.inputs.is_empty() {
                let slots = lock(&self.shared.slots);
                for (i, t) in &self.inputs {
                    let key = self.shared.inputs[*i].0;
                    let dst = slots.get(&key).cloned().ok_or_else(|| {
                        Error::invalid("graph launch", "a bound input has no buffer")
                    })?;
                    copies.push((dst, cx.input(t)?.0));
                }
            }
            let (id, seg) = (self.shared.id, self.seg);
            let BackendCx::Cuda(scx) = cx.backend() else {
                unreachable!("checked above")
            };
            copy_pairs(scx, &copies)?;
            let stream = scx.stream().clone();
            let table = GraphTable::of(scx)?;
            let graph = table.graphs.get(&(id, seg)).ok_or_else(|| {
                Error::invalid("graph launch", "the segment's graph is not on this stream")
            })?;
            graph.launch(&stream)?;
        }
        set_token(cx)
    }
}

/// Copies output `key` of the graph into a fresh tensor, after the launch's segment
/// that produced it (`token`).
pub(crate) struct ReadSlot {
    pub(crate) shared: Arc<Shared>,
    pub(crate) key: usize,
    pub(crate) spec: TensorSpec,
    pub(crate) token: Tensor,
}

impl Op for ReadSlot {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "graph output"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.token]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        Ok(Plan {
            outputs: vec![self.spec.clone()],
            cost: Cost {
                flops: 0.0,
                bytes: (2 * self.spec.shape.numel() * self.spec.dtype.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let src = lock(&self.shared.slots)
            .get(&self.key)
            .cloned()
            .ok_or_else(|| Error::invalid("graph output", "the output was never computed"))?;
        let out = match cx.backend() {
            BackendCx::Cpu => match &*src {
                Buffer::Cpu(d) => Buffer::Cpu(d.clone()),
                Buffer::Cuda(_) => {
                    return Err(Error::invalid("graph output", "device buffer on the CPU"))
                }
            },
            BackendCx::Cuda(scx) => {
                let dst = alloc_like(scx, src.dtype(), src.len())?;
                copy_into(&dst, &src, scx)?;
                dst
            }
        };
        cx.set_output(0, out)
    }
}

/// Frees the graphs of `segs` on this stream once every launch before it has finished.
pub(crate) struct Release {
    pub(crate) shared: Arc<Shared>,
    pub(crate) segs: Vec<usize>,
    pub(crate) deps: Vec<Tensor>,
}

impl Op for Release {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        "graph release"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        self.deps.iter().collect()
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        Ok(Plan {
            outputs: vec![],
            cost: Cost::default(),
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        if let BackendCx::Cuda(scx) = cx.backend() {
            let id = self.shared.id;
            let any = GraphTable::of(scx)?
                .graphs
                .keys()
                .any(|(g, s)| *g == id && self.segs.contains(s));
            if any {
                // No launch of these graphs may still run when they are destroyed: the
                // launches are ahead of this op on the stream (and on the others, by
                // the tokens it waited for).
                scx.stream()
                    .synchronize()
                    .map_err(|e| Error::cuda("cuStreamSynchronize", e))?;
                let table = GraphTable::of(scx)?;
                for s in &self.segs {
                    table.graphs.remove(&(id, *s));
                }
            }
        }
        Ok(())
    }
}
