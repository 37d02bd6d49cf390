//! Compiles every kernel program for sm_90 into the kernel cache (`RTX_KERNEL_CACHE` or
//! the default folder), so that a GPU run starts without compiling: the cache key covers
//! source, headers, arch, options and the NVRTC version.
//!
//! `RTX_KERNEL_CACHE=DIR cargo run -p rtx-kernels --example warm_cache`

use rtx_kernels::{sources, Arch, KernelCache, Options};

fn main() {
    let cache = KernelCache::global();
    for s in sources() {
        match cache.cubin(s.name, Arch::SM_90, &Options::default()) {
            Ok(c) => println!("{}: {} bytes", s.name, c.len()),
            Err(e) => {
                eprintln!("{}: {e}", s.name);
                std::process::exit(1);
            }
        }
    }
    println!("{}", cache.stats());
}
