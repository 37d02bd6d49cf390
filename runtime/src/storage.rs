//! Storage: a tensor's memory plus its sync state.
//!
//! # Protocol
//!
//! A storage is created by `submit` for each output of an op, in state `Pending`, before
//! the op is sent to its stream actor. From then on:
//!
//! 1. Only the producing op's actor writes the slot, exactly once: `publish` (state
//!    `Ready`) after the op is *enqueued* (CUDA: kernels launched and the ready event
//!    recorded; CPU: computed), or `fail` (state `Failed`). If the job is dropped
//!    unexecuted (shutdown), its guard fails the storage, so no waiter hangs.
//! 2. Consumers call `wait_ready`, which blocks on the condvar until the slot leaves
//!    `Pending` (never spinning). A consumer on another CUDA stream then makes its stream
//!    wait on the ready event; on the CPU backend `Ready` already means computed.
//! 3. `Ready` is immutable, except by donation: an op holding the only handle to a
//!    storage may take the buffer out (state `Donated`) and write it in place. Checked by
//!    the actor at execution time, under the slot's lock: no other tensor handle and no
//!    pending reader's keep-alive can see the memory. The one handle not counted is the
//!    producing op's own keep-alive (`producer_holds`, cleared under the same lock before
//!    that handle goes): a consumer runs after its producer's kernels (same stream) or
//!    makes its stream wait on the producer's event first, so writing in place is
//!    ordered after the producer; and the memory, now the consumer's, is freed only
//!    after the consumer's completion, which comes after the producer's. So an update
//!    submitted right after the op that produced its operand (an optimizer step after
//!    the previous one, a chain of element-wise ops) works in place without waiting.
//! 4. The storage (and so the buffer) is freed when the last handle goes: user tensors,
//!    and the keep-alives that each op holds on its inputs and outputs until its
//!    completion is observed. Memory is therefore never freed under a running kernel.

use crate::buffer::Buffer;
use crate::burst::Burst;
use crate::device::{Device, StreamId};
use crate::driver::event::PooledEvent;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sync::{lock, Arc, AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering, WaitCv};

#[cfg(not(loom))]
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    #[cfg(not(loom))]
    {
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    }
    #[cfg(loom)]
    {
        // loom atomics cannot be statics; ids only label storages in traces.
        let _ = (AtomicU64::new(0), Ordering::Relaxed);
        0
    }
}

/// The ready event of a burst of ops on one CUDA stream, set once the actor records it
/// (see `burst.rs`).
pub(crate) type EventBurst = Burst<Arc<PooledEvent>>;

/// How a published buffer becomes safe to read.
#[derive(Clone)]
pub(crate) enum Mark {
    /// The data is computed (CPU backend, uploads from host).
    Host,
    /// The data is ready once this event, recorded on `stream`, has completed. The
    /// event may not be recorded yet: its burst is still open (see `burst.rs`).
    Cuda {
        event: Arc<EventBurst>,
        stream: StreamId,
    },
}

/// A published buffer and how to wait for it.
#[derive(Clone)]
pub(crate) struct Ready {
    pub(crate) buf: Arc<Buffer>,
    pub(crate) mark: Mark,
}

enum Slot {
    Pending,
    Ready(Ready),
    Failed(Error),
    Donated,
}

/// A tensor's memory and sync state. See the module docs for the protocol.
pub(crate) struct Storage {
    pub(crate) id: u64,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    pub(crate) device: Device,
    /// The stream whose op produces this storage (`None` for host uploads on the CPU).
    pub(crate) producer: Option<StreamId>,
    /// The runtime this storage belongs to (stream ids and events are per runtime).
    pub(crate) runtime: u64,
    slot: Mutex<Slot>,
    cv: WaitCv,
    /// Set (after the slot) once the slot has left `Pending`: a lock-free answer for
    /// `Tensor::is_published`, which submitters ask about every input.
    settled: AtomicBool,
    /// Whether the producing op's envelope still holds a handle (rule 3): written and
    /// read only under `slot`'s lock.
    producer_holds: AtomicBool,
}

impl Storage {
    /// A storage its producer has yet to publish.
    pub(crate) fn pending(
        dtype: DType,
        len: usize,
        device: Device,
        producer: Option<StreamId>,
        runtime: u64,
    ) -> Self {
        Storage {
            id: next_id(),
            dtype,
            len,
            device,
            producer,
            runtime,
            slot: Mutex::new(Slot::Pending),
            settled: AtomicBool::new(false),
            producer_holds: AtomicBool::new(false),
            cv: WaitCv::new(),
        }
    }

