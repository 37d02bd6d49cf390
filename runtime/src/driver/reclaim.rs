//! Out of memory inside a library (cuBLAS, cuBLASLt, cuDNN): empty the caches, retry once.
//!
//! The libraries allocate some device memory of their own (cuDNN's graph engines,
//! cuBLAS's internal buffers when it has no workspace set). When that fails they return
//! an allocation status (`CUBLAS_STATUS_ALLOC_FAILED`,
//! `CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED` and its host twin) rather than
//! `CUDA_ERROR_OUT_OF_MEMORY`, so the allocator's own out-of-memory path (`alloc_in` in
//! `alloc.rs`) never sees it, though the memory rtx keeps in its block caches and pools
//! may be exactly what the library was missing.
//!
//! [`retry_after_reclaim`] is the policy, generic so that it is tested without a device:
//! run the call; on an allocation failure, reclaim and run it once more; any other error
//! passes through unretried. [`Reclaimer`] is the reclaim step for one stream actor,
//! the same as the allocator's: this stream's cached blocks freed, its work waited for,
//! its pool and the default pool trimmed; then every stream's caches and pools of the
//! device, after the whole device's work. [`Reclaimer::retry`] puts the two together for
//! a library call whose errors are rtx [`Error`]s: a second allocation failure is
//! [`Error::OutOfMemory`] (`requested` 0: the library does not say how much it wanted;
//! `available` the device's free bytes after the reclaim), so a caller matches one
//! variant for out of memory wherever it happened. The library's status is logged.
//!
//! Inside a graph capture (`capture.rs`) nothing is reclaimed (it would synchronize the
//! capturing stream): the first failure is returned as it is.

use std::sync::{Arc as StdArc, Weak};

use cudarc::driver::CudaStream;

use super::alloc::{reclaim_device, reclaim_stream, StreamMem};
use super::DeviceShared;
use crate::error::{CublasStatus, Error, Result};

/// Runs `call`; if it fails with an error `is_alloc_failure` accepts, runs `reclaim`
/// and then `call` once more, returning that second result. Any other error is
/// returned at once, without reclaiming or retrying.
pub fn retry_after_reclaim<T, E>(
    mut call: impl FnMut() -> std::result::Result<T, E>,
    is_alloc_failure: impl Fn(&E) -> bool,
    reclaim: impl FnOnce(),
) -> std::result::Result<T, E> {
    match call() {
        Err(e) if is_alloc_failure(&e) => {
            reclaim();
            call()
        }
        r => r,
    }
}

/// Whether `e` is a library's report that it could not allocate memory: cuBLAS or
/// cuBLASLt `CUBLAS_STATUS_ALLOC_FAILED`, cuDNN `CUDNN_STATUS_ALLOC_FAILED` (cuDNN 8) or
/// `CUDNN_STATUS_INTERNAL_ERROR_{DEVICE,HOST}_ALLOCATION_FAILED` (cuDNN 9).
pub fn is_library_alloc_failure(e: &Error) -> bool {
    use cudarc::cudnn::sys::cudnnStatus_t as S;
    match e {
        Error::Cublas { status, .. } => *status == CublasStatus::ALLOC_FAILED,
        Error::Cudnn { status, .. } => matches!(
            status,
            S::CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                | S::CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED
        ),
        _ => false,
    }
}

/// The reclaim step of one stream actor's out-of-memory path, detached from its
/// [`StreamCx`](super::StreamCx) so that library state kept in the stream's `ext`
/// (which borrows the `StreamCx`) can hold one ([`StreamCx::reclaimer`](super::StreamCx::reclaimer)).
/// It holds the stream and weak handles to the actor's memory and device: after the
/// actor is gone it reclaims what is left.
#[derive(Clone)]
pub struct Reclaimer {
    stream: StdArc<CudaStream>,
    mem: Option<Weak<StreamMem>>,
    dev: Weak<DeviceShared>,
}

impl Reclaimer {
    pub(crate) fn new(
        stream: StdArc<CudaStream>,
        mem: Option<&StdArc<StreamMem>>,
        dev: &StdArc<DeviceShared>,
    ) -> Self {
        Reclaimer {
            stream,
            mem: mem.map(StdArc::downgrade),
            dev: StdArc::downgrade(dev),
        }
    }

