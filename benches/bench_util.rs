//! Shared helpers of the bench programs: random inputs, marker timing, JSON lines.
#![allow(dead_code)]

use rtx::{bf16, f16, DType, Op, Runtime, StreamId, Tensor};

/// Deterministic uniform values in [-1, 1) (xorshift), never all zeros.
pub fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

/// Uploads f32 host data as `dt`.
pub fn upload(rt: &Runtime, data: &[f32], shape: &[usize], dt: DType) -> Tensor {
    match dt {
        DType::F32 => rt.upload(data, shape.to_vec()),
        DType::F16 => rt.upload(
            &data.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(),
            shape.to_vec(),
        ),
        DType::BF16 => rt.upload(
            &data.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(),
            shape.to_vec(),
        ),
        other => panic!("no float upload for {other}"),
    }
    .expect("upload")
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Downloads every tensor of `xs` as bf16, the downloads in flight together, and waits
/// for them all (the values go to `black_box`).
pub fn download_all_bf16(rt: &Runtime, xs: &[Tensor]) {
    let downloads: Vec<_> = xs
        .iter()
        .map(|x| rt.to_vec::<bf16>(x).expect("download"))
        .collect();
    for d in downloads {
        std::hint::black_box(d.wait().expect("download"));
    }
}

/// Runs `body` between timing markers on every stream of `streams` (one before it on
/// each, one after it on each) and returns its value and the device span in ms: from
/// the earliest start marker to the latest end marker (CUDA events of one device; the
/// host clock on the CPU backend). Submit only work that belongs in the span from
/// `body`; read results back after this returns, so the span leaves the download out,
/// as PyTorch's event-timed forms do.
pub fn device_span<R>(rt: &Runtime, streams: &[StreamId], body: impl FnOnce() -> R) -> (R, f64) {
    let starts: Vec<_> = streams.iter().map(|&s| rt.mark(s).expect("mark")).collect();
    let r = body();
    let ends: Vec<_> = streams.iter().map(|&s| rt.mark(s).expect("mark")).collect();
    let starts: Vec<_> = starts
        .into_iter()
        .map(|m| m.wait().expect("marker"))
        .collect();
    let ends: Vec<_> = ends
        .into_iter()
        .map(|m| m.wait().expect("marker"))
        .collect();
    let mut span = 0f64;
    for a in &starts {
        for b in &ends {
            span = span.max(a.elapsed_ms(b).expect("marker span"));
        }
    }
    (r, span)
}

/// Median over `samples` of the per-op time (ms) of `batch` back-to-back ops made by
/// `make`, on one stream, between two markers; after a warm-up of up to 3 ops. See
/// [`time_with`] for how the samples are laid out and what they measure.
pub fn time_op<O: Op>(
    rt: &Runtime,
    batch: usize,
    samples: usize,
    mut make: impl FnMut() -> O,
) -> f64 {
    time_with(rt, batch, samples, |rt, s| {
        // The output handle is dropped at once: the op still runs and its memory is
        // released after completion.
        let _submitted = rt
            .submit_on(s, make())
            .map_err(|e| e.error)
            .expect("submit");
    })
}

/// Like [`time_op`] for a body that submits several ops itself on stream `s`.
///
/// The samples are back to back on the device: one untimed batch is enqueued ahead of
/// the first marker, and the host stays up to two batches ahead, so every marker is
/// reached while the next batch is already queued. A sample then measures the steady
/// state of its batch, not the delay between a marker and the launch of the op behind
/// it (which counted once per sample when each sample started on an idle device;
/// `docs/performance-notes.md`, "Timing"). That is the device time when the host enqueues faster
/// than the device runs, and the host's enqueue rate (throughput) when it does not. The
/// PyTorch baseline (`time_cuda` in `torch_baseline.py`) lays its samples out the same
/// way; its `graph_ms` (CUDA-graph replays) is PyTorch's device time without its host.
pub fn time_with(
    rt: &Runtime,
    batch: usize,
    samples: usize,
    mut body: impl FnMut(&Runtime, StreamId),
) -> f64 {
    let s = rt.compute_streams(rt.device())[0];
    let mut enqueue = |n: usize| {
        for _ in 0..n {
            body(rt, s);
        }
    };
    // Warm-up (first-call searches and plans), waited for.
    enqueue(batch.min(3));
    rt.mark(s).expect("mark").wait().expect("marker");
    enqueue(batch);
    let mut pending = std::collections::VecDeque::from([rt.mark(s).expect("mark")]);
    let mut reached = Vec::with_capacity(samples + 1);
    for _ in 0..samples {
        enqueue(batch);
        pending.push_back(rt.mark(s).expect("mark"));
        if pending.len() > 2 {
            let m = pending.pop_front().expect("three pending");
            reached.push(m.wait().expect("marker"));
        }
    }
    reached.extend(pending.into_iter().map(|m| m.wait().expect("marker")));
    let mut t: Vec<f64> = reached
        .windows(2)
        .map(|w| w[0].elapsed_ms(&w[1]).expect("elapsed") / batch as f64)
        .collect();
    median(&mut t)
}

/// Prints one JSON line.
pub fn emit(case: &str, ms: f64, bytes: f64, flops: f64, extra: &[(&str, f64)]) {
    let mut s = format!(
        "{{\"case\": \"{case}\", \"rtx_ms\": {ms:.6}, \"bytes\": {bytes}, \"flops\": {flops}"
    );
    for (k, v) in extra {
        s.push_str(&format!(", \"{k}\": {v:.4}"));
    }
    s.push('}');
    println!("{s}");
}

/// The process's CPU counters: user and system CPU time (ms, at the kernel's clock-tick
/// resolution) and minor page faults of the whole process, threads that have exited
/// included (`/proc/self/stat`), and the voluntary and involuntary context switches of
/// its live threads (`/proc/self/task/*/status`; an exited thread's are lost). Zeros
/// where `/proc` is not there. For the streams investigation: where a run's host time
/// goes.
pub fn proc_counters() -> [f64; 5] {
    let mut c = [0f64; 5];
    // USER_HZ: 100 on every Linux configuration this runs on.
    let tick_ms = 10.0;
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the parenthesised command name: state is field 3; minflt 10,
        // utime 14, stime 15 (1-based, as in proc(5)).
        if let Some((_, rest)) = stat.rsplit_once(')') {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok());
            c[0] = num(14).unwrap_or(0.0) * tick_ms;
            c[1] = num(15).unwrap_or(0.0) * tick_ms;
            c[2] = num(10).unwrap_or(0.0);
        }
    }
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return c;
    };
    for task in dir.flatten() {
        if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
            for line in status.lines() {
                let value = |l: &str| {
                    l.split(':')
                        .nth(1)
                        .and_then(|v| v.trim().parse::<f64>().ok())
                };
                if line.starts_with("voluntary_ctxt_switches") {
                    c[3] += value(line).unwrap_or(0.0);
                } else if line.starts_with("nonvoluntary_ctxt_switches") {
                    c[4] += value(line).unwrap_or(0.0);
                }
            }
        }
    }
    c
}

