//! The library's one error type, and the submit error that gives the op back.

use std::fmt;

use crate::device::{Device, StreamId};
use crate::dtype::DType;
use crate::shape::Shape;

/// Every failure rtx reports. Errors are `Clone` because one failed producer fails every
/// consumer that waited on its output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variant fields are named for what they hold
pub enum Error {
    /// The requested backend or device is not present.
    #[error("device not found: {0}")]
    DeviceNotFound(String),
    /// Device memory ran out.
    #[error("out of device memory on {device}: requested {requested} bytes, {available} bytes available")]
    OutOfMemory {
        device: Device,
        requested: usize,
        available: usize,
    },
    /// A kernel failed to compile. `status` is NVRTC's status name (e.g.
    /// `NVRTC_ERROR_COMPILATION`) when NVRTC itself rejected the program, `None` when the
    /// failure came before or around the compiler (library missing, unknown kernel,
    /// cache I/O); `log` is the compiler's output or the failure's description.
    #[error("kernel `{kernel}` failed to compile for {arch}{}:\n{log}", fmt_status(.status))]
    KernelCompile {
        kernel: String,
        arch: String,
        status: Option<String>,
        log: String,
    },
    /// A kernel launch (`call`, e.g. `cuLaunchKernel`) of op `op` failed with the driver
    /// status `code`.
    #[error("kernel execution failed in `{op}`: {call}: {message}")]
    KernelExecution {
        op: String,
        call: String,
        code: CudaCode,
        message: String,
    },
    /// Waiting for the device failed: `code` is the driver's status when a driver call
    /// failed, `None` when the stream actor stopped before its work could be waited for.
    #[error("synchronization failed: {message}")]
    Synchronization {
        code: Option<CudaCode>,
        message: String,
    },
    /// Two shapes that must agree do not.
    #[error("shape mismatch in `{op}`: {lhs} vs {rhs}{}", fmt_detail(.detail))]
    ShapeMismatch {
        op: String,
        lhs: Shape,
        rhs: Shape,
        detail: String,
    },
    /// Two dtypes that must agree do not, or a dtype is not supported.
    #[error("dtype mismatch in `{op}`: expected {expected}, got {got}")]
    DTypeMismatch {
        op: String,
        expected: DType,
        got: DType,
    },
    /// Operands live on different devices, or on a device this runtime does not own.
    #[error("device mismatch in `{op}`: {lhs} vs {rhs}")]
    DeviceMismatch {
        op: String,
        lhs: Device,
        rhs: Device,
    },
    /// A dimension index or size is invalid.
    #[error("invalid dimension in `{op}`: {message}")]
    InvalidDim { op: String, message: String },
    /// Anything else the op's contract forbids.
    #[error("invalid operation `{op}`: {message}")]
    InvalidOp { op: String, message: String },
    /// A CUDA driver call failed: the call, the driver's status code, its description.
    #[error("CUDA error in {call}: {message}")]
    Cuda {
        call: String,
        code: CudaCode,
        message: String,
    },
    /// A cuBLAS or cuBLASLt call failed with `status`.
    #[error("cuBLAS error in {call}: {message}")]
    Cublas {
        call: String,
        status: CublasStatus,
        message: String,
    },
    /// An NCCL call failed (a collective on the CUDA backend), or the NCCL library was
    /// not found.
    #[error("NCCL error in {call}: {message}")]
    Nccl { call: String, message: String },
    /// A cuDNN call failed with `status` (`message`: cuDNN's description).
    #[error("cuDNN error in {call}: {message}")]
    Cudnn {
        call: String,
        status: CudnnStatus,
        message: String,
    },
    /// The device hit a sticky error earlier; every later op on it fails with this.
    ///
    /// A sticky error (an illegal address, a trap, ...) stays in the device's CUDA
    /// context. Once the poisoned runtime (and every other runtime on that device) is
    /// dropped, the next runtime built on the device resets the primary context; where
    /// the driver keeps the error for the rest of the process anyway (NVIDIA documents
    /// that for these errors the process must be relaunched; a trap does so on the
    /// H200), that build fails at once with this error, and a new process can use the
    /// device. Tensors of the poisoned runtime still alive after a reset refer to freed
    /// memory: they can only be dropped. Building a runtime while another one on the
    /// device is still alive fails with this error.
    #[error("device {device} is poisoned by an earlier error: {cause}")]
    DevicePoisoned { device: Device, cause: String },
    /// An op panicked while executing; the actor caught it and lives on.
    #[error("op `{op}` panicked: {message}")]
    OpPanicked { op: String, message: String },
    /// An input of this op was produced by an op that failed.
    #[error("input of `{op}` is unavailable: {cause}")]
    Upstream { op: String, cause: Box<Error> },
    /// An input's buffer was donated to (taken for in-place use by) another op.
    #[error("the tensor's buffer was donated to another op")]
    Donated,
    /// A buffer was accessed as something it does not hold (another dtype, host memory
    /// as device memory or the reverse).
    #[error("buffer access: {held} accessed as {wanted}")]
    BufferAccess { wanted: String, held: String },
    /// A device allocation was asked for that cannot be made (zero elements, or more
    /// bytes than fit in `usize`).
    #[error("invalid allocation: {message}")]
    InvalidAllocation { message: String },
    /// A submission's result was taken already (awaited or waited for twice).
    #[error("the submission's result was already taken")]
    ResultTaken,
    /// The runtime was shut down before the op could run.
    #[error("the runtime is shut down")]
    Shutdown,
    /// A call made inside an op's `run`, on the actor thread of `stream`, that would wait
    /// for the runtime's own work: waiting for a submission not yet done (`wait`,
    /// `block_on`, `.await`), a submit into a full mailbox, awaiting a shutdown. The actor
    /// runs one op at a time, so the wait could last forever (the awaited op may sit
    /// behind this one, or on an actor waiting for this one); the call fails at once
    /// instead. See the rule on [`Op`](crate::Op).
    #[error("`{call}` inside an op's run (the actor of {stream}) would wait for the runtime's own work: {reason}")]
    ActorWouldBlock {
        call: String,
        stream: StreamId,
        reason: String,
    },
    /// Op `op` cannot be captured into a graph (`Runtime::capture`): it would do
    /// `hazard` inside the captured body. Nothing of the capture is kept; the runtime
    /// stays usable.
    #[error("op `{op}` cannot be captured into a graph: {hazard}")]
    NotCapturable { op: String, hazard: CaptureHazard },
}

