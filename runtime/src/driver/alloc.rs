//! Device allocation: each stream actor's own memory pool and block cache.
//!
//! # Why
//!
//! With every stream allocating from the device's one default pool and freeing back to
//! it, the driver's locks serialized the actors: on the H200, with 8 chains of small
//! GEMMs, an allocation took 3.6 µs on one stream, 16 µs on 4 and 50 µs on 8 (per-stream
//! pools alone brought 8 streams to 14 µs). Like PyTorch's caching allocator, rtx keeps
//! freed blocks in a cache of the stream that allocated them and hands them out again
//! with no driver call.
//!
//! # How
//!
//! - Each actor registers a [`StreamMem`] for its stream when it starts (a pool of its
//!   own, see `pool.rs`, and a block cache), owns it, and unregisters it when it exits.
//!   Its device's [`DeviceMem`] (one per device and runtime) lists it for the
//!   out-of-memory path.
//! - [`alloc_in`] (through `StreamCx::alloc`, or [`alloc_uninit`] on the actor's
//!   thread) rounds the size up to a size class, takes a cached block of that class if
//!   there is one, else one that another stream of the device keeps ([`steal`]), else
//!   allocates from the stream's pool.
//! - A published output buffer carries a [`Home`], a weak handle to the memory of the
//!   actor that ran its op (`ExecCx::set_output` attaches it). When the buffer is
//!   dropped ([`Home::recycle`], from `CudaData`'s drop), a block of that stream's pool
//!   goes back to its cache instead of the pool; once the actor has exited (the handle
//!   no longer upgrades) it is freed stream-ordered as usual. No process-wide registry
//!   is involved.
//!
//! # Why reuse is safe
//!
//! A tensor's memory is dropped when its last handle goes, and every op keeps its
//! inputs and outputs alive until its completion has been observed, so by then no
//! kernel on any stream uses the block. (A consumer may take a producer's output in
//! place while the producer still runs, `storage.rs` rule 3: the memory is then the
//! consumer's, kept until the consumer's completion, which the device orders after the
//! producer's.) The exception is an op that fails after
//! enqueueing work: its outputs are dropped only after its stream has been synchronized
//! (`actor::execute`). A cached block is therefore idle on every stream, and is handed
//! out on its own stream first, on another stream of its device when that one has no
//! block of the class.
//!
//! Cached memory is bounded per stream ([`CACHE_MAX_BYTES`]; larger blocks than
//! [`CACHE_MAX_BLOCK`] are never cached). When an allocation runs out of memory, every
//! cache is emptied and every pool trimmed before the retry.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::LazyLock;
use std::sync::Mutex as StdMutex;
use std::sync::{Arc as StdArc, Weak};

use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DeviceRepr};

use super::block_cache::{lend, BlockCache, CacheLock};
use super::parking::Parking;
use super::pool::{MemPool, StreamPool};
use crate::error::{Error, Result};
use crate::stats::Counters;

/// Blocks above this size are not cached (the pool serves them).
pub const CACHE_MAX_BLOCK: usize = 64 << 20;
/// Bytes one stream's cache may hold; blocks freed beyond it go back to the pool.
pub const CACHE_MAX_BYTES: usize = 4 << 30;
/// Size classes: multiples of this many bytes.
const GRANULE: usize = 512;

/// One stream actor's memory: its pool and its cache of freed blocks. (It holds no
/// reference to the stream or the context, only the stream's handle value to recognize
/// slices of its stream: their lifetimes stay the actor's.) The actor holds the one
/// lasting strong reference (other streams' [`steal`] and the out-of-memory path hold
/// passing ones); buffers hold weak ones ([`Home`]).
pub(crate) struct StreamMem {
    /// The stream's `CUstream` handle, as a number.
    stream: usize,
    pool: StreamPool,
    /// Behind the runtime's synchronization shim (`crate::sync`), so the lending
    /// protocol ([`lend`]) is model-checked with loom (`loom_tests.rs`).
    cache: CacheLock,
    /// The device's list of stream memories (this one among them).
    device: StdArc<DeviceMem>,
}