/// Names of [`proc_counters`]' fields, for `emit`'s extras.
const PROC_FIELDS: [&str; 5] = ["cpu_user_ms", "cpu_sys_ms", "minflt", "vcsw", "ivcsw"];

/// `emit` extras: the [`proc_counters`] that moved from `before` to `after`, per run of
/// `runs`.
pub fn proc_per_run(before: [f64; 5], after: [f64; 5], runs: usize) -> Vec<(&'static str, f64)> {
    PROC_FIELDS
        .iter()
        .zip(before.iter().zip(after))
        .map(|(name, (b, a))| (*name, (a - b) / runs as f64))
        .collect()
}

/// One warm-up call of `run`, then `n` timed calls; `run` returns `(total_ms, part_ms)`
/// (e.g. the whole run and its submitting or launching part). Returns the median, min
/// and max of the totals and the median of the parts.
pub fn warm_then_time(mut run: impl FnMut() -> (f64, f64), n: usize) -> (f64, f64, f64, f64) {
    run();
    let (mut t, mut part): (Vec<f64>, Vec<f64>) = (0..n).map(|_| run()).unzip();
    let (lo, hi) = t
        .iter()
        .fold((f64::MAX, 0f64), |(a, b), &v| (a.min(v), b.max(v)));
    (median(&mut t), lo, hi, median(&mut part))
}
