//! What a CUDA op sees of its stream: [`StreamCx`].

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc as StdArc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr};

use super::alloc::{alloc_in, Home, StreamMem};
use super::batch::{Geometry, LaunchBatch, BATCH_STEP_BYTES};
use super::DeviceShared;
use crate::error::{Error, Result};
use crate::settings::Settings;
use crate::stats::{Counters, Phase};

/// The hook an op calls before it blocks its actor's thread (`StreamCx::before_blocking`).
pub(crate) type BeforeBlocking = Box<dyn FnMut(&CudaStream)>;

/// A CUDA stream actor's context, lent to each op it runs: the stream, the device's
/// context, kernel functions and per-stream library state (cuBLAS, cuDNN handles...).
/// It lives on the actor thread only, so `!Send` handles may be stored in it.
pub struct StreamCx {
    pub(crate) stream: StdArc<CudaStream>,
    pub(crate) dev: StdArc<DeviceShared>,
    /// This actor's memory pool and block cache (`None`: the device's default pool).
    pub(crate) mem: Option<StdArc<StreamMem>>,
    pub(crate) settings: Settings,
    pub(crate) counters: StdArc<Counters>,
    functions: HashMap<(String, String), CudaFunction>,
    ext: HashMap<TypeId, Box<dyn Any>>,
    /// Persistent scratch buffers ([`StreamCx::scratch`]) by (key, bytes rounded up to
    /// a power of two).
    scratch: HashMap<(&'static str, usize), CudaSlice<u8>>,
    /// The actor's hook for [`StreamCx::before_blocking`].
    before_blocking: Option<BeforeBlocking>,
    /// The launches deferred on this stream (`batch.rs`), shared with the actor's
    /// outbox, which launches them before it records a burst's event.
    pub(crate) batch: Rc<RefCell<LaunchBatch>>,
}

impl StreamCx {
    pub(crate) fn new(
        stream: StdArc<CudaStream>,
        dev: StdArc<DeviceShared>,
        mem: Option<StdArc<StreamMem>>,
        settings: Settings,
        counters: StdArc<Counters>,
    ) -> Self {
        StreamCx {
            stream,
            dev,
            mem,
            settings,
            counters,
            functions: HashMap::new(),
            ext: HashMap::new(),
            scratch: HashMap::new(),
            before_blocking: None,
            batch: Rc::new(RefCell::new(LaunchBatch::new())),
        }
    }
    /// Tells the actor that the op is about to block this thread for long (a cuDNN
    /// algorithm search, a synchronize): the actor records and hands over the ops it
    /// enqueued before this one, so that consumers on other streams waiting for their
    /// event do not wait for this op as well. Cheap when there is nothing to hand over.
    pub fn before_blocking(&mut self) {
        if let Some(h) = self.before_blocking.as_mut() {
            h(&self.stream);
        }
    }
    /// Installs the actor's hook for [`StreamCx::before_blocking`].
    pub(crate) fn set_before_blocking(&mut self, h: BeforeBlocking) {
        self.before_blocking = Some(h);
    }
    /// Drops the actor's hook (when the actor stops).
    pub(crate) fn clear_before_blocking(&mut self) {
        self.before_blocking = None;
    }
    /// Whether this actor is capturing a graph right now (`Runtime::capture`): an op
    /// must then not synchronize, time or read back (its launches are recorded, not run).
    pub fn capturing(&self) -> bool {
        super::capture::active()
    }
    /// The settings of the runtime this stream belongs to.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }
    /// Where memory allocated by [`StreamCx::alloc`] goes back to when its buffer drops.
    pub(crate) fn home(&self) -> Home {
        self.mem.as_ref().map(Home::of).unwrap_or_default()
    }
    /// This stream's out-of-memory reclaim step, for library calls (see
    /// [`Reclaimer::retry`](super::Reclaimer::retry)); library state kept in
    /// [`StreamCx::ext`] may hold it.
    pub fn reclaimer(&self) -> super::Reclaimer {
        super::Reclaimer::new(self.stream.clone(), self.mem.as_ref(), &self.dev)
    }
    /// The stream ops enqueue on.
    pub fn stream(&self) -> &StdArc<CudaStream> {
        &self.stream
    }
    /// Defers a kernel launch into this stream's launch batch
    /// ([`Settings::launch_batching`](crate::Settings::launch_batching); see
    /// `runtime/src/driver/batch.rs`): `f` is a batch kernel, which takes one parameter,
    /// `struct { uint32_t count; uint32_t pad; uint8_t steps[BATCH_STEPS][BATCH_STEP_BYTES]; }`
    /// by value, runs as `geo` says (`grid` blocks of `threads` threads; cooperatively
    /// when `coop`) and performs `steps[0..count]` in order with a barrier between them
    /// (block-wide on one block, grid-wide on a cooperative grid); `step` is this
    /// launch's descriptor. Steps of another function or geometry start a new batch.
    /// Returns `false` when the op running now may not defer (the actor did not open the
    /// batch for it: batching off, a capture, a timed op, an op that does not batch):
    /// the caller then launches as usual, after [`StreamCx::flush_launches`].
    ///
    /// # Safety
    ///
    /// Launching `f` with a block whose steps include `step` must be safe as a launch
    /// of the op's own kernel would be: every address the step holds is inside a
    /// buffer the op holds (its inputs and outputs) until its completion, and the kernel
    /// reads no memory another step of the batch writes except in step order (through
    /// loads that see the earlier steps' stores after the barrier, not the read-only
    /// cache).
    pub unsafe fn defer_launch(
        &self,
        f: &CudaFunction,
        geo: Geometry,
        step: &[u8; BATCH_STEP_BYTES],
    ) -> bool {
        self.batch
            .borrow_mut()
            .defer(f, geo, step, &self.stream, &self.counters)
    }
    /// Whether the op running now may defer its launches ([`StreamCx::defer_launch`]
    /// would take a step): for a launcher that must prepare something first.
    pub fn launch_batch_open(&self) -> bool {
        self.batch.borrow().is_open()
    }
    /// Launches the steps deferred on this stream ([`StreamCx::defer_launch`]), if any:
    /// an op of [`Op::batches_launches`](crate::Op::batches_launches) calls it before a
    /// launch it does not defer. Cheap when nothing is pending. A failed launch fails
    /// the ops of the burst (when the actor hands it over).
    pub fn flush_launches(&self) {
        let mut b = self.batch.borrow_mut();
        if b.pending() {
            b.flush(&self.stream, &self.counters);
        }
    }
    /// The device's context.
    pub fn context(&self) -> &StdArc<CudaContext> {
        &self.dev.ctx
    }
    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.dev.ordinal
    }
    /// Compute capability (major, minor).
    pub fn arch(&self) -> (i32, i32) {
        self.dev.arch
    }
    /// Multiprocessor count (for sizing grids).
    pub fn sm_count(&self) -> u32 {
        self.dev.sm_count
    }

