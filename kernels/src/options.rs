//! What a compilation targets (`Arch`) and how (`Options`), rendered as NVRTC flags;
//! and where the CUDA headers are found.

use std::{
    env, fmt,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

/// A real GPU architecture (compute capability), e.g. `sm_90` for Hopper. NVRTC emits
/// CUBIN only for real architectures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Compute capability major version (9 on Hopper).
    pub major: u32,
    /// Compute capability minor version (0 on H100/H200).
    pub minor: u32,
}

impl Arch {
    /// Hopper (H100, H200).
    pub const SM_90: Arch = Arch { major: 9, minor: 0 };

    /// The architecture of compute capability `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Arch { major, minor }
    }

    /// The `--gpu-architecture` value: `sm_90`, or `sm_90a` with `arch_specific`.
    pub fn gpu_arch(self, arch_specific: bool) -> String {
        let suffix = if arch_specific { "a" } else { "" };
        format!("sm_{}{}{suffix}", self.major, self.minor)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

/// Compilation options. `Options::default()` is what the runtime uses: precise math,
/// no ptxas report, the portable architecture.
///
/// Every field but `verbose` is part of the cache key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Options {
    /// `--use_fast_math` (flush denormals, approximate division, sqrt and
    /// transcendentals). Opt-in: it changes results.
    pub fast_math: bool,
    /// `--ptxas-options=-v`: put registers, spills and shared memory per kernel in the
    /// log (see [`Compiled::resources`](crate::Compiled::resources)).
    pub verbose: bool,
    /// Compile for the architecture-specific target (`sm_90a`), which `wgmma` and
    /// `setmaxnreg` need. Such a CUBIN loads only on exactly that architecture.
    pub arch_specific: bool,
    /// `-lineinfo`, for profilers.
    pub line_info: bool,
    /// Extra include folders (`-I`), searched before the CUDA headers.
    pub include_dirs: Vec<PathBuf>,
    /// Extra NVRTC flags, passed as given (e.g. `-DBLOCK=128`).
    pub extra: Vec<String>,
}

impl Options {
    /// The NVRTC flags for `arch`, with `cuda_include` (if any) as the last `-I`.
    pub(crate) fn nvrtc_flags(&self, arch: Arch, cuda_include: Option<&Path>) -> Vec<String> {
        let mut flags = vec![
            format!("--gpu-architecture={}", arch.gpu_arch(self.arch_specific)),
            "-std=c++17".to_owned(),
            "-default-device".to_owned(),
        ];
        if self.fast_math {
            flags.push("--use_fast_math".to_owned());
        }
        if self.line_info {
            flags.push("-lineinfo".to_owned());
        }
        if self.verbose {
            flags.push("--ptxas-options=-v".to_owned());
        }
        let dirs = self
            .include_dirs
            .iter()
            .map(PathBuf::as_path)
            .chain(cuda_include);
        flags.extend(dirs.map(|d| format!("-I{}", d.display())));
        flags.extend(self.extra.iter().cloned());
        flags
    }

    /// The options with everything that does not change the CUBIN cleared.
    pub(crate) fn key(&self) -> Options {
        Options {
            verbose: false,
            ..self.clone()
        }
    }
}

/// The folder of CUDA headers (`cuda_fp16.h`, `cuda_bf16.h`, ...) handed to NVRTC: the
/// first of `$RTX_CUDA_INCLUDE`, `$CUDA_HOME/include`, `$CUDA_PATH/include`,
/// `/usr/local/cuda/include`, `$RTX_NVRTC_DIR/nvidia/cu13/include`, the
/// `nvidia/cu13/include` folder of a pip-installed CUDA runtime in python3's
/// site-packages, and this repository's `.nvrtc/nvidia/cu13/include` (made by
/// `.ci/nvrtc-setup`) that holds `cuda_fp16.h`. Looked up once per process.
pub fn cuda_include_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(find_cuda_include).as_deref()
}

fn find_cuda_include() -> Option<PathBuf> {
    let var = |name: &str| {
        env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let pip = Path::new("nvidia/cu13/include");
    let cheap = [
        var("RTX_CUDA_INCLUDE"),
        var("CUDA_HOME").map(|d| d.join("include")),
        var("CUDA_PATH").map(|d| d.join("include")),
        Some(PathBuf::from("/usr/local/cuda/include")),
        var("RTX_NVRTC_DIR").map(|d| d.join(pip)),
    ];
    let has_headers = |d: &PathBuf| d.join("cuda_fp16.h").is_file();
    if let Some(dir) = cheap.into_iter().flatten().find(has_headers) {
        return Some(dir);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.nvrtc")
        .join(pip);
    python_site_packages()
        .into_iter()
        .map(|site| site.join(pip))
        .chain(std::iter::once(repo))
        .find(has_headers)
}

/// python3's site-packages folders (system and user), or none if python3 is absent.
fn python_site_packages() -> Vec<PathBuf> {
    let script = "import site,sys\n\
                  p=list(site.getsitepackages())\n\
                  try: p.append(site.getusersitepackages())\n\
                  except Exception: pass\n\
                  print('\\n'.join(p))";
    match Command::new("python3").args(["-c", script]).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_the_options() {
        let opts = Options {
            fast_math: true,
            verbose: true,
            arch_specific: true,
            ..Options::default()
        };
        let flags = opts.nvrtc_flags(Arch::SM_90, Some(Path::new("/cuda/include")));
        assert_eq!(flags[0], "--gpu-architecture=sm_90a");
        for f in [
            "-std=c++17",
            "-default-device",
            "--use_fast_math",
            "--ptxas-options=-v",
        ] {
            assert!(flags.iter().any(|x| x == f), "{f} missing from {flags:?}");
        }
        assert_eq!(flags.last().map(String::as_str), Some("-I/cuda/include"));
        let plain = Options::default().nvrtc_flags(Arch::new(8, 9), None);
        assert_eq!(
            plain,
            ["--gpu-architecture=sm_89", "-std=c++17", "-default-device"]
        );
    }

    #[test]
    fn the_key_ignores_verbose() {
        let v = Options {
            verbose: true,
            ..Options::default()
        };
        assert_eq!(v.key(), Options::default());
    }
}
