//! The library's one error type, and the submit error that gives the op back.

use std::fmt;

use crate::device::Device;
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
    /// A kernel failed to compile; `log` is the compiler's output.
    #[error("kernel `{kernel}` failed to compile for {arch}:\n{log}")]
    KernelCompile {
        kernel: String,
        arch: String,
        log: String,
    },
    /// A kernel or library call failed while executing.
    #[error("kernel execution failed in `{op}`: {message}")]
    KernelExecution { op: String, message: String },
    /// Waiting for the device failed.
    #[error("synchronization failed: {0}")]
    Synchronization(String),
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
    /// A CUDA driver call failed.
    #[error("CUDA error in {call}: {message}")]
    Cuda { call: String, message: String },
    /// A cuBLAS / cuBLASLt call failed.
    #[error("cuBLAS error in {call}: {message}")]
    Cublas { call: String, message: String },
    /// A cuDNN call failed.
    #[error("cuDNN error in {call}: {message}")]
    Cudnn { call: String, message: String },
    /// The device hit a sticky error earlier; every later op on it fails with this.
    #[error("device {device} is poisoned by an earlier error: {cause}")]
    DevicePoisoned { device: Device, cause: String },
    /// An op panicked while executing; the actor caught it and lives on.
    #[error("op `{op}` panicked: {message}")]
    OpPanicked { op: String, message: String },
    /// An input of this op was produced by an op that failed.
    #[error("input of `{op}` is unavailable: {cause}")]
    Upstream { op: String, cause: Box<Error> },
    /// The runtime was shut down before the op could run.
    #[error("the runtime is shut down")]
    Shutdown,
}

fn fmt_detail(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(" ({d})")
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
