//! The completion watcher of a CUDA stream actor (protocol in `cuda/mod.rs`, step 3):
//! it synchronizes the bursts' events in FIFO order, completes the ops, and hands their
//! keep-alives back to the actor.

use std::time::Duration;

use crate::completion::Payload;
use crate::driver::event::RawEvent;
use crate::driver::DeviceShared;
use crate::error::{Error, Result};
use crate::job::{Envelope, Msg};
use crate::mailbox::{Sender, TrySendError};
use crate::stats::{Counters, Phase};
use crate::storage::EventBurst;
use crate::sync::Arc;

/// An enqueued op waiting for its burst's event.
pub(super) struct Watch {
    pub(super) env: Envelope,
    pub(super) burst: Arc<EventBurst>,
    pub(super) finisher: Option<Box<dyn FnOnce() -> Result<Payload> + Send>>,
    pub(super) took: Duration,
    /// The op's timing events, when the runtime records a timeline.
    pub(super) timing: Option<super::timing::OpTiming>,
    /// The op's timing events when it is one of the sampled ops
    /// (`Settings::device_timing`) and no timeline is recorded.
    pub(super) sample: Option<super::timing::Sample>,
}

/// Ops completed per synchronization at most (bounds how long the oldest op of a batch
/// waits for the newest).
const WATCH_BATCH: usize = 32;

/// The watcher loop: takes every watch queued so far (up to [`WATCH_BATCH`]), waits for
/// the newest one's event only — stream order means every earlier op on this stream has
/// finished once it has — then completes them all in FIFO order. Under load this makes
/// one driver call per batch instead of two per op; the actor shares the driver's locks
/// with this thread, so fewer calls here make its launches cheaper.
pub(super) fn watch(
    wrx: &crossbeam_channel::Receiver<Vec<Watch>>,
    release: &Sender<Msg>,
    dev: &DeviceShared,
    policy: &dyn crate::placement::Policy,
    sid: crate::device::StreamId,
    counters: &Counters,
) {
    while let Ok(mut batch) = wrx.recv() {
        while batch.len() < WATCH_BATCH {
            match wrx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        let newest = batch.last().expect("one watch at least");
        let mut t = counters.clock();
        // The actor records a burst's event before handing its ops over.
        let r = match newest.burst.get() {
            Some(Ok(ev)) => wait_event(ev.event()),
            _ => Err(cudarc::driver::DriverError(
                cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NOT_READY,
            )),
        };
        counters.lap(Phase::WatchWait, &mut t);
        let mut done = Vec::with_capacity(batch.len());
        for w in batch.drain(..) {
            done.push(finish(w, r, dev, policy, sid, counters));
            counters.lap(Phase::WatchFinish, &mut t);
        }
        // The keep-alives go back to the actor, which frees them between its own driver
        // calls; if its mailbox is full or gone, they are dropped here.
        match release.try_send(Msg::Release(done)) {
            Ok(()) => {}
            Err(TrySendError::Full(m) | TrySendError::Closed(m)) => drop(m),
        }
    }
}

/// Completes one op whose event (or a later one on its stream) was waited for with
/// result `r`, then releases its keep-alive.
fn finish(
    mut w: Watch,
    r: Result<(), cudarc::driver::DriverError>,
    dev: &DeviceShared,
    policy: &dyn crate::placement::Policy,
    sid: crate::device::StreamId,
    counters: &Counters,
) -> Envelope {
    match r {
        Ok(()) => {
            // The policy hears of every op (host time), and of a timed op's device time.
            let device = match (&w.timing, &w.sample) {
                (Some(t), _) => t.device_time(),
                (None, Some(s)) => s.device_time(),
                (None, None) => None,
            };
            if let Some(t) = w.timing.take() {
                t.resolve(w.env.name(), &counters.trace);
            }
            crate::actor::observe(policy, w.env.name(), w.env.cost, sid, w.took);
            if let Some(d) = device {
                let (name, cost) = (w.env.name(), w.env.cost);
                crate::actor::policy_call(name, "observe_device", || {
                    policy.observe_device(name, cost, sid, d)
                });
            }
            let name = w.env.name();
            let payload = w
                .finisher
                .take()
                .map(|f| crate::actor::run_finisher(name, f))
                .transpose();
            for s in &w.env.outputs {
                s.mark_done();
            }
            if let Some(c) = w.env.completion.take() {
                c.finish(payload);
            }
        }
        Err(e) => {
            dev.poison(format!("{e} (detected after `{}`)", w.env.name()));
            let err = dev.poisoned().unwrap_or(Error::synchronization(e));
            w.env.fail(err);
        }
    }
    // The envelope (the op and its inputs) is released by the caller — after the device
    // has finished with them; the event goes back to its pool here.
    w.env
}

/// Waits for an event: one non-blocking query first (when the GPU is ahead of the
/// watcher, which is the common case under load, this skips a sleep and a wake-up per
/// op), then a blocking sync in the driver, without spinning: a spinning watcher would
/// contend with its actor for the driver's locks.
fn wait_event(e: &RawEvent) -> Result<(), cudarc::driver::DriverError> {
    match e.query() {
        Ok(true) => Ok(()),
        Ok(false) => e.synchronize(),
        Err(err) => Err(err),
    }
}
