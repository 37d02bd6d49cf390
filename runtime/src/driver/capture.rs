//! The thread-local capture mode of a stream actor (graphs: `runtime/src/runtime/graph/`).
//!
//! While an actor captures an op into a CUDA graph, the op's kernels are recorded, not
//! run, and every replay of the graph runs them on the same memory. So the op may not
//! allocate: its outputs were allocated before the capture (by the eager warm-up run,
//! and are owned by the graph), and [`StreamCx::alloc`](super::StreamCx::alloc) hands
//! out exactly those, in order, with their planned types and lengths. Any other
//! allocation on the capturing thread — one more `StreamCx::alloc`, or
//! [`alloc_uninit`](super::alloc_uninit) for a workspace — fails with
//! [`Error::NotCapturable`] ([`CaptureHazard::Allocation`]) naming the op.
//!
//! The state is per thread, like CUDA's `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` the
//! capture uses: other actors keep allocating and synchronizing as usual.

use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;

use cudarc::driver::CudaSlice;

use crate::error::{CaptureHazard, Error, Result};

struct Active {
    op: &'static str,
    /// The op's pre-allocated outputs, each a `Box<CudaSlice<T>>` of its dtype.
    queue: VecDeque<Box<dyn Any>>,
}

thread_local! {
    static CAPTURE: RefCell<Option<Active>> = const { RefCell::new(None) };
    /// Device memory dropped on this thread while it captured (`defer`).
    static DEFERRED: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Keeps `slice` (a `CudaSlice<T>` dropped while this thread captures) to be dropped
/// after the capture has ended ([`take_deferred`]): `cuMemFreeAsync` on the capturing
/// stream would be recorded into the graph, not done, and is refused
/// (`CUDA_ERROR_INVALID_VALUE`) for memory the graph did not allocate.
pub(crate) fn defer(slice: Box<dyn Any>) {
    DEFERRED.with(|d| d.borrow_mut().push(slice));
}

/// What was deferred on this thread, for the caller to drop once its capture ended.
pub(crate) fn take_deferred() -> Vec<Box<dyn Any>> {
    DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()))
}

/// Enters capture mode for op `op` on this thread: `queue` holds its outputs, each a
/// `Box<CudaSlice<T>>`, in output order.
pub(crate) fn enter(op: &'static str, queue: VecDeque<Box<dyn Any>>) {
    CAPTURE.with(|c| *c.borrow_mut() = Some(Active { op, queue }));
}

/// Leaves capture mode; what the op did not take of its queue.
pub(crate) fn leave() -> VecDeque<Box<dyn Any>> {
    CAPTURE.with(|c| c.borrow_mut().take().map(|a| a.queue).unwrap_or_default())
}

/// Whether this thread is capturing.
pub(crate) fn active() -> bool {
    CAPTURE.with(|c| c.borrow().is_some())
}

/// The hazard error for the op being captured on this thread.
pub(crate) fn refuse(hazard: CaptureHazard) -> Error {
    let op = CAPTURE.with(|c| c.borrow().as_ref().map(|a| a.op).unwrap_or("?"));
    Error::NotCapturable {
        op: op.to_string(),
        hazard,
    }
}

/// In capture mode, the next pre-allocated output if it is a slice of `n` elements of
/// `T` (else the allocation hazard, the queue left as it was); `None` outside capture.
pub(crate) fn take<T: 'static>(n: usize) -> Option<Result<CudaSlice<T>>> {
    CAPTURE.with(|c| {
        let mut c = c.borrow_mut();
        let a = c.as_mut()?;
        let fits = a
            .queue
            .front()
            .and_then(|b| b.downcast_ref::<CudaSlice<T>>())
            .is_some_and(|s| s.len() == n);
        if !fits {
            return Some(Err(Error::NotCapturable {
                op: a.op.to_string(),
                hazard: CaptureHazard::Allocation,
            }));
        }
        let b = a.queue.pop_front().expect("checked above");
        Some(Ok(*b.downcast::<CudaSlice<T>>().expect("checked above")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deferred_drops_wait_for_the_caller_in_order() {
        assert!(take_deferred().is_empty());
        enter("op", VecDeque::new());
        assert!(active());
        defer(Box::new(1u32));
        defer(Box::new(2u32));
        assert!(leave().is_empty());
        assert!(!active());
        let d = take_deferred();
        let got: Vec<u32> = d
            .iter()
            .map(|b| *b.downcast_ref::<u32>().unwrap())
            .collect();
        assert_eq!(got, [1, 2]);
        assert!(take_deferred().is_empty(), "taken once");
    }
}