/// The stream memories of one device of one runtime, and the runtime's counters.
pub(crate) struct DeviceMem {
    streams: StdMutex<Vec<Weak<StreamMem>>>,
    counters: StdArc<Counters>,
}

impl DeviceMem {
    pub(crate) fn new(counters: StdArc<Counters>) -> Self {
        DeviceMem {
            streams: StdMutex::new(Vec::new()),
            counters,
        }
    }
    /// The stream memories still registered.
    fn live(&self) -> Vec<StdArc<StreamMem>> {
        let g = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().filter_map(Weak::upgrade).collect()
    }
}

/// Where a device buffer's memory goes when it is dropped: the block cache of the stream
/// actor whose op produced it, while that actor lives (see the module docs).
#[derive(Clone, Default)]
pub(crate) struct Home(Option<Weak<StreamMem>>);

impl std::fmt::Debug for Home {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Home(stream)"
        } else {
            "Home(none)"
        })
    }
}

impl Home {
    /// The home of memory allocated by `mem`'s actor.
    pub(crate) fn of(mem: &StdArc<StreamMem>) -> Self {
        Home(Some(StdArc::downgrade(mem)))
    }
    /// Whether this is no stream's memory.
    pub(crate) fn is_none(&self) -> bool {
        self.0.is_none()
    }
    /// Takes back the memory of a dropped buffer (see [`recycle`]).
    pub(crate) fn recycle<T: Send + 'static>(&self, s: CudaSlice<T>) {
        match self.0.as_ref().and_then(Weak::upgrade) {
            Some(mem) => recycle(&mem, s),
            None => free(s),
        }
    }
}

thread_local! {
    /// The memory of the stream actor running on this thread (for [`alloc_uninit`]).
    static ACTOR_MEM: RefCell<Option<StdArc<StreamMem>>> = const { RefCell::new(None) };
    /// Set while an op's `run` executes on this thread ([`in_op_run`]).
    static IN_RUN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (an op's `run`, on its actor's thread) marked as inside an op: device
/// memory it drops may still be used by kernels it enqueued on its stream (a warm-up
/// before a failed capture, an op's own donated buffer), so such blocks are cached for
/// that stream alone, not handed to another stream ([`steal`]). Nesting keeps the mark.
pub(crate) fn in_op_run<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_RUN.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(IN_RUN.with(|c| c.replace(true)));
    f()
}

fn key(stream: &CudaStream) -> usize {
    stream.cu_stream() as usize
}

/// The size class of `bytes`.
fn class_of(bytes: usize) -> usize {
    bytes.div_ceil(GRANULE) * GRANULE
}

/// Registers an actor's stream, on the actor's thread: allocations on it come from a
/// pool of its own and its freed tensor memory is cached for it. Without a pool
/// (creation failed), the stream uses the device's default pool and no cache; so it does
/// when `pools` is off (setting `stream_pools`, `RTX_STREAM_POOLS=0`; for diagnosis: a
/// switch between the two allocation paths). The caller owns the returned memory and
/// gives it to [`unregister`] when it exits.
pub(crate) fn register(
    ctx: &CudaContext,
    stream: &CudaStream,
    device: &StdArc<DeviceMem>,
    pools: bool,
) -> Option<StdArc<StreamMem>> {
    if !pools {
        return None;
    }
    match StreamPool::create(ctx) {
        Ok(pool) => {
            let mem = StdArc::new(StreamMem {
                stream: key(stream),
                pool,
                cache: CacheLock::new(BlockCache::default()),
                device: device.clone(),
            });
            let mut list = device.streams.lock().unwrap_or_else(|p| p.into_inner());
            list.retain(|w| w.strong_count() > 0);
            list.push(StdArc::downgrade(&mem));
            drop(list);
            ACTOR_MEM.with(|m| *m.borrow_mut() = Some(mem.clone()));
            Some(mem)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no memory pool of its own for a stream actor");
            None
        }
    }
}

