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
//!   own, see `pool.rs`, and a block cache) and removes it when it exits.
//! - [`alloc_uninit`] on an actor's stream rounds the size up to a size class, takes a
//!   cached block of that class if there is one, else allocates from the stream's pool.
//! - When a tensor's device memory is dropped ([`recycle`], from `CudaData`'s drop), a
//!   block of a registered stream goes back to that stream's cache instead of the pool.
//!
//! # Why reuse is safe
//!
//! A cached block is handed out only on its own stream. A tensor's memory is dropped
//! when its last handle goes, and every op keeps its inputs and outputs alive until its
//! completion has been observed, so by then no kernel on any stream uses the block. The
//! exception is an op that fails after enqueueing work: its outputs are dropped only
//! after its stream has been synchronized (`actor::execute`), and any work still
//! enqueued on the block's own stream is ordered before the block's next use there.
//!
//! Cached memory is bounded per stream ([`CACHE_MAX_BYTES`]; larger blocks than
//! [`CACHE_MAX_BLOCK`] are never cached). When an allocation runs out of memory, every
//! cache is emptied and every pool trimmed before the retry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc as StdArc;
use std::sync::LazyLock;
use std::sync::Mutex as StdMutex;

use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DeviceRepr};
use dashmap::DashMap;

use super::pool::{MemPool, StreamPool};
use crate::error::{Error, Result};

/// Blocks above this size are not cached (the pool serves them).
pub const CACHE_MAX_BLOCK: usize = 64 << 20;
/// Bytes one stream's cache may hold; blocks freed beyond it go back to the pool.
pub const CACHE_MAX_BYTES: usize = 4 << 30;
/// Size classes: multiples of this many bytes.
const GRANULE: usize = 512;

static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);

/// `(hits, misses)` of the stream actors' block caches, process-wide: allocations served
/// from a cache, and allocations that went to a pool.
pub fn block_cache_stats() -> (u64, u64) {
    (HITS.load(Ordering::Relaxed), MISSES.load(Ordering::Relaxed))
}

/// One stream actor's memory: its pool and its cache of freed blocks. (It holds no
/// reference to the stream or the context: their lifetimes stay the actor's.)
pub(crate) struct StreamMem {
    ordinal: usize,
    pool: StreamPool,
    cache: StdMutex<BlockCache>,
}

/// Freed blocks by size class, and the class of every block the pool handed out (a
/// slice only knows its element count; its block may be larger).
///
/// `classes` may name blocks that were freed to the pool without passing through the
/// cache (scratch slices): the pool keeps that memory (release threshold: max), so the
/// address can only come back from this pool, which records its class anew. Trimming
/// the pool returns memory to the driver, so every trim clears `classes` (blocks still
/// in use then are freed normally later, not cached).
#[derive(Default)]
struct BlockCache {
    free: HashMap<usize, Vec<sys::CUdeviceptr>>,
    bytes: usize,
    classes: HashMap<sys::CUdeviceptr, usize>,
    /// Set when the stream is unregistered: nothing is cached any more.
    closed: bool,
}

impl BlockCache {
    fn take(&mut self, class: usize) -> Option<sys::CUdeviceptr> {
        let p = self.free.get_mut(&class)?.pop()?;
        self.bytes -= class;
        Some(p)
    }

    /// Whether a block of `class` bytes may be kept.
    fn has_room(&self, class: usize) -> bool {
        !self.closed && class <= CACHE_MAX_BLOCK && self.bytes + class <= CACHE_MAX_BYTES
    }

    /// Keeps `ptr` (the caller checked [`BlockCache::has_room`]).
    fn put(&mut self, class: usize, ptr: sys::CUdeviceptr) {
        self.free.entry(class).or_default().push(ptr);
        self.bytes += class;
    }

    fn drain(&mut self) -> Vec<sys::CUdeviceptr> {
        self.bytes = 0;
        let blocks: Vec<sys::CUdeviceptr> = self.free.drain().flat_map(|(_, v)| v).collect();
        for p in &blocks {
            self.classes.remove(p);
        }
        blocks
    }
}

/// The registered streams' memory, by stream handle.
static STREAMS: LazyLock<DashMap<usize, StdArc<StreamMem>>> = LazyLock::new(DashMap::new);

