//! `rtx bench`: runs the benchmark harness (benches/harness.rs) or the sweep benchmark
//! (benches/sweep.rs): a staged executable beside this one (`bench-harness`,
//! `bench-sweep`, as benches/gpu/run stages them) when there is one, else `cargo bench`
//! in the repository this executable was built from.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// Runs the suites; the exit code is the benchmark's.
pub fn run(suites: &[String]) -> ExitCode {
    let sweep = suites.first().is_some_and(|s| s == "sweep");
    let (bench, args): (&str, &[String]) = if sweep {
        ("sweep", &suites[1..])
    } else {
        ("harness", suites)
    };
    let staged: Option<PathBuf> = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(format!("bench-{bench}"))))
        .filter(|p| p.is_file());
    let mut cmd = match staged {
        Some(p) => {
            let mut c = Command::new(p);
            c.arg("--bench");
            c
        }
        None => {
            let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            c.current_dir(env!("CARGO_MANIFEST_DIR"))
                .args(["bench", "--bench", bench, "--"]);
            c
        }
    };
    cmd.args(args);
    eprintln!("rtx bench: {cmd:?}");
    match cmd.status() {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => ExitCode::from(s.code().map_or(1, |c| c.clamp(1, 255) as u8)),
        Err(e) => {
            eprintln!("rtx bench: could not run {cmd:?}: {e}");
            ExitCode::FAILURE
        }
    }
}