/// Unregisters an actor's stream (when the actor exits, its work finished), on the
/// actor's thread: the cached blocks are freed; memory still held by tensors is freed to
/// the pool when dropped (their [`Home`] no longer upgrades).
pub(crate) fn unregister(mem: StdArc<StreamMem>, stream: &CudaStream) {
    ACTOR_MEM.with(|m| m.borrow_mut().take());
    // Closed under the lock: a `recycle` racing this (it upgraded its handle before the
    // actor let go) then frees its block instead of caching it where no one looks.
    crate::sync::lock(&mem.cache).closed = true;
    free_cached(&mem, stream);
    // The frees done before the pool's trim (`StreamPool::drop`): a trim leaves memory
    // whose free is still enqueued in the pool, which is kept as a spare.
    let _ = stream.synchronize();
    let ordinal = stream.context().ordinal();
    drop(mem);
    // Blocks this stream took from other streams went back to their pools above; an
    // actor that exited before this one left its pool trimmed on the spare list, where
    // those frees landed after its trim: trim the spares again, or that memory stays
    // mapped (GPU run d2: 264 MiB after a stress run's teardown, against 8 before).
    super::pool::trim_spare(ordinal);
}

/// Returns `mem`'s unused pool memory to the driver (after its cached blocks were freed
/// and the frees seen complete) and forgets the classes: trimmed addresses may come
/// back from other allocators.
fn trim(mem: &StreamMem) {
    let mut cache = crate::sync::lock(&mem.cache);
    let _ = mem.pool.trim();
    cache.classes.clear();
}

/// Frees every cached block of `mem` stream-ordered on `stream` (its own stream, or
/// another stream of its device: no kernel uses a cached block, so the order does not
/// matter; a pool takes back its blocks from any stream).
fn free_cached(mem: &StreamMem, stream: &CudaStream) {
    let (blocks, bytes) = {
        let mut cache = crate::sync::lock(&mem.cache);
        let bytes = cache.bytes;
        (cache.drain(), bytes)
    };
    mem.device
        .counters
        .block_bytes
        .fetch_sub(bytes as u64, Ordering::Relaxed);
    for ptr in blocks {
        // SAFETY: `ptr` is a pool allocation of this device that no slice owns any more
        // (it was leaked into the cache) and that no enqueued work uses.
        let _ = unsafe { cudarc::driver::result::free_async(ptr, stream.cu_stream()) };
    }
}

/// Takes back the memory of a dropped tensor buffer: into `mem`'s cache when the slice
/// is of `mem`'s stream and the cache has room, else freed stream-ordered as usual.
fn recycle<T: Send + 'static>(mem: &StreamMem, s: CudaSlice<T>) {
    if key(s.stream()) != mem.stream {
        free(s);
        return;
    }
    let ptr = {
        use cudarc::driver::DevicePtr;
        let stream = s.stream().clone();
        // No event tracking in rtx's contexts: this only reads the address.
        let (ptr, _sync) = s.device_ptr(&stream);
        ptr
    };
    let shared = !IN_RUN.with(|c| c.get());
    let mut cache = crate::sync::lock(&mem.cache);
    // Only blocks this stream handed out are kept: of a recorded class, the class of
    // the slice's own size (see `BlockCache`: a stale entry names another size).
    match cache.classes.get(&ptr).copied() {
        Some(class) if class == class_of(s.num_bytes()) && cache.has_room(class) => {
            // The block stays allocated; the cache owns it from here (the module docs
            // say why its next user cannot race an earlier one). Dropped inside an op's
            // run, it may still be in use on this stream: this stream's alone then.
            cache.put(class, s.leak(), shared);
            mem.device
                .counters
                .block_bytes
                .fetch_add(class as u64, Ordering::Relaxed);
        }
        _ => {
            cache.classes.remove(&ptr);
            drop(cache);
            free(s);
        }
    }
}

