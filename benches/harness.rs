//! The rtx benchmark harness: one JSON line per case, to be joined with
//! `benches/torch_baseline.py` by `benches/compare.py` (same case names).
//!
//! ```text
//! cargo bench --bench harness -- [SUITE ...]      suites: ew reduce chain chaingraph gemm conv streams streamsgraph speedup train
//!                                                 (on request: convtiny attention raw rawstreams)
//! ```
//!
//! Device cases are timed with the runtime's markers (CUDA events on the op's stream)
//! after warm-up: each sample is a batch of back-to-back ops between two markers, the
//! samples follow each other on the device (`bench_util::time_with`: device time when
//! the host keeps up, enqueue throughput when it does not), and the reported time is the
//! median over samples of the per-op mean. Inputs are random, uniform in [-1, 1) drawn
//! in f32 and rounded to the case's dtype (the PyTorch baseline draws its inputs the
//! same way, `uniform` in `torch_baseline.py`).
//! `RTX_LOG=rtx_ops=debug` prints the library's tracing events (e.g. why a cuDNN engine
//! was skipped) on stderr; `RTX_PROFILE=1` adds the actors' phase timers to some cases.

/// With the `mimalloc` feature this program allocates through mimalloc (see the README,
/// "Host allocator").
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench_util;
mod graphs;
mod streams;
mod train;

use std::time::Instant;

use bench_util::*;
use graphs::{suite_chain_graph, suite_streams_graph, suite_streams_stacked_graph};
use rtx::ops::conv::{conv2d, Conv2dOpts, Layout};
use rtx::ops::gemm::{gemm_plan_cache_stats, matmul};
use rtx::ops::{conv, elementwise as ew, reduce, softmax};
use rtx::{Backend, DType, Runtime};
use streams::{suite_convtiny, suite_rawstreams, suite_streams, suite_streams_stacked};

fn suite_ew(rt: &Runtime) {
    let host = random_f32(1 << 28, 1);
    let host_b = random_f32(1 << 28, 2);
    for dt in [DType::F32, DType::F16] {
        for p in [24u32, 26, 28] {
            let n = 1usize << p;
            let a = upload(rt, &host[..n], &[n], dt);
            let b = upload(rt, &host_b[..n], &[n], dt);
            let es = dt.size() as f64;
            let name = dt.name();
            let ms = time_op(rt, 10, 15, || ew::add(&a, &b));
            emit(
                &format!("add_{name}_2^{p}"),
                ms,
                3.0 * n as f64 * es,
                0.0,
                &[],
            );
            let ms = time_op(rt, 10, 15, || ew::exp(&a));
            emit(
                &format!("exp_{name}_2^{p}"),
                ms,
                2.0 * n as f64 * es,
                0.0,
                &[],
            );
        }
    }
}

fn suite_reduce(rt: &Runtime) {
    let host = random_f32(1 << 28, 3);
    for p in [24u32, 26, 28] {
        let n = 1usize << p;
        let a = upload(rt, &host[..n], &[n], DType::F32);
        let ms = time_op(rt, 10, 15, || reduce::sum(&a));
        emit(&format!("sum_f32_2^{p}"), ms, 4.0 * n as f64, 0.0, &[]);
    }
    let n = 8192usize;
    let x = upload(rt, &host[..n * n], &[n, n], DType::F32);
    let nb = 4.0 * (n * n) as f64;
    let ms = time_op(rt, 10, 15, || reduce::sum_dim(&x, 0, false));
    emit("sum_dim0_f32_8192x8192", ms, nb + 4.0 * n as f64, 0.0, &[]);
    let ms = time_op(rt, 10, 15, || reduce::sum_dim(&x, 1, false));
    emit("sum_dim1_f32_8192x8192", ms, nb + 4.0 * n as f64, 0.0, &[]);
    let ms = time_op(rt, 10, 15, || reduce::max_dim(&x, 1, false));
    emit("max_dim1_f32_8192x8192", ms, nb + 4.0 * n as f64, 0.0, &[]);
    let ms = time_op(rt, 10, 15, || reduce::argmax_dim(&x, 1, false));
    emit(
        "argmax_dim1_f32_8192x8192",
        ms,
        nb + 4.0 * n as f64,
        0.0,
        &[],
    );
    let ms = time_op(rt, 10, 15, || softmax::softmax(&x));
    emit("softmax_f32_8192x8192", ms, 2.0 * nb, 0.0, &[]);
}