    /// Gives back the memory rtx keeps on this device: this stream's cached blocks
    /// (after its work), then every stream's of the device (after the device's work),
    /// every pool trimmed. Blocks the thread until the device is idle. Does nothing
    /// inside a graph capture.
    pub fn reclaim(&self) {
        if super::capture::active() {
            return;
        }
        let mem = self.mem.as_ref().and_then(Weak::upgrade);
        reclaim_stream(mem.as_ref(), &self.stream);
        let dev = self.dev.upgrade();
        reclaim_device(dev.as_deref().map(|d| &*d.mem), &self.stream);
    }

    /// Runs a library call with the policy of [`retry_after_reclaim`] (an allocation
    /// failure: [`Reclaimer::reclaim`], then once more); a second allocation failure is
    /// [`Error::OutOfMemory`] (see the module docs of `runtime/src/driver/reclaim.rs`).
    pub fn retry<T>(&self, call: impl FnMut() -> Result<T>) -> Result<T> {
        if super::capture::active() {
            let mut call = call;
            return call();
        }
        retry_after_reclaim(call, is_library_alloc_failure, || self.reclaim()).map_err(|e| {
            if !is_library_alloc_failure(&e) {
                return e;
            }
            tracing::warn!(error = %e, "a library ran out of memory after the caches were emptied");
            let ctx = self.stream.context();
            Error::OutOfMemory {
                device: crate::device::Device::Cuda(ctx.ordinal()),
                requested: 0,
                available: ctx.mem_get_info().map(|(free, _)| free).unwrap_or(0),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[derive(Debug, PartialEq)]
    enum E {
        Alloc,
        Other,
    }

    fn alloc(e: &E) -> bool {
        *e == E::Alloc
    }

    #[test]
    fn a_reclaim_that_frees_enough_makes_the_retry_succeed() {
        let free = Cell::new(false);
        let calls = Cell::new(0);
        let reclaims = Cell::new(0);
        let r = retry_after_reclaim(
            || {
                calls.set(calls.get() + 1);
                if free.get() {
                    Ok(7)
                } else {
                    Err(E::Alloc)
                }
            },
            alloc,
            || {
                reclaims.set(reclaims.get() + 1);
                free.set(true);
            },
        );
        assert_eq!(r, Ok(7));
        assert_eq!((calls.get(), reclaims.get()), (2, 1));
    }

    #[test]
    fn a_reclaim_that_does_not_help_fails_after_one_retry() {
        let calls = Cell::new(0);
        let reclaims = Cell::new(0);
        let r: std::result::Result<u8, E> = retry_after_reclaim(
            || {
                calls.set(calls.get() + 1);
                Err(E::Alloc)
            },
            alloc,
            || reclaims.set(reclaims.get() + 1),
        );
        assert_eq!(r, Err(E::Alloc));
        assert_eq!(
            (calls.get(), reclaims.get()),
            (2, 1),
            "one reclaim, one retry"
        );
    }

    #[test]
    fn other_errors_and_successes_pass_through_unretried() {
        for first in [Err(E::Other), Ok(3)] {
            let calls = Cell::new(0);
            let reclaims = Cell::new(0);
            let want = format!("{first:?}");
            let mut once = Some(first);
            let r = retry_after_reclaim(
                || {
                    calls.set(calls.get() + 1);
                    once.take().unwrap_or(Ok(99))
                },
                alloc,
                || reclaims.set(reclaims.get() + 1),
            );
            assert_eq!(format!("{r:?}"), want);
            assert_eq!((calls.get(), reclaims.get()), (1, 0));
        }
    }

    #[test]
    fn library_alloc_statuses_are_recognized() {
        use cudarc::cudnn::sys::cudnnStatus_t as S;
        assert!(is_library_alloc_failure(&Error::cublas(
            "cublasLtMatmul",
            cudarc::cublaslt::sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED
        )));
        assert!(is_library_alloc_failure(&Error::cudnn(
            "cudnnBackendExecute",
            S::CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED,
            "",
        )));
        assert!(is_library_alloc_failure(&Error::cudnn(
            "cudnnFind",
            S::CUDNN_STATUS_ALLOC_FAILED,
            "",
        )));
        assert!(!is_library_alloc_failure(&Error::cublas(
            "cublasLtMatmul",
            cudarc::cublaslt::sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED
        )));
        assert!(!is_library_alloc_failure(&Error::cudnn(
            "cudnnFind",
            S::CUDNN_STATUS_BAD_PARAM,
            "",
        )));
        assert!(!is_library_alloc_failure(&Error::invalid("op", "x")));
    }
}
