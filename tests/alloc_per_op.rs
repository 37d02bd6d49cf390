//! Heap allocations per op on the eager path, counted by a counting global allocator on
//! the CPU backend: a chain of tiny dependent adds (the tiny-op chain of
//! `benches/overhead.rs`) after a warm-up, every thread of the process counted (the
//! submitting thread, the stream actor, rayon), and the submitting thread's share
//! apart. Run with `--nocapture` to see the counts.
//!
//! The bounds are what the eager path needs today for `add(&x, &a)` (measured: 23 per
//! op before the eager-path work of issue 13, 9 after). On the submitting thread, 5: the
//! op's input list (`Op::inputs` returns a `Vec`), its plan's output list
//! (`Plan::outputs`), the output's storage, the completion and the boxed job. On the
//! actor, 3: the op's input list again (built once there, for the waits and `run`), the
//! output's data (a fresh `Vec` on the CPU) and the published buffer's `Arc`; plus one
//! in builds with debug assertions (the CPU kernel's `debug_assert` on the broadcast
//! shape). Nothing of the runtime's own bookkeeping (placement, input scans, the
//! execution context, the output lists, shapes of up to 2 dims, tensor handles)
//! allocates in steady state. A change that adds an allocation per op fails here.
//!
//! One test in this binary: the counter is process-wide, and another test running
//! beside it would count too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use rtx::ops::elementwise as ew;
use rtx::Runtime;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static HERE: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    ALLOCS.fetch_add(1, Relaxed);
    // `try_with`: the thread-local may be gone while a thread exits.
    let _ = HERE.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is forwarded to `System` unchanged (same layout, same pointer);
// the counting touches only an atomic and a const-initialized thread-local `Cell`
// (no allocation, no re-entry into the allocator).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout (the caller upholds `alloc`'s contract).
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count();
        // SAFETY: `p` was allocated by `System` with layout `l` (every allocation here is).
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` was allocated by `System` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const LEN: usize = 16;
const WARM: usize = 1000;
const OPS: usize = 1000;

/// Submits `n` dependent adds `x = x + a` on `s` and waits for the last; the result.
fn chain(rt: &Runtime, s: rtx::StreamId, x: rtx::Tensor, a: &rtx::Tensor, n: usize) -> rtx::Tensor {
    let mut x = x;
    for _ in 0..n {
        x = rt
            .submit_on(s, ew::add(&x, a))
            .expect("submit")
            .into_outputs()
            .expect("one output");
    }
    x
}

#[test]
fn the_eager_path_allocates_a_bounded_number_of_times_per_op() {
    let rt = Runtime::cpu(2);
    let s = rt.compute_streams(rt.device())[0];
    let av: Vec<f32> = (0..LEN).map(|i| i as f32 * 0.25 - 1.0).collect();
    let a = rt.upload(&av, [LEN]).expect("upload");
    let x = chain(&rt, s, a.clone(), &a, WARM);
    let x0 = rt
        .to_vec::<f32>(&x)
        .expect("download")
        .wait()
        .expect("warm-up");

    let (before, here_before) = (ALLOCS.load(Relaxed), HERE.with(Cell::get));
    let x = chain(&rt, s, x, &a, OPS);
    // The last op's completion: every op of the chain has run.
    let x = rt
        .submit_on(s, ew::add(&x, &a))
        .expect("submit")
        .wait()
        .expect("chain");
    let (after, here_after) = (ALLOCS.load(Relaxed), HERE.with(Cell::get));
    let total = (after - before) as f64 / (OPS + 1) as f64;
    let submit = (here_after - here_before) as f64 / (OPS + 1) as f64;
    println!(
        "allocations per op: {total:.3} in all, {submit:.3} on the submitting thread, {:.3} elsewhere ({} allocations over {} ops)",
        total - submit,
        after - before,
        OPS + 1
    );

    // The chain computed what it should: x0 + (OPS + 1) * a, elementwise.
    let v = rt
        .to_vec::<f32>(&x)
        .expect("download")
        .wait()
        .expect("result");
    for i in 0..LEN {
        let want = x0[i] as f64 + (OPS + 1) as f64 * av[i] as f64;
        assert!(
            (v[i] as f64 - want).abs() <= 1e-3 * want.abs().max(1.0),
            "element {i}: {} against {want}",
            v[i]
        );
    }
    // Per op: a few one-off allocations in the window (a waker list or a cache growing
    // once, depending on timing; a CI run saw 9.001 per op) are not the eager path's, and
    // one more allocation per op still fails.
    let slack = ONE_OFF as f64 / (OPS + 1) as f64;
    assert!(
        submit <= SUBMIT_BOUND + slack,
        "{submit:.3} allocations per submit"
    );
    assert!(
        total <= TOTAL_BOUND + slack,
        "{total:.3} allocations per op"
    );
}

/// Allocations in the counted window that are not per op (see the assertions).
const ONE_OFF: u64 = 16;

/// Allocations per op on the submitting thread (see the module docs).
const SUBMIT_BOUND: f64 = 5.0;
/// Allocations per op on all threads (8 without debug assertions).
const TOTAL_BOUND: f64 = 9.0;
