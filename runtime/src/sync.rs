//! The synchronization shim: std's primitives normally, loom's under `--cfg loom`.
//!
//! Everything in the runtime that is shared between the submitting threads, the stream
//! actors and the completion watchers goes through these names, so the loom tests
//! (`runtime/tests/loom_*.rs`) model-check the real protocol code rather than a copy.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
#[cfg(loom)]
pub(crate) use loom::thread;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
#[cfg(not(loom))]
pub(crate) use std::thread;

/// Locks a mutex, ignoring poisoning: the runtime's critical sections never panic while
/// holding a lock (op code runs outside them), so a poisoned lock still guards valid state.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Waits on a condition variable, ignoring poisoning (see [`lock`]).
pub(crate) fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    match cv.wait(g) {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// A condition variable that skips the wake-up when nobody waits: std's `notify_all`
/// is a system call (a futex wake) even then, and the runtime notifies once per
/// published output and once per completed op, almost always with no waiter.
///
/// A waiter counts itself in while it holds the mutex, before it sleeps, and out once
/// woken (holding the mutex again). A notifier changes the guarded state under the same
/// mutex and reads the count after that (before or after unlocking): a waiter that
/// counted itself in did so before the notifier took the mutex, so the notifier sees it;
/// one that comes later sees the new state and does not sleep. Loom checks it through
/// the storage and completion models (`loom_tests.rs`).
pub(crate) struct WaitCv {
    cv: Condvar,
    waiters: AtomicUsize,
}

impl WaitCv {
    pub(crate) fn new() -> Self {
        WaitCv {
            cv: Condvar::new(),
            waiters: AtomicUsize::new(0),
        }
    }

    /// Sleeps until notified (or spuriously): call in a loop over the guarded state.
    pub(crate) fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        // Relaxed: the mutex orders these against the notifier's read (see above).
        self.waiters.fetch_add(1, Ordering::Relaxed);
        let g = wait(&self.cv, g);
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        g
    }

    /// Wakes every waiter, if there is one.
    pub(crate) fn notify_all(&self) {
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.cv.notify_all();
        }
    }
}
