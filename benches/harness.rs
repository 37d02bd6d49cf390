//! The rtx benchmark harness: one JSON line per case, to be joined with
//! `benches/torch_baseline.py` by `benches/compare.py` (same case names).
//!
//! ```text
//! cargo bench --bench harness -- [SUITE ...]      suites: ew reduce chain gemm conv streams speedup
//!                                                 (on request: convtiny attention raw rawstreams)
//! ```
//!
//! Device cases are timed with the runtime's markers (CUDA events on the op's stream)
//! after warm-up: each sample is a batch of back-to-back ops between two markers, the
//! samples follow each other on the device (`bench_util::time_with`: device time when
//! the host keeps up, enqueue throughput when it does not), and the reported time is the
//! median over samples of the per-op mean. Inputs are random, uniform in [-1, 1) drawn
//! in f32 and rounded to the case's dtype (the PyTorch baseline draws its gemm and conv
//! inputs the same way; its element-wise, reduction and attention inputs are `randn`).
//! `RTX_LOG=rtx_ops=debug` prints the library's tracing events (e.g. why a cuDNN engine
//! was skipped) on stderr; `RTX_PROFILE=1` adds the actors' phase timers to some cases.

mod bench_util;

use std::time::Instant;

use bench_util::*;
use rtx::ops::conv::{conv2d, Conv2dOpts, Layout};
use rtx::ops::gemm::{gemm_plan_cache_stats, linear, matmul, Activation};
use rtx::ops::{conv, elementwise as ew, reduce, softmax};
use rtx::{Backend, DType, Runtime, Tensor};

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
/// per op (first submit to last completion) and the submitting thread's µs per submit.
fn suite_chain(_rt: &Runtime) {
    // A runtime whose policy records the actors' own time in `op.run` (enqueue on CUDA:
    // allocation and launch), to split the per-op cost.
    let rec = std::sync::Arc::new(RunTime::default());
    let rt = Runtime::builder()
        .streams(4)
        .policy(RecordRun(rec.clone()))
        .build()
        .expect("runtime");
    let rt = &rt;
    let s = rt.compute_streams(rt.device())[0];
    let a = upload(rt, &random_f32(16, 4), &[16], DType::F32);
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
    rtx::profile::reset();
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
    let mut extra = vec![("us_per_op", e), ("submit_us", s), ("op_run_us", run_us)];
    // With RTX_PROFILE=1: mean µs per sample of each actor / watcher phase.
    let phases = rtx::profile::report();
    extra.extend(phases.iter().map(|(name, us, _)| (*name, *us)));
    emit("chain_1000_tiny_adds", e, 0.0, 0.0, &extra);
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

/// 8 independent chains of 200 steps of (GEMM 256³ bf16 + relu), chain c pinned to
/// stream c % k, submitted step by step from one thread; wall time to the last result.
/// Two forms: `matmul` then an in-place `relu_` (two ops per step, as PyTorch eager
/// runs it), and `linear` with the fused relu epilogue (one op per step, as an rtx
/// user would write it). Extra fields: the submitting loop's own time (`submit_ms`)
/// and, with `RTX_PROFILE=1`, the actors' mean µs per phase.
fn suite_streams(_rt: &Runtime) {
    let n = 256usize;
    // He-style scale (uniform, variance 2/n) keeps the chain's values O(1) through relu.
    let scale: Vec<f32> = random_f32(n * n, 8)
        .iter()
        .map(|v| v * (6.0f32 / n as f32).sqrt())
        .collect();
    for fused in [false, true] {
        for k in [1usize, 2, 4, 8] {
            let rt = Runtime::builder().streams(k).build().expect("runtime");
            let streams = rt.compute_streams(rt.device());
            let ws: Vec<Tensor> = (0..8)
                .map(|_| upload(&rt, &scale, &[n, n], DType::BF16))
                .collect();
            let x0: Vec<Tensor> = (0..8)
                .map(|c| upload(&rt, &random_f32(n * n, 10 + c), &[n, n], DType::BF16))
                .collect();
            let step = |x: &Tensor, w: &Tensor, s: rtx::StreamId| -> Tensor {
                if fused {
                    return rt
                        .submit_on(s, linear(x, w, None, Activation::Relu))
                        .expect("submit")
                        .outputs()
                        .cloned()
                        .expect("out");
                }
                let y = rt
                    .submit_on(s, matmul(x, w))
                    .expect("submit")
                    .outputs()
                    .cloned()
                    .expect("out");
                rt.submit_on(s, ew::relu_(y))
                    .expect("submit")
                    .outputs()
                    .cloned()
                    .expect("out")
            };
            let run = || {
                let t = Instant::now();
                let mut xs = x0.clone();
                for _ in 0..200 {
                    for c in 0..8 {
                        xs[c] = step(&xs[c], &ws[c], streams[c % k]);
                    }
                }
                let submitted = t.elapsed().as_secs_f64() * 1e3;
                for x in &xs {
                    rt.to_vec::<rtx::bf16>(x)
                        .expect("download")
                        .wait()
                        .expect("chain");
                }
                (t.elapsed().as_secs_f64() * 1e3, submitted)
            };
            run();
            rtx::profile::reset();
            let before = proc_counters();
            let (mut t, mut sub): (Vec<f64>, Vec<f64>) = (0..9).map(|_| run()).unzip();
            let after = proc_counters();
            let ms = median(&mut t);
            let (lo, hi) = t
                .iter()
                .fold((f64::MAX, 0f64), |(a, b), &v| (a.min(v), b.max(v)));
            let (hits, misses) = rtx::cuda::block_cache_stats();
            let (pinned_hits, pinned_misses) = rtx::cuda::pinned_cache_stats();
            let mut extra = vec![
                ("min_ms", lo),
                ("max_ms", hi),
                ("submit_ms", median(&mut sub)),
                ("block_cache_hits", hits as f64),
                ("block_cache_misses", misses as f64),
                ("pinned_cache_hits", pinned_hits as f64),
                ("pinned_cache_misses", pinned_misses as f64),
            ];
            // The process's CPU time, page faults and context switches per run.
            for (i, name) in PROC_FIELDS.iter().enumerate() {
                extra.push((name, (after[i] - before[i]) / 9.0));
            }
            // With RTX_PROFILE=1: each phase's mean µs per sample, and its total per run
            // summed over the actors (or watchers), in ms (`<phase>_ms`).
            let phases = rtx::profile::report();
            let totals: Vec<(String, f64)> = phases
                .iter()
                .map(|(name, us, n)| (format!("{name}_ms"), us * *n as f64 / 9.0 / 1e3))
                .collect();
            extra.extend(phases.iter().map(|(name, us, _)| (*name, *us)));
            extra.extend(totals.iter().map(|(name, ms)| (name.as_str(), *ms)));
            let form = if fused { "linear_relu" } else { "gemm256_relu" };
            emit(
                &format!("streams_8x200_{form}_{k}"),
                ms,
                0.0,
                8.0 * 200.0 * 2.0 * (n * n * n) as f64,
                &extra,
            );
        }
    }
}

/// One small convolution (f16 NHWC, 2×16×16×32 → 32, 3×3), for the streams
/// investigation of `benches/RESULTS.md` (runs 24-29): whether the first cuDNN use in a
/// process is what changes the streams suite's time. Prints its time like any case.
fn suite_convtiny(rt: &Runtime) {
    let host = random_f32(2 * 16 * 16 * 32, 12);
    let x = upload(rt, &host, &[2, 16, 16, 32], DType::F16);
    let w = upload(rt, &host[..32 * 9 * 32], &[32, 3, 3, 32], DType::F16);
    let opts = Conv2dOpts::default().pad(1).layout(Layout::Nhwc);
    let ms = time_op(rt, 3, 5, || conv2d(&x, &w, opts));
    emit(
        "conv_tiny_16_32_32_3x3",
        ms,
        0.0,
        2.0 * (2 * 32 * 16 * 16 * 32 * 9) as f64,
        &[],
    );
}

/// The streams workload without the runtime (the issue's "raw prototype"): 8 chains ×
/// 200 steps of GEMM 256³ bf16 with the relu epilogue through cuBLASLt, chain c on
/// stream c % k, one launching thread per stream with its own handle and plan, no
/// events (the chains are independent). Wall time from the threads' start to the last
/// stream's synchronize, median of 9 after a warm-up. For the streams investigation
/// (`benches/RESULTS.md`, runs 24-32): whether the driver's and cuBLASLt's per-call cost
/// depends on what the process ran before, with the runtime out of the picture.
fn suite_rawstreams(_rt: &Runtime) {
    use cudarc::cublaslt::{result as lt, sys};
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
    use std::ffi::c_void;
    use std::sync::Arc;
    type DescAttr = sys::cublasLtMatmulDescAttributes_t;
    type PrefAttr = sys::cublasLtMatmulPreferenceAttributes_t;
    let n = 256usize;
    let ctx = CudaContext::new(0).expect("context");
    // SAFETY: each stream's buffers are used only on that stream, in order.
    unsafe { ctx.disable_event_tracking() };
    let w_host: Vec<rtx::bf16> = random_f32(n * n, 8)
        .iter()
        .map(|v| rtx::bf16::from_f32(v * (6.0f32 / n as f32).sqrt()))
        .collect();
    /// One stream's launcher: its handle, plan and chains (x ping-pong buffers, weight).
    struct Lane {
        stream: Arc<CudaStream>,
        handle: sys::cublasLtHandle_t,
        desc: sys::cublasLtMatmulDesc_t,
        layout: sys::cublasLtMatrixLayout_t,
        algo: sys::cublasLtMatmulAlgo_t,
        chains: Vec<[CudaSlice<rtx::bf16>; 3]>,
    }
    // SAFETY: a lane is used by one thread at a time (the scope below hands each lane to
    // exactly one thread); cuBLASLt handles and descriptors may move between threads.
    unsafe impl Send for Lane {}
    unsafe impl Sync for Lane {}
    impl Drop for Lane {
        fn drop(&mut self) {
            let _ = self.stream.synchronize();
            // SAFETY: the stream is idle, so nothing uses these objects any more; each
            // was created once below and is destroyed once here.
            unsafe {
                let _ = lt::destroy_matrix_layout(self.layout);
                let _ = lt::destroy_matmul_desc(self.desc);
                let _ = lt::destroy_handle(self.handle);
            }
        }
    }
    for k in [1usize, 2, 4, 8] {
        let lanes: Vec<Lane> = (0..k)
            .map(|l| {
                let stream = ctx.new_stream().expect("stream");
                let handle = lt::create_handle().expect("cublasLt handle");
                let desc = lt::create_matmul_desc(
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cudaDataType::CUDA_R_32F,
                )
                .expect("desc");
                let epi = sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU;
                // SAFETY: the epilogue attribute takes a cublasLtEpilogue_t, passed with
                // its exact size; `desc` is live.
                unsafe {
                    lt::set_matmul_desc_attribute(
                        desc,
                        DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE,
                        &epi as *const _ as *const c_void,
                        std::mem::size_of_val(&epi),
                    )
                }
                .expect("epilogue");
                let layout = lt::create_matrix_layout(
                    sys::cudaDataType::CUDA_R_16BF,
                    n as u64,
                    n as u64,
                    n as i64,
                )
                .expect("layout");
                let pref = lt::create_matmul_pref().expect("pref");
                let ws = 0u64;
                // SAFETY: the attribute takes a u64, passed with its size; `pref` is live.
                unsafe {
                    lt::set_matmul_pref_attribute(
                        pref,
                        PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                        &ws as *const u64 as *const c_void,
                        8,
                    )
                }
                .expect("pref workspace");
                // SAFETY: handle, descriptor, layout and preference are live.
                let heur = unsafe {
                    lt::get_matmul_algo_heuristic(
                        handle, desc, layout, layout, layout, layout, pref,
                    )
                }
                .expect("heuristic");
                // SAFETY: created above, used only by the heuristic call.
                unsafe { lt::destroy_matmul_pref(pref) }.expect("pref destroy");
                let chains = (0..8)
                    .filter(|c| c % k == l)
                    .map(|c| {
                        let x0: Vec<rtx::bf16> = random_f32(n * n, 10 + c as u64)
                            .iter()
                            .map(|&v| rtx::bf16::from_f32(v))
                            .collect();
                        [
                            stream.clone_htod(&x0).expect("upload"),
                            stream.clone_htod(&x0).expect("upload"),
                            stream.clone_htod(&w_host).expect("upload"),
                        ]
                    })
                    .collect();
                stream.synchronize().expect("sync");
                Lane {
                    stream,
                    handle,
                    desc,
                    layout,
                    algo: heur.algo,
                    chains,
                }
            })
            .collect();
        let run = || {
            let t = Instant::now();
            std::thread::scope(|s| {
                for lane in &lanes {
                    s.spawn(move || {
                        lane.stream.context().bind_to_thread().expect("bind");
                        let cu = lane.stream.cu_stream() as sys::cudaStream_t;
                        let ptrs: Vec<[u64; 3]> = lane
                            .chains
                            .iter()
                            .map(|[a, b, w]| {
                                [
                                    a.device_ptr(&lane.stream).0,
                                    b.device_ptr(&lane.stream).0,
                                    w.device_ptr(&lane.stream).0,
                                ]
                            })
                            .collect();
                        let (alpha, beta) = (1f32, 0f32);
                        for step in 0..200 {
                            for p in &ptrs {
                                let (src, dst) = if step % 2 == 0 {
                                    (p[0], p[1])
                                } else {
                                    (p[1], p[0])
                                };
                                // SAFETY: src, dst and w are live 256×256 bf16 buffers on
                                // this lane's stream (kept by `lanes` until after the
                                // synchronize below); dst does not overlap the inputs;
                                // the plan was validated for these layouts with no
                                // workspace; alpha/beta are host f32 (scale type f32).
                                unsafe {
                                    lt::matmul(
                                        lane.handle,
                                        lane.desc,
                                        &alpha as *const f32 as *const c_void,
                                        &beta as *const f32 as *const c_void,
                                        p[2] as *const c_void,
                                        lane.layout,
                                        src as *const c_void,
                                        lane.layout,
                                        dst as *const c_void,
                                        lane.layout,
                                        dst as *mut c_void,
                                        lane.layout,
                                        &lane.algo,
                                        std::ptr::null_mut(),
                                        0,
                                        cu,
                                    )
                                }
                                .expect("cublasLtMatmul");
                            }
                        }
                        lane.stream.synchronize().expect("sync");
                    });
                }
            });
            t.elapsed().as_secs_f64() * 1e3
        };
        run();
        let before = proc_counters();
        let mut t: Vec<f64> = (0..9).map(|_| run()).collect();
        let after = proc_counters();
        let ms = median(&mut t);
        let mut extra: Vec<(&str, f64)> = PROC_FIELDS
            .iter()
            .enumerate()
            .map(|(i, name)| (*name, (after[i] - before[i]) / 9.0))
            .collect();
        extra.push(("min_ms", t[0]));
        emit(
            &format!("rawstreams_8x200_linear_relu_{k}"),
            ms,
            0.0,
            8.0 * 200.0 * 2.0 * (n * n * n) as f64,
            &extra,
        );
    }
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

/// bf16 attention, B·L = 16384, H·D = 2048: forward, and forward + backward.
fn suite_attention(rt: &Runtime) {
    use rtx::ops::attention::{attention, attention_backward};
    let host = random_f32(16384 * 2048, 11);
    for d in [64usize, 128] {
        for l in [1024usize, 4096, 16384] {
            for causal in [false, true] {
                let (b, h) = (16384 / l, 2048 / d);
                let shape = [b, h, l, d];
                // k and v: the same values rotated, so no two inputs are equal.
                let rotated = |by: usize| -> Vec<f32> {
                    host[by..].iter().chain(&host[..by]).copied().collect()
                };
                let q = upload(rt, &host, &shape, DType::BF16);
                let k = upload(rt, &rotated(7), &shape, DType::BF16);
                let v = upload(rt, &rotated(13), &shape, DType::BF16);
                let dout = k.clone();
                let fwd = 4.0 * (b * h * l * l * d) as f64 / if causal { 2.0 } else { 1.0 };
                let name = format!("attn_d{d}_l{l}_c{}", causal as u8);
                let reps = if l >= 16384 { 3 } else { 8 };
                let ms = time_op(rt, reps, 7, || attention(&q, &k, &v).causal(causal));
                emit(&format!("{name}_fwd"), ms, 0.0, fwd, &[]);
                let ms = time_with(rt, reps, 7, |rt, s| {
                    let (o, lse) = rt
                        .submit_on(s, attention(&q, &k, &v).causal(causal))
                        .expect("fwd")
                        .outputs()
                        .cloned()
                        .expect("out");
                    let _ = rt
                        .submit_on(
                            s,
                            attention_backward(&q, &k, &v, &o, &lse, &dout).causal(causal),
                        )
                        .expect("bwd");
                });
                emit(&format!("{name}_fwdbwd"), ms, 0.0, 3.5 * fwd, &[]);
            }
        }
    }
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
        "ew", "reduce", "chain", "gemm", "conv", "streams", "speedup",
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
            "gemm" => suite_gemm(&rt),
            "conv" => suite_conv(&rt),
            "convtiny" => suite_convtiny(&rt),
            "streams" => suite_streams(&rt),
            "speedup" => suite_speedup(&rt),
            "attention" => suite_attention(&rt),
            "raw" => suite_raw(&rt),
            "rawstreams" => suite_rawstreams(&rt),
            other => eprintln!("unknown suite {other}"),
        }
    }
}
