//! Host overhead of the runtime on the CPU backend: a chain of 10,000 tiny dependent
//! ops (16-element f32 adds) through `submit`, against calling the CPU kernel directly.
//!
//! ```text
//! cargo bench --bench overhead [-- multi]     # multi: only the multi-tensor step
//! ```
//! Prints a markdown table: median over 9 runs of µs per op (end to end: first submit to
//! last completion), the submitting thread's µs per submit, and ops/s. With
//! `RTX_PROFILE=1`, then the mean µs per sample of each phase (`Stats::phases`: submit,
//! the actor's inputs, execute, publish, idle) over the submit chain's runs. Then one op
//! with many tensors: a multi-tensor AdamW step over 148 tiny parameters (the runtime's
//! per-tensor cost, which bounds such a step on the GPU when the kernels are fast).

/// With the `mimalloc` feature this program allocates through mimalloc (see the README,
/// "Host allocator").
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use rtx::ops::elementwise::{self as ew, cpu, BinaryOp};
use rtx::{Backend, Runtime};

const N: usize = 10_000;
const LEN: usize = 16;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    // `-- multi`: only the multi-tensor step (for a profiler).
    if std::env::args().any(|a| a == "multi") {
        multi_tensor();
        return;
    }
    let a: Vec<f32> = (0..LEN).map(|i| i as f32 * 0.25 - 1.0).collect();

    // Direct calls: the same CPU kernel, no runtime.
    let mut direct = Vec::new();
    for _ in 0..9 {
        let mut x = a.clone();
        let mut y = vec![0.0f32; LEN];
        let t = Instant::now();
        for _ in 0..N {
            cpu::binary(BinaryOp::Add, &x, &[LEN], &a, &[LEN], &mut y, &[LEN]);
            std::mem::swap(&mut x, &mut y);
        }
        direct.push(t.elapsed().as_secs_f64() * 1e6 / N as f64);
        std::hint::black_box(&x);
    }

    let mut rows = vec![(
        "direct CPU kernel call".to_string(),
        median(&mut direct),
        f64::NAN,
    )];
    let mut profiles = Vec::new();
    for streams in [1usize, 4] {
        let rt = Runtime::builder()
            .backend(Backend::Cpu)
            .streams(streams)
            .build()
            .expect("runtime");
        let s = rt.compute_streams(rt.device())[0];
        let at = rt.upload(&a, [LEN]).expect("upload");
        let run = || {
            let mut x = at.clone();
            let t0 = Instant::now();
            for _ in 0..N {
                x = rt
                    .submit_on(s, ew::add(&x, &at))
                    .expect("submit")
                    .outputs()
                    .expect("output")
                    .clone();
            }
            let t1 = Instant::now();
            let v = rt
                .to_vec::<f32>(&x)
                .expect("download")
                .wait()
                .expect("chain completes");
            let t2 = Instant::now();
            std::hint::black_box(v);
            (
                (t2 - t0).as_secs_f64() * 1e6 / N as f64,
                (t1 - t0).as_secs_f64() * 1e6 / N as f64,
            )
        };
        run();
        rt.reset_stats();
        let (mut e2e, mut sub): (Vec<f64>, Vec<f64>) = (0..9).map(|_| run()).unzip();
        let phases = rt.stats().phases;
        if !phases.is_empty() {
            let list: Vec<String> = phases
                .iter()
                .map(|p| format!("{} {:.2}", p.phase, p.mean_us))
                .collect();
            profiles.push(format!(
                "submit chain, {streams}-stream runtime: {}",
                list.join(", ")
            ));
        }
        rows.push((
            format!("submit chain, {streams}-stream runtime"),
            median(&mut e2e),
            median(&mut sub),
        ));

        // The same chain captured once as a graph (`Runtime::capture`) and launched:
        // on the CPU backend a launch replays the recorded ops on the actor.
        let mut graph = rt
            .capture(|g| {
                let mut x = g.input(&at)?;
                for _ in 0..N {
                    x = g.submit_on(s, ew::add(&x, &at))?;
                }
                g.output(&x)?;
                Ok(())
            })
            .expect("capture");
        let mut launch = || {
            let t0 = Instant::now();
            let mut l = graph.launch(&[&at]).expect("launch");
            let t1 = Instant::now();
            std::hint::black_box(l.to_vec::<f32>(0).expect("result"));
            (
                t0.elapsed().as_secs_f64() * 1e6 / N as f64,
                (t1 - t0).as_secs_f64() * 1e6 / N as f64,
            )
        };
        launch();
        let (mut g2e, mut gsub): (Vec<f64>, Vec<f64>) = (0..9).map(|_| launch()).unzip();
        rows.push((
            format!("graph launch of the chain, {streams}-stream runtime"),
            median(&mut g2e),
            median(&mut gsub),
        ));
        drop(graph);

        // Round trip: submit and await each op before the next.
        let mut rt_lat = Vec::new();
        for _ in 0..5 {
            let mut x = at.clone();
            let t = Instant::now();
            for _ in 0..1000 {
                x = rt
                    .submit_on(s, ew::add(&x, &at))
                    .expect("submit")
                    .wait()
                    .expect("op");
            }
            rt_lat.push(t.elapsed().as_secs_f64() * 1e6 / 1000.0);
        }
        rows.push((
            format!("submit + wait each, {streams}-stream runtime"),
            median(&mut rt_lat),
            f64::NAN,
        ));
    }

    println!("| case ({N} dependent 16-element f32 adds) | µs per op (median of 9) | µs per submit | ops/s |");
    println!("|---|---:|---:|---:|");
    for (name, us, sub) in rows {
        let sub = if sub.is_nan() {
            "".to_string()
        } else {
            format!("{sub:.2}")
        };
        println!("| {name} | {us:.2} | {sub} | {:.0} |", 1e6 / us);
    }
    for p in profiles {
        println!("RTX_PROFILE phases, µs per sample: {p}");
    }
    multi_tensor();
}

