//! The kernel sources compiled into the crate: every `kernels/cuda/*.cu` file (one
//! NVRTC program each) and every `kernels/cuda/*.cuh` header they may `#include`.
//!
//! `build.rs` generates the tables; the text is embedded with `include_str!`, so a
//! binary carries its kernels and needs no source tree at run time.

use std::borrow::Cow;

use crate::options::Options;

/// The line that marks a program as architecture-specific: a program whose text has a
/// line that is exactly this (surrounding whitespace aside) is always compiled for the
/// architecture-specific target (`sm_90a` on Hopper), which `wgmma` and `setmaxnreg`
/// need; every other program keeps the portable target (`sm_90`).
pub const ARCH_SPECIFIC_MARKER: &str = "// rtx-kernels: arch-specific";

/// One CUDA C source: a kernel program (`*.cu`) or a header (`*.cuh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// For a program the file stem (`"elementwise"` for `elementwise.cu`); for a header
    /// the file name as `#include "…"` spells it (`"common.cuh"`).
    pub name: &'static str,
    /// The CUDA C text.
    pub source: &'static str,
}

impl KernelSource {
    /// Whether this program must be compiled for the architecture-specific target: its
    /// text has an [`ARCH_SPECIFIC_MARKER`] line. [`compile`](crate::compile) and
    /// [`KernelCache`](crate::KernelCache) then set [`Options::arch_specific`] themselves.
    ///
    /// # Examples
    ///
    /// ```
    /// let wgmma = rtx::kernels::source("attention_wgmma").unwrap();
    /// assert!(wgmma.arch_specific());
    /// assert!(!rtx::kernels::source("attention").unwrap().arch_specific());
    /// ```
    pub fn arch_specific(&self) -> bool {
        self.source
            .lines()
            .any(|line| line.trim() == ARCH_SPECIFIC_MARKER)
    }

    /// `opts` as this program is compiled with them: with [`Options::arch_specific`]
    /// set if the program is [architecture-specific](KernelSource::arch_specific).
    pub fn options<'a>(&self, opts: &'a Options) -> Cow<'a, Options> {
        if self.arch_specific() && !opts.arch_specific {
            Cow::Owned(Options {
                arch_specific: true,
                ..opts.clone()
            })
        } else {
            Cow::Borrowed(opts)
        }
    }
}

include!(concat!(env!("OUT_DIR"), "/sources.rs"));

/// Every kernel program in `kernels/cuda/*.cu` (and, with the `test-util` feature,
/// `kernels/cuda/testing/*.cu`), sorted by name.
///
/// # Examples
///
/// ```
/// let names: Vec<_> = rtx::kernels::sources().iter().map(|s| s.name).collect();
/// assert!(names.contains(&"elementwise"));
/// ```
pub fn sources() -> &'static [KernelSource] {
    SOURCES
}

/// The kernel program named `name` (the file stem of its `.cu` file), if any.
///
/// # Examples
///
/// ```
/// let softmax = rtx::kernels::source("softmax").expect("softmax.cu is built in");
/// assert!(softmax.source.contains("softmax_"));
/// assert!(rtx::kernels::source("no_such_kernel").is_none());
/// ```
pub fn source(name: &str) -> Option<&'static KernelSource> {
    SOURCES.iter().find(|s| s.name == name)
}

/// Every header in `kernels/cuda/*.cuh`. Each is handed to NVRTC as a named header,
/// so `#include "common.cuh"` works from any program.
pub fn headers() -> &'static [KernelSource] {
    HEADERS
}

/// The headers `source` includes from `kernels/cuda/`, directly or through another
/// header, in first-include order. The cache key hashes exactly these.
pub(crate) fn local_includes(source: &str) -> Vec<&'static KernelSource> {
    let mut found: Vec<&'static KernelSource> = Vec::new();
    let mut pending = vec![source];
    while let Some(text) = pending.pop() {
        for name in quoted_includes(text) {
            if let Some(h) = HEADERS.iter().find(|h| h.name == name) {
                if !found.iter().any(|f| f.name == h.name) {
                    found.push(h);
                    pending.push(h.source);
                }
            }
        }
    }
    found
}

/// The names in the `#include "name"` lines of `text`.
fn quoted_includes(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        let rest = line.trim_start().strip_prefix('#')?.trim_start();
        let rest = rest
            .strip_prefix("include")?
            .trim_start()
            .strip_prefix('"')?;
        rest.split('"').next()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_quoted_includes_only() {
        let text = "#include <cuda_fp16.h>\n  #  include \"a.cuh\"\n// #include \"b.cuh\" x\n";
        let names: Vec<_> = quoted_includes(text).collect();
        assert_eq!(names, ["a.cuh"]);
    }

    #[test]
    fn only_marked_programs_are_arch_specific() {
        let marked: Vec<_> = sources()
            .iter()
            .filter(|s| s.arch_specific())
            .map(|s| s.name)
            .collect();
        assert_eq!(
            marked,
            [
                "attention_tma",
                "attention_tma_bwd",
                "attention_wgmma",
                "attention_wgmma_bwd"
            ]
        );
        let plain = Options::default();
        let wgmma = source("attention_wgmma").unwrap();
        assert!(wgmma.options(&plain).arch_specific);
        assert!(!source("attention").unwrap().options(&plain).arch_specific);
        let text = KernelSource {
            name: "x",
            source: "// rtx-kernels: arch-specific (not exactly the marker)\n",
        };
        assert!(!text.arch_specific());
    }

    #[test]
    fn every_program_is_listed_and_named_by_its_stem() {
        for name in ["elementwise", "reduce", "softmax", "epilogue"] {
            assert!(source(name).is_some(), "{name}.cu missing from sources()");
        }
        // The test-only kernel exists exactly with the `test-util` feature.
        assert_eq!(source("fault").is_some(), cfg!(feature = "test-util"));
        assert!(sources().windows(2).all(|w| w[0].name < w[1].name));
    }
}
