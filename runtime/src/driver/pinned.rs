//! Pinned (page-locked) host staging memory for transfers, cached per device.
//!
//! # Why
//!
//! Every upload and download goes through pinned memory, so that the copy is truly
//! asynchronous on the copy or compute stream. Pinning fresh memory per transfer
//! (`cuMemHostAlloc`, then `cuMemFreeHost`) is expensive: the driver maps and locks a
//! new region each time (on the H200 host, every 128 KiB download cost 512 minor page
//! faults, a 2 MiB region), and freeing it unmaps it again. In the streams benchmark the
//! 8 downloads at the end of each run doubled the run's time, unless some earlier
//! allocation (cuDNN's first use) happened to keep the driver's region mapped
//! (`benches/RESULTS.md`, run 32). Like PyTorch's caching host allocator, rtx keeps the
//! pinned blocks of finished transfers and hands them out again.
//!
//! # How
//!
//! - [`PinnedCache::take`] rounds the request up to a power of two (at least 4 KiB) and
//!   reuses a free block of that size, else pins a new one. Blocks above
//!   [`PINNED_MAX_BLOCK`] are pinned at their exact size and freed after use.
//! - The transfer enqueues its copy and then [`Pinned::record`]s the block's event on
//!   that stream. When the [`Pinned`] is dropped, the block goes back to the cache; when
//!   the cache would then hold more than [`PINNED_MAX_BYTES`], its largest free blocks
//!   are freed to make room.
//!
//! # Why reuse is safe
//!
//! A block is handed out again only after its event, recorded behind the last copy that
//! used it, has completed ([`PinnedCache::take`] synchronizes it, which costs nothing
//! when the copy is long done, the normal case: uploads return their block when the op
//! completes, downloads after the data is read out). So no DMA into or out of a block is
//! pending when the next user writes or reads it, even when a transfer's op failed or
//! its result was never collected. A transfer whose event cannot be recorded after its
//! copy was enqueued synchronizes its stream before giving the block back, or leaks it.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc as StdArc;
use std::sync::Mutex as StdMutex;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};

use crate::stats::Counters;

/// Pinned blocks above this size are not cached (pinned per transfer, freed after it).
pub const PINNED_MAX_BLOCK: usize = 64 << 20;
/// Bytes of free pinned blocks a runtime keeps per device; blocks released beyond it
/// are freed.
pub const PINNED_MAX_BYTES: usize = 256 << 20;
/// The smallest block.
const MIN_BLOCK: usize = 4 << 10;

/// One pinned allocation and the event recorded behind its last copy.
struct Block {
    ptr: *mut u8,
    size: usize,
    event: CudaEvent,
}

// SAFETY: a block is plain page-locked memory owned by exactly one `Block`; the pointer
// is only dereferenced by the holder of the `Pinned` (or freed by the cache), so moving
// the owner between threads is sound.
unsafe impl Send for Block {}

impl Block {
    /// Waits for the copies recorded on the block's event.
    fn wait(&self, ctx: &CudaContext) -> Result<(), DriverError> {
        bind(ctx)?;
        // SAFETY: the event is live (owned by the block) and belongs to `ctx`, bound above.
        unsafe { result::event::synchronize(self.event.cu_event()) }
    }

    /// Records the block's event on `stream` (a stream of `ctx`).
    fn record(&self, ctx: &CudaContext, stream: &CudaStream) -> Result<(), DriverError> {
        bind(ctx)?;
        // SAFETY: event and stream are live and belong to `ctx`, bound above.
        unsafe { result::event::record(self.event.cu_event(), stream.cu_stream()) }
    }

    /// Waits for the last copy that used the block, then frees it. When that wait fails
    /// (a device with a sticky error), the block is leaked instead: whether a copy still
    /// uses it cannot be known, and freeing it under one would be unsound.
    fn free(self, ctx: &CudaContext) {
        if self.wait(ctx).is_err() {
            std::mem::forget(self);
            return;
        }
        // SAFETY: `ptr` came from `cuMemHostAlloc` in `ctx` (bound by `wait`), is freed
        // once (the block is consumed), and no copy uses it any more (waited above).
        let _ = unsafe { result::free_host(self.ptr.cast::<c_void>()) };
    }
}

/// Makes `ctx` current on this thread. Unlike cudarc's `bind_to_thread`, this does not
/// first return (and clear) an error that an earlier cudarc drop stashed in the context:
/// the staging cache must really wait for its events, whatever was stashed.
fn bind(ctx: &CudaContext) -> Result<(), DriverError> {
    // SAFETY: `ctx` is borrowed, so its context is alive; making it current on this
    // thread has no other effect.
    unsafe { result::ctx::set_current(ctx.cu_ctx()) }
}

