//! The `rtx` command line: `rtx` alone runs the main job (the training sweep, `cli/sweep.rs`);
//! `rtx info`, `rtx demo`, `rtx bench` (`rtx --help` lists them).

/// With the `mimalloc` feature this program allocates through mimalloc (see the README,
/// "Host allocator").
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli {
    pub mod bench;
    pub mod sweep;
}

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use rtx::ops::{elementwise as ew, reduce, softmax};
use rtx::{block_on, Backend, Runtime, Submission, Tensor};

/// rtx: an actor-based multi-stream execution runtime for CUDA GPUs, with a CPU backend.
///
/// Without a command, runs the main job: 8 heterogeneous training pipelines at once on
/// one runtime (a sweep of MLP classifiers on a synthetic teacher task), with a progress
/// bar per pipeline, a final table, and the timeline of the streams written as a Chrome
/// trace (Perfetto) and an SVG. On the CPU backend the sweep is scaled down to finish in
/// about a minute.
///
/// Each command runs on the backend `--backend` names; by default the best one present
/// (CUDA when a driver and a device are found, else the CPU backend).
#[derive(Parser, Debug)]
#[command(name = "rtx", version, about, long_about)]
struct Cli {
    /// The backend to run on.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto, global = true)]
    backend: BackendArg,
    /// The main job: compute streams (default 8 on CUDA, 2 on the CPU).
    #[arg(long, default_value_t = 0)]
    streams: usize,
    /// The main job: steps per model (default 200 on CUDA, 300 on the CPU).
    #[arg(long, default_value_t = 0)]
    steps: u64,
    /// The main job: the folder for rtx-timeline.json and rtx-timeline.svg.
    #[arg(long, default_value = "target/rtx-timeline")]
    out: std::path::PathBuf,
    /// The main job: no progress bars.
    #[arg(long)]
    quiet: bool,
    /// The main job: each pipeline's whole step captured once into a graph and launched
    /// every step (a CUDA graph per stream segment on the GPU; on the CPU the recorded
    /// ops are replayed).
    #[arg(long)]
    graphs: bool,
    /// The main job: the folder whose .rs and .md files the character-level LM beside
    /// the sweep trains on (default: this repository, found from the current folder
    /// upwards or where rtx was built).
    #[arg(long)]
    text: Option<std::path::PathBuf>,
    /// The main job: the LM's steps (default 400 on CUDA, 300 on the CPU).
    #[arg(long, default_value_t = 0)]
    lm_steps: u64,
    /// The main job: no character-level LM beside the sweep.
    #[arg(long)]
    no_lm: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

/// `--backend` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// CUDA when a device is usable, else the CPU.
    Auto,
    /// The CPU backend (rayon).
    Cpu,
    /// Every CUDA device (an error when there is none).
    Cuda,
}

