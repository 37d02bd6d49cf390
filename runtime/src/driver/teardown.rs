//! One driver teardown at a time, process-wide.

/// Runs `f` holding [`TEARDOWN`]; on a thread that already holds it (a teardown step
/// that drops the last reference to something that tears down too), just runs `f`.
pub(crate) fn teardown_serialized<R>(f: impl FnOnce() -> R) -> R {
    thread_local! {
        static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    /// Clears `HELD` when the teardown step ends, also by unwinding.
    struct Held;
    impl Drop for Held {
        fn drop(&mut self) {
            HELD.with(|h| h.set(false));
        }
    }
    if HELD.with(|h| h.get()) {
        return f();
    }
    let _one = TEARDOWN.lock().unwrap_or_else(|p| p.into_inner());
    HELD.with(|h| h.set(true));
    let _held = Held;
    f()
}

/// Held by an exiting actor while it unregisters its memory and drops its stream and
/// library handles, and by a pinned staging cache while it frees its blocks
/// ([`teardown_serialized`]). Dropping a cuBLAS or cuDNN handle synchronizes the whole
/// context (`cuCtxSynchronize`); on the H200 (driver 580.159), with the actors of one
/// runtime doing that and destroying their streams and events all at once while other
/// runtimes ran, the driver deadlocked in GPU runs 20-21 (stacks in
/// `benches/RESULTS.md`). Teardown is rare and short, so serializing it costs nothing
/// that matters.
static TEARDOWN: std::sync::Mutex<()> = std::sync::Mutex::new(());
