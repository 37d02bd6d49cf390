//! Earliest-finish placement (StarPU's *dmda* idea), the recommended policy.
//!
//! # Queue estimates
//!
//! The policy keeps, per stream, the predicted time of the ops it placed there and that
//! have not been observed to finish. Protocol, all under one mutex:
//!
//! 1. `place` predicts the op's time with the [`CostModel`], picks the stream with the
//!    earliest estimated finish, and adds the prediction to that stream's queue, also
//!    recording it under the op's name (`pending[name] = (ops, ns)`).
//! 2. `observe(name, stream)` removes one op of that name from the stream's queue,
//!    subtracting the *average recorded prediction* of its pending ops of that name
//!    (not today's prediction, which calibration may have changed), so the sum cannot
//!    drift. An observation with nothing pending of that name (a pinned op) is ignored.
//!    A stream with no pending op has an estimate of exactly 0.
//! 3. The runtime does not report failed ops to the policy, so their predictions would
//!    stay queued. When the runtime says a stream has no queued op
//!    ([`StreamLoad::queued_ops`] = 0), `place` clears that stream's queue. (A placement
//!    by another thread that the runtime has not counted yet can be cleared too; that
//!    op is then underestimated until it finishes, and its observation is ignored.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rtx_runtime::placement::{OpInfo, Policy, StreamLoad};
use rtx_runtime::{Cost, StreamId};

use crate::cost::CostModel;

/// The default penalty per input produced on another stream.
const WAIT_PENALTY: Duration = Duration::from_micros(2);

/// Places each op on the stream where it is estimated to finish first.
///
/// For each candidate stream: the op's start — the later of the stream's queued work
/// (this policy's own calibrated estimate, see [`EarliestFinish::queued`]) and the time
/// its still-queued inputs are ready (their producers' queues) — + the op's predicted time
/// ([`CostModel::predict`]) + a penalty for each of the op's inputs produced on *another*
/// stream (a cross-stream event wait; default 2 µs). The minimum wins; ties go to the lowest index. With equal
/// loads a dependent op therefore stays on its producer's stream, and it moves to
/// another stream once the producer's is busier by more than the penalty.
///
/// The estimate does not model when the inputs become ready (the policy cannot tell
/// where in its producer's queue an input sits), so a dependent op may be placed on an
/// idle stream and wait there for its producer.
///
/// Every observed run time calibrates the cost model: on CUDA the sampled ops' device
/// times once they come ([`Policy::observe_device`], `Settings::device_timing`; the
/// first one resets the model, [`CostModel::reset`]), the host's times before (only the
/// enqueue there) and on the CPU backend (the computation).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use rtx::{Backend, Runtime};
/// use rtx::scheduler::{CostModel, EarliestFinish};
///
/// // Keep a handle on the model to inspect its calibration later.
/// let model = Arc::new(CostModel::new());
/// let policy = EarliestFinish::with_model(model.clone())
///     .with_wait_penalty(Duration::from_micros(5));
/// let rt = Runtime::builder()
///     .backend(Backend::Cpu)
///     .streams(4)
///     .policy(policy)
///     .build()?;
/// assert_eq!(rt.info().policy, "earliest-finish");
/// assert_eq!(model.total_observations(), 0);
/// # Ok::<(), rtx::Error>(())
/// ```
#[derive(Debug)]
pub struct EarliestFinish {
    model: Arc<CostModel>,
    wait_penalty: Duration,
    queues: Mutex<HashMap<StreamId, Queue>>,
    /// Set by the first device time ([`Policy::observe_device`]): from then on only
    /// device times calibrate the model.
    device_times: AtomicBool,
}

impl Default for EarliestFinish {
    fn default() -> Self {
        Self::with_model(Arc::new(CostModel::new()))
    }
}

impl EarliestFinish {
    /// With a fresh [`CostModel`] and the default 2 µs wait penalty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Predicting with `model` (which keeps being calibrated by this policy).
    pub fn with_model(model: Arc<CostModel>) -> Self {
        EarliestFinish {
            model,
            wait_penalty: WAIT_PENALTY,
            queues: Mutex::new(HashMap::new()),
            device_times: AtomicBool::new(false),
        }
    }

    /// Sets the penalty per input produced on another stream.
    pub fn with_wait_penalty(mut self, penalty: Duration) -> Self {
        self.wait_penalty = penalty;
        self
    }

    /// The penalty per input produced on another stream.
    pub fn wait_penalty(&self) -> Duration {
        self.wait_penalty
    }

    /// The cost model.
    pub fn model(&self) -> &Arc<CostModel> {
        &self.model
    }

    /// The predicted time of the ops this policy placed on `stream` that have not been
    /// observed to finish.
    pub fn queued(&self, stream: StreamId) -> Duration {
        let ns = self.lock().get(&stream).map_or(0.0, |q| q.ns);
        Duration::from_nanos(ns as u64)
    }

