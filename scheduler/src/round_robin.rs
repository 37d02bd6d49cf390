//! Round-robin placement: each op goes to the next stream in turn.

use std::sync::atomic::{AtomicUsize, Ordering};

use rtx_runtime::placement::{OpInfo, Policy, StreamLoad};

/// Places ops on the candidate streams in turn, ignoring load and inputs.
///
/// One shared counter: concurrent submitters each take the next slot. Useful as a
/// baseline and for spreading many independent, equal ops.
///
/// # Examples
///
/// ```
/// use rtx::{Backend, Runtime};
/// use rtx::scheduler::RoundRobin;
///
/// let rt = Runtime::builder()
///     .backend(Backend::Cpu)
///     .streams(4)
///     .policy(RoundRobin::default())
///     .build()?;
/// assert_eq!(rt.info().policy, "round-robin");
/// # Ok::<(), rtx::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    /// A round-robin policy starting at the first stream.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn place(&self, _op: &OpInfo<'_>, streams: &[StreamLoad]) -> usize {
        // Relaxed: the counter only spreads ops; it orders nothing else.
        self.next.fetch_add(1, Ordering::Relaxed) % streams.len().max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtx_runtime::{Cost, StreamId};

    #[test]
    fn cycles() {
        let p = RoundRobin::new();
        let loads: Vec<StreamLoad> = (0..3)
            .map(|i| StreamLoad {
                id: StreamId::new(i),
                queued_ops: 0,
                queued_ns: 0,
            })
            .collect();
        let op = OpInfo {
            name: "x",
            cost: Cost::default(),
            input_streams: &[],
            pending_input_streams: &[],
        };
        let got: Vec<usize> = (0..7).map(|_| p.place(&op, &loads)).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0]);
    }
}
