//! The main job (`rtx` with no subcommand): the sweep of 8 heterogeneous MLP training
//! pipelines and a small CNN on one runtime and, beside it on the last compute stream, a character-level
//! transformer LM trained on the repository's own text; a progress bar per job, a final
//! table and the timeline of the streams (Chrome trace JSON + SVG).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use rtx::ops::optim::AdamW as AdamWConfig;
use rtx::timeline::Timeline;
use rtx::train::pipeline::sweep::SweepConfig;
use rtx::train::pipeline::{run_concurrently, Progress};
use rtx::train::{train_lm, CharLm, CharLmConfig, LmReport, LmRun, TextCorpus};
use rtx::{Backend, BackendKind, Runtime};

/// What the sweep command is told.
pub struct Args {
    /// The backend.
    pub backend: Backend,
    /// Compute streams (0: 8 on CUDA, 2 on the CPU).
    pub streams: usize,
    /// Steps per model (0: the backend's default).
    pub steps: u64,
    /// Where the timeline files go.
    pub out: PathBuf,
    /// No progress bars (still the table and the timeline).
    pub quiet: bool,
    /// Each pipeline's step as a captured graph ([`SweepConfig::graphs`]).
    pub graphs: bool,
    /// What the character-level LM trains on.
    pub text: LmText,
    /// The LM's steps (0: the backend's default).
    pub lm_steps: u64,
}

/// The text of the character-level LM beside the sweep.
pub enum LmText {
    /// No LM.
    None,
    /// This repository's `.rs` and `.md` files ([`rtx::train::lm::find_repository`]).
    Repository,
    /// The `.rs` and `.md` files under this folder.
    Dir(PathBuf),
}

/// The character-level LM beside the sweep: its model, run and corpus, or why not.
struct LmJob {
    cfg: CharLmConfig,
    run: LmRun,
    corpus: TextCorpus,
}

impl LmJob {
    /// 4 blocks of width 256 over 128 bytes, batch 32, 400 steps on CUDA; scaled down to
    /// 2 blocks of width 64 over 32 bytes, batch 16, 300 steps on the CPU.
    fn new(text: &Path, cuda: bool, steps: u64) -> rtx::Result<Self> {
        let corpus = TextCorpus::from_dir(text)?;
        let (cfg, batch, default_steps) = if cuda {
            (CharLmConfig::new(128, 256, 4, 4), 32, 400)
        } else {
            (CharLmConfig::new(32, 64, 4, 2), 16, 300)
        };
        let run = LmRun {
            steps: if steps > 0 { steps } else { default_steps },
            batch,
            loss_every: 20,
            adamw: AdamWConfig {
                lr: if cuda { 1e-3 } else { 3e-3 },
                weight_decay: 0.0,
                ..AdamWConfig::default()
            },
            seed: 5,
        };
        Ok(LmJob { cfg, run, corpus })
    }
}

