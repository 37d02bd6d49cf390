//! The `rtx` command line: `--help`, `--version`, errors on bad arguments, and `info` on
//! the CPU backend.

use std::process::{Command, Output};

fn rtx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rtx"))
        .args(args)
        .output()
        .expect("the rtx binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_is_on_stdout_and_exits_0() {
    let out = rtx(&["--help"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("Usage: rtx"), "no usage line in {stdout:?}");
    for sub in ["info", "demo"] {
        assert!(
            stdout.contains(sub),
            "subcommand {sub} not listed in {stdout:?}"
        );
    }
    let sub = rtx(&["demo", "--help"]);
    assert_eq!(sub.status.code(), Some(0));
    assert!(text(&sub.stdout).contains("Usage: rtx demo"));
}

#[test]
fn version_prints_the_crate_version() {
    let out = rtx(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("rtx {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn unknown_subcommand_is_an_error_on_stderr() {
    let out = rtx(&["frobnicate"]);
    assert_ne!(out.status.code(), Some(0));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("error") && stderr.contains("frobnicate"),
        "stderr: {stderr:?}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn no_subcommand_prints_usage_on_stderr_and_exits_2() {
    let out = rtx(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Usage: rtx"));
}

#[test]
fn info_runs_on_the_cpu_backend() {
    let out = rtx(&["--backend", "cpu", "info"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("backend: Cpu"),
        "no CPU backend in {stdout:?}"
    );
    assert!(stdout.contains("NVRTC:"), "no NVRTC line in {stdout:?}");
}