/// What makes an op unsafe to capture into a graph (see `runtime/src/runtime/graph/mod.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaptureHazard {
    /// It allocates device memory inside the captured body beyond its planned outputs
    /// (per-call scratch memory): a replay would reuse memory the graph does not own.
    Allocation,
    /// It synchronizes the host with the device (a stream or event synchronize).
    HostSync,
    /// It queries an event or stream status from the host.
    EventQuery,
    /// It reads device data back to the host (a download, a finisher).
    Readback,
    /// It searches for a library algorithm by running candidates (cuDNN find).
    AlgorithmSearch,
}

impl std::fmt::Display for CaptureHazard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CaptureHazard::Allocation => {
                "it allocates device memory beyond its planned outputs inside the capture"
            }
            CaptureHazard::HostSync => "it synchronizes the host with the device",
            CaptureHazard::EventQuery => "it queries an event or stream from the host",
            CaptureHazard::Readback => "it reads device data back to the host",
            CaptureHazard::AlgorithmSearch => "it searches for an algorithm by running it",
        })
    }
}

/// A driver status as text: its name, and the driver's description when the driver
/// library is there to give one (never a panic without it).
fn driver_message(e: cudarc::driver::DriverError) -> String {
    let describe = || {
        // SAFETY: `is_culib_present` only tries to load the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return None;
        }
        e.error_string()
            .ok()
            .map(|s| s.to_string_lossy().into_owned())
    };
    match std::panic::catch_unwind(describe).ok().flatten() {
        Some(d) => format!("{:?}: {d}", e.0),
        None => format!("{:?}", e.0),
    }
}

fn fmt_status(s: &Option<String>) -> String {
    s.as_ref().map(|s| format!(" ({s})")).unwrap_or_default()
}

fn fmt_detail(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(" ({d})")
    }
}

/// A CUDA driver status (`CUresult`), e.g. `CudaCode::CUDA_ERROR_ILLEGAL_ADDRESS`.
pub type CudaCode = cudarc::driver::sys::CUresult;

/// A cuDNN status (`cudnnStatus_t`), e.g. `CudnnStatus::CUDNN_STATUS_NOT_SUPPORTED`.
pub type CudnnStatus = cudarc::cudnn::sys::cudnnStatus_t;

/// A cuBLAS or cuBLASLt status (`cublasStatus_t`, whose codes the two libraries share):
/// its numeric value. Built from either library's status or error type with `From`;
/// compare with [`CublasStatus::NOT_SUPPORTED`] and friends, or with a converted status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CublasStatus(pub u32);

impl CublasStatus {
    /// `CUBLAS_STATUS_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: CublasStatus = CublasStatus(1);
    /// `CUBLAS_STATUS_ALLOC_FAILED`.
    pub const ALLOC_FAILED: CublasStatus = CublasStatus(3);
    /// `CUBLAS_STATUS_INVALID_VALUE`.
    pub const INVALID_VALUE: CublasStatus = CublasStatus(7);
    /// `CUBLAS_STATUS_ARCH_MISMATCH`.
    pub const ARCH_MISMATCH: CublasStatus = CublasStatus(8);
    /// `CUBLAS_STATUS_EXECUTION_FAILED`.
    pub const EXECUTION_FAILED: CublasStatus = CublasStatus(13);
    /// `CUBLAS_STATUS_INTERNAL_ERROR`.
    pub const INTERNAL_ERROR: CublasStatus = CublasStatus(14);
    /// `CUBLAS_STATUS_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: CublasStatus = CublasStatus(15);
}

