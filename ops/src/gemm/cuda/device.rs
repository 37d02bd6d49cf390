//! Library-side pieces the GEMM and convolution ops share: raw device pointers and
//! their alignment, scratch (workspace) memory, library presence probes, and the
//! mapping of cuBLAS / cuDNN status codes to [`Error`]. (Output allocation, poisoning
//! and dtype dispatch are the crate-wide ones in `kernels.rs`.)

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use rtx_runtime::{Error, Result};

/// Uninitialized device scratch memory (a library workspace) of `bytes` bytes,
/// stream-ordered on `stream`, through the runtime's allocator (out of memory trims the
/// pool and retries, then is [`Error::OutOfMemory`]).
pub(crate) fn scratch(stream: &Arc<CudaStream>, bytes: usize) -> Result<CudaSlice<u8>> {
    // SAFETY: the memory is only handed to library calls as a workspace, and those
    // never read workspace bytes they have not written in the same call.
    unsafe { rtx_runtime::cuda::alloc_uninit::<u8>(stream, bytes.max(1)) }
}

/// The raw address of a device slice, for library calls enqueued on `stream`. Keep the
/// guard alive until the call has been enqueued (it records cudarc's read event when
/// event tracking is on; the runtime turns tracking off).
pub(crate) fn dptr<'a, T>(s: &'a CudaSlice<T>, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
    s.device_ptr(stream)
}

/// Like [`dptr`], for a slice the call writes.
pub(crate) fn dptr_mut<'a, T>(
    s: &'a mut CudaSlice<T>,
    stream: &'a CudaStream,
) -> (u64, SyncOnDrop<'a>) {
    s.device_ptr_mut(stream)
}

/// The largest power of two (at most 256) dividing a device address: the alignment a
/// library may assume for it.
pub(crate) fn alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        return 256;
    }
    1u32 << ptr.trailing_zeros().min(8)
}

/// A cuBLAS or cuBLASLt status as [`Error::Cublas`] (the status code kept).
pub(crate) fn cublas_error(
    call: &str,
    status: impl Into<rtx_runtime::CublasStatus> + std::fmt::Debug,
) -> Error {
    Error::cublas(call, status)
}

/// A cuDNN status as [`Error::Cudnn`], with cuDNN's own description.
pub(crate) fn cudnn_error(call: &str, status: cudarc::cudnn::sys::cudnnStatus_t) -> Error {
    // SAFETY: `cudnnGetErrorString` takes any status value and returns a pointer to a
    // static NUL-terminated string (or null), which is only read here.
    let text = unsafe { cudarc::cudnn::sys::cudnnGetErrorString(status) };
    let detail = if text.is_null() {
        String::new()
    } else {
        // SAFETY: non-null, NUL-terminated and static (see above).
        unsafe { std::ffi::CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    Error::cudnn(call, status, format!("{status:?}: {detail}"))
}

/// Fails with a readable error unless `present` (a library presence probe) holds;
/// cudarc panics on a missing library, so probe before the first call.
pub(crate) fn require_library(
    name: &str,
    present: impl FnOnce() -> bool + std::panic::UnwindSafe,
) -> Result<()> {
    match std::panic::catch_unwind(present) {
        Ok(true) => Ok(()),
        _ => Err(Error::invalid(
            name,
            format!("the {name} library was not found (is it on the loader path?)"),
        )),
    }
}
