//! The crate's error type.

use std::{io, path::PathBuf};

/// What can go wrong building a kernel.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The NVRTC shared library could not be loaded, or lacks a function we call.
    #[error(
        "NVRTC is not available: {detail}. Install it (`.ci/nvrtc-setup` pip-installs \
         NVRTC 13.0) and put the folder holding libnvrtc.so.13 on LD_LIBRARY_PATH"
    )]
    NvrtcMissing {
        /// What failed: the library search, or the symbol that was missing.
        detail: String,
    },

    /// No `kernels/cuda/<name>.cu` exists.
    #[error("no kernel source named `{name}`; the built-in ones are: {known}")]
    UnknownKernel {
        /// The name asked for.
        name: String,
        /// The names that exist, comma-separated.
        known: String,
    },

    /// NVRTC rejected the program. `log` is NVRTC's full log.
    #[error(
        "NVRTC failed to compile `{name}` for {arch} ({status}){}:\n{log}",
        headers_note(.cuda_include)
    )]
    Compile {
        /// The kernel program's name (file stem).
        name: String,
        /// The architecture option used, e.g. `sm_90` or `sm_90a`.
        arch: String,
        /// NVRTC's status string, e.g. `NVRTC_ERROR_COMPILATION`.
        status: String,
        /// NVRTC's complete program log.
        log: String,
        /// The CUDA include folder passed to NVRTC, if one was found.
        cuda_include: Option<PathBuf>,
    },

    /// An NVRTC call other than the compilation itself failed.
    #[error("NVRTC call {call} failed for `{name}`: {status}")]
    Nvrtc {
        /// The kernel program's name.
        name: String,
        /// The NVRTC function, e.g. `nvrtcGetCUBIN`.
        call: &'static str,
        /// NVRTC's status string.
        status: String,
    },

    /// The on-disk CUBIN cache could not be used.
    #[error("kernel cache I/O error at {}: {source}", .path.display())]
    CacheIo {
        /// The file or folder involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

fn headers_note(dir: &Option<PathBuf>) -> String {
    match dir {
        Some(dir) => format!(" with CUDA headers from {}", dir.display()),
        None => " without a CUDA include folder (none found: set RTX_CUDA_INCLUDE, \
                 CUDA_HOME, or run .ci/nvrtc-setup)"
            .to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_message_carries_the_facts() {
        let e = KernelError::Compile {
            name: "softmax".into(),
            arch: "sm_90".into(),
            status: "NVRTC_ERROR_COMPILATION".into(),
            log: "softmax.cu(3): error: expected a \";\"".into(),
            cuda_include: None,
        };
        let msg = e.to_string();
        for part in [
            "softmax",
            "sm_90",
            "NVRTC_ERROR_COMPILATION",
            "expected a",
            "RTX_CUDA_INCLUDE",
        ] {
            assert!(msg.contains(part), "{part} missing from: {msg}");
        }
    }
}