impl BackendArg {
    fn backend(self) -> Backend {
        match self {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Cpu => Backend::Cpu,
            BackendArg::Cuda => Backend::Cuda(Vec::new()),
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// What rtx found: backend, devices, streams, CUDA libraries, NVRTC.
    Info,
    /// Run a multi-stream DAG of ops on the chosen backend and show what ran
    /// where and how long (the quickstart).
    Demo,
    /// Run the benchmark harness (benches/harness.rs) with these suites, or the sweep
    /// benchmark (benches/sweep.rs) for `rtx bench sweep`; needs the repository (it runs
    /// `cargo bench`) or a staged `bench-harness` / `bench-sweep` beside this executable.
    Bench {
        /// Suites (e.g. `gemm conv streams`; `sweep` for the sweep benchmark); none: the
        /// harness's default suites.
        suites: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Some(Command::Info) => info(cli.backend.backend()),
        Some(Command::Demo) => demo(cli.backend.backend()),
        Some(Command::Bench { suites }) => return cli::bench::run(&suites),
        None => cli::sweep::run(cli::sweep::Args {
            backend: cli.backend.backend(),
            streams: cli.streams,
            steps: cli.steps,
            out: cli.out,
            quiet: cli.quiet,
            graphs: cli.graphs,
            text: if cli.no_lm {
                cli::sweep::LmText::None
            } else {
                cli.text
                    .map_or(cli::sweep::LmText::Repository, cli::sweep::LmText::Dir)
            },
            lm_steps: cli.lm_steps,
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rtx: {e}");
            ExitCode::FAILURE
        }
    }
}

fn present(f: unsafe fn() -> bool) -> &'static str {
    // SAFETY: the `is_culib_present` probes only try to dlopen a library by name.
    match std::panic::catch_unwind(|| unsafe { f() }) {
        Ok(true) => "found",
        _ => "not found",
    }
}

fn info(backend: Backend) -> rtx::Result<()> {
    let rt = Runtime::builder().backend(backend).build()?;
    print!("{}", rt.info());
    match rtx::cuda::probe() {
        Ok(n) => println!("CUDA driver: found, {n} device(s)"),
        Err(e) => println!("CUDA driver: {e}"),
    }
    println!("cuBLAS: {}", present(cudarc::cublas::sys::is_culib_present));
    println!(
        "cuBLASLt: {}",
        present(cudarc::cublaslt::sys::is_culib_present)
    );
    println!("cuDNN: {}", present(cudarc::cudnn::sys::is_culib_present));
    match rtx::kernels::nvrtc_version() {
        Some((a, b)) if rtx::kernels::nvrtc_present() => println!("NVRTC: {a}.{b}"),
        _ => println!("NVRTC: not found"),
    }
    match rtx::kernels::cuda_include_dir() {
        Some(d) => println!("CUDA headers: {}", d.display()),
        None => println!("CUDA headers: not found (set RTX_CUDA_INCLUDE)"),
    }
    if let Some(d) = rtx::kernels::KernelCache::global().dir() {
        println!("kernel cache: {}", d.display());
    }
    Ok(())
}

struct Ran {
    what: String,
    sub: Submission<Tensor>,
    at: Instant,
}

/// Four independent branches, each a short chain of element-wise ops on its own data,
/// joined by a sum and reduced: the scheduler spreads the branches over the streams and
/// the join waits on their ready events.
fn demo(backend: Backend) -> rtx::Result<()> {
    let rt = Runtime::builder()
        .backend(backend)
        .streams(4)
        .policy(rtx::scheduler::EarliestFinish::new())
        .build()?;
    print!("{}", rt.info());
    let n = if rt.backend() == rtx::BackendKind::Cuda {
        1 << 24
    } else {
        1 << 20
    };
    let data: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let start = Instant::now();
    let mut ran: Vec<Ran> = Vec::new();
    let mut push = |what: String, sub: Submission<Tensor>| -> Tensor {
        let t = sub.outputs().cloned().expect("tensor output");
        ran.push(Ran {
            what,
            sub,
            at: Instant::now(),
        });
        t
    };
    let w = rt.upload(&data, [n])?;
    let mut heads = Vec::new();
    for b in 0..4 {
        let x = rt.upload(
            &data[b..]
                .iter()
                .chain(&data[..b])
                .copied()
                .collect::<Vec<_>>(),
            [n],
        )?;
        let y = push(format!("branch {b}: mul"), rt.submit(ew::mul(&x, &w))?);
        let y = push(format!("branch {b}: relu"), rt.submit(ew::relu_(y))?);
        let y = push(format!("branch {b}: exp"), rt.submit(ew::exp_(y))?);
        heads.push(y);
    }
    let s01 = push(
        "join: add 0+1".into(),
        rt.submit(ew::add(&heads[0], &heads[1]))?,
    );
    let s23 = push(
        "join: add 2+3".into(),
        rt.submit(ew::add(&heads[2], &heads[3]))?,
    );
    let all = push("join: add".into(), rt.submit(ew::add_(s01, &s23))?);
    let rows = all.reshape([n / 1024, 1024])?;
    let sm = push("softmax rows".into(), rt.submit(softmax::softmax(&rows))?);
    let total = push("sum".into(), rt.submit(reduce::sum(&sm))?);
    let submitted = start.elapsed();
    let v = block_on(rt.to_vec::<f32>(&total)?)?;
    println!(
        "\n{:<18} {:>7} {:>13} {:>13}",
        "op", "stream", "submitted at", "done by"
    );
    for r in ran {
        let stream = r.sub.stream();
        block_on(r.sub)?;
        let done = start.elapsed();
        println!(
            "{:<18} {:>7} {:>10.3} ms {:>10.3} ms",
            r.what,
            stream.index(),
            ms(r.at.duration_since(start)),
            ms(done)
        );
    }
    println!(
        "\nsubmitted {} ops in {:.3} ms; result sum(softmax) = {:.1} (expected {}); total {:.3} ms",
        16,
        ms(submitted),
        v[0],
        n / 1024,
        ms(start.elapsed())
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