/// A chain of 1,000 tiny dependent adds on one stream through `submit`: end-to-end µs
/// per op (first submit to last completion) and the submitting thread's µs per submit;
/// with eager launch batching (the default) and without (`_unbatched`), in one call.
/// The same chain over 4096 elements (the largest ops batched, `chain_1000_adds_4096`)
/// shows what a batched step costs on the device against a launch of its own.
fn suite_chain(_rt: &Runtime) {
    for len in [16, 4096] {
        for batching in [true, false] {
            chain_case(batching, len);
        }
    }
}

fn chain_case(batching: bool, len: usize) {
    // A runtime whose policy records the actors' own time in `op.run` (enqueue on CUDA:
    // allocation and launch, or the deferral into a batch), to split the per-op cost.
    let rec = std::sync::Arc::new(RunTime::default());
    let rt = Runtime::builder()
        .streams(4)
        .policy(RecordRun(rec.clone()))
        .launch_batching(batching)
        .build()
        .expect("runtime");
    let rt = &rt;
    let s = rt.compute_streams(rt.device())[0];
    let a = upload(rt, &random_f32(len, 4), &[len], DType::F32);
    let run = || {
        let mut x = a.clone();
        let t0 = Instant::now();
        for _ in 0..1000 {
            let sub = rt.submit_on(s, ew::add(&x, &a)).expect("submit");
            x = sub.outputs().expect("one output").clone();
        }
        let t1 = Instant::now();
        rt.to_vec::<f32>(&x)
            .expect("download")
            .wait()
            .expect("chain completes");
        let t2 = Instant::now();
        (
            (t2 - t0).as_secs_f64() * 1e3,
            (t1 - t0).as_secs_f64() * 1e6 / 1000.0,
        )
    };
    run();
    rt.reset_stats();
    let mut e2e = Vec::new();
    let mut sub = Vec::new();
    for _ in 0..7 {
        let (e, s) = run();
        e2e.push(e);
        sub.push(s);
    }
    let e = median(&mut e2e);
    let s = median(&mut sub);
    let run_us = rec.mean_us();
    let stats = rt.stats();
    let b = stats.launch_batches;
    let per_batch = if b.launches > 0 {
        b.ops as f64 / b.launches as f64
    } else {
        0.0
    };
    let mut extra = vec![
        ("us_per_op", e),
        ("submit_us", s),
        ("op_run_us", run_us),
        ("ops_per_batch", per_batch),
        ("batched_ops", b.ops as f64),
    ];
    // With RTX_PROFILE=1: mean µs per sample of each actor / watcher phase.
    extra.extend(stats.phases.iter().map(|p| (p.phase, p.mean_us)));
    let base = if len == 16 {
        "chain_1000_tiny_adds".to_string()
    } else {
        format!("chain_1000_adds_{len}")
    };
    let name = if batching {
        base
    } else {
        format!("{base}_unbatched")
    };
    emit(&name, e, 0.0, 0.0, &extra);
}

/// Mean time of `op.run` over the ops observed (CUDA: the enqueue, i.e. allocation and
/// launch; the rest of an actor's per-op time is events, waits and bookkeeping).
#[derive(Default)]
struct RunTime {
    ns: std::sync::atomic::AtomicU64,
    n: std::sync::atomic::AtomicU64,
}

impl RunTime {
    fn mean_us(&self) -> f64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.ns.load(Relaxed) as f64 / self.n.load(Relaxed).max(1) as f64 / 1e3
    }
}

struct RecordRun(std::sync::Arc<RunTime>);

impl rtx::placement::Policy for RecordRun {
    fn name(&self) -> &'static str {
        "affinity+record"
    }
    fn place(
        &self,
        op: &rtx::placement::OpInfo<'_>,
        streams: &[rtx::placement::StreamLoad],
    ) -> usize {
        rtx::placement::Affinity.place(op, streams)
    }
    fn observe(
        &self,
        name: &str,
        _cost: rtx::Cost,
        _stream: rtx::StreamId,
        took: std::time::Duration,
    ) {
        if name == "add" {
            use std::sync::atomic::Ordering::Relaxed;
            self.0.ns.fetch_add(took.as_nanos() as u64, Relaxed);
            self.0.n.fetch_add(1, Relaxed);
        }
    }
}

