//! The CUBIN cache: in memory per process, and on disk across processes.
//!
//! Protocol:
//! 1. The in-memory map goes from (program, arch, options) to a slot. Each slot has its
//!    own mutex, held while its CUBIN is loaded or compiled, so two threads asking for
//!    the same kernel compile it once and different kernels compile in parallel.
//! 2. On disk a CUBIN lives at `<dir>/<name>-<arch>-<key>.cubin`, where `key` is the
//!    FNV-1a 64 hash of: the program's text, the text of every local header it
//!    includes, the architecture, the NVRTC flags that change code, and NVRTC's version.
//!    Any change to one of those is a different file.
//! 3. A file is written to a uniquely named temporary file in the same folder and then
//!    `rename`d into place, which is atomic on POSIX: a reader sees no file or a whole
//!    one, and two processes racing on one key both succeed (the last rename wins, with
//!    identical content).
//! 4. Each file starts with a header (magic, length, FNV-1a of the payload). A file that
//!    is short, corrupt or from another format is recompiled and overwritten.
//! 5. Failing to write the cache is not an error (the CUBIN is still returned): it is
//!    logged with `tracing::warn!`.

use std::{
    collections::HashMap,
    env, fmt, fs,
    io::{self, Write},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, OnceLock, PoisonError,
    },
};

use crate::{
    compile::compile,
    error::KernelError,
    hash::{fnv64, Fnv64},
    nvrtc,
    options::{Arch, Options},
    sources::{local_includes, source, sources, KernelSource},
};

const MAGIC: &[u8; 8] = b"RTXCUBN1";
const HEADER: usize = 24;

/// How a cache has answered so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Answered from memory.
    pub memory_hits: u64,
    /// Loaded from a file on disk (no compilation).
    pub disk_hits: u64,
    /// Compiled by NVRTC (a miss in memory and on disk).
    pub compiles: u64,
}

impl fmt::Display for CacheStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel cache: {} memory hits, {} disk hits, {} compiled",
            self.memory_hits, self.disk_hits, self.compiles
        )
    }
}

/// Identifies a slot in memory. `text` is the address and length of the program's
/// `&'static str`: static text is never freed, so its address names it for the life of
/// the process (two equal texts at different addresses only share the disk file).
#[derive(Clone, PartialEq, Eq, Hash)]
struct MemKey {
    name: &'static str,
    text: (usize, usize),
    arch: Arch,
    opts: Options,
}

type Slot = Arc<Mutex<Option<Arc<Vec<u8>>>>>;

/// A CUBIN cache. [`KernelCache::global`] is the one the runtime uses.
pub struct KernelCache {
    dir: Option<PathBuf>,
    slots: Mutex<HashMap<MemKey, Slot>>,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    compiles: AtomicU64,
}