/// Tensors in the multi-tensor step: GPT-2 small's parameter count (148).
const TENSORS: usize = 148;

/// The host cost of one op with many inputs and outputs: a multi-tensor AdamW step over
/// [`TENSORS`] parameters of 16 elements (3 × 148 outputs, the parameters and moments
/// donated back in each step), so that the runtime's per-tensor bookkeeping (plan,
/// donation checks, outputs, publication, completion) is what is timed.
fn multi_tensor() {
    use rtx::ops::optim::{adamw, AdamW};
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(1)
        .build()
        .expect("runtime");
    let s = rt.compute_streams(rt.device())[0];
    let up = |seed: f32| -> Vec<rtx::Tensor> {
        (0..TENSORS)
            .map(|i| {
                let v: Vec<f32> = (0..LEN)
                    .map(|j| ((i * LEN + j) as f32 * 0.37 + seed).sin() * 0.1)
                    .collect();
                rt.upload(&v, [LEN]).expect("upload")
            })
            .collect()
    };
    let grads = up(1.0);
    let (mut p, mut m, mut v) = (up(2.0), up(3.0), up(4.0));
    for x in &mut v {
        // Second moments are non-negative.
        let sq = rt.to_vec::<f32>(x).expect("read").wait().expect("read");
        *x = rt
            .upload(&sq.iter().map(|a| a * a).collect::<Vec<_>>(), [LEN])
            .expect("upload");
    }
    let cfg = AdamW::default();
    let mut times = Vec::new();
    for round in 0..9 {
        let steps = 200;
        let t0 = Instant::now();
        for k in 0..steps {
            let t = (round * steps + k + 1) as u64;
            let sub = rt
                .submit_on(
                    s,
                    adamw(
                        cfg,
                        t,
                        std::mem::take(&mut p),
                        &grads,
                        std::mem::take(&mut m),
                        std::mem::take(&mut v),
                    ),
                )
                .map_err(|e| e.error)
                .expect("submit");
            let mut out = sub.wait().expect("step");
            v = out.split_off(2 * TENSORS);
            m = out.split_off(TENSORS);
            p = out;
        }
        times.push(t0.elapsed().as_secs_f64() * 1e6 / steps as f64);
    }
    let us = median(&mut times);
    println!();
    println!("| case ({TENSORS} tensors of {LEN} f32, one stream, submit + wait each) | µs per step (median of 9) | µs per tensor |");
    println!("|---|---:|---:|");
    println!(
        "| multi-tensor AdamW step, donated | {us:.1} | {:.2} |",
        us / TENSORS as f64
    );
}