/// Free blocks by size, and their total bytes.
#[derive(Default)]
struct Free {
    blocks: BTreeMap<usize, Vec<Block>>,
    bytes: usize,
}

/// A device's cache of pinned host blocks (one per runtime and device).
pub(crate) struct PinnedCache {
    ctx: StdArc<CudaContext>,
    free: StdMutex<Free>,
    /// The runtime's counters (pinned hits and misses).
    counters: StdArc<Counters>,
}

impl PinnedCache {
    pub(crate) fn new(ctx: StdArc<CudaContext>, counters: StdArc<Counters>) -> StdArc<Self> {
        StdArc::new(PinnedCache {
            ctx,
            free: StdMutex::new(Free::default()),
            counters,
        })
    }

    /// A pinned block of at least `bytes` bytes (its contents are whatever it last held),
    /// with no copy pending on it.
    pub(crate) fn take(self: &StdArc<Self>, bytes: usize) -> Result<Pinned, DriverError> {
        let size = class(bytes);
        if size <= PINNED_MAX_BLOCK {
            let reused = {
                let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
                let b = free.blocks.get_mut(&size).and_then(Vec::pop);
                if b.is_some() {
                    free.bytes -= size;
                    self.counters
                        .pinned_bytes
                        .fetch_sub(size as u64, Ordering::Relaxed);
                    if free.blocks.get(&size).is_some_and(Vec::is_empty) {
                        free.blocks.remove(&size);
                    }
                }
                b
            };
            if let Some(block) = reused {
                match block.wait(&self.ctx) {
                    Ok(()) => {
                        self.counters.pinned_hits.fetch_add(1, Ordering::Relaxed);
                        return Ok(self.lend(block, bytes));
                    }
                    // The device failed: this block cannot be proven idle (`free` leaks
                    // it); the allocation below reports the error.
                    Err(_) => block.free(&self.ctx),
                }
            }
        }
        self.counters.pinned_misses.fetch_add(1, Ordering::Relaxed);
        bind(&self.ctx)?;
        let event = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        // SAFETY: plain allocation of `size` bytes of page-locked memory in the bound
        // context; the pointer is owned by the block from here on.
        let ptr = unsafe { result::malloc_host(size, 0) }?.cast::<u8>();
        Ok(self.lend(Block { ptr, size, event }, bytes))
    }

    fn lend(self: &StdArc<Self>, block: Block, len: usize) -> Pinned {
        Pinned {
            block: Some(block),
            len,
            cache: self.clone(),
        }
    }

    /// Takes a block back into the cache. When the free blocks would exceed
    /// [`PINNED_MAX_BYTES`], the largest ones are freed to make room, so that a cache
    /// once filled by large transfers does not turn every later small one into a fresh
    /// pin. Blocks above [`PINNED_MAX_BLOCK`] are freed.
    fn give_back(&self, block: Block) {
        if block.size > PINNED_MAX_BLOCK {
            block.free(&self.ctx);
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            while free.bytes + block.size > PINNED_MAX_BYTES {
                let Some(mut largest) = free.blocks.last_entry() else {
                    break;
                };
                let victim = largest.get_mut().pop().expect("no empty lists are kept");
                if largest.get().is_empty() {
                    largest.remove();
                }
                free.bytes -= victim.size;
                evicted.push(victim);
            }
            free.bytes += block.size;
            let evicted_bytes: usize = evicted.iter().map(|b| b.size).sum();
            // The gauge of bytes held: this block in, the evicted ones out.
            let c = &self.counters.pinned_bytes;
            c.fetch_add(block.size as u64, Ordering::Relaxed);
            c.fetch_sub(evicted_bytes as u64, Ordering::Relaxed);
            free.blocks.entry(block.size).or_default().push(block);
        }
        // Driver calls outside the lock.
        for victim in evicted {
            victim.free(&self.ctx);
        }
    }
}

impl Drop for PinnedCache {
    /// Frees the cached blocks, one cache at a time process-wide with the actors'
    /// teardown (`cuMemFreeHost` was among the calls in the driver deadlock that
    /// `teardown::TEARDOWN` prevents).
    fn drop(&mut self) {
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.counters
            .pinned_bytes
            .fetch_sub(free.bytes as u64, Ordering::Relaxed);
        super::teardown::teardown_serialized(|| {
            for block in free.blocks.into_values().flatten() {
                block.free(&self.ctx);
            }
        });
    }
}

/// The size a request of `bytes` is served with.
fn class(bytes: usize) -> usize {
    let b = bytes.max(MIN_BLOCK);
    if b > PINNED_MAX_BLOCK {
        b
    } else {
        b.next_power_of_two()
    }
}

