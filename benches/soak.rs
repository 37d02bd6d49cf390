//! Soak: several MLPs (`rtx::train::Mlp`) trained at once on one runtime, each by its own
//! thread (forward, `cross_entropy`, its backward, the MLP's backward, one `adamw` step
//! over every parameter), for `--minutes N`. Every `--sample-secs S` (default 10) it
//! prints one CSV row: elapsed seconds, training steps (all models), steps per second in
//! the interval, the mean loss of the last steps, host RSS, the process's threads, the
//! device memory in use (CUDA: total − free as the driver reports it; empty on the CPU),
//! the bytes held by the runtime's block and pinned caches (`rt.stats()`) and their hit
//! and miss counters (and the hits served from another stream's cache). At the end a verdict: after the
//! warm-up (the first third of the samples, at least one), RSS, device memory and the
//! thread count are flat and the throughput steady, and no step failed. Exits 1 when not.
//!
//! ```sh
//! cargo bench --bench soak -- --minutes 1 --backend cpu      # or --backend cuda
//! bash benches/gpu/run soak:10                               # on the GPU host
//! ```
//!
//! Options: `--minutes N` (default 0.5), `--sample-secs S` (default 10), `--backend
//! cpu|cuda|auto` (default auto: CUDA when present), `--models K` (default 4),
//! `--streams S` (default 4), `--batch B` (default 256), `--width W` (hidden width,
//! default 256 on the CPU, 1024 on CUDA).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rtx::ops::optim::AdamW;
use rtx::ops::{self};
use rtx::train::{Mlp, MlpConfig, Module};
use rtx::{Backend, BackendKind, Runtime, Tensor};

struct Args {
    minutes: f64,
    sample: f64,
    backend: String,
    models: usize,
    streams: usize,
    batch: usize,
    width: Option<usize>,
}

fn args() -> Args {
    let mut a = Args {
        minutes: 0.5,
        sample: 10.0,
        backend: "auto".into(),
        models: 4,
        streams: 4,
        batch: 256,
        width: None,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let val = || v.get(i + 1).cloned().unwrap_or_default();
        let num = |s: String| -> f64 {
            s.parse()
                .unwrap_or_else(|_| panic!("soak: {} wants a number, got {s:?}", v[i]))
        };
        match v[i].as_str() {
            "--minutes" => a.minutes = num(val()),
            "--sample-secs" => a.sample = num(val()),
            "--backend" => a.backend = val(),
            "--models" => a.models = num(val()) as usize,
            "--streams" => a.streams = num(val()) as usize,
            "--batch" => a.batch = num(val()) as usize,
            "--width" => a.width = Some(num(val()) as usize),
            // `cargo bench` passes `--bench`; anything else is a mistake.
            "--bench" => {
                i += 1;
                continue;
            }
            "-h" | "--help" => {
                println!("usage: soak [--minutes N] [--sample-secs S] [--backend cpu|cuda|auto] [--models K] [--streams S] [--batch B] [--width W]");
                std::process::exit(0);
            }
            other => panic!("soak: unknown option {other}"),
        }
        i += 2;
    }
    a
}

/// Reads `key:` of `/proc/self/status` (a number; 0 where absent).
fn status(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix(key)
                    .and_then(|r| r.trim_start_matches(':').trim().split(' ').next())
                    .and_then(|n| n.parse().ok())
            })
        })
        .unwrap_or(0)
}

/// Device memory in use (total − free) in bytes, from the driver.
fn device_used(ctx: &Option<Arc<cudarc::driver::CudaContext>>) -> Option<u64> {
    let (free, total) = ctx.as_ref()?.mem_get_info().ok()?;
    Some((total - free) as u64)
}

/// One model's state between steps.
struct Model {
    mlp: Mlp,
    x: Tensor,
    labels: Tensor,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    t: u64,
}

/// One training step; returns the loss when `read` (a download that waits for it).
fn step(rt: &Runtime, md: &mut Model, read: bool) -> rtx::Result<Option<f32>> {
    let (logits, ctx) = md.mlp.forward(rt, &md.x)?;
    let ce = rt.submit(ops::cross_entropy(&logits, &md.labels))?;
    let (loss, lse) = {
        let o = ce.outputs().expect("outputs");
        (o.loss.clone(), o.lse.clone())
    };
    let dl = rt.submit(ops::cross_entropy_backward(&logits, &md.labels, &lse, 1.0))?;
    md.mlp.backward(rt, dl.outputs().expect("outputs"), &ctx)?;
    md.t += 1;
    let mut ps = md.mlp.parameters();
    let n = ps.len();
    let values: Vec<Tensor> = ps.iter().map(|p| p.value().clone()).collect();
    let grads: Vec<Tensor> = ps
        .iter()
        .map(|p| p.grad().expect("a gradient").clone())
        .collect();
    let cfg = AdamW {
        lr: 1e-3,
        ..AdamW::default()
    };
    let st = rt.submit(ops::adamw(
        cfg,
        md.t,
        values,
        &grads,
        std::mem::take(&mut md.m),
        std::mem::take(&mut md.v),
    ))?;
    let mut out = st.outputs().expect("outputs").clone();
    drop(st);
    md.v = out.split_off(2 * n);
    md.m = out.split_off(n);
    for (p, new) in ps.iter_mut().zip(out) {
        p.set_value(new)?;
    }
    if read {
        let l = rt.to_vec::<f32>(&loss)?.wait()?;
        ce.wait()?;
        return Ok(Some(l[0]));
    }
    Ok(None)
}