    /// Marks a pending storage as held by its producer's envelope until that lets go
    /// ([`Storage::release_producer`]); donation does not count that handle (rule 3).
    pub(crate) fn held_by_producer(self) -> Self {
        self.producer_holds.store(true, Ordering::Relaxed);
        self
    }

    /// The producer's envelope is about to drop its handle: from now on every handle
    /// counts. Called before the handle goes, under the slot's lock, so that a
    /// concurrent [`Storage::take_unique`] never subtracts a handle that is gone.
    pub(crate) fn release_producer(&self) {
        let _g = lock(&self.slot);
        self.producer_holds.store(false, Ordering::Relaxed);
    }

    /// A storage that is ready at once (host data on the CPU backend).
    pub(crate) fn ready(buf: Buffer, device: Device, runtime: u64) -> Self {
        let s = Storage::pending(buf.dtype(), buf.len(), device, None, runtime);
        *lock(&s.slot) = Slot::Ready(Ready {
            buf: Arc::new(buf),
            mark: Mark::Host,
        });
        s.settled.store(true, Ordering::Release);
        s
    }

    /// Publishes the producer's result (rule 1). Later calls are ignored.
    pub(crate) fn publish(&self, ready: Ready) {
        let mut g = lock(&self.slot);
        if matches!(*g, Slot::Pending) {
            *g = Slot::Ready(ready);
            self.settled.store(true, Ordering::Release);
            drop(g);
            self.cv.notify_all();
        }
    }

    /// Fails the storage (rule 1). Ignored if already published or failed.
    pub(crate) fn fail(&self, err: Error) {
        let mut g = lock(&self.slot);
        if matches!(*g, Slot::Pending) {
            *g = Slot::Failed(err);
            self.settled.store(true, Ordering::Release);
            drop(g);
            self.cv.notify_all();
        }
    }

    /// Whether the producer has published or failed, without taking the lock.
    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Blocks until the producer has published or failed (rule 2).
    pub(crate) fn wait_ready(&self) -> Result<Ready> {
        let mut g = lock(&self.slot);
        loop {
            match &*g {
                Slot::Pending => g = self.cv.wait(g),
                Slot::Ready(r) => return Ok(r.clone()),
                Slot::Failed(e) => return Err(e.clone()),
                Slot::Donated => return Err(Error::Donated),
            }
        }
    }

    /// The published buffer without waiting, if there is one.
    pub(crate) fn try_ready(&self) -> Option<Result<Ready>> {
        match &*lock(&self.slot) {
            Slot::Pending => None,
            Slot::Ready(r) => Some(Ok(r.clone())),
            Slot::Failed(e) => Some(Err(e.clone())),
            Slot::Donated => Some(Err(Error::Donated)),
        }
    }

    /// Records that the producer's event has completed: later consumers on other streams
    /// need not wait on it (saves a `cuStreamWaitEvent` per use of long-lived tensors).
    pub(crate) fn mark_done(&self) {
        if let Slot::Ready(r) = &mut *lock(&self.slot) {
            r.mark = Mark::Host;
        }
    }

    /// Takes the buffer out for in-place use (rule 3), if `s` is ready and the caller's
    /// handle is the only one besides the producer's keep-alive; the buffer is returned
    /// only if no transient reader holds it either.
    pub(crate) fn take_unique(s: &Arc<Storage>) -> Option<Buffer> {
        let mut g = lock(&s.slot);
        // Under the lock the producer's flag cannot clear, so while it is set its handle
        // is still counted (it goes only after `release_producer`).
        let producer = usize::from(s.producer_holds.load(Ordering::Relaxed));
        if Arc::strong_count(s) != 1 + producer {
            return None;
        }
        Storage::take_buffer(&mut g)
    }

    /// The buffer of a `Ready` slot (the caller has checked the handles), unless a
    /// transient reader holds it: then the slot stays `Ready`.
    fn take_buffer(g: &mut MutexGuard<'_, Slot>) -> Option<Buffer> {
        if !matches!(**g, Slot::Ready(_)) {
            return None;
        }
        let Slot::Ready(r) = std::mem::replace(&mut **g, Slot::Donated) else {
            return None;
        };
        match Arc::try_unwrap(r.buf) {
            Ok(buf) => Some(buf),
            Err(buf) => {
                **g = Slot::Ready(Ready { buf, mark: r.mark });
                None
            }
        }
    }

    /// [`Storage::take_unique`] without the handle count, for the loom model of the
    /// buffer's transient readers.
    #[cfg(all(test, loom))]
    pub(crate) fn take_buffer_for_test(&self) -> Option<Buffer> {
        Storage::take_buffer(&mut lock(&self.slot))
    }
}