fn key(stream: &CudaStream) -> usize {
    stream.cu_stream() as usize
}

/// The size class of `bytes`.
fn class_of(bytes: usize) -> usize {
    bytes.div_ceil(GRANULE) * GRANULE
}

/// Registers an actor's stream: allocations on it come from a pool of its own and its
/// freed tensor memory is cached for it. Without a pool (creation failed), the stream
/// uses the device's default pool and no cache; so it does with `RTX_STREAM_POOLS=0`
/// (for diagnosis: a switch between the two allocation paths).
pub(crate) fn register(ctx: &CudaContext, stream: &CudaStream) {
    if std::env::var("RTX_STREAM_POOLS").is_ok_and(|v| v == "0") {
        return;
    }
    match StreamPool::create(ctx) {
        Ok(pool) => {
            let mem = StreamMem {
                ordinal: ctx.ordinal(),
                pool,
                cache: StdMutex::new(BlockCache::default()),
            };
            STREAMS.insert(key(stream), StdArc::new(mem));
        }
        Err(e) => tracing::warn!(error = %e, "no memory pool of its own for a stream actor"),
    }
}

/// Unregisters an actor's stream (when the actor exits, its work finished): the cached
/// blocks are freed; memory still held by tensors is freed to the pool when dropped.
pub(crate) fn unregister(stream: &CudaStream) {
    if let Some((_, mem)) = STREAMS.remove(&key(stream)) {
        // Closed under the lock: a `recycle` racing this (it found the entry before the
        // removal) then frees its block instead of caching it where no one looks.
        mem.cache.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        free_cached(&mem, stream);
    }
}

/// Returns `mem`'s unused pool memory to the driver (after its cached blocks were freed
/// and the frees seen complete) and forgets the classes: trimmed addresses may come
/// back from other allocators.
fn trim(mem: &StreamMem) {
    let mut cache = mem.cache.lock().unwrap_or_else(|p| p.into_inner());
    let _ = mem.pool.trim();
    cache.classes.clear();
}

/// Frees every cached block of `mem` stream-ordered on `stream` (its own stream, or
/// another stream of its device: no kernel uses a cached block, so the order does not
/// matter; a pool takes back its blocks from any stream).
fn free_cached(mem: &StreamMem, stream: &CudaStream) {
    let blocks = mem.cache.lock().unwrap_or_else(|p| p.into_inner()).drain();
    for ptr in blocks {
        // SAFETY: `ptr` is a pool allocation of this device that no slice owns any more
        // (it was leaked into the cache) and that no enqueued work uses.
        let _ = unsafe { cudarc::driver::result::free_async(ptr, stream.cu_stream()) };
    }
}

/// Takes back the memory of a dropped tensor buffer: into its stream's cache when the
/// stream is registered and the cache has room, else freed stream-ordered as usual.
pub(crate) fn recycle<T>(s: CudaSlice<T>) {
    let Some(mem) = STREAMS.get(&key(s.stream())).map(|m| m.value().clone()) else {
        drop(s);
        return;
    };
    let ptr = {
        use cudarc::driver::DevicePtr;
        let stream = s.stream().clone();
        // No event tracking in rtx's contexts: this only reads the address.
        let (ptr, _sync) = s.device_ptr(&stream);
        ptr
    };
    let mut cache = mem.cache.lock().unwrap_or_else(|p| p.into_inner());
    // Only blocks this stream's pool handed out (of a known class) are kept.
    match cache.classes.get(&ptr).copied() {
        Some(class) if class >= s.num_bytes() && cache.has_room(class) => {
            // The block stays allocated; the cache owns it from here (the module docs
            // say why its next user on this stream cannot race an earlier one).
            cache.put(class, s.leak());
        }
        _ => {
            cache.classes.remove(&ptr);
            drop(cache);
            drop(s);
        }
    }
}