fn model(rt: &Runtime, seed: u64, batch: usize, width: usize) -> rtx::Result<Model> {
    let (inp, classes) = (64usize, 16usize);
    let cfg = MlpConfig::new(&[inp, width, width, classes]);
    let mlp = Mlp::new(rt, &cfg, seed)?;
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let x: Vec<f32> = (0..batch * inp)
        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let labels: Vec<u32> = (0..batch)
        .map(|_| (next() % classes as u64) as u32)
        .collect();
    let x = rt.upload(&x, [batch, inp])?;
    let labels = rt.upload(&labels, [batch])?;
    let mut mlp = mlp;
    let zeros = |rt: &Runtime, ps: &mut rtx::train::Parameters<'_>| -> rtx::Result<Vec<Tensor>> {
        ps.iter()
            .map(|p| {
                let z = rt.submit(ops::zeros(p.value().shape().clone(), p.value().dtype()))?;
                Ok(z.outputs().expect("outputs").clone())
            })
            .collect()
    };
    let (m, v) = {
        let mut ps = mlp.parameters();
        (zeros(rt, &mut ps)?, zeros(rt, &mut ps)?)
    };
    Ok(Model {
        mlp,
        x,
        labels,
        m,
        v,
        t: 0,
    })
}

struct Sample {
    t: f64,
    steps: u64,
    rate: f64,
    rss_mib: f64,
    threads: u64,
    dev_mib: Option<f64>,
}

