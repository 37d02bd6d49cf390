//! The thread-local capture mode of a stream actor (graphs: `runtime/src/runtime/graph/`).
//!
//! While an actor captures an op into a CUDA graph, the op's kernels are recorded, not
//! run, and every replay of the graph runs them on the same memory. So the op may not
//! allocate: its outputs were allocated before the capture (by the eager warm-up run,
//! and are owned by the graph), and [`StreamCx::alloc`](super::StreamCx::alloc) hands
//! out exactly those, each to a request of its planned type and length (in any order).
//! Any other allocation on the capturing thread — one more `StreamCx::alloc`, or
//! [`alloc_uninit`](super::alloc_uninit) for a workspace — fails with
//! [`Error::NotCapturable`] ([`CaptureHazard::Allocation`]) naming the op.
//!
//! The state is per thread, like CUDA's `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` the
//! capture uses: other actors keep allocating and synchronizing as usual.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use cudarc::driver::{sys, CudaSlice};

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
    /// The thread's capture mode before [`refuse`] relaxed it, until [`restore_mode`].
    static RELAXED_FROM: Cell<Option<sys::CUstreamCaptureMode>> = const { Cell::new(None) };
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

/// Relaxes this thread's stream-capture mode (`cuThreadExchangeStreamCaptureMode`),
/// once per capture, remembering the mode it had: called where an op is refused (here
/// and in [`refuse`]), see there. Nothing without a CUDA driver (the unit tests below
/// enter capture mode with no capture).
fn relax_mode() {
    if RELAXED_FROM.with(Cell::get).is_some() {
        return;
    }
    // SAFETY: `is_culib_present` only tries to load the driver library.
    if !unsafe { sys::is_culib_present() } {
        return;
    }
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `mode` is a valid in/out pointer for the call; it changes only this
    // thread's mode.
    let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    if r == sys::CUresult::CUDA_SUCCESS {
        RELAXED_FROM.with(|m| m.set(Some(mode)));
    }
}

/// Gives this thread back the capture mode [`refuse`] relaxed (if it did): called when
/// a capture has ended or was aborted.
pub(crate) fn restore_mode() {
    if let Some(mut mode) = RELAXED_FROM.with(Cell::take) {
        // SAFETY: as in `relax_mode`.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
}

/// Whether this thread is capturing.
pub(crate) fn active() -> bool {
    CAPTURE.with(|c| c.borrow().is_some())
}

/// The hazard error for the op being captured on this thread.
///
/// The capture is lost from here on, and the op, failing, drops what it holds: a planned
/// output it already took (as a temporary, say) is bound to the graph's side stream, and
/// its free there is one of the calls CUDA prohibits a capturing thread in the capture's
/// thread-local mode (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: the free fails and the
/// block leaks). So this thread's capture mode is relaxed until the capture ends
/// ([`restore_mode`]): the op's drops free on the side stream, which does not capture.
pub(crate) fn refuse(hazard: CaptureHazard) -> Error {
    let op = CAPTURE.with(|c| c.borrow().as_ref().map(|a| a.op).unwrap_or("?"));
    if active() {
        relax_mode();
    }
    Error::NotCapturable {
        op: op.to_string(),
        hazard,
    }
}

/// In capture mode, a pre-allocated output that is a slice of `n` elements of `T`: the
/// first such in the queue (else the allocation hazard, the queue left as it was);
/// `None` outside capture.
///
/// The first match rather than the queue's front: an op may allocate its outputs in
/// another order than it returns them (`linear_backward` makes dx, then the bias
/// gradient, then dw, and returns `(dx, dw, db)`). Two planned outputs of one type and
/// length are interchangeable: the capture binds each *returned* buffer to its output.
pub(crate) fn take<T: 'static>(n: usize) -> Option<Result<CudaSlice<T>>> {
    take_first(|s: &CudaSlice<T>| s.len() == n)
}

/// The first queued item of type `S` that `fits` (removed), the hazard if none does;
/// `None` outside capture.
fn take_first<S: 'static>(fits: impl Fn(&S) -> bool) -> Option<Result<S>> {
    CAPTURE.with(|c| {
        let mut c = c.borrow_mut();
        let a = c.as_mut()?;
        let at = a
            .queue
            .iter()
            .position(|b| b.downcast_ref::<S>().is_some_and(&fits));
        let Some(at) = at else {
            relax_mode();
            return Some(Err(Error::NotCapturable {
                op: a.op.to_string(),
                hazard: CaptureHazard::Allocation,
            }));
        };
        let b = a.queue.remove(at).expect("found above");
        Some(Ok(*b.downcast::<S>().expect("checked above")))
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

    #[test]
    fn outputs_go_to_the_first_request_of_their_type_and_length() {
        assert!(take_first(|_: &Vec<f32>| true).is_none(), "not capturing");
        // Planned as (dx: 6 f32, dw: 12 f32, db: 3 f32); requested dx, db, dw.
        let queue: VecDeque<Box<dyn Any>> = [vec![1.0f32; 6], vec![2.0; 12], vec![3.0; 3]]
            .into_iter()
            .map(|v| Box::new(v) as Box<dyn Any>)
            .collect();
        enter("op", queue);
        let len = |n| move |v: &Vec<f32>| v.len() == n;
        assert_eq!(take_first(len(6)).unwrap().unwrap()[0], 1.0);
        assert_eq!(take_first(len(3)).unwrap().unwrap()[0], 3.0);
        // A length or a type nothing planned is refused, and takes nothing.
        let e = take_first(len(5)).unwrap().unwrap_err();
        assert!(
            matches!(&e, Error::NotCapturable { op, hazard: CaptureHazard::Allocation } if op == "op"),
            "{e:?}"
        );
        assert!(take_first(|_: &Vec<f64>| true).unwrap().is_err());
        assert_eq!(take_first(len(12)).unwrap().unwrap()[0], 2.0);
        assert!(take_first(len(12)).unwrap().is_err(), "each output once");
        assert!(leave().is_empty());
    }
}