/// A pinned host block lent for one transfer of `len` bytes; back to its cache on drop.
pub(crate) struct Pinned {
    block: Option<Block>,
    len: usize,
    cache: StdArc<PinnedCache>,
}

impl Pinned {
    fn block(&self) -> &Block {
        self.block.as_ref().expect("present until drop")
    }
    /// The first byte of the transfer's `len` bytes.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.block().ptr
    }
    /// The transfer's size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// Records the block's event on `stream`, right after enqueueing a copy that uses it.
    pub(crate) fn record(&self, stream: &CudaStream) -> Result<(), DriverError> {
        self.block().record(&self.cache.ctx, stream)
    }
    /// Gives up the block without returning it to the cache (leaked): for a copy whose
    /// completion can no longer be tracked (its event could not be recorded and its
    /// stream could not be synchronized).
    pub(crate) fn leak(mut self) {
        std::mem::forget(self.block.take());
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.cache.give_back(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Device 0's context, or `None` (skip) without a device (see `present_for_tests`).
    fn device() -> Option<StdArc<CudaContext>> {
        super::super::present_for_tests().then(|| CudaContext::new(0).expect("context"))
    }

    /// Host function that holds its stream until the test's go (a boxed receiver).
    unsafe extern "C" fn hold(arg: *mut c_void) {
        // SAFETY: `arg` is the `Box<Receiver<()>>` leaked for this one call below.
        let go = unsafe { Box::from_raw(arg.cast::<mpsc::Receiver<()>>()) };
        let _ = go.recv();
    }

    /// A block given back with its copy still pending is not handed out until the copy
    /// has completed, and then holds the copied data.
    #[test]
    fn a_block_is_not_lent_again_while_its_copy_is_pending() {
        let Some(ctx) = device() else { return };
        let stream = ctx.new_stream().expect("stream");
        let counters = StdArc::new(Counters::default());
        let cache = PinnedCache::new(ctx.clone(), counters.clone());
        let n = 1usize << 16;
        let data: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.25 - 60.0).collect();
        let src = stream.clone_htod(&data).expect("upload");
        stream.synchronize().expect("sync");

        // The stream stops at a host function until `go` is sent.
        let (go, wait) = mpsc::channel::<()>();
        let arg = Box::into_raw(Box::new(wait)).cast::<c_void>();
        // SAFETY: `hold` takes back the box it is given, exactly once.
        unsafe { result::stream::launch_host_function(stream.cu_stream(), hold, arg) }
            .expect("cuLaunchHostFunc");
        let bytes = n * 4;
        let dst = cache.take(bytes).expect("take");
        let first = dst.as_ptr() as usize;
        {
            use cudarc::driver::DevicePtr;
            let (sptr, _record) = src.device_ptr(&stream);
            // SAFETY: `src` holds `bytes` bytes; the block at least as many, and it is
            // only read after its event (recorded next) has completed.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst.as_ptr().cast(), sptr, bytes, stream.cu_stream())
            }
            .result()
            .expect("cuMemcpyDtoHAsync");
        }
        dst.record(&stream).expect("record");
        drop(dst); // back in the cache, its copy stuck behind the host function

        let (lent, got) = mpsc::channel();
        let taker = {
            let cache = cache.clone();
            std::thread::spawn(move || {
                let b = cache.take(bytes).expect("take again");
                lent.send(()).expect("send");
                b
            })
        };
        assert!(
            got.recv_timeout(Duration::from_millis(300)).is_err(),
            "the block was lent again while its copy was pending"
        );
        go.send(()).expect("release the stream");
        got.recv_timeout(Duration::from_secs(20))
            .expect("lent once the copy completed");
        let again = taker.join().expect("taker");
        assert_eq!(again.as_ptr() as usize, first, "the same block was reused");
        // SAFETY: the block holds `bytes` bytes written by the completed copy (the taker
        // waited for its event); page-aligned, so aligned for f32.
        let got = unsafe { std::slice::from_raw_parts(again.as_ptr().cast::<f32>(), n) };
        assert!(got == &data[..], "the reused block holds the copied data");
        let hits = counters.pinned_hits.load(Ordering::Relaxed);
        assert!(hits >= 1);
    }

    #[test]
    fn classes_are_powers_of_two_from_4k_up_to_the_cached_limit() {
        assert_eq!(class(0), 4096);
        assert_eq!(class(1), 4096);
        assert_eq!(class(4097), 8192);
        assert_eq!(class(128 << 10), 128 << 10);
        assert_eq!(class((128 << 10) + 1), 256 << 10);
        assert_eq!(class(PINNED_MAX_BLOCK), PINNED_MAX_BLOCK);
        // Above the limit: exact size, never cached.
        assert_eq!(class(PINNED_MAX_BLOCK + 1), PINNED_MAX_BLOCK + 1);
    }
}
