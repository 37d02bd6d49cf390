//! The only module that calls NVRTC: `cudarc::nvrtc::sys` functions turned into
//! `Result`s, an owning `Program`, and a probe that finds out — without panicking —
//! whether the library can be used at all.
//!
//! cudarc's dynamic loading panics when libnvrtc (or one of its symbols) is missing;
//! `probe` checks for the library first and runs the first call under `catch_unwind`,
//! and `crate::compile` runs every compilation under `catch_unwind` as well.

use std::{
    ffi::{c_char, c_int, CStr, CString},
    panic::{self, AssertUnwindSafe},
    ptr,
    sync::OnceLock,
};

use cudarc::nvrtc::sys::{self, nvrtcResult};

/// A failed NVRTC call: the function and NVRTC's status string.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) call: &'static str,
    pub(crate) status: String,
}

/// The NVRTC version `(major, minor)`, or why NVRTC cannot be used. Probed once.
pub(crate) fn probe() -> Result<(i32, i32), String> {
    static PROBE: OnceLock<Result<(i32, i32), String>> = OnceLock::new();
    PROBE.get_or_init(probe_uncached).clone()
}

fn probe_uncached() -> Result<(i32, i32), String> {
    // SAFETY: `is_culib_present` only dlopens candidate names for libnvrtc and closes
    // them again; loading NVRTC runs no initializer with preconditions on us.
    let present = catch(|| unsafe { sys::is_culib_present() })?;
    if !present {
        return Err("libnvrtc was not found by the dynamic loader".to_owned());
    }
    catch(version)?.map_err(|f| format!("{} failed: {}", f.call, f.status))
}

/// Runs `f`, turning a panic (cudarc's report of a missing library or symbol) into
/// its message.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    panic::catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "NVRTC panicked while loading".to_owned())
    })
}

fn version() -> Result<(i32, i32), Failure> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are to live, writable `c_int`s.
    check("nvrtcVersion", unsafe {
        sys::nvrtcVersion(&mut major, &mut minor)
    })?;
    Ok((major, minor))
}

fn check(call: &'static str, status: nvrtcResult) -> Result<(), Failure> {
    if status == nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString accepts any status and returns a pointer to a static,
    // NUL-terminated string (or null, handled below).
    let text = unsafe { sys::nvrtcGetErrorString(status) };
    let status = if text.is_null() {
        format!("{status:?}")
    } else {
        // SAFETY: non-null results point to static NUL-terminated strings.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    Err(Failure { call, status })
}

/// An NVRTC program and the strings it was created from (NVRTC may keep pointers to
/// them until the program is destroyed, so the program owns them).
pub(crate) struct Program {
    raw: sys::nvrtcProgram,
    _strings: Vec<CString>,
}

impl Program {
    /// Creates a program named `name` from `source`, with `headers` as
    /// `(include name, text)` pairs that `#include "name"` resolves to.
    pub(crate) fn new(name: &str, source: &str, headers: &[(&str, &str)]) -> Result<Self, Failure> {
        let cstr = |s: &str| CString::new(s.replace('\0', " ")).expect("NUL bytes were replaced");
        let (src, file) = (cstr(source), cstr(&format!("{name}.cu")));
        let texts: Vec<CString> = headers.iter().map(|(_, t)| cstr(t)).collect();
        let names: Vec<CString> = headers.iter().map(|(n, _)| cstr(n)).collect();
        let text_ptrs: Vec<*const c_char> = texts.iter().map(|s| s.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = names.iter().map(|s| s.as_ptr()).collect();
        let count = c_int::try_from(headers.len()).expect("fewer than 2^31 headers");
        let mut raw: sys::nvrtcProgram = ptr::null_mut();
        // SAFETY: `raw` is writable; `src` and `file` are NUL-terminated; the two pointer
        // arrays hold `count` NUL-terminated strings each. All strings move into the
        // returned Program and outlive `raw`.
        let status = unsafe {
            sys::nvrtcCreateProgram(
                &mut raw,
                src.as_ptr(),
                file.as_ptr(),
                count,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
        };
        check("nvrtcCreateProgram", status)?;
        let mut strings = vec![src, file];
        strings.extend(texts.into_iter().chain(names));
        Ok(Program {
            raw,
            _strings: strings,
        })
    }

    /// Compiles with `flags`. On failure the log tells why.
    pub(crate) fn compile(&self, flags: &[String]) -> Result<(), Failure> {
        let flags: Vec<CString> = flags
            .iter()
            .map(|f| CString::new(f.as_str()).unwrap_or_else(|_| CString::from(c"-w")))
            .collect();
        let ptrs: Vec<*const c_char> = flags.iter().map(|f| f.as_ptr()).collect();
        let count = c_int::try_from(ptrs.len()).expect("fewer than 2^31 flags");
        // SAFETY: `self.raw` is a live program; `ptrs` holds `count` NUL-terminated
        // strings that live until the call returns.
        check("nvrtcCompileProgram", unsafe {
            sys::nvrtcCompileProgram(self.raw, count, ptrs.as_ptr())
        })
    }

    /// The program log (compiler diagnostics; ptxas statistics with `-v`).
    pub(crate) fn log(&self) -> Result<String, Failure> {
        let mut size = 0usize;
        // SAFETY: `self.raw` is live and `size` writable.
        check("nvrtcGetProgramLogSize", unsafe {
            sys::nvrtcGetProgramLogSize(self.raw, &mut size)
        })?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` has room for `size` bytes, the size NVRTC just reported.
        check("nvrtcGetProgramLog", unsafe {
            sys::nvrtcGetProgramLog(self.raw, buf.as_mut_ptr().cast())
        })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim_end().to_owned())
    }

    /// The CUBIN of a program compiled for a real architecture.
    pub(crate) fn cubin(&self) -> Result<Vec<u8>, Failure> {
        let mut size = 0usize;
        // SAFETY: `self.raw` is live and `size` writable.
        check("nvrtcGetCUBINSize", unsafe {
            sys::nvrtcGetCUBINSize(self.raw, &mut size)
        })?;
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: `buf` has room for the `size` bytes NVRTC just reported.
            check("nvrtcGetCUBIN", unsafe {
                sys::nvrtcGetCUBIN(self.raw, buf.as_mut_ptr().cast())
            })?;
        }
        Ok(buf)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from nvrtcCreateProgram and is destroyed only here.
        // A failure cannot be reported from Drop and leaks at most the program.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.raw) };
    }
}
