//! One NVRTC compilation: a kernel program (with the crate's headers) to CUBIN.

use crate::{
    error::KernelError,
    nvrtc::{self, Failure, Program},
    options::{cuda_include_dir, Arch, Options},
    report::{parse_ptxas_log, KernelResources},
    sources::{headers, KernelSource},
};

/// The result of a successful compilation.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The CUBIN (an ELF image), ready for `cuModuleLoadData`
    /// (`ctx.load_module(Ptx::from_binary(cubin))` in cudarc).
    pub cubin: Vec<u8>,
    /// NVRTC's log: warnings, and with [`Options::verbose`] ptxas's per-kernel report.
    pub log: String,
}

impl Compiled {
    /// Registers, spills and memory per kernel, parsed from the ptxas report in the log
    /// (empty unless compiled with [`Options::verbose`]).
    pub fn resources(&self) -> Vec<KernelResources> {
        parse_ptxas_log(&self.log)
    }
}

/// Whether NVRTC can be loaded and called. Never panics; the answer is probed once.
pub fn nvrtc_present() -> bool {
    nvrtc::probe().is_ok()
}

/// The NVRTC version `(major, minor)`, e.g. `(13, 0)`, or `None` when NVRTC is absent.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    nvrtc::probe().ok()
}

/// Compiles `source` for `arch` to CUBIN with NVRTC.
///
/// The crate's headers (`kernels/cuda/*.cuh`) are available to `#include "…"`, and the
/// CUDA headers from [`cuda_include_dir`](crate::cuda_include_dir) to `#include <…>`.
/// This always compiles; [`KernelCache`](crate::KernelCache) avoids that. A program with
/// the [`ARCH_SPECIFIC_MARKER`](crate::ARCH_SPECIFIC_MARKER) line is compiled with
/// [`Options::arch_specific`] whatever `opts` says.
///
/// # Errors
///
/// [`KernelError::NvrtcMissing`] without NVRTC, [`KernelError::Compile`] (with NVRTC's
/// log) when the source does not compile, [`KernelError::Nvrtc`] when another NVRTC call
/// fails.
///
/// # Examples
///
/// ```
/// use rtx::kernels::{compile, nvrtc_present, source, Arch, Options};
/// if nvrtc_present() {
///     let softmax = source("softmax").unwrap();
///     let built = compile(softmax, Arch::SM_90, &Options::default())?;
///     assert!(built.cubin.starts_with(b"\x7fELF"));
/// }
/// # Ok::<(), rtx::kernels::KernelError>(())
/// ```
pub fn compile(source: &KernelSource, arch: Arch, opts: &Options) -> Result<Compiled, KernelError> {
    nvrtc::probe().map_err(|detail| KernelError::NvrtcMissing { detail })?;
    let opts = source.options(opts);
    let cuda_include = cuda_include_dir();
    let flags = opts.nvrtc_flags(arch, cuda_include);
    let gpu_arch = arch.gpu_arch(opts.arch_specific);
    let call_failed = |f: Failure| KernelError::Nvrtc {
        name: source.name.to_owned(),
        call: f.call,
        status: f.status,
    };
    let run = || -> Result<Compiled, KernelError> {
        let named: Vec<(&str, &str)> = headers().iter().map(|h| (h.name, h.source)).collect();
        let program = Program::new(source.name, source.source, &named).map_err(call_failed)?;
        let compiled = program.compile(&flags);
        let log = program.log().map_err(call_failed)?;
        if let Err(f) = compiled {
            return Err(KernelError::Compile {
                name: source.name.to_owned(),
                arch: gpu_arch.clone(),
                status: f.status,
                log,
                cuda_include: cuda_include.map(Into::into),
            });
        }
        let cubin = program.cubin().map_err(call_failed)?;
        Ok(Compiled { cubin, log })
    };
    nvrtc::catch(run).unwrap_or_else(|detail| Err(KernelError::NvrtcMissing { detail }))
}