/// Runs the sweep and prints its table; writes the timeline files.
pub fn run(args: Args) -> rtx::Result<()> {
    let probe = Runtime::builder()
        .backend(args.backend.clone())
        .streams(1)
        .build()?;
    let cuda = probe.backend() == BackendKind::Cuda;
    drop(probe);
    let streams = match args.streams {
        0 if cuda => 8,
        0 => 2,
        n => n,
    };
    let rt = Runtime::builder()
        .backend(args.backend)
        .streams(streams)
        .trace(true)
        .build()?;
    let mut cfg = if cuda {
        SweepConfig::full()
    } else {
        SweepConfig::cpu()
    };
    if args.steps > 0 {
        cfg.steps = args.steps;
    }
    cfg.graphs = args.graphs;
    if args.graphs {
        println!("each pipeline's step is captured once into a graph and launched every step");
    }
    print!("{}", rt.info());
    if cuda {
        println!(
            "sweep: 8 MLPs and a small CNN (the rows as 16x16 images, always eager) on {}-d inputs, {} classes, batch {}, {} steps each, {} compute, f32 masters",
            cfg.dim,
            cfg.classes,
            cfg.batch,
            cfg.steps,
            cfg.dtype.name()
        );
    } else {
        println!(
            "sweep (scaled down for the CPU backend: {}-d inputs instead of 256, batch {} instead of 512, \
             {} steps instead of 200, widths / {}, f32): 8 MLPs and a small CNN (the rows as 8x8 images), {} classes",
            cfg.dim, cfg.batch, cfg.steps, cfg.width_div, cfg.classes
        );
    }
    let all = rt.compute_streams(rt.device());
    let (task, mut pipelines) = cfg.build(&rt, &all, 1, 32)?;
    // The small CNN, a ninth pipeline (the benchmark's sweep is the 8 MLPs).
    let cnn_seed = rtx::train::init::derive_seed(cfg.seed, 200);
    pipelines.push(cfg.cnn_pipeline(&rt, vec![all[0]], &task.train, cnn_seed)?);
    let text = match args.text {
        LmText::None => None,
        LmText::Dir(d) => Some(Ok(d)),
        LmText::Repository => Some(rtx::train::lm::find_repository().ok_or(())),
    };
    let lm = match &text {
        Some(Err(())) => {
            println!(
                "no character-level LM: this repository's text was not found from the current \
                 folder (pass --text DIR, a folder of .rs/.md files)"
            );
            None
        }
        Some(Ok(dir)) => match LmJob::new(dir, cuda, args.lm_steps) {
            Ok(job) => {
                let c = &job.cfg;
                println!(
                    "beside it, a character-level causal transformer ({} blocks, d {}, {} heads, context {}{}) \
                     trained on the {} .rs and .md files under {} ({} bytes; unigram entropy {:.3} nats), \
                     batch {}, {} steps, on compute stream {}",
                    c.layers,
                    c.d_model,
                    c.heads,
                    c.context,
                    if cuda { "" } else { ", scaled down for the CPU" },
                    job.corpus.files(),
                    dir.display(),
                    job.corpus.len(),
                    job.corpus.unigram_entropy(),
                    job.run.batch,
                    job.run.steps,
                    all.len() - 1
                );
                Some(job)
            }
            Err(e) => {
                println!("no character-level LM: {e} (pass --text DIR, a folder of .rs/.md files)");
                None
            }
        },
        None => None,
    };
    println!(
        "task: teacher MLP {}→{}→{} (tanh), {:.0}% label noise, seed {}; the teacher's accuracy on the held-out set, the bound: {:.1}%\n",
        cfg.dim,
        cfg.task().hidden,
        cfg.classes,
        cfg.task().noise * 100.0,
        cfg.seed,
        task.teacher_accuracy * 100.0
    );
    let multi = MultiProgress::new();
    if args.quiet {
        multi.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let style =
        ProgressStyle::with_template("{prefix:>13} {bar:28.cyan/blue} {pos:>4}/{len:4} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    let bars: Vec<ProgressBar> = pipelines
        .iter()
        .map(|p| {
            let b = multi.add(ProgressBar::new(p.config().steps));
            b.set_style(style.clone());
            b.set_prefix(p.config().name.clone());
            b
        })
        .collect();
    let start = Instant::now();
    // The steady state begins once every pipeline has read back a loss (its first steps,
    // with the module loads and library plans they caused, are done). Kept then: the
    // time, the steps submitted by then (an upper bound on those done) and the steps
    // whose losses were read back (a lower bound), for the rate without the warm-up.
    let n = pipelines.len();
    let warm = std::sync::Mutex::new((vec![None::<(u64, u64)>; n], None::<(Instant, u64, u64)>));
    let show = |i: usize, p: &Progress| {
        {
            let mut w = warm.lock().unwrap_or_else(|e| e.into_inner());
            let (seen, at) = &mut *w;
            if at.is_none() {
                // `loss` names its step counted from 0: steps 0..=that one are done.
                if let Some((done, _)) = p.loss {
                    seen[i] = Some((p.step, done + 1));
                }
                if seen.iter().all(Option::is_some) {
                    let (sub, done) = seen
                        .iter()
                        .flatten()
                        .fold((0, 0), |(a, b), (s, d)| (a + s, b + d));
                    *at = Some((Instant::now(), sub, done));
                }
            }
        }
        let b = &bars[i];
        b.set_position(p.step);
        let loss = p
            .loss
            .map_or("loss   -   ".to_string(), |(_, l)| format!("loss {l:.4}"));
        b.set_message(format!("{loss}  {:>9.0} samples/s", p.samples_per_s));
    };
    let lm_bar = lm.as_ref().map(|job| {
        let b = multi.add(ProgressBar::new(job.run.steps));
        b.set_style(style.clone());
        b.set_prefix("char-lm");
        b
    });
    let (lm_report, wall) = std::thread::scope(|s| {
        let lm_thread = lm.as_ref().map(|job| {
            let r = rt.on(*all.last().expect("a compute stream"));
            let bar = lm_bar.clone();
            s.spawn(move || -> rtx::Result<(LmReport, Duration)> {
                let t0 = Instant::now();
                let mut model = CharLm::new(&r, job.cfg, 2026)?;
                let unigram = job.corpus.unigram_entropy();
                let rep = train_lm(&r, &mut model, &job.corpus, &job.run, |k, l| {
                    if let Some(b) = &bar {
                        b.set_position(k);
                        b.set_message(format!("loss {l:.4}  (unigram {unigram:.4})"));
                    }
                })?;
                Ok((rep, t0.elapsed()))
            })
        });
        let swept = run_concurrently(&mut pipelines, &show);
        let wall = start.elapsed();
        let lm = lm_thread.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(rtx::Error::invalid("char-lm", "its thread panicked")))
        });
        swept.map(|()| (lm, wall))
    })?;
    for b in bars.iter().chain(&lm_bar) {
        b.finish();
    }
    let reports = pipelines
        .iter()
        .map(|p| p.report(&task.eval))
        .collect::<rtx::Result<Vec<_>>>()?;
    println!(
        "\n{:<13} {:>10} {:<16} {:>10} {:>9} {:>9} {:>12}  streams",
        "model", "params", "optimizer", "final loss", "eval loss", "accuracy", "samples/s"
    );
    for r in &reports {
        let s: Vec<String> = r.streams.iter().map(|s| s.index().to_string()).collect();
        println!(
            "{:<13} {:>10} {:<16} {:>10.4} {:>9.4} {:>8.1}% {:>12.0}  {}",
            r.name,
            r.params,
            r.optimizer,
            r.final_loss,
            r.eval_loss,
            r.accuracy * 100.0,
            r.samples_per_s,
            s.join(",")
        );
    }
    let samples: u64 = pipelines
        .iter()
        .map(|p| p.steps_done() * cfg.batch as u64)
        .sum();
    println!(
        "\nwhole sweep: {samples} samples in {:.2} s = {:.0} samples/s on {} compute streams (teacher bound {:.1}%)",
        wall.as_secs_f64(),
        samples as f64 / wall.as_secs_f64(),
        all.len(),
        task.teacher_accuracy * 100.0
    );
    if let (Some(job), Some(r)) = (&lm, lm_report) {
        let (rep, took) = r?;
        let first = rep.losses.first().map_or(f32::NAN, |l| l.1);
        let last = rep.losses.last().map_or(f32::NAN, |l| l.1);
        let tokens = job.run.steps as f64 * (job.run.batch * job.cfg.context) as f64;
        println!(
            "char-lm: loss {first:.4} (step {}) -> {last:.4} (step {}), held out {:.4}, against the text's unigram entropy {:.4} nats ({:.2}x); {:.0} tokens/s over {:.2} s",
            rep.losses.first().map_or(0, |l| l.0),
            rep.losses.last().map_or(0, |l| l.0),
            rep.held_out,
            rep.unigram,
            f64::from(rep.held_out) / rep.unigram,
            tokens / took.as_secs_f64(),
            took.as_secs_f64()
        );
    }
    let (_, at) = warm.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some((t, submitted, done)) = at {
        let rest = (start + wall).saturating_duration_since(t).as_secs_f64();
        let total: u64 = pipelines.iter().map(|p| p.steps_done()).sum();
        let rate = |before: u64| (total.saturating_sub(before) * cfg.batch as u64) as f64 / rest;
        if rest > 0.0 && total > submitted {
            println!(
                "steady state, after every pipeline's first loss read-back ({:.2} s in): {:.0}-{:.0} samples/s over the last {rest:.2} s (the steps done by then lie between those read back and those submitted)",
                t.duration_since(start).as_secs_f64(),
                rate(submitted),
                rate(done),
            );
        }
    }
    drop(pipelines);
    write_timeline(&rt, &args.out, wall)
}