    /// The estimated finish of `op` on each candidate, in ns, given the queues.
    /// Estimated finish on a stream whose queue is `q`: the op starts when the stream is
    /// free and its pending inputs are ready (`ready_ns`), runs, and pays a penalty per
    /// input it must wait for from another stream.
    fn finish_ns(
        &self,
        q: &Queue,
        load: &StreamLoad,
        op: &OpInfo<'_>,
        run_ns: f64,
        ready_ns: f64,
    ) -> f64 {
        let waits = op.input_streams.iter().filter(|s| **s != load.id).count();
        q.ns.max(ready_ns) + run_ns + waits as f64 * self.wait_penalty.as_nanos() as f64
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<StreamId, Queue>> {
        // The queues hold plain numbers, consistent after every statement: a panic
        // elsewhere cannot leave them half-updated, so poisoning is ignored.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Policy for EarliestFinish {
    fn name(&self) -> &'static str {
        "earliest-finish"
    }

    fn place(&self, op: &OpInfo<'_>, streams: &[StreamLoad]) -> usize {
        let run_ns = self.model.predict_ns(op.name, op.cost);
        let mut queues = self.lock();
        // Inputs whose producers are still queued are ready, at the earliest, when their
        // streams' queued work is done (the producer may be last in its queue).
        let ready_ns = op
            .pending_input_streams
            .iter()
            .map(|s| queues.get(s).map_or(0.0, |q| q.ns))
            .fold(0.0, f64::max);
        let mut best = (0, f64::INFINITY);
        for (i, load) in streams.iter().enumerate() {
            let q = queues.entry(load.id).or_default();
            if load.queued_ops == 0 {
                q.clear();
            }
            let t = self.finish_ns(q, load, op, run_ns, ready_ns);
            if t < best.1 {
                best = (i, t);
            }
        }
        if let Some(load) = streams.get(best.0) {
            queues.entry(load.id).or_default().push(op.name, run_ns);
        }
        best.0
    }

    fn observe(&self, name: &str, cost: Cost, stream: StreamId, took: Duration) {
        // Host times calibrate the model until device times come (CUDA: they are only
        // the enqueue; on the CPU backend they are the computation and no device time
        // ever comes).
        if !self.device_times.load(Ordering::Relaxed) {
            self.model.observe(name, cost, took);
        }
        if let Some(q) = self.lock().get_mut(&stream) {
            q.pop(name);
        }
    }

    fn observe_device(&self, name: &str, cost: Cost, _stream: StreamId, device: Duration) {
        // The first device time: what the host times taught (enqueue costs) goes.
        if !self.device_times.swap(true, Ordering::Relaxed) {
            self.model.reset();
        }
        self.model.observe(name, cost, device);
    }
}

/// One stream's placed, unfinished ops.
#[derive(Debug, Default)]
struct Queue {
    /// Their total predicted time.
    ns: f64,
    /// Their count.
    ops: u64,
    /// Count and total prediction per op name.
    pending: HashMap<String, Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    ops: u64,
    ns: f64,
}

impl Queue {
    fn push(&mut self, name: &str, ns: f64) {
        let p = match self.pending.get_mut(name) {
            Some(p) => p,
            None => self.pending.entry(name.to_string()).or_default(),
        };
        p.ops += 1;
        p.ns += ns;
        self.ops += 1;
        self.ns += ns;
    }

    /// Removes one op named `name`, if one is pending.
    fn pop(&mut self, name: &str) {
        let Some(p) = self.pending.get_mut(name).filter(|p| p.ops > 0) else {
            return;
        };
        let ns = p.ns / p.ops as f64;
        p.ops -= 1;
        p.ns = if p.ops == 0 {
            0.0
        } else {
            (p.ns - ns).max(0.0)
        };
        self.ops -= 1;
        self.ns = if self.ops == 0 {
            0.0
        } else {
            (self.ns - ns).max(0.0)
        };
    }

    fn clear(&mut self) {
        self.ns = 0.0;
        self.ops = 0;
        for p in self.pending.values_mut() {
            *p = Pending::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_sums_do_not_drift() {
        let mut q = Queue::default();
        q.push("a", 10.0);
        q.push("a", 30.0);
        q.push("b", 0.1);
        q.pop("a");
        assert_eq!((q.ops, q.ns), (2, 20.1));
        q.pop("zzz"); // never pushed: ignored
        q.pop("a");
        q.pop("a"); // nothing left of "a": ignored
        assert_eq!(q.ops, 1);
        q.pop("b");
        assert_eq!((q.ops, q.ns), (0, 0.0));
    }

    #[test]
    fn cleared_when_the_runtime_reports_an_empty_stream() {
        let p = EarliestFinish::new();
        let op = OpInfo {
            name: "x",
            cost: Cost::default(),
            input_streams: &[],
            pending_input_streams: &[],
        };
        let busy = [StreamLoad {
            id: StreamId::new(0),
            queued_ops: 1,
            queued_ns: 0,
        }];
        p.place(&op, &busy);
        p.place(&op, &busy);
        assert_eq!(p.queued(StreamId::new(0)), Duration::from_micros(10));
        // An op failed (never observed); the runtime now says the stream is empty.
        let idle = [StreamLoad {
            queued_ops: 0,
            ..busy[0].clone()
        }];
        p.place(&op, &idle);
        assert_eq!(p.queued(StreamId::new(0)), Duration::from_micros(5));
    }
}
