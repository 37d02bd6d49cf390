//! The sweep benchmark: samples/s of the whole sweep (8 heterogeneous MLP training
//! pipelines at once on one runtime, `rtx_train::pipeline::sweep`) with 1, 2, 4 and 8
//! compute streams, each eagerly and with every pipeline's step as a graph
//! (`PipelineConfig::graph`: one training step captured, then launched per step); and
//! one small model's step alone, eager against graph. The PyTorch side is
//! `benches/torch_sweep.py` (same models, batch and steps).
//!
//! ```text
//! cargo bench --bench sweep [-- [STREAMS ...] [--eager|--graphs] [--upload|--resident]
//!                              [--stacked|--no-stacked] [--no-step] [--each]]
//!     default: streams 1 2 4 8, eager and graph rows, batches uploaded and resident,
//!     then the stacked rows, then the step rows; --stacked: only the stacked rows;
//!     --each: only each model's step alone, eager and graph
//!     (`sweep_each_{eager,graph}_MODEL`)
//! ```
//!
//! One JSON line per stream count and form: `{"case": "sweep_rtx_streams4"` (eager) or
//! `"sweep_rtx_graphs_streams4"` (graphs), `"samples_per_s": .., "wall_s": .., "steps":
//! .., "batch": ..}`; the graph rows' `samples_per_s` is the steady state after every
//! pipeline's first step (its capture), as PyTorch's graph forms time theirs after
//! capture, and `samples_per_s_with_capture` the whole run. The `_resident_` rows (`sweep_rtx_resident_streams4`,
//! `sweep_rtx_graphs_resident_streams4`) keep every batch on the device
//! (`PipelineConfig::resident`), uploaded before the clock starts
//! (`Pipeline::preload`: the 32-batch epoch), as PyTorch's forms keep their data on the
//! GPU; the other rows upload every batch. The stacked rows (`sweep_rtx_stacked`, `sweep_rtx_stacked_graphs`) train the
//! 8 models of one shape of PyTorch's stacked forms (512 wide, 3 deep, AdamW) as one
//! `rtx_train::StackedMlp` on one stream, batches resident, `"members": 8`; their
//! samples count every member's rows. Then the step of the sweep's smallest model on one stream:
//! `{"case": "sweep_step_eager" | "sweep_step_graph", "us_per_step": .., "model": ..}`,
//! timed after its first step (the capture, for the graph), over `STEP_STEPS` steps;
//! `"sweep_step_speedup"` is eager time / graph time (issue 13's target: >= 2 on the
//! H200). On CUDA it runs the full sweep (256-d, batch 512, 200 steps, bf16 compute with
//! f32 masters, AdamW/SGD fused steps); each batch is uploaded on the copy stream
//! double-buffered (PyTorch's forms keep the data on the GPU). Each run follows a 10-step
//! warm-up on the same runtime (kernel loads, library handles, caches), of the same
//! form. On the CPU backend it runs the scaled-down CPU sweep, as `rtx` does. With
//! `RTX_TRACE=1` each row adds `"<case>_overlap"` (the streams' device time, their union
//! and the mean number busy, and each stream's first start and last end), with
//! `RTX_PROFILE=1` `"<case>_phases"` (the host phases'
//! mean µs and sample counts over the timed run, `Runtime::stats`). `SWEEP_LOSS_EVERY=N`
//! reads the loss every N steps, `SWEEP_PREFETCH=N` uploads the batches N steps ahead
//! (profiling runs; the defaults are the sweep's: 10 and
//! `rtx_train::pipeline::DEFAULT_PREFETCH`).

/// With the `mimalloc` feature this program allocates through mimalloc (see the README,
/// "Host allocator").
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use rtx::train::pipeline::run_concurrently;
use rtx::train::pipeline::sweep::SweepConfig;
use rtx::{BackendKind, Runtime};

/// Steps of the one-model step bench.
const STEP_STEPS: u64 = 400;

