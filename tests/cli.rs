//! The `rtx` command line: `--help`, `--version`, errors on bad arguments, `info` on the
//! CPU backend, and the main job (no subcommand: the sweep) in a short CPU run.

use std::process::{Command, Output};

/// The `rtx` binary: `RTX_BIN` when set (a GPU host runs the staged copy, where the
/// build machine's path does not exist: `benches/gpu/run tests` sets it), else the one
/// Cargo built.
fn bin() -> std::ffi::OsString {
    std::env::var_os("RTX_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_rtx").into())
}

fn rtx(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("the rtx binary runs")
}

/// The start of the usage line: clap names the program by its file name (`rtx`, or the
/// staged copy's `bin-rtx`).
fn usage() -> String {
    let bin = bin();
    let name = std::path::Path::new(&bin)
        .file_name()
        .expect("the binary's path names a file")
        .to_string_lossy()
        .into_owned();
    format!("Usage: {name}")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_is_on_stdout_and_exits_0() {
    let out = rtx(&["--help"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains(&usage()), "no usage line in {stdout:?}");
    for sub in ["info", "demo", "bench"] {
        assert!(
            stdout.contains(sub),
            "subcommand {sub} not listed in {stdout:?}"
        );
    }
    let sub = rtx(&["demo", "--help"]);
    assert_eq!(sub.status.code(), Some(0));
    assert!(text(&sub.stdout).contains(&format!("{} demo", usage())));
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

/// The main job on the CPU backend, 4 steps, quiet, with `extra` arguments; its timeline
/// folder (named after `tag`) and output.
fn main_job(tag: &str, extra: &[&str]) -> (std::path::PathBuf, Output) {
    let dir = std::env::temp_dir().join(format!("rtx-cli-{tag}-{}", std::process::id()));
    let mut args = vec![
        "--backend",
        "cpu",
        "--steps",
        "4",
        "--lm-steps",
        "4",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    args.extend(["--out", dir.to_str().expect("utf-8 temp dir")]);
    let out = rtx(&args);
    (dir, out)
}

#[test]
fn no_subcommand_runs_the_main_job_the_sweep() {
    let (dir, out) = main_job("main", &[]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("scaled down for the CPU backend"),
        "{stdout}"
    );
    for col in [
        "model",
        "params",
        "final loss",
        "accuracy",
        "samples/s",
        "streams",
    ] {
        assert!(stdout.contains(col), "no {col} column in {stdout}");
    }
    assert_eq!(
        stdout.matches("mlp-").count(),
        8,
        "8 models in the table: {stdout}"
    );
    assert!(stdout.contains("whole sweep:"), "{stdout}");
    assert!(stdout.contains("\ncnn-8x8 "), "the CNN's row: {stdout}");
    // The LM beside it, on the repository's text (the test's working folder).
    assert!(
        stdout.contains("character-level causal transformer"),
        "{stdout}"
    );
    let lm = stdout
        .lines()
        .find(|l| l.starts_with("char-lm: loss"))
        .unwrap_or_else(|| panic!("no char-lm line in {stdout}"));
    assert!(
        lm.contains("(step 4)") && lm.contains("unigram entropy"),
        "{lm}"
    );
    let json = std::fs::read_to_string(dir.join("rtx-timeline.json")).expect("trace written");
    assert!(json.starts_with("{\"traceEvents\":[") && json.contains("cpu stream 1"));
    let svg = std::fs::read_to_string(dir.join("rtx-timeline.svg")).expect("svg written");
    assert!(svg.starts_with("<svg"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_main_job_runs_with_graphs() {
    let (dir, out) = main_job("graphs", &["--graphs"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("captured once into a graph"), "{stdout}");
    assert_eq!(stdout.matches("mlp-").count(), 8, "8 models: {stdout}");
    assert!(stdout.contains("whole sweep:"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_main_job_runs_without_the_lm() {
    let (dir, out) = main_job("nolm", &["--no-lm"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("whole sweep:"), "{stdout}");
    assert!(!stdout.contains("char-lm"), "--no-lm runs no LM: {stdout}");
    let _ = std::fs::remove_dir_all(&dir);
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
