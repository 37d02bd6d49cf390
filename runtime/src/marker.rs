//! Timing markers: a point in a stream's order, timed on the device.
//!
//! `rt.mark(stream)` enqueues a marker; once it completes it yields a [`Marker`]. The time
//! between two markers on one stream is the time the stream took from one to the other
//! (CUDA: timing events; CPU: host clock when the actor reached the marker): the device
//! time of the ops between them when the host enqueued them faster than the device ran
//! them, and otherwise also the gaps where the device waited for the next op.
//! Benchmarks use this to time with CUDA events after warm-up.

use std::time::Instant;

use crate::completion::{Payload, Submission};
use crate::device::StreamId;
use crate::error::{Error, Result};
use crate::op::{BackendCx, Cost, ExecCx, Op, Plan, PlanCx};
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// A completed timing marker. See [`Runtime::mark`].
pub struct Marker(Inner);

enum Inner {
    Host(Instant),
    Cuda(cudarc::driver::CudaEvent),
}

impl Marker {
    /// Milliseconds from `self` to `later`, both of one device (`later` after `self`).
    /// On one stream that is the stream's time between them; markers of two streams of
    /// a device compare on its one clock (CUDA events of one context), so the span of
    /// work spread over several streams is the earliest start to the latest end.
    pub fn elapsed_ms(&self, later: &Marker) -> Result<f64> {
        match (&self.0, &later.0) {
            (Inner::Host(a), Inner::Host(b)) => Ok(b.duration_since(*a).as_secs_f64() * 1e3),
            (Inner::Cuda(a), Inner::Cuda(b)) => a
                .elapsed_ms(b)
                .map(|ms| ms as f64)
                .map_err(|e| Error::cuda("cuEventElapsedTime", e)),
            _ => Err(Error::invalid("mark", "markers from different backends")),
        }
    }
}

struct Mark;

impl Op for Mark {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        "mark"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan {
            outputs: vec![],
            cost: Cost::default(),
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let m = match cx.backend() {
            BackendCx::Cpu => Inner::Host(Instant::now()),
            BackendCx::Cuda(scx) => {
                let ev = scx
                    .context()
                    .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .and_then(|e| e.record(scx.stream()).map(|_| e))
                    .map_err(|e| Error::cuda("cuEventRecord", e))?;
                Inner::Cuda(ev)
            }
        };
        cx.finish_with(Box::new(move || Ok(Box::new(Marker(m)) as Payload)));
        Ok(())
    }
}

impl Runtime {
    /// Enqueues a timing marker on `stream`; the submission yields it once reached.
    pub fn mark(&self, stream: StreamId) -> Result<Submission<Marker>> {
        self.submit_payload(stream, Mark)
    }
}
