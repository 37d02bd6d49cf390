//! Compiles kernel programs for sm_90 (sm_90a for the arch-specific ones, e.g.
//! `attention_wgmma`) with the ptxas report on and prints registers, spills and shared
//! memory per kernel.
//!
//! `cargo run -p rtx-kernels --example ptxas -- [program ...] [--log] [--out=DIR] [--flag=NVRTC_FLAG ...]`
//! (`--out` writes each CUBIN to DIR/<program>.cubin, e.g. for `cuobjdump -sass`)

use std::time::Instant;

use rtx_kernels::{compile, nvrtc_version, sources, Arch, Options};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let show_log = args.iter().any(|a| a == "--log");
    let out_dir = args.iter().find_map(|a| a.strip_prefix("--out="));
    let wanted: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let Some((major, minor)) = nvrtc_version() else {
        eprintln!("NVRTC not found (see .ci/nvrtc-setup)");
        std::process::exit(2);
    };
    println!("NVRTC {major}.{minor}");
    let extra = args
        .iter()
        .filter_map(|a| a.strip_prefix("--flag="))
        .map(String::from)
        .collect();
    let opts = Options {
        verbose: true,
        extra,
        ..Options::default()
    };
    for program in sources()
        .iter()
        .filter(|s| wanted.is_empty() || wanted.iter().any(|w| *w == s.name))
    {
        let start = Instant::now();
        match compile(program, Arch::SM_90, &opts) {
            Ok(built) => {
                println!(
                    "{} ({}): {} bytes of CUBIN in {:.2?}",
                    program.name,
                    Arch::SM_90.gpu_arch(program.options(&opts).arch_specific),
                    built.cubin.len(),
                    start.elapsed()
                );
                if let Some(dir) = out_dir {
                    let path = std::path::Path::new(dir).join(format!("{}.cubin", program.name));
                    if let Err(e) = std::fs::write(&path, &built.cubin) {
                        eprintln!("writing {}: {e}", path.display());
                    }
                }
                if show_log {
                    println!("{}", built.log);
                }
                for k in built.resources() {
                    println!(
                        "  {:<32} {:>3} regs {:>5} B smem {:>4} B stack {:>4} B spill st {:>4} B spill ld",
                        k.name, k.registers, k.shared, k.stack_frame, k.spill_stores, k.spill_loads
                    );
                }
            }
            Err(e) => println!("{}: {e}", program.name),
        }
    }
}
