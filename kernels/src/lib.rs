//! rtx's CUDA C kernels (`kernels/cuda/*.cu`), compiled at run time by NVRTC to CUBIN
//! for the device's architecture, and cached on disk so a second process starts
//! without compiling.
//!
//! - [`sources`] / [`source`]: every `kernels/cuda/*.cu` file, found by `build.rs`, so a
//!   new `.cu` file needs no Rust change (the test-only `kernels/cuda/testing/*.cu`
//!   only with the `test-util` feature). Headers (`kernels/cuda/*.cuh`) are given to
//!   NVRTC as named headers: `#include "common.cuh"` works. Programs are compiled for the
//!   portable target (`sm_90`), except those with an [`ARCH_SPECIFIC_MARKER`] line
//!   (`attention_wgmma`, `attention_tma`, `attention_wgmma_bwd`, `attention_tma_bwd`,
//!   which need `wgmma`),
//!   always compiled for `sm_90a`.
//! - [`compile`]: one NVRTC compilation to CUBIN (with the ptxas report on request).
//! - [`KernelCache`]: CUBINs by (program, arch, options), in memory and on disk.
//! - [`launch`]: block size, grids, workspace sizes and entry-point names.
//!
//! NVRTC is loaded dynamically: building needs no CUDA, and [`nvrtc_present`] says,
//! without panicking, whether it can be used. Environment:
//!
//! | variable | meaning |
//! |---|---|
//! | `LD_LIBRARY_PATH` | must reach `libnvrtc.so.13` (e.g. `.nvrtc/nvidia/cu13/lib` after `.ci/nvrtc-setup`) |
//! | `RTX_CUDA_INCLUDE` | folder with `cuda_fp16.h` (else `$CUDA_HOME/include`, `/usr/local/cuda/include`, pip's `nvidia/cu13/include`; see [`cuda_include_dir`]) |
//! | `RTX_NVRTC_DIR` | a `.ci/nvrtc-setup` folder, searched for headers |
//! | `RTX_KERNEL_CACHE` | the CUBIN cache folder (else `$XDG_CACHE_HOME/rtx/kernels`, `~/.cache/rtx/kernels`) |
//!
//! # Examples
//!
//! ```
//! use rtx::kernels::{nvrtc_present, Arch, KernelCache, Options};
//! if nvrtc_present() {
//!     let cubin = KernelCache::global().cubin("softmax", Arch::SM_90, &Options::default())?;
//!     assert!(cubin.starts_with(b"\x7fELF"));
//! }
//! # Ok::<(), rtx::kernels::KernelError>(())
//! ```
//!
#![doc = include_str!("../KERNELS.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod cache;
mod compile;
mod error;
mod hash;
pub mod launch;
mod nvrtc;
mod options;
mod report;
mod sources;

pub use cache::{CacheStats, KernelCache};
pub use compile::{compile, nvrtc_present, nvrtc_version, Compiled};
pub use error::KernelError;
pub use options::{cuda_include_dir, Arch, Options};
pub use report::{parse_ptxas_log, KernelResources};
pub use sources::{headers, source, sources, KernelSource, ARCH_SPECIFIC_MARKER};
