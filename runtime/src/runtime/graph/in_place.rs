//! Graph states updated in place: which states a capture lends to the op producing their
//! update ([`lend_plan`]). `segment.rs` lends them during the capture (the op takes a
//! lent buffer through [`ExecCx::donate`](crate::ExecCx::donate), reads it through
//! `ExecCx::input` until then) and checks that a taken buffer became the update's output.

use std::collections::HashMap;

use super::record::Recorded;
use super::segment::Shared;

/// States updated in place: by op (index in the segment), the states whose buffers the
/// capture lends that op for donation, each as (placeholder key, the index among the
/// op's outputs of the state's update). A state qualifies when this segment commits it,
/// its update is an output of an op of this segment that reads the state exactly once,
/// no later op of the segment reads the state, and that value updates no other state.
/// The op, donating the state, writes the update into the state's own buffer: the state
/// needs no copy at the launch's end (a captured training step's parameters, moments
/// and masters: a copy of every one of them per launch otherwise). The state's other
/// readers come before it on the same stream (a state is read on one stream only), so
/// they read the old value, as with the copy; later readers of the value read the
/// state's buffer, which holds it.
pub(crate) fn lend_plan(
    ops: &[Recorded],
    shared: &Shared,
    commits: &[usize],
) -> HashMap<usize, Vec<(usize, usize)>> {
    let mut plan: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
    for &i in commits {
        let (state, value) = shared.commits[i];
        if state == value || shared.commits.iter().filter(|c| c.1 == value).count() != 1 {
            continue;
        }
        let Some(p) = ops.iter().position(|r| r.outs.contains(&value)) else {
            continue;
        };
        let j = ops[p]
            .outs
            .iter()
            .position(|k| *k == value)
            .expect("found above");
        let reads = ops[p].declared.iter().filter(|k| **k == state).count();
        if reads != 1 || ops[p + 1..].iter().any(|r| r.declared.contains(&state)) {
            continue;
        }
        plan.entry(p).or_default().push((state, j));
    }
    plan
}