fn suite_gemm(rt: &Runtime) {
    let host = random_f32(8192 * 8192, 5);
    let host_b = random_f32(8192 * 8192, 6);
    for (label, dt, tf32) in [
        ("f32", DType::F32, false),
        ("tf32", DType::F32, true),
        ("f16", DType::F16, false),
        ("bf16", DType::BF16, false),
    ] {
        for n in [1024usize, 4096, 8192] {
            let a = upload(rt, &host[..n * n], &[n, n], dt);
            let b = upload(rt, &host_b[..n * n], &[n, n], dt);
            let reps = if n >= 4096 { 5 } else { 20 };
            let ms = time_op(rt, reps, 9, || {
                if tf32 {
                    matmul(&a, &b).tf32()
                } else {
                    matmul(&a, &b)
                }
            });
            emit(
                &format!("gemm_{label}_{n}"),
                ms,
                0.0,
                2.0 * (n * n * n) as f64,
                &[],
            );
        }
    }
    let (bt, n) = (64usize, 512usize);
    let a = upload(rt, &host[..bt * n * n], &[bt, n, n], DType::BF16);
    let b = upload(rt, &host_b[..bt * n * n], &[bt, n, n], DType::BF16);
    let ms = time_op(rt, 10, 9, || matmul(&a, &b));
    emit(
        "bmm_bf16_64x512",
        ms,
        0.0,
        2.0 * (bt * n * n * n) as f64,
        &[],
    );
    let (hits, misses) = gemm_plan_cache_stats();
    emit(
        "gemm_plan_cache",
        0.0,
        0.0,
        0.0,
        &[("hits", hits as f64), ("misses", misses as f64)],
    );
}

/// ResNet-50 layers, f16 NHWC, N = 32: (name, h=w, c_in, c_out, k, stride).
const CONV_LAYERS: [(&str, usize, usize, usize, usize, usize); 6] = [
    ("conv_56_64_64_3x3", 56, 64, 64, 3, 1),
    ("conv_56_64_256_1x1", 56, 64, 256, 1, 1),
    ("conv_28_128_128_3x3", 28, 128, 128, 3, 1),
    ("conv_14_256_1024_1x1", 14, 256, 1024, 1, 1),
    ("conv_7_512_512_3x3", 7, 512, 512, 3, 1),
    ("conv_56_256_128_1x1_s2", 56, 256, 128, 1, 2),
];

fn suite_conv(rt: &Runtime) {
    let n = 32usize;
    let host = random_f32(32 * 56 * 56 * 256, 7);
    for (name, hw, cin, cout, k, stride) in CONV_LAYERS {
        let x = upload(
            rt,
            &host[..n * hw * hw * cin],
            &[n, hw, hw, cin],
            DType::F16,
        );
        let w = upload(
            rt,
            &host[..cout * k * k * cin],
            &[cout, k, k, cin],
            DType::F16,
        );
        let opts = Conv2dOpts::default()
            .stride(stride)
            .pad(k / 2)
            .layout(Layout::Nhwc);
        let ho = (hw + 2 * (k / 2) - k) / stride + 1;
        let flops = 2.0 * (n * cout * ho * ho * cin * k * k) as f64;
        let ms = time_op(rt, 10, 9, || conv2d(&x, &w, opts));
        emit(name, ms, 0.0, flops, &[]);
    }
    let (hits, misses) = conv::conv_algo_cache_stats();
    let (graph, legacy) = conv::conv_engine_stats();
    emit(
        "conv_algo_cache",
        0.0,
        0.0,
        0.0,
        &[
            ("hits", hits as f64),
            ("misses", misses as f64),
            ("graph_api_chosen", graph as f64),
            ("legacy_chosen", legacy as f64),
        ],
    );
}