impl From<cudarc::cublas::sys::cublasStatus_t> for CublasStatus {
    fn from(s: cudarc::cublas::sys::cublasStatus_t) -> Self {
        CublasStatus(s as u32)
    }
}
impl From<cudarc::cublaslt::sys::cublasStatus_t> for CublasStatus {
    fn from(s: cudarc::cublaslt::sys::cublasStatus_t) -> Self {
        CublasStatus(s as u32)
    }
}
impl From<cudarc::cublas::result::CublasError> for CublasStatus {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        e.0.into()
    }
}
impl From<cudarc::cublaslt::result::CublasError> for CublasStatus {
    fn from(e: cudarc::cublaslt::result::CublasError) -> Self {
        e.0.into()
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::InvalidOp`].
    pub fn invalid(op: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidOp {
            op: op.into(),
            message: message.into(),
        }
    }
    /// Shorthand for [`Error::InvalidDim`].
    pub fn invalid_dim(op: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidDim {
            op: op.into(),
            message: message.into(),
        }
    }
    /// Shorthand for [`Error::ShapeMismatch`].
    pub fn shape(
        op: impl Into<String>,
        lhs: &Shape,
        rhs: &Shape,
        detail: impl Into<String>,
    ) -> Self {
        Error::ShapeMismatch {
            op: op.into(),
            lhs: lhs.clone(),
            rhs: rhs.clone(),
            detail: detail.into(),
        }
    }
    /// A failed CUDA driver call as [`Error::Cuda`] (status code kept).
    pub fn cuda(call: impl Into<String>, e: cudarc::driver::DriverError) -> Self {
        Error::Cuda {
            call: call.into(),
            code: e.0,
            message: driver_message(e),
        }
    }
    /// A failed cuBLAS or cuBLASLt call as [`Error::Cublas`]; `status` is either
    /// library's status or error value.
    pub fn cublas(call: impl Into<String>, status: impl Into<CublasStatus> + fmt::Debug) -> Self {
        let message = format!("{status:?}");
        Error::Cublas {
            call: call.into(),
            status: status.into(),
            message,
        }
    }
    /// A failed cuDNN call as [`Error::Cudnn`], described by `message` (e.g. cuDNN's
    /// own error string).
    pub fn cudnn(call: impl Into<String>, status: CudnnStatus, message: impl Into<String>) -> Self {
        Error::Cudnn {
            call: call.into(),
            status,
            message: message.into(),
        }
    }
    /// A failed kernel launch of op `op` as [`Error::KernelExecution`].
    pub fn kernel_execution(
        op: impl Into<String>,
        call: impl Into<String>,
        e: cudarc::driver::DriverError,
    ) -> Self {
        Error::KernelExecution {
            op: op.into(),
            call: call.into(),
            code: e.0,
            message: driver_message(e),
        }
    }
    /// A failed wait for the device as [`Error::Synchronization`] (status code kept).
    pub fn synchronization(e: cudarc::driver::DriverError) -> Self {
        Error::Synchronization {
            code: Some(e.0),
            message: driver_message(e),
        }
    }
    /// The CUDA driver status of a driver, launch or synchronization failure.
    pub fn cuda_code(&self) -> Option<CudaCode> {
        match self {
            Error::Cuda { code, .. } | Error::KernelExecution { code, .. } => Some(*code),
            Error::Synchronization { code, .. } => *code,
            Error::Upstream { cause, .. } => cause.cuda_code(),
            _ => None,
        }
    }
    /// Shorthand for [`Error::DTypeMismatch`].
    pub fn dtype(op: impl Into<String>, expected: DType, got: DType) -> Self {
        Error::DTypeMismatch {
            op: op.into(),
            expected,
            got,
        }
    }
}

/// A rejected submission: the error, and the op given back with everything moved into it.
pub struct SubmitError<O> {
    /// Why the op was rejected.
    pub error: Error,
    /// The op, untouched.
    pub op: O,
}

impl<O> SubmitError<O> {
    /// Takes the op back.
    pub fn into_op(self) -> O {
        self.op
    }
    /// The error alone, dropping the op.
    pub fn into_error(self) -> Error {
        self.error
    }
}

impl<O> fmt::Debug for SubmitError<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<O> fmt::Display for SubmitError<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "submission rejected: {}", self.error)
    }
}

impl<O> std::error::Error for SubmitError<O> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<O> From<SubmitError<O>> for Error {
    fn from(e: SubmitError<O>) -> Self {
        e.error
    }
}