/// Allocates `n` elements stream-ordered on `stream`: from the stream's cache or pool
/// when `stream` is an actor's, else from the device's default pool. Sizes of actor
/// streams are rounded up to a multiple of 512 bytes (the slice has `n` elements). When
/// the device is out of memory, the caches are emptied and the pools (which keep freed
/// memory) trimmed, and the allocation is retried: first after this stream's work, then
/// after the whole device's. Then out-of-memory is [`Error::OutOfMemory`] with the
/// requested and available bytes. Zero elements are an error.
///
/// # Safety
///
/// The memory is uninitialized: the caller must write every element before any read of
/// it (by a kernel, a copy or the host).
pub unsafe fn alloc_uninit<T: DeviceRepr>(
    stream: &StdArc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>> {
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
    let own = STREAMS.get(&key(stream)).map(|m| m.value().clone());
    let class = class_of(bytes);
    if let Some(mem) = &own {
        let cached = mem
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(class);
        if let Some(ptr) = cached {
            HITS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: `ptr` is a block of `class` >= `bytes` bytes allocated from this
            // stream's pool and owned by the cache alone; it passes to the slice, which
            // frees or recycles it. The caller's contract covers initialization.
            return Ok(unsafe { stream.upgrade_device_ptr::<T>(ptr, n) });
        }
        MISSES.fetch_add(1, Ordering::Relaxed);
    }
    let attempt = || match &own {
        Some(mem) => {
            ctx.bind_to_thread()?;
            // SAFETY: the pool is this stream's (registered by its actor for this
            // stream) and the stream is live (borrowed).
            let ptr = unsafe { mem.pool.alloc(class, stream.cu_stream()) }?;
            mem.cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .classes
                .insert(ptr, class);
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
    if let Some(mem) = &own {
        free_cached(mem, stream);
    }
    let _ = stream.synchronize();
    if let Some(mem) = &own {
        trim(mem);
    }
    trim_default(ctx);
    match attempt() {
        Ok(s) => return Ok(s),
        Err(e) if !oom(&e) => return Err(driver_error("cuMemAllocAsync", e, ctx, bytes)),
        Err(_) => {}
    }
    // Still out: memory may sit in the caches and pools of this device's other streams;
    // empty them, wait for the whole device, and trim their pools.
    let ordinal = ctx.ordinal();
    let same_device: Vec<StdArc<StreamMem>> = STREAMS
        .iter()
        .filter(|e| e.value().ordinal == ordinal)
        .map(|e| e.value().clone())
        .collect();
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
    attempt().map_err(|e| driver_error("cuMemAllocAsync", e, ctx, bytes))
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
    fn cache_hands_back_blocks_of_the_class_and_accounts_bytes() {
        let mut c = BlockCache::default();
        assert!(c.take(GRANULE).is_none());
        c.put(GRANULE, 0x1000);
        c.put(2 * GRANULE, 0x2000);
        assert_eq!(c.bytes, 3 * GRANULE);
        assert_eq!(c.take(2 * GRANULE), Some(0x2000));
        assert!(c.take(2 * GRANULE).is_none(), "a block is handed out once");
        assert_eq!(c.bytes, GRANULE);
        assert_eq!(c.take(GRANULE), Some(0x1000));
        assert_eq!(c.bytes, 0);
    }

    #[test]
    fn room_is_bounded_by_block_size_budget_and_closing() {
        let mut c = BlockCache::default();
        assert!(c.has_room(CACHE_MAX_BLOCK));
        assert!(!c.has_room(CACHE_MAX_BLOCK + GRANULE));
        c.bytes = CACHE_MAX_BYTES - GRANULE;
        assert!(c.has_room(GRANULE));
        assert!(!c.has_room(2 * GRANULE));
        c.bytes = 0;
        c.closed = true;
        assert!(!c.has_room(GRANULE), "a closed cache keeps nothing");
    }

    #[test]
    fn drain_empties_and_forgets_the_drained_blocks_classes() {
        let mut c = BlockCache::default();
        c.classes.insert(0x1000, GRANULE);
        c.classes.insert(0x3000, GRANULE); // in use, not cached
        c.put(GRANULE, 0x1000);
        let mut drained = c.drain();
        drained.sort_unstable();
        assert_eq!(drained, [0x1000]);
        assert_eq!(c.bytes, 0);
        assert!(c.take(GRANULE).is_none());
        assert!(!c.classes.contains_key(&0x1000));
        assert_eq!(
            c.classes.get(&0x3000),
            Some(&GRANULE),
            "blocks in use keep their class"
        );
    }
}