/// Drops `s`, which frees it stream-ordered on its stream; while this thread captures a
/// graph, only after the capture has ended (`capture::defer`: the capturing stream
/// would record the free into the graph, and refuses it for memory the graph did not
/// allocate). While another thread captures `s`'s stream (a tensor dropped on the
/// user's thread, say), the free is parked until that capture ends
/// ([`capture_ends`]): `cuMemFreeAsync` on a capturing stream from outside the
/// capture would invalidate it.
fn free<T: Send + 'static>(s: CudaSlice<T>) {
    if super::capture::active() {
        super::capture::defer(Box::new(s));
        return;
    }
    let on = key(s.stream());
    CAPTURE_FREES.free_or_park(on, s, drop, |s| Box::new(s) as Box<dyn Any + Send>);
}

/// The frees held back while their stream is captured (`parking.rs`): each a slice of
/// that stream, dropped (freed stream-ordered) once the capture has ended.
static CAPTURE_FREES: LazyLock<Parking<Box<dyn Any + Send>>> = LazyLock::new(Parking::new);

/// Called by the actor of `stream` before it begins a capture: frees of that stream's
/// memory from other threads are parked from now on (and any in progress have been
/// enqueued).
pub(crate) fn capture_begins(stream: &CudaStream) {
    CAPTURE_FREES.begin(key(stream));
}

/// Called by the actor of `stream` after its capture has ended (or was aborted): the
/// frees parked meanwhile are enqueued on it.
pub(crate) fn capture_ends(stream: &CudaStream) {
    drop(CAPTURE_FREES.end(key(stream)));
}

/// The same allocation as a slice of `stream`: its drop (or [`Home::recycle`]) frees it
/// stream-ordered on `stream` from now on, after the work enqueued there before. No
/// driver call (rtx's contexts track no events).
pub(crate) fn rebind<T>(s: CudaSlice<T>, stream: &StdArc<CudaStream>) -> CudaSlice<T> {
    let n = s.len();
    let ptr = s.leak();
    // SAFETY: `ptr` is the live allocation of `n` elements of `T` that `s` owned (its
    // contents as they were), now owned by nothing else; `stream` is of the same
    // context (every caller rebinds between streams of one device).
    unsafe { stream.upgrade_device_ptr::<T>(ptr, n) }
}