/// The seeds' GPU-vs-CPU matmul table: f32 n³ on this runtime and on the CPU backend.
fn suite_speedup(rt: &Runtime) {
    let cpu = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(1)
        .build()
        .expect("cpu runtime");
    let host = random_f32(2048 * 2048, 9);
    for n in [128usize, 256, 512, 1024, 2048] {
        let a = upload(rt, &host[..n * n], &[n, n], DType::F32);
        let ms = time_op(rt, 10, 9, || matmul(&a, &a));
        let ac = upload(&cpu, &host[..n * n], &[n, n], DType::F32);
        let cms = time_op(&cpu, if n >= 1024 { 2 } else { 5 }, 5, || matmul(&ac, &ac));
        emit(
            &format!("matmul_speedup_f32_{n}"),
            ms,
            0.0,
            2.0 * (n * n * n) as f64,
            &[("cpu_ms", cms), ("speedup", cms / ms)],
        );
    }
}

/// bf16 attention, B·L = 16384, H·D = 2048: forward, and forward + backward; on CUDA,
/// forward + backward again without the TMA backward (the setting `attn_bwd_tma` off: the
/// wgmma backward at D = 128, `mma.sync` at D = 64; case names ending in `_no_tma_bwd`).
fn suite_attention(rt: &Runtime) {
    use rtx::ops::attention::attention;
    let no_tma_bwd = (rt.backend() == rtx::BackendKind::Cuda).then(|| {
        Runtime::builder()
            .backend(Backend::Cuda(vec![]))
            .streams(1)
            .attn_bwd_tma(false)
            .build()
            .expect("runtime without attn_bwd_tma")
    });
    let host = random_f32(16384 * 2048, 11);
    for d in [64usize, 128] {
        for l in [1024usize, 4096, 16384] {
            for causal in [false, true] {
                let (b, h) = (16384 / l, 2048 / d);
                let shape = [b, h, l, d];
                let fwd = 4.0 * (b * h * l * l * d) as f64 / if causal { 2.0 } else { 1.0 };
                let name = format!("attn_d{d}_l{l}_c{}", causal as u8);
                let reps = if l >= 16384 { 3 } else { 8 };
                let [q, k, v] = attention_inputs(rt, &host, &shape);
                let ms = time_op(rt, reps, 7, || attention(&q, &k, &v).causal(causal));
                emit(&format!("{name}_fwd"), ms, 0.0, fwd, &[]);
                let ms = time_fwd_bwd(rt, &[q, k, v], causal, reps);
                emit(&format!("{name}_fwdbwd"), ms, 0.0, 3.5 * fwd, &[]);
                if let Some(rt2) = &no_tma_bwd {
                    let ms = time_fwd_bwd(rt2, &attention_inputs(rt2, &host, &shape), causal, reps);
                    emit(
                        &format!("{name}_fwdbwd_no_tma_bwd"),
                        ms,
                        0.0,
                        3.5 * fwd,
                        &[],
                    );
                }
            }
        }
    }
}

/// q, k, v of `shape` in bf16 on `rt`: `host`, and the same values rotated by 7 and 13 (so
/// that no two inputs are equal).
fn attention_inputs(rt: &Runtime, host: &[f32], shape: &[usize; 4]) -> [rtx::Tensor; 3] {
    let rotated =
        |by: usize| -> Vec<f32> { host[by..].iter().chain(&host[..by]).copied().collect() };
    [
        upload(rt, host, shape, DType::BF16),
        upload(rt, &rotated(7), shape, DType::BF16),
        upload(rt, &rotated(13), shape, DType::BF16),
    ]
}

/// Milliseconds per forward + backward on `rt` (the output gradient: k).
fn time_fwd_bwd(rt: &Runtime, [q, k, v]: &[rtx::Tensor; 3], causal: bool, reps: usize) -> f64 {
    use rtx::ops::attention::{attention, attention_backward};
    time_with(rt, reps, 7, |rt, s| {
        let (o, lse) = rt
            .submit_on(s, attention(q, k, v).causal(causal))
            .expect("fwd")
            .outputs()
            .cloned()
            .expect("out");
        let _submitted = rt
            .submit_on(s, attention_backward(q, k, v, &o, &lse, k).causal(causal))
            .expect("bwd");
    })
}

