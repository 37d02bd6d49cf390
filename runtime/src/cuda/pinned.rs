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
//!   that stream. When the [`Pinned`] is dropped, the block goes back to the cache (or is
//!   freed when the cache already holds [`PINNED_MAX_BYTES`]).
//!
//! # Why reuse is safe
//!
//! A block is handed out again only after its event, recorded behind the last copy that
//! used it, has completed ([`PinnedCache::take`] synchronizes it, which costs nothing
//! when the copy is long done, the normal case: uploads return their block when the op
//! completes, downloads after the data is read out). So no DMA into or out of a block is
//! pending when the next user writes or reads it, even when a transfer's op failed or
//! its result was never collected.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc as StdArc;
use std::sync::Mutex as StdMutex;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};

/// Pinned blocks above this size are not cached (pinned per transfer, freed after it).
pub const PINNED_MAX_BLOCK: usize = 64 << 20;
/// Bytes of free pinned blocks a runtime keeps per device; blocks released beyond it
/// are freed.
pub const PINNED_MAX_BYTES: usize = 256 << 20;
/// The smallest block.
const MIN_BLOCK: usize = 4 << 10;

static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);

/// `(hits, misses)` of the pinned host staging caches, process-wide: transfers that
/// reused a cached block, and transfers that pinned new memory.
pub fn pinned_cache_stats() -> (u64, u64) {
    (HITS.load(Ordering::Relaxed), MISSES.load(Ordering::Relaxed))
}

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
    /// Waits for the last copy that used the block, then frees it. Errors are ignored
    /// (a device with a sticky error has no copy running any more).
    fn free(self, ctx: &CudaContext) {
        let _ = self.event.synchronize();
        let _ = ctx.bind_to_thread();
        // SAFETY: `ptr` came from `cuMemHostAlloc` in this context, is freed once (the
        // block is consumed), and no copy uses it any more (synchronized above).
        let _ = unsafe { result::free_host(self.ptr.cast::<c_void>()) };
    }
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
}

impl PinnedCache {
    pub(crate) fn new(ctx: StdArc<CudaContext>) -> StdArc<Self> {
        StdArc::new(PinnedCache {
            ctx,
            free: StdMutex::new(Free::default()),
        })
    }

    /// A pinned block of at least `bytes` bytes (its contents are whatever it last held).
    pub(crate) fn take(self: &StdArc<Self>, bytes: usize) -> Result<Pinned, DriverError> {
        let size = class(bytes);
        if size <= PINNED_MAX_BLOCK {
            let reused = {
                let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
                let b = free.blocks.get_mut(&size).and_then(Vec::pop);
                if b.is_some() {
                    free.bytes -= size;
                }
                b
            };
            if let Some(block) = reused {
                match block.event.synchronize() {
                    Ok(()) => {
                        HITS.fetch_add(1, Ordering::Relaxed);
                        return Ok(self.lend(block, bytes));
                    }
                    // A sticky device error: this block cannot be proven idle; drop it
                    // and let the allocation below report the error.
                    Err(_) => block.free(&self.ctx),
                }
            }
        }
        MISSES.fetch_add(1, Ordering::Relaxed);
        self.ctx.bind_to_thread()?;
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

    /// Takes a block back: cached when it fits, else freed.
    fn give_back(&self, block: Block) {
        if block.size <= PINNED_MAX_BLOCK {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.bytes + block.size <= PINNED_MAX_BYTES {
                free.bytes += block.size;
                free.blocks.entry(block.size).or_default().push(block);
                return;
            }
        }
        block.free(&self.ctx);
    }
}

impl Drop for PinnedCache {
    fn drop(&mut self) {
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|p| p.into_inner()));
        for block in free.blocks.into_values().flatten() {
            block.free(&self.ctx);
        }
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
        self.block().event.record(stream)
    }
    /// Waits until the copies recorded with [`Pinned::record`] have completed.
    pub(crate) fn wait(&self) -> Result<(), DriverError> {
        self.block().event.synchronize()
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