/// Allocates `n` elements stream-ordered on `stream`: from the stream's cache or pool
/// when `stream` is the stream of the actor running on this thread, else from the
/// device's default pool. See [`StreamCx::alloc`](crate::cuda::StreamCx::alloc) for the
/// details; this form is for library workspaces. Zero elements are
/// [`Error::InvalidAllocation`].
///
/// # Safety
///
/// The memory is uninitialized: the caller must write every element before any read of
/// it (by a kernel, a copy or the host).
pub unsafe fn alloc_uninit<T: DeviceRepr>(
    stream: &StdArc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>> {
    let own = ACTOR_MEM.with(|m| {
        m.borrow()
            .as_ref()
            .filter(|m| m.stream == key(stream))
            .cloned()
    });
    // SAFETY: the caller's contract; `own` is this stream's memory.
    unsafe { alloc_in(own.as_ref(), None, stream, n) }
}

/// Allocates `n` elements stream-ordered on `stream`: from `own`'s cache or pool
/// (`own`: the memory of `stream`'s actor), else from the device's default pool. Sizes of actor
/// streams are rounded up to a multiple of 512 bytes (the slice has `n` elements). When
/// the device is out of memory, the caches are emptied and the pools (which keep freed
/// memory) trimmed, and the allocation is retried: first after this stream's work, then
/// after the whole device's. Then out-of-memory is [`Error::OutOfMemory`] with the
/// requested and available bytes. The out-of-memory path also empties the caches of
/// `device`'s other streams (`device`: that of `own` when `None`). Zero elements are
/// an error.
///
/// # Safety
///
/// The memory is uninitialized: the caller must write every element before any read of
/// it (by a kernel, a copy or the host). `own`, if given, is `stream`'s actor's memory.
pub(crate) unsafe fn alloc_in<T: DeviceRepr>(
    own: Option<&StdArc<StreamMem>>,
    device: Option<&DeviceMem>,
    stream: &StdArc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>> {
    if super::capture::active() {
        // Inside a graph capture (`capture.rs`): the graph would replay into memory it
        // does not own.
        return Err(super::capture::refuse(
            crate::error::CaptureHazard::Allocation,
        ));
    }
    if n == 0 {
        return Err(Error::InvalidAllocation {
            message: "zero elements".into(),
        });
    }
    let bytes =
        n.checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::InvalidAllocation {
                message: format!("{n} elements overflow usize bytes"),
            })?;
    let ctx = stream.context();
    let device = device.or(own.map(|m| &*m.device));
    let class = class_of(bytes);
    if let Some(mem) = own {
        let cached = crate::sync::lock(&mem.cache).take(class);
        let (cached, stolen) = match cached {
            Some(p) => (Some(p), false),
            None => (steal(mem, class), true),
        };
        if let Some(ptr) = cached {
            let c = &mem.device.counters;
            c.block_hits.fetch_add(1, Ordering::Relaxed);
            if stolen {
                c.block_steals.fetch_add(1, Ordering::Relaxed);
            }
            c.block_bytes.fetch_sub(class as u64, Ordering::Relaxed);
            // SAFETY: `ptr` is a block of `class` >= `bytes` bytes from a pool of this
            // device (this stream's, or another stream's for a lent block: `steal`),
            // owned by the cache alone and used by no kernel that is not ordered before
            // this stream's next work (module docs); it passes to the slice, which
            // frees or recycles it. The caller's contract covers initialization.
            return Ok(unsafe { stream.upgrade_device_ptr::<T>(ptr, n) });
        }
        mem.device
            .counters
            .block_misses
            .fetch_add(1, Ordering::Relaxed);
    }
    let attempt = || match own {
        Some(mem) => {
            ctx.bind_to_thread()?;
            // SAFETY: the pool is this stream's (registered by its actor for this
            // stream) and the stream is live (borrowed).
            let ptr = unsafe { mem.pool.alloc(class, stream.cu_stream()) }?;
            crate::sync::lock(&mem.cache).classes.insert(ptr, class);
            // SAFETY: `ptr` is a fresh allocation of `class` >= `bytes` bytes, owned by
            // nothing else; the slice frees it stream-ordered on this stream, back to
            // the pool it came from, or recycles it. The caller's contract covers
            // initialization.
            Ok(unsafe { stream.upgrade_device_ptr::<T>(ptr, n) })
        }
        // SAFETY: the caller's contract: every element is written before it is read.
        None => unsafe { stream.alloc::<T>(n) },
    };
    let oom =
        |e: &cudarc::driver::DriverError| e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY;
    match attempt() {
        Ok(s) => return Ok(s),
        Err(e) if !oom(&e) => return Err(driver_error("cuMemAllocAsync", e, ctx, bytes)),
        Err(_) => {}
    }
    // Out of memory: give back what this stream keeps and its finished work freed.
    reclaim_stream(own, stream);
    match attempt() {
        Ok(s) => return Ok(s),
        Err(e) if !oom(&e) => return Err(driver_error("cuMemAllocAsync", e, ctx, bytes)),
        Err(_) => {}
    }
    // Still out: memory may sit in the caches and pools of this device's other streams.
    reclaim_device(device, stream);
    attempt().map_err(|e| driver_error("cuMemAllocAsync", e, ctx, bytes))
}

/// A cached block of `class` bytes from the cache of another stream of `mem`'s device
/// (when `mem`'s own has none), now `mem`'s: recorded in its classes, so that it is
/// cached there when freed.
///
/// Without this, a block freed on one stream stayed in that stream's cache while
/// another stream, short of that class, allocated a fresh one from its pool, and each
/// pool kept its own high-water mark: on the H200 a 10-minute soak of four models over
/// four streams (`benches/soak.rs`) saw the device memory in use climb by 224 MiB in
/// 32 MiB steps, one step at a time when the ops' placement shifted between streams.
/// Taking an idle block from a neighbour first, a stream allocates only when no
/// stream of its device keeps a free block of the class.
///
/// Only blocks of the shared lists are taken: those are used by no kernel on any
/// stream (module docs: they reached the cache after every op that used them was seen
/// complete, or after their stream was synchronized; a block dropped inside an op's run
/// is kept apart, [`in_op_run`]), and their stream-ordered allocation completed before
/// their first user ran, so they may be handed out on any stream of the device. The
/// block stays memory of the pool it came from; freed, it goes back there, from
/// whichever stream frees it. One cache lock is held at a time.
fn steal(mem: &StdArc<StreamMem>, class: usize) -> Option<sys::CUdeviceptr> {
    // Nothing of this size is ever cached, or nothing at all is now.
    if class > CACHE_MAX_BLOCK || mem.device.counters.block_bytes.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let others: Vec<StdArc<StreamMem>> = mem
        .device
        .live()
        .into_iter()
        .filter(|o| !StdArc::ptr_eq(o, mem))
        .collect();
    lend(others.iter().map(|o| &o.cache), &mem.cache, class)
}

/// The first step of the out-of-memory path: `own`'s cached blocks freed (`own`: the
/// memory of `stream`'s actor), `stream`'s work waited for, `own`'s pool and the
/// device's default pool trimmed.
pub(crate) fn reclaim_stream(own: Option<&StdArc<StreamMem>>, stream: &StdArc<CudaStream>) {
    if let Some(mem) = own {
        free_cached(mem, stream);
    }
    let _ = stream.synchronize();
    if let Some(mem) = own {
        trim(mem);
    }
    trim_default(stream.context());
}

/// The second step: the caches of every stream of `device` emptied (the frees enqueued
/// on `stream`), the whole device's work waited for, every pool of the device trimmed
/// (its streams', the spare ones, the default one).
pub(crate) fn reclaim_device(device: Option<&DeviceMem>, stream: &StdArc<CudaStream>) {
    let ctx = stream.context();
    let ordinal = ctx.ordinal();
    let same_device: Vec<StdArc<StreamMem>> = device.map(DeviceMem::live).unwrap_or_default();
    for mem in &same_device {
        free_cached(mem, stream);
    }
    // The frees above and the work that freed blocks to the pools, seen complete.
    let _ = ctx.synchronize();
    for mem in &same_device {
        trim(mem);
    }
    super::pool::trim_spare(ordinal);
    trim_default(ctx);
}

fn trim_default(ctx: &CudaContext) {
    if let Ok(pool) = MemPool::default_of(ctx) {
        let _ = pool.trim();
    }
}

/// Maps a driver error, turning out-of-memory into [`Error::OutOfMemory`].
pub(crate) fn driver_error(
    call: &str,
    e: cudarc::driver::DriverError,
    ctx: &CudaContext,
    requested: usize,
) -> Error {
    if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        let available = ctx.mem_get_info().map(|(free, _)| free).unwrap_or(0);
        return Error::OutOfMemory {
            device: crate::device::Device::Cuda(ctx.ordinal()),
            requested,
            available,
        };
    }
    Error::cuda(call, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_to_the_granule() {
        assert_eq!(class_of(1), GRANULE);
        assert_eq!(class_of(GRANULE), GRANULE);
        assert_eq!(class_of(GRANULE + 1), 2 * GRANULE);
        assert_eq!(class_of(3 << 20), 3 << 20);
    }

    #[test]
    fn the_in_run_mark_nests_and_is_restored() {
        let get = || IN_RUN.with(|c| c.get());
        assert!(!get());
        in_op_run(|| {
            assert!(get());
            in_op_run(|| assert!(get()));
            assert!(get(), "an inner run leaves the outer mark");
        });
        assert!(!get());
        let r = std::panic::catch_unwind(|| in_op_run(|| panic!("op panicked")));
        assert!(r.is_err());
        assert!(!get(), "a panicking run clears the mark");
    }
}
