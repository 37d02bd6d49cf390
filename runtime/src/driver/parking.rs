//! Frees held back while their stream is being captured into a graph.
//!
//! A stream actor capturing its stream into a CUDA graph records, rather than runs,
//! what is enqueued on that stream, and a `cuMemFreeAsync` onto it from *another*
//! thread (the last handle of a tensor dropped on the user's thread, say) would
//! invalidate the capture. So the actor announces its capture ([`Parking::begin`])
//! before it begins it and ends the announcement ([`Parking::end`]) after the capture
//! has ended; a free of that stream's memory in between is parked and handed back by
//! `end` for the actor to do.
//!
//! The freer checks for a capture and frees **under one shared lock** that `begin`
//! takes exclusively: a free that saw no capture is enqueued before the capture can
//! begin. (Checking, unlocking, then freeing would let a capture begin in between; the
//! loom model `parking_free_never_lands_in_a_capture` in `loom_tests.rs` catches that,
//! plant 17.) Frees of streams that do not capture run concurrently (shared lock).

use crate::sync::{Mutex, RwLock};

/// The capturing streams (by key) and what was parked for them.
pub(crate) struct Parking<V> {
    capturing: RwLock<Vec<usize>>,
    parked: Mutex<Vec<(usize, V)>>,
}

impl<V> Parking<V> {
    pub(crate) fn new() -> Self {
        Parking {
            capturing: RwLock::new(Vec::new()),
            parked: Mutex::new(Vec::new()),
        }
    }

    /// Frees `x`, memory of stream `key`, with `free`; while `key` is announced as
    /// capturing, parks `park(x)` instead (returned by that capture's [`Parking::end`]).
    /// (`park` makes the parked form, a boxed slice say, only when one is parked.)
    pub(crate) fn free_or_park<X>(
        &self,
        key: usize,
        x: X,
        free: impl FnOnce(X),
        park: impl FnOnce(X) -> V,
    ) {
        // Held across `free`: `begin` cannot return (nor the capture begin) meanwhile.
        let capturing = self.capturing.read().unwrap_or_else(|p| p.into_inner());
        if capturing.contains(&key) {
            crate::sync::lock(&self.parked).push((key, park(x)));
            return;
        }
        free(x);
        drop(capturing);
    }

    /// Announces that stream `key` is about to be captured: from the return on, its
    /// frees are parked, and every free that saw no capture has been done.
    pub(crate) fn begin(&self, key: usize) {
        self.capturing
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(key);
    }

    /// Ends `key`'s announcement (its capture has ended): what was parked for it, for
    /// the caller to free.
    pub(crate) fn end(&self, key: usize) -> Vec<V> {
        {
            let mut c = self.capturing.write().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = c.iter().position(|&k| k == key) {
                c.swap_remove(i);
            }
        }
        let mut parked = crate::sync::lock(&self.parked);
        let mut mine = Vec::new();
        let mut i = 0;
        while i < parked.len() {
            if parked[i].0 == key {
                mine.push(parked.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        mine
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn frees_of_a_capturing_stream_wait_for_its_end() {
        let p = Parking::new();
        let freed = std::cell::RefCell::new(Vec::new());
        let free = |v| freed.borrow_mut().push(v);
        p.free_or_park(1, 10, free, |v| v);
        p.begin(1);
        p.begin(2);
        p.free_or_park(1, 11, free, |v| v);
        p.free_or_park(2, 20, free, |v| v);
        p.free_or_park(3, 30, free, |v| v);
        assert_eq!(*freed.borrow(), [10, 30], "1 and 2 capture");
        assert_eq!(p.end(1), [11]);
        assert!(p.end(1).is_empty(), "handed back once");
        p.free_or_park(1, 12, free, |v| v);
        assert_eq!(*freed.borrow(), [10, 30, 12]);
        assert_eq!(p.end(2), [20]);
    }
}
