//! Least-loaded placement: the stream with the fewest queued ops.

use rtx_runtime::placement::{OpInfo, Policy, StreamLoad};

/// Places each op on the stream with the fewest queued ops; ties go to the lowest
/// estimated queued time ([`StreamLoad::queued_ns`], the runtime's rough estimate), then
/// to the lowest index.
///
/// Ignores where the inputs are, so dependent ops may wait on other streams; prefer
/// [`EarliestFinish`](crate::EarliestFinish) when ops depend on each other.
///
/// # Examples
///
/// ```
/// use rtx::{Backend, Runtime};
/// use rtx::scheduler::LeastLoaded;
///
/// let rt = Runtime::builder()
///     .backend(Backend::Cpu)
///     .streams(4)
///     .policy(LeastLoaded)
///     .build()?;
/// assert_eq!(rt.info().policy, "least-loaded");
/// # Ok::<(), rtx::Error>(())
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least-loaded"
    }

    fn place(&self, _op: &OpInfo<'_>, streams: &[StreamLoad]) -> usize {
        // `min_by_key` keeps the first of equal keys, so the index breaks ties.
        streams
            .iter()
            .enumerate()
            .min_by_key(|(_, l)| (l.queued_ops, l.queued_ns))
            .map_or(0, |(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtx_runtime::{Cost, StreamId};

    fn load(i: usize, ops: usize, ns: u64) -> StreamLoad {
        StreamLoad {
            id: StreamId::new(i),
            queued_ops: ops,
            queued_ns: ns,
        }
    }

    fn place(loads: &[StreamLoad]) -> usize {
        let op = OpInfo {
            name: "x",
            cost: Cost::default(),
            input_streams: &[StreamId::new(0)],
            pending_input_streams: &[],
        };
        LeastLoaded.place(&op, loads)
    }

    #[test]
    fn fewest_ops_then_least_time_then_index() {
        assert_eq!(place(&[load(0, 3, 0), load(1, 1, 900), load(2, 2, 0)]), 1);
        assert_eq!(
            place(&[load(0, 2, 500), load(1, 2, 100), load(2, 2, 300)]),
            1
        );
        assert_eq!(place(&[load(0, 1, 100), load(1, 1, 100)]), 0);
    }
}