    /// Allocates `n` elements stream-ordered, from this stream actor's block cache or
    /// memory pool (or the device's default pool when the runtime's `stream_pools`
    /// setting is off); sizes are rounded up to a multiple of 512 bytes (the slice has
    /// `n` elements). The memory is uninitialized: the op must write every element it
    /// publishes. When the device is out of memory, the caches are emptied and the pools
    /// trimmed, and the allocation is retried (after this stream's work, then after the
    /// whole device's); then out-of-memory is [`Error::OutOfMemory`] with the requested
    /// and available bytes. Zero elements are [`Error::InvalidAllocation`].
    ///
    /// While the actor captures the op into a graph, this hands out the op's outputs,
    /// allocated before the capture, each to a request of its type and length; any
    /// other allocation is [`Error::NotCapturable`] (see `runtime/src/driver/capture.rs`).
    pub fn alloc<T: DeviceRepr + 'static>(&self, n: usize) -> Result<CudaSlice<T>> {
        if let Some(r) = super::capture::take::<T>(n) {
            return r;
        }
        let t = self.counters.clock();
        // SAFETY: the slice is only published as an op output, and ops write every
        // element of their outputs before publishing (the parity tests poison outputs to
        // catch unwritten elements); `mem` is this stream's memory.
        let r = unsafe { alloc_in::<T>(self.mem.as_ref(), Some(&self.dev.mem), &self.stream, n) };
        if let Some(t) = t {
            self.counters.add(Phase::Alloc, t.elapsed());
        }
        r
    }

    /// Runs `launch` (an op's kernel launches), timing it as the `launch` phase of
    /// [`Stats::phases`](crate::Stats::phases) when profiling is on (`RTX_PROFILE=1`);
    /// otherwise only runs it. The built-in kernels launch through it.
    pub fn timed_launch<R>(&self, launch: impl FnOnce() -> R) -> R {
        let t = self.counters.clock();
        let r = launch();
        if let Some(t) = t {
            self.counters.add(Phase::Launch, t.elapsed());
        }
        r
    }

    /// The device address of a **persistent scratch buffer** of at least `n` elements
    /// of `T` for this stream, under `key` (one name per use: two buffers an op needs
    /// at once take two keys): the memory an op needs only while its kernels run
    /// (partial sums, counters), without an allocation per call, so that the op can be
    /// captured into a graph. Buffers are kept by size class (bytes rounded up to a
    /// power of two) and never freed before the stream: a captured graph may use one
    /// on every launch. The memory is uninitialized and shared by every op on this
    /// stream that uses `key` — stream order keeps their uses apart; the op must not
    /// expect its contents to survive to its next call.
    ///
    /// Outside capture a missing buffer is allocated ([`StreamCx::alloc`]'s errors).
    /// While the actor captures an op into a graph, only an existing buffer is handed
    /// out (the graph's eager warm-up run of the same op made it); a missing one is
    /// [`Error::NotCapturable`] (allocation). Zero elements are
    /// [`Error::InvalidAllocation`].
    pub fn scratch<T: DeviceRepr + 'static>(&mut self, key: &'static str, n: usize) -> Result<u64> {
        let bytes = n
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b > 0)
            .and_then(usize::checked_next_power_of_two)
            .ok_or_else(|| Error::InvalidAllocation {
                message: format!("scratch {key:?} of {n} elements is empty or too large"),
            })?;
        if !self.scratch.contains_key(&(key, bytes)) {
            if super::capture::active() {
                return Err(super::capture::refuse(
                    crate::error::CaptureHazard::Allocation,
                ));
            }
            let buf = self.alloc::<u8>(bytes)?;
            self.scratch.insert((key, bytes), buf);
        }
        let buf = &self.scratch[&(key, bytes)];
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(buf, &self.stream);
        Ok(ptr)
    }

    /// A kernel function, loading its module once per device from the CUBIN `cubin`
    /// returns (called with the device's compute capability only on first use).
    pub fn function(
        &mut self,
        module: &str,
        name: &str,
        cubin: impl FnOnce((i32, i32)) -> Result<StdArc<Vec<u8>>>,
    ) -> Result<CudaFunction> {
        let key = (module.to_string(), name.to_string());
        if let Some(f) = self.functions.get(&key) {
            return Ok(f.clone());
        }
        let m = match self.dev.modules.get(module) {
            Some(m) => m.clone(),
            None => {
                let bin = cubin(self.dev.arch)?;
                let m = self
                    .dev
                    .ctx
                    .load_module(cudarc::nvrtc::Ptx::from_binary((*bin).clone()))
                    .map_err(|e| Error::cuda(format!("cuModuleLoadData({module})"), e))?;
                self.dev.modules.insert(module.to_string(), m.clone());
                m
            }
        };
        let f = m
            .load_function(name)
            .map_err(|e| Error::cuda(format!("cuModuleGetFunction({module}::{name})"), e))?;
        self.functions.insert(key, f.clone());
        Ok(f)
    }

    /// Per-stream state of type `T` (a library handle, a plan cache), created by `init`
    /// on first use, on this actor's thread.
    pub fn ext<T: 'static>(&mut self, init: impl FnOnce(&StreamCx) -> Result<T>) -> Result<&mut T> {
        let id = TypeId::of::<T>();
        if !self.ext.contains_key(&id) {
            let v = init(self)?;
            self.ext.insert(id, Box::new(v));
        }
        Ok(self
            .ext
            .get_mut(&id)
            .and_then(|b| b.downcast_mut::<T>())
            .expect("inserted above with this type"))
    }
}