fn config(rt: &Runtime, graphs: bool, resident: bool) -> SweepConfig {
    let cfg = if rt.backend() == BackendKind::Cuda {
        SweepConfig::full()
    } else {
        SweepConfig::cpu()
    };
    // `SWEEP_LOSS_EVERY=N` reads the loss back every N steps instead (profiling runs;
    // PyTorch's forms read theirs once, at the end).
    let loss_every = std::env::var("SWEEP_LOSS_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u64| n > 0)
        .unwrap_or(cfg.loss_every);
    // `SWEEP_PREFETCH=N`: the batches uploaded N steps ahead instead.
    let prefetch = std::env::var("SWEEP_PREFETCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(cfg.prefetch);
    SweepConfig {
        graphs,
        resident,
        loss_every,
        prefetch,
        ..cfg
    }
}

/// A row's case name.
fn case(n: usize, graphs: bool, resident: bool) -> String {
    format!(
        "sweep_rtx_{}{}streams{n}",
        if graphs { "graphs_" } else { "" },
        if resident { "resident_" } else { "" }
    )
}

/// One sweep row; an error (a step that could not be captured, say) is returned for
/// the caller to print as the row's failure, and the other rows still run.
fn sweep(n: usize, graphs: bool, resident: bool) -> rtx::Result<()> {
    let rt = Runtime::builder().streams(n).build()?;
    let cfg = config(&rt, graphs, resident);
    let streams = rt.compute_streams(rt.device());
    let warm = SweepConfig {
        steps: 10,
        ..cfg.clone()
    };
    let (_, mut ps) = warm.build(&rt, &streams, 1, 8)?;
    run_concurrently(&mut ps, &|_, _| {})?;
    drop(ps);
    let (_, mut ps) = cfg.build(&rt, &streams, 1, 32)?;
    // Resident rows: every batch on the device before the clock starts, as PyTorch's
    // forms keep theirs (`Pipeline::preload`); else the first epoch's uploads, 32
    // batches per pipeline, would be timed.
    for p in &mut ps {
        p.preload()?;
    }
    let start = Instant::now();
    // With graphs, every pipeline's first step (its capture, then its first launch) runs
    // before the steady-state clock starts, as PyTorch's graph forms capture before
    // theirs; `wall_with_capture_s` keeps the whole run's time.
    let steady = if graphs {
        first_steps(&mut ps)?;
        for &s in &streams {
            rt.mark(s)?.wait()?;
        }
        Instant::now()
    } else {
        start
    };
    let skipped = u64::from(graphs);
    if rt.settings().trace {
        // Only the timed run's spans.
        drop(rt.take_trace());
    }
    rt.reset_stats();
    run_concurrently(&mut ps, &|_, _| {})?;
    let wall = steady.elapsed().as_secs_f64();
    if rt.settings().trace {
        overlap(&case(n, graphs, resident), &rt.take_trace());
    }
    // With `RTX_PROFILE=1`: where the timed run's host time went, per op phase.
    let phases = rt.stats().phases;
    if !phases.is_empty() {
        let list: Vec<String> = phases
            .iter()
            .map(|p| format!("\"{}\": [{:.2}, {}]", p.phase, p.mean_us, p.samples))
            .collect();
        println!(
            "{{\"case\": \"{}_phases\", \"mean_us_and_samples\": {{{}}}}}",
            case(n, graphs, resident),
            list.join(", ")
        );
    }
    let whole = start.elapsed().as_secs_f64();
    let samples: u64 = ps
        .iter()
        .map(|p| p.steps_done().saturating_sub(skipped) * cfg.batch as u64)
        .sum();
    let all: u64 = ps.iter().map(|p| p.steps_done() * cfg.batch as u64).sum();
    println!(
        "{{\"case\": \"{}\", \"backend\": \"{:?}\", \"samples_per_s\": {:.1}, \"wall_s\": {wall:.4}, \"samples_per_s_with_capture\": {:.1}, \"wall_with_capture_s\": {whole:.4}, \"steps\": {}, \"batch\": {}}}",
        case(n, graphs, resident),
        rt.backend(),
        samples as f64 / wall,
        all as f64 / whole,
        cfg.steps,
        cfg.batch
    );
    Ok(())
}

/// With the timeline recorder on (`RTX_TRACE=1`): how much the streams' device work
/// overlapped during the timed run: per stream the device time its ops covered, their
/// union over all streams, and the mean number of streams busy while any was
/// (`sum / union`; 1.0 when the streams took turns).
fn overlap(case: &str, spans: &[rtx::TraceSpan]) {
    let mut by_stream: std::collections::BTreeMap<usize, Vec<(f64, f64)>> = Default::default();
    for s in spans {
        by_stream
            .entry(s.stream.index())
            .or_default()
            .push((s.start_us, s.start_us + s.dur_us));
    }
    let merge = |mut v: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut out: Vec<(f64, f64)> = Vec::new();
        for (a, b) in v {
            match out.last_mut() {
                Some(l) if a <= l.1 => l.1 = l.1.max(b),
                _ => out.push((a, b)),
            }
        }
        out
    };
    let len = |v: &[(f64, f64)]| v.iter().map(|(a, b)| b - a).sum::<f64>();
    let mut sum = 0.0;
    let mut all = Vec::new();
    let mut per = Vec::new();
    let mut extent = Vec::new();
    for (sid, v) in by_stream {
        let m = merge(v);
        let busy = len(&m);
        sum += busy;
        per.push(format!("\"{sid}\": {:.0}", busy));
        // When the stream's first op started and its last ended: a stream busy for less
        // than that waited between its ops.
        if let (Some(a), Some(b)) = (m.first(), m.last()) {
            extent.push(format!("\"{sid}\": [{:.0}, {:.0}]", a.0, b.1));
        }
        all.extend(m);
    }
    let union = len(&merge(all));
    let (first, last) = spans.iter().fold((f64::MAX, f64::MIN), |(a, b), s| {
        (a.min(s.start_us), b.max(s.start_us + s.dur_us))
    });
    println!(
        "{{\"case\": \"{case}_overlap\", \"spans\": {}, \"window_us\": {:.0}, \"union_us\": {union:.0}, \"sum_us\": {sum:.0}, \"mean_busy_streams\": {:.2}, \"busy_us_by_stream\": {{{}}}, \"first_last_us_by_stream\": {{{}}}}}",
        spans.len(),
        last - first,
        sum / union.max(1e-9),
        per.join(", "),
        extent.join(", ")
    );
}

/// Every pipeline's first step, each on its own thread (for the graph rows: the
/// captures run concurrently, as they would in the sweep).
fn first_steps(ps: &mut [rtx::train::pipeline::Pipeline]) -> rtx::Result<()> {
    std::thread::scope(|scope| {
        let hs: Vec<_> = ps
            .iter_mut()
            .map(|p| scope.spawn(move || p.step()))
            .collect();
        hs.into_iter().try_for_each(|h| {
            h.join().unwrap_or_else(|_| {
                Err(rtx::Error::invalid(
                    "sweep",
                    "a pipeline's first step panicked",
                ))
            })
        })
    })
}

/// The stacked rows: the 8 models of one shape (`SweepConfig::stacked_spec`, 512 wide,
/// 3 deep, AdamW) as one `StackedMlp` pipeline on one stream, its batches resident,
/// as PyTorch's `stacked` and `stacked_graph` forms train them; samples count every
/// member's rows.
fn stacked(graphs: bool) -> rtx::Result<()> {
    let rt = Runtime::builder().streams(1).build()?;
    let cfg = config(&rt, graphs, true);
    let (spec, members) = cfg.stacked_spec();
    let task = cfg.task().generate(cfg.batch * 8, cfg.batch);
    let s = rt.compute_streams(rt.device());
    let warm = SweepConfig {
        steps: 10,
        ..cfg.clone()
    };
    let mut w = warm.stacked_pipeline(&rt, &spec, members, s.clone(), &task.train, 1)?;
    run_concurrently(std::slice::from_mut(&mut w), &|_, _| {})?;
    drop(w);
    let mut p = cfg.stacked_pipeline(&rt, &spec, members, s, &task.train, 2)?;
    p.preload()?;
    let start = Instant::now();
    run_concurrently(std::slice::from_mut(&mut p), &|_, _| {})?;
    let wall = start.elapsed().as_secs_f64();
    let samples = p.steps_done() * (cfg.batch * members) as u64;
    println!(
        "{{\"case\": \"{}\", \"backend\": \"{:?}\", \"samples_per_s\": {:.1}, \"wall_s\": {wall:.4}, \"steps\": {}, \"batch\": {}, \"members\": {members}, \"model\": \"{}\"}}",
        stacked_case(graphs),
        rt.backend(),
        samples as f64 / wall,
        cfg.steps,
        cfg.batch,
        spec.name
    );
    Ok(())
}

fn stacked_case(graphs: bool) -> &'static str {
    if graphs {
        "sweep_rtx_stacked_graphs"
    } else {
        "sweep_rtx_stacked"
    }
}