fn main() {
    let a = args();
    let backend = match a.backend.as_str() {
        "cpu" => Backend::Cpu,
        "cuda" => Backend::Cuda(vec![0]),
        _ => Backend::Auto,
    };
    let rt = Runtime::builder()
        .backend(backend)
        .streams(a.streams)
        .build()
        .expect("runtime");
    let cuda = rt.backend() == BackendKind::Cuda;
    let width = a.width.unwrap_or(if cuda { 1024 } else { 256 });
    let ctx = if cuda {
        cudarc::driver::CudaContext::new(0).ok()
    } else {
        None
    };
    eprintln!(
        "soak: {} models [64, {width}, {width}, 16], batch {}, on {:?} with {} streams, {} \
         min, a sample every {} s",
        a.models,
        a.batch,
        rt.backend(),
        a.streams,
        a.minutes,
        a.sample
    );
    let steps = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let losses = Arc::new(Mutex::new(Vec::<(usize, f32)>::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..a.models)
        .map(|k| {
            let (rt, steps, stop) = (rt.clone(), steps.clone(), stop.clone());
            let (losses, errors) = (losses.clone(), errors.clone());
            let batch = a.batch;
            std::thread::spawn(move || {
                let mut md = match model(&rt, 1000 + k as u64, batch, width) {
                    Ok(m) => m,
                    Err(e) => return errors.lock().unwrap().push(format!("model {k}: {e}")),
                };
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Read the loss every 8th step: the submitter then waits for its work.
                    match step(&rt, &mut md, i % 8 == 7) {
                        Ok(Some(l)) => {
                            if !l.is_finite() {
                                errors.lock().unwrap().push(format!("model {k}: loss {l}"));
                                return;
                            }
                            losses.lock().unwrap().push((k, l));
                        }
                        Ok(None) => {}
                        Err(e) => {
                            errors
                                .lock()
                                .unwrap()
                                .push(format!("model {k} step {i}: {e}"));
                            return;
                        }
                    }
                    i += 1;
                    steps.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    println!("t_s,steps,steps_per_s,loss,rss_mib,threads,device_used_mib,block_cache_mib,pinned_cache_mib,block_hits,block_misses,block_from_other_stream,pinned_hits,pinned_misses");
    let t0 = Instant::now();
    let end = Duration::from_secs_f64(a.minutes * 60.0);
    let mut samples: Vec<Sample> = Vec::new();
    let (mut last_t, mut last_steps) = (0.0, 0u64);
    let mut first_loss = None;
    let mut last_loss = f32::NAN;
    loop {
        let next = Duration::from_secs_f64(a.sample * (samples.len() + 1) as f64);
        let now = t0.elapsed();
        if next > now {
            std::thread::sleep(next - now);
        }
        let t = t0.elapsed().as_secs_f64();
        let s = steps.load(Ordering::Relaxed);
        let rate = (s - last_steps) as f64 / (t - last_t);
        let l = {
            let mut g = losses.lock().unwrap();
            let recent: Vec<f32> = g.iter().map(|x| x.1).collect();
            g.clear();
            if recent.is_empty() {
                f32::NAN
            } else {
                recent.iter().sum::<f32>() / recent.len() as f32
            }
        };
        if l.is_finite() {
            first_loss.get_or_insert(l);
            last_loss = l;
        }
        let st = rt.stats();
        let sample = Sample {
            t,
            steps: s,
            rate,
            rss_mib: status("VmRSS") as f64 / 1024.0,
            threads: status("Threads"),
            dev_mib: device_used(&ctx).map(|b| b as f64 / (1 << 20) as f64),
        };
        println!(
            "{:.1},{},{:.1},{:.4},{:.1},{},{},{:.1},{:.1},{},{},{},{},{}",
            sample.t,
            sample.steps,
            sample.rate,
            l,
            sample.rss_mib,
            sample.threads,
            sample
                .dev_mib
                .map(|m| format!("{m:.1}"))
                .unwrap_or_default(),
            st.block_cache.bytes as f64 / (1 << 20) as f64,
            st.pinned_cache.bytes as f64 / (1 << 20) as f64,
            st.block_cache.hits,
            st.block_cache.misses,
            st.block_cache.from_other_stream,
            st.pinned_cache.hits,
            st.pinned_cache.misses
        );
        samples.push(sample);
        (last_t, last_steps) = (t, s);
        let failed = !errors.lock().unwrap().is_empty();
        if t0.elapsed() >= end || failed {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let errors = errors.lock().unwrap().clone();
    std::process::exit(verdict(&samples, &errors, first_loss, last_loss, cuda));
}

/// Prints the verdict; the exit code (0 flat and error-free, 1 otherwise).
///
/// The throughput's steadiness counts on CUDA only: on the CPU backend the ops share the
/// host's cores with whatever else runs there, and a slower interval says more about
/// the neighbours than about rtx (it is printed either way).
fn verdict(
    samples: &[Sample],
    errors: &[String],
    first: Option<f32>,
    last: f32,
    cuda: bool,
) -> i32 {
    let warm = (samples.len() / 3).max(1);
    let rest = &samples[warm.min(samples.len())..];
    let mut bad = Vec::new();
    for e in errors {
        bad.push(format!("error: {e}"));
    }
    if rest.len() < 2 {
        bad.push(format!(
            "{} samples after a warm-up of {warm}: run longer (--minutes) or sample more often \
             (--sample-secs) for a verdict",
            rest.len()
        ));
    } else {
        let range = |f: &dyn Fn(&Sample) -> f64| {
            let v: Vec<f64> = rest.iter().map(f).collect();
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            (lo, hi)
        };
        let (lo, hi) = range(&|s| s.rss_mib);
        // Flat: within 16 MiB or 5 % (allocator arenas move a little).
        let rss_ok = hi - lo <= 16f64.max(0.05 * lo);
        println!(
            "# verdict: host RSS {lo:.1}..{hi:.1} MiB after warm-up: {}",
            flat(rss_ok)
        );
        if !rss_ok {
            bad.push("host RSS grows".into());
        }
        if rest.iter().all(|s| s.dev_mib.is_some()) {
            let (lo, hi) = range(&|s| s.dev_mib.unwrap_or(0.0));
            let ok = hi - lo <= 64.0;
            println!(
                "# verdict: device memory in use {lo:.1}..{hi:.1} MiB after warm-up: {}",
                flat(ok)
            );
            if !ok {
                bad.push("device memory grows".into());
            }
        }
        let (lo, hi) = range(&|s| s.threads as f64);
        let ok = lo == hi;
        println!("# verdict: threads {lo}..{hi} after warm-up: {}", flat(ok));
        if !ok {
            bad.push("the thread count changes".into());
        }
        let (lo, hi) = range(&|s| s.rate);
        let mut rates: Vec<f64> = rest.iter().map(|s| s.rate).collect();
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        let ok = lo >= 0.7 * median;
        println!(
            "# verdict: throughput {lo:.1}..{hi:.1} steps/s (median {median:.1}) after warm-up: {}{}",
            if ok { "steady" } else { "NOT steady" },
            if cuda { "" } else { " (not judged on the CPU backend: shared cores)" }
        );
        if !ok && cuda {
            bad.push("throughput falls".into());
        }
    }
    let total = samples.last().map_or(0, |s| s.steps);
    println!(
        "# verdict: {total} steps, loss {} -> {last:.4}, {} errors",
        first.map(|f| format!("{f:.4}")).unwrap_or("-".into()),
        errors.len()
    );
    if bad.is_empty() {
        println!(
            "# verdict: FLAT (memory and threads flat{} after warm-up, no error)",
            if cuda { ", throughput steady" } else { "" }
        );
        0
    } else {
        println!("# verdict: NOT FLAT: {}", bad.join("; "));
        1
    }
}

fn flat(ok: bool) -> &'static str {
    if ok {
        "flat"
    } else {
        "NOT flat"
    }
}
