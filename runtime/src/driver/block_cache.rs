//! The block cache of one stream actor (`alloc.rs` says how the caches are used): freed
//! device blocks by size class, kept for the stream's next allocations, and the lending
//! of idle blocks to another stream of the device ([`lend`], model-checked with loom).

use std::collections::HashMap;

use cudarc::driver::sys;

use super::alloc::{CACHE_MAX_BLOCK, CACHE_MAX_BYTES};

/// Freed blocks by size class, and the class of every block the pool handed out (a
/// slice only knows its element count; its block may be larger).
///
/// `classes` may name blocks that were freed to their pool without passing through the
/// cache (scratch slices). The address may come back from that pool (this stream's, or
/// another stream's for a block taken by `alloc::steal`), or, after a trim, from any
/// allocator, as a block of another size: `alloc::recycle` keeps a block only when its
/// recorded class is the class of the slice's own size, which is what every block this
/// stream handed out has. Every trim of this stream's pool clears `classes` (blocks
/// still in use then are freed normally later, not cached).
#[derive(Default)]
pub(crate) struct BlockCache {
    /// Blocks idle on every stream: this stream's, or another's (`alloc::steal`).
    pub(crate) free: HashMap<usize, Vec<sys::CUdeviceptr>>,
    /// Blocks freed inside an op's `run` on this stream's actor (`alloc::in_op_run`): kernels
    /// the op enqueued may still use them, so they are handed out on this stream only
    /// (where the next user is ordered after those kernels), never to another.
    pub(crate) local: HashMap<usize, Vec<sys::CUdeviceptr>>,
    pub(crate) bytes: usize,
    pub(crate) classes: HashMap<sys::CUdeviceptr, usize>,
    /// Set when the stream is unregistered: nothing is cached any more.
    pub(crate) closed: bool,
}

impl BlockCache {
    /// A block of `class` for this cache's own stream.
    pub(crate) fn take(&mut self, class: usize) -> Option<sys::CUdeviceptr> {
        let p = match self.local.get_mut(&class).and_then(Vec::pop) {
            Some(p) => p,
            None => self.free.get_mut(&class)?.pop()?,
        };
        self.bytes -= class;
        Some(p)
    }

    /// A block of `class` idle on every stream (for another stream: `alloc::steal`).
    pub(crate) fn take_shared(&mut self, class: usize) -> Option<sys::CUdeviceptr> {
        let p = self.free.get_mut(&class)?.pop()?;
        self.bytes -= class;
        Some(p)
    }

    /// Whether a block of `class` bytes may be kept.
    pub(crate) fn has_room(&self, class: usize) -> bool {
        !self.closed && class <= CACHE_MAX_BLOCK && self.bytes + class <= CACHE_MAX_BYTES
    }

    /// Keeps `ptr` (the caller checked [`BlockCache::has_room`]); `shared`: whether it
    /// is idle on every stream (else it is handed out on this stream only).
    pub(crate) fn put(&mut self, class: usize, ptr: sys::CUdeviceptr, shared: bool) {
        let list = if shared {
            &mut self.free
        } else {
            &mut self.local
        };
        list.entry(class).or_default().push(ptr);
        self.bytes += class;
    }

    pub(crate) fn drain(&mut self) -> Vec<sys::CUdeviceptr> {
        self.bytes = 0;
        let blocks: Vec<sys::CUdeviceptr> = self
            .free
            .drain()
            .chain(self.local.drain())
            .flat_map(|(_, v)| v)
            .collect();
        for p in &blocks {
            self.classes.remove(p);
        }
        blocks
    }
}

/// One stream's block cache behind its lock.
pub(crate) type CacheLock = crate::sync::Mutex<BlockCache>;

/// The lending step of `alloc::steal`, over the caches alone: the first block of `class` idle
/// on every stream (a shared one, [`BlockCache::take_shared`]) in `donors`' caches,
/// taken out of its cache and its donor's classes, and recorded in `own`'s classes. One
/// lock at a time. Model-checked with loom (`loom_tests.rs`,
/// `block_cache_lends_only_idle_blocks_once`).
pub(crate) fn lend<'a>(
    donors: impl IntoIterator<Item = &'a CacheLock>,
    own: &CacheLock,
    class: usize,
) -> Option<sys::CUdeviceptr> {
    for donor in donors {
        let ptr = {
            let mut cache = crate::sync::lock(donor);
            let ptr = cache.take_shared(class);
            if let Some(p) = ptr {
                cache.classes.remove(&p);
            }
            ptr
        };
        if let Some(ptr) = ptr {
            crate::sync::lock(own).classes.insert(ptr, class);
            return Some(ptr);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRANULE: usize = 512;

    #[test]
    fn cache_hands_back_blocks_of_the_class_and_accounts_bytes() {
        let mut c = BlockCache::default();
        assert!(c.take(GRANULE).is_none());
        c.put(GRANULE, 0x1000, true);
        c.put(2 * GRANULE, 0x2000, true);
        assert_eq!(c.bytes, 3 * GRANULE);
        assert_eq!(c.take(2 * GRANULE), Some(0x2000));
        assert!(c.take(2 * GRANULE).is_none(), "a block is handed out once");
        assert_eq!(c.bytes, GRANULE);
        assert_eq!(c.take(GRANULE), Some(0x1000));
        assert_eq!(c.bytes, 0);
    }

    #[test]
    fn blocks_freed_inside_a_run_stay_with_their_stream() {
        let mut c = BlockCache::default();
        c.put(GRANULE, 0x1000, false);
        assert!(
            c.take_shared(GRANULE).is_none(),
            "another stream never gets a block dropped inside an op's run"
        );
        c.put(GRANULE, 0x2000, true);
        assert_eq!(c.take_shared(GRANULE), Some(0x2000));
        assert_eq!(c.bytes, GRANULE);
        assert_eq!(c.take(GRANULE), Some(0x1000), "its own stream does");
        assert_eq!(c.bytes, 0);
        assert!(c.take(GRANULE).is_none());
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
        c.put(GRANULE, 0x1000, true);
        c.classes.insert(0x5000, GRANULE);
        c.put(GRANULE, 0x5000, false);
        let mut drained = c.drain();
        drained.sort_unstable();
        assert_eq!(drained, [0x1000, 0x5000], "shared and local blocks");
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