/// Writes the Chrome trace of the whole run and an SVG of a window of it.
fn write_timeline(rt: &Runtime, out: &Path, wall: Duration) -> rtx::Result<()> {
    // Let the last completions land in the recorder.
    let _ = rtx::block_on(rt.shutdown());
    let spans = rt.take_trace();
    let timeline = Timeline::from_trace(&rt.info(), &spans);
    let io = |e: std::io::Error| rtx::Error::invalid("timeline", format!("{}: {e}", out.display()));
    std::fs::create_dir_all(out).map_err(io)?;
    let json = out.join("rtx-timeline.json");
    let svg = out.join("rtx-timeline.svg");
    std::fs::write(&json, timeline.to_chrome_trace()).map_err(io)?;
    // The picture: 0.5% of the sweep's run (the recording goes on while the LM beside it
    // finishes), so that single ops stay visible, where the streams are busiest with
    // short ops between 10% and 90% of the recording (see `busiest_window`: the warm-up's
    // long first calls do not count).
    let end = timeline.end_us();
    let len = end.min(wall.as_secs_f64() * 1e6) * 0.005;
    let from = timeline.busiest_window(len, end * 0.1, end * 0.9);
    let to = from + len;
    let window = timeline.window(from, to);
    std::fs::write(&svg, window.to_svg(1200)).map_err(io)?;
    println!(
        "timeline: {} spans on {} tracks ({:.2} s recorded, run {:.2} s; at most {} streams busy at once in the picture) -> {} (open in https://ui.perfetto.dev), {} ({:.1}-{:.1} ms)",
        timeline.spans().len(),
        timeline.tracks().len(),
        end / 1e6,
        wall.as_secs_f64(),
        window.max_concurrency(),
        json.display(),
        svg.display(),
        from / 1e3,
        to / 1e3
    );
    Ok(())
}