impl KernelCache {
    /// The process-wide cache, on disk in [`KernelCache::default_dir`] (created at the
    /// first write), or in memory only if no folder can be named.
    pub fn global() -> &'static KernelCache {
        static GLOBAL: OnceLock<KernelCache> = OnceLock::new();
        GLOBAL.get_or_init(|| KernelCache::with_dir(Self::default_dir()))
    }

    /// A cache on disk in `dir`, created now if needed.
    ///
    /// # Errors
    ///
    /// [`KernelError::CacheIo`] if the folder cannot be created.
    pub fn open(dir: impl Into<PathBuf>) -> Result<KernelCache, KernelError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| KernelError::CacheIo {
            path: dir.clone(),
            source,
        })?;
        Ok(KernelCache::with_dir(Some(dir)))
    }

    /// A cache that keeps CUBINs in memory only.
    pub fn in_memory() -> KernelCache {
        KernelCache::with_dir(None)
    }

    fn with_dir(dir: Option<PathBuf>) -> KernelCache {
        KernelCache {
            dir,
            slots: Mutex::default(),
            memory_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
        }
    }

    /// The default cache folder: `$RTX_KERNEL_CACHE`, else `$XDG_CACHE_HOME/rtx/kernels`,
    /// else `$HOME/.cache/rtx/kernels`; `None` if none of these is set.
    pub fn default_dir() -> Option<PathBuf> {
        let var = |name: &str| {
            env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        var("RTX_KERNEL_CACHE")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("rtx/kernels")))
            .or_else(|| var("HOME").map(|d| d.join(".cache/rtx/kernels")))
    }

    /// The folder this cache writes to, if it has one.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// How this cache has answered so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            compiles: self.compiles.load(Ordering::Relaxed),
        }
    }

    /// The CUBIN of the built-in program `name` (a `kernels/cuda/<name>.cu` file) for
    /// `arch`, from memory, from disk, or compiled now.
    ///
    /// # Errors
    ///
    /// [`KernelError::UnknownKernel`] for a name with no source; otherwise as
    /// [`compile`](crate::compile).
    ///
    /// # Examples
    ///
    /// ```
    /// use rtx::kernels::{nvrtc_present, Arch, KernelCache, Options};
    /// if nvrtc_present() {
    ///     let cache = KernelCache::in_memory();
    ///     let cubin = cache.cubin("softmax", Arch::SM_90, &Options::default())?;
    ///     let again = cache.cubin("softmax", Arch::SM_90, &Options::default())?;
    ///     assert!(std::sync::Arc::ptr_eq(&cubin, &again));
    ///     assert_eq!(cache.stats().memory_hits, 1);
    /// }
    /// # Ok::<(), rtx::kernels::KernelError>(())
    /// ```
    pub fn cubin(
        &self,
        name: &str,
        arch: Arch,
        opts: &Options,
    ) -> Result<Arc<Vec<u8>>, KernelError> {
        let program = source(name).ok_or_else(|| KernelError::UnknownKernel {
            name: name.to_owned(),
            known: sources()
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        self.cubin_for(program, arch, opts)
    }

    /// Like [`KernelCache::cubin`], for any program (not only the built-in ones).
    ///
    /// # Errors
    ///
    /// As [`compile`](crate::compile).
    pub fn cubin_for(
        &self,
        program: &KernelSource,
        arch: Arch,
        opts: &Options,
    ) -> Result<Arc<Vec<u8>>, KernelError> {
        // An arch-specific program is always built (and named on disk) for `sm_XYa`.
        let opts = &*program.options(opts);
        let key = MemKey {
            name: program.name,
            text: (program.source.as_ptr() as usize, program.source.len()),
            arch,
            opts: opts.key(),
        };
        let slot = Arc::clone(lock(&self.slots).entry(key).or_default());
        let mut cubin = lock(&slot);
        if let Some(found) = cubin.as_ref() {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(found));
        }
        let loaded = Arc::new(self.load_or_compile(program, arch, opts)?);
        *cubin = Some(Arc::clone(&loaded));
        Ok(loaded)
    }

    fn load_or_compile(
        &self,
        program: &KernelSource,
        arch: Arch,
        opts: &Options,
    ) -> Result<Vec<u8>, KernelError> {
        let version = nvrtc::probe().map_err(|detail| KernelError::NvrtcMissing { detail })?;
        let path = self
            .dir
            .as_ref()
            .map(|dir| dir.join(file_name(program, arch, opts, version)));
        if let Some(cubin) = path.as_deref().and_then(read_cubin) {
            self.disk_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(cubin);
        }
        let cubin = compile(program, arch, opts)?.cubin;
        self.compiles.fetch_add(1, Ordering::Relaxed);
        if let Some(path) = path {
            if let Err(e) = write_cubin(&path, &cubin) {
                tracing::warn!("not caching kernel `{}`: {e}", program.name);
            }
        }
        Ok(cubin)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a slot leaves it empty or filled, both consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `<name>-<arch>-<key>.cubin`, the key as described in the module docs.
fn file_name(program: &KernelSource, arch: Arch, opts: &Options, version: (i32, i32)) -> String {
    let gpu_arch = arch.gpu_arch(opts.arch_specific);
    let mut h = Fnv64::new();
    h.field(MAGIC)
        .field(program.name.as_bytes())
        .field(program.source.as_bytes());
    for header in local_includes(program.source) {
        h.field(header.name.as_bytes())
            .field(header.source.as_bytes());
    }
    h.field(gpu_arch.as_bytes());
    for flag in opts.key().nvrtc_flags(arch, None) {
        h.field(flag.as_bytes());
    }
    h.bytes(&version.0.to_le_bytes())
        .bytes(&version.1.to_le_bytes());
    let name: String = program
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{name}-{gpu_arch}-{:016x}.cubin", h.finish())
}

/// The CUBIN stored at `path`, or `None` if it is missing or not a whole, valid file.
fn read_cubin(path: &Path) -> Option<Vec<u8>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!("recompiling: cannot read {}: {e}", path.display());
            return None;
        }
    };
    let (head, payload) = bytes.split_at_checked(HEADER)?;
    let len = u64::from_le_bytes(head[8..16].try_into().ok()?);
    let sum = u64::from_le_bytes(head[16..24].try_into().ok()?);
    let whole = &head[..8] == MAGIC && len == payload.len() as u64 && sum == fnv64(payload);
    (whole && payload.starts_with(b"\x7fELF")).then(|| payload.to_vec())
}

/// Writes `cubin` to `path` through a temporary file and a rename.
fn write_cubin(path: &Path, cubin: &[u8]) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or("kernel.cubin");
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{file}.{}.{seq}.tmp", std::process::id()));
    let written = (|| {
        let mut out = fs::File::create(&tmp)?;
        out.write_all(MAGIC)?;
        out.write_all(&(cubin.len() as u64).to_le_bytes())?;
        out.write_all(&fnv64(cubin).to_le_bytes())?;
        out.write_all(cubin)?;
        drop(out);
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back_and_damage_is_detected() {
        let dir = env::temp_dir().join(format!("rtx-kernels-unit-{}", std::process::id()));
        let path = dir.join("x-sm_90-0.cubin");
        let cubin = b"\x7fELF and the rest".to_vec();
        write_cubin(&path, &cubin).unwrap();
        assert_eq!(read_cubin(&path), Some(cubin.clone()));
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(read_cubin(&path), None, "a flipped bit must be caught");
        fs::write(&path, &bytes[..10]).unwrap();
        assert_eq!(read_cubin(&path), None, "a short file must be caught");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_key_changes_with_arch_and_options_but_not_verbose() {
        let p = KernelSource {
            name: "k",
            source: "x",
        };
        let base = file_name(&p, Arch::SM_90, &Options::default(), (13, 0));
        let verbose = Options {
            verbose: true,
            ..Options::default()
        };
        let fast = Options {
            fast_math: true,
            ..Options::default()
        };
        assert_eq!(base, file_name(&p, Arch::SM_90, &verbose, (13, 0)));
        assert_ne!(base, file_name(&p, Arch::SM_90, &fast, (13, 0)));
        assert_ne!(
            base,
            file_name(&p, Arch::new(8, 0), &Options::default(), (13, 0))
        );
        assert_ne!(
            base,
            file_name(&p, Arch::SM_90, &Options::default(), (13, 1))
        );
    }
}
