//! `RTX_TEST_SHARD`: a long test split over processes (the sanitizer runs of
//! `benches/gpu/run sanitize`). Shared by the test helpers of rtx-ops and rtx-train
//! (`train/tests/common/mod.rs` includes this file).

/// The cases of `cases` this process runs: all of them, or with `RTX_TEST_SHARD=i/n`
/// those whose index is `i` modulo `n` (the sanitizer runs split a long test into
/// processes of their own: `benches/gpu/run sanitize`). A malformed value panics.
pub fn shard<T: Copy>(cases: &[T]) -> Vec<T> {
    // Unset or empty (the sanitizer runner sets it empty for unsplit runs): all cases.
    let v = std::env::var("RTX_TEST_SHARD").unwrap_or_default();
    if v.is_empty() {
        return cases.to_vec();
    }
    let parsed = v
        .split_once('/')
        .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
        .filter(|&(i, n)| n > 0 && i < n);
    let Some((i, n)) = parsed else {
        panic!("RTX_TEST_SHARD={v}: expected i/n with i < n");
    };
    eprintln!(
        "RTX_TEST_SHARD={v}: cases {i}, {i}+{n}, ... of {}",
        cases.len()
    );
    cases
        .iter()
        .enumerate()
        .filter(|(k, _)| k % n == i)
        .map(|(_, c)| *c)
        .collect()
}