/// The row of a case that failed: its error, in the JSON line.
fn failed(case: &str, e: &rtx::Error) {
    let msg = e
        .to_string()
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    println!("{{\"case\": \"{case}\", \"error\": \"{msg}\"}}");
}

/// Seconds per step of one of the sweep's models (`which`; the smallest when `None`)
/// alone on one stream (after its first step).
fn step(graphs: bool, which: Option<usize>) -> rtx::Result<(f64, String)> {
    let rt = Runtime::builder().streams(1).build()?;
    let base = config(&rt, graphs, which.is_some());
    let cfg = SweepConfig {
        steps: STEP_STEPS + 1,
        ..base
    };
    let models = cfg.models();
    let m = match which {
        Some(i) => models.get(i).cloned(),
        None => models.into_iter().min_by_key(|m| m.width * m.depth),
    }
    .ok_or_else(|| rtx::Error::invalid("sweep", "no such model"))?;
    let task = cfg.task().generate(cfg.batch * 8, cfg.batch);
    let s = rt.compute_streams(rt.device());
    let s0 = s[0];
    let settle = || rt.mark(s0).and_then(|m| m.wait());
    // Warm-up: a short pipeline of the same form on the same runtime.
    let warm = SweepConfig {
        steps: 10,
        ..cfg.clone()
    };
    let mut w = warm.pipeline(&rt, &m, s.clone(), &task.train, 1)?;
    run_concurrently(std::slice::from_mut(&mut w), &|_, _| {})?;
    drop(w);
    let mut p = cfg.pipeline(&rt, &m, s, &task.train, 2)?;
    p.step()?;
    settle()?;
    let start = Instant::now();
    while !p.is_done() {
        p.step()?;
    }
    p.finish()?;
    settle()?;
    Ok((start.elapsed().as_secs_f64() / STEP_STEPS as f64, m.name))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |f: &str| args.iter().any(|a| a == f);
    let counts: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let counts = if counts.is_empty() {
        vec![1, 2, 4, 8]
    } else {
        counts
    };
    let forms: Vec<bool> = match (has("--eager"), has("--graphs")) {
        (true, false) => vec![false],
        (false, true) => vec![true],
        _ => vec![false, true],
    };
    let data: Vec<bool> = match (has("--upload"), has("--resident")) {
        (true, false) => vec![false],
        (false, true) => vec![true],
        _ => vec![false, true],
    };
    let only_stacked = has("--stacked");
    let only_each = has("--each");
    for &r in data.iter().filter(|_| !only_stacked && !only_each) {
        for &n in &counts {
            for &g in &forms {
                if let Err(e) = sweep(n, g, r) {
                    failed(&case(n, g, r), &e);
                }
            }
        }
    }
    if !has("--no-stacked") && !only_each {
        for &g in &forms {
            if let Err(e) = stacked(g) {
                failed(stacked_case(g), &e);
            }
        }
    }
    if has("--each") {
        // Each model's step alone, batches resident: where the sweep's time goes, model
        // by model (`torch_sweep.py each` is the PyTorch side).
        // SWEEP_EACH=i: model i only (for a profiler run).
        let only: Option<usize> = std::env::var("SWEEP_EACH")
            .ok()
            .and_then(|v| v.parse().ok());
        for i in (0..8).filter(|i| only.is_none_or(|o| o == *i)) {
            for (form, g) in [("eager", false), ("graph", true)] {
                match step(g, Some(i)) {
                    Ok((t, model)) => println!(
                        "{{\"case\": \"sweep_each_{form}_{model}\", \"us_per_step\": {:.2}, \"model\": \"{model}\", \"steps\": {STEP_STEPS}}}",
                        t * 1e6
                    ),
                    Err(e) => failed(&format!("sweep_each_{form}_{i}"), &e),
                }
            }
        }
    }
    if !has("--no-step") && !only_stacked && !only_each {
        let mut times = Vec::new();
        for (case, g) in [("sweep_step_eager", false), ("sweep_step_graph", true)] {
            match step(g, None) {
                Ok((t, model)) => {
                    println!(
                        "{{\"case\": \"{case}\", \"us_per_step\": {:.2}, \"model\": \"{model}\", \"steps\": {STEP_STEPS}}}",
                        t * 1e6
                    );
                    times.push((t, model));
                }
                Err(e) => failed(case, &e),
            }
        }
        if let [(eager, model), (graph, _)] = &times[..] {
            println!(
                "{{\"case\": \"sweep_step_speedup\", \"ratio\": {:.3}, \"model\": \"{model}\"}}",
                eager / graph
            );
        }
    }
}