/// The driver's own cost on this host, without the runtime: 1,000 dependent 16-element
/// adds on one stream through cudarc (alloc + launch + free per op, and launch only).
fn suite_raw(_rt: &Runtime) {
    use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
    use rtx::kernels::{Arch, KernelCache, Options};
    let ctx = CudaContext::new(0).expect("context");
    // SAFETY: no slice exists yet; this loop orders everything on one stream.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().expect("stream");
    let cubin = KernelCache::global()
        .cubin("elementwise", Arch::SM_90, &Options::default())
        .expect("cubin");
    let m = ctx
        .load_module(cudarc::nvrtc::Ptx::from_binary((*cubin).clone()))
        .expect("module");
    let f = m.load_function("ew_add_f32").expect("function");
    let a = stream.clone_htod(&random_f32(16, 4)).expect("upload");
    let n = 16usize;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    for mode in ["alloc_launch_free", "launch_only"] {
        let mut x = stream.clone_dtod(&a).expect("copy");
        let mut y = stream.alloc_zeros::<f32>(n).expect("alloc");
        let mut times = Vec::new();
        for _ in 0..7 {
            stream.synchronize().expect("sync");
            let t = Instant::now();
            for _ in 0..1000 {
                if mode == "alloc_launch_free" {
                    // SAFETY: the kernel writes all n elements before anything reads them.
                    let mut out = unsafe { stream.alloc::<f32>(n) }.expect("alloc");
                    let mut lb = stream.launch_builder(&f);
                    lb.arg(&x).arg(&a).arg(&mut out).arg(&n);
                    // SAFETY: ew_add_f32(const float*, const float*, float*, size_t n), buffers of n.
                    unsafe { lb.launch(cfg) }.expect("launch");
                    x = out;
                } else {
                    let mut lb = stream.launch_builder(&f);
                    lb.arg(&x).arg(&a).arg(&mut y).arg(&n);
                    // SAFETY: as above.
                    unsafe { lb.launch(cfg) }.expect("launch");
                    std::mem::swap(&mut x, &mut y);
                }
            }
            stream.synchronize().expect("sync");
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let ms = median(&mut times);
        emit(
            &format!("raw_cudarc_1000_tiny_adds_{mode}"),
            ms,
            0.0,
            0.0,
            &[("us_per_op", ms)],
        );
    }
}

/// `RTX_LOG=target=level,...` (e.g. `rtx_ops=debug`): the runtime's and ops' tracing
/// events on stderr.
fn init_log() {
    use tracing_subscriber::prelude::*;
    let Ok(spec) = std::env::var("RTX_LOG") else {
        return;
    };
    match spec.parse::<tracing_subscriber::filter::Targets>() {
        Ok(filter) => tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(std::io::stderr),
            )
            .with(filter)
            .init(),
        Err(e) => eprintln!("RTX_LOG={spec}: {e}"),
    }
}

fn main() {
    init_log();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let rt = Runtime::builder().streams(4).build().expect("runtime");
    eprintln!("{}", rt.info());
    let all = [
        "ew",
        "reduce",
        "chain",
        "chaingraph",
        "gemm",
        "conv",
        "streams",
        "streamsgraph",
        "speedup",
        "train",
    ];
    let suites: Vec<&str> = if args.is_empty() {
        all.to_vec()
    } else {
        args.iter().map(|s| s.as_str()).collect()
    };
    for s in suites {
        match s {
            "ew" => suite_ew(&rt),
            "reduce" => suite_reduce(&rt),
            "chain" => suite_chain(&rt),
            "chaingraph" => suite_chain_graph(&rt),
            "streamsgraph" => {
                suite_streams_graph(&rt);
                suite_streams_stacked_graph(&rt);
            }
            "gemm" => suite_gemm(&rt),
            "conv" => suite_conv(&rt),
            "convtiny" => suite_convtiny(&rt),
            "streams" => {
                suite_streams(&rt);
                suite_streams_stacked(&rt);
            }
            "speedup" => suite_speedup(&rt),
            "attention" => suite_attention(&rt),
            "train" => train::suite_train(&rt),
            "raw" => suite_raw(&rt),
            "rawstreams" => suite_rawstreams(&rt),
            other => eprintln!("unknown suite {other}"),
        }
    }
}
