//! The harness's multi-stream workload (8 chains × 200 steps of GEMM 256³ bf16 + relu on
//! 1-8 streams) and the cases that investigated it (`docs/performance-notes.md`,
//! "Pinned-memory page faults"): the same workload through cuBLASLt with no runtime, and
//! one tiny convolution (cuDNN's first use).

use std::time::Instant;

use crate::bench_util::*;
use rtx::ops::conv::{conv2d, Conv2dOpts, Layout};
use rtx::ops::elementwise as ew;
use rtx::ops::gemm::{linear, matmul, Activation};
use rtx::{DType, Runtime, Tensor};

/// The chains' width (256 × 256 bf16).
pub(crate) const CHAIN_N: usize = 256;

/// The chains' weight values: He-style scale (uniform, variance 2/n) keeps the chain's
/// values O(1) through relu.
pub(crate) fn chain_weight(n: usize) -> Vec<f32> {
    random_f32(n * n, 8)
        .iter()
        .map(|v| v * (6.0f32 / n as f32).sqrt())
        .collect()
}

/// The 8 chains' weights and starting inputs on `rt` (bf16 `[n, n]` each).
pub(crate) fn chain_inputs(rt: &Runtime, scale: &[f32], n: usize) -> (Vec<Tensor>, Vec<Tensor>) {
    let ws = (0..8)
        .map(|_| upload(rt, scale, &[n, n], DType::BF16))
        .collect();
    let x0 = (0..8)
        .map(|c| upload(rt, &random_f32(n * n, 10 + c), &[n, n], DType::BF16))
        .collect();
    (ws, x0)
}

/// The same weights and starting inputs stacked (bf16 `[8, n, n]` each): chain c is
/// layer c, for `linear`'s stacked form.
pub(crate) fn stacked_inputs(rt: &Runtime, scale: &[f32], n: usize) -> (Tensor, Tensor) {
    let w: Vec<f32> = (0..8).flat_map(|_| scale.iter().copied()).collect();
    let x: Vec<f32> = (0..8).flat_map(|c| random_f32(n * n, 10 + c)).collect();
    (
        upload(rt, &w, &[8, n, n], DType::BF16),
        upload(rt, &x, &[8, n, n], DType::BF16),
    )
}

/// The 8 chains as one stacked `linear` (`w` `[8, 256, 256]`, relu fused) per step on
/// one stream: 200 ops, PyTorch's stacked `bmm` form in one op a step. Wall time to the
/// downloaded result (one `[8, 256, 256]` tensor).
pub fn suite_streams_stacked(_rt: &Runtime) {
    let n = CHAIN_N;
    let rt = Runtime::builder().streams(1).build().expect("runtime");
    let (w, x0) = stacked_inputs(&rt, &chain_weight(n), n);
    let s = rt.compute_streams(rt.device());
    let mut device = Vec::new();
    let run = || {
        let t = Instant::now();
        let ((x, submitted), span) = device_span(&rt, &s[..1], || {
            let mut x = x0.clone();
            for _ in 0..200 {
                x = rt
                    .submit_on(s[0], linear(&x, &w, None, Activation::Relu))
                    .expect("submit")
                    .outputs()
                    .cloned()
                    .expect("out");
            }
            (x, t.elapsed().as_secs_f64() * 1e3)
        });
        device.push(span);
        std::hint::black_box(
            rt.to_vec::<rtx::bf16>(&x)
                .expect("download")
                .wait()
                .expect("chain"),
        );
        (t.elapsed().as_secs_f64() * 1e3, submitted)
    };
    let (ms, lo, hi, sub) = warm_then_time(run, 9);
    let extra = [
        ("min_ms", lo),
        ("max_ms", hi),
        ("device_ms", median(&mut device[1..])),
        ("submit_ms", sub),
    ];
    emit(
        "streams_8x200_stacked_linear_relu_1",
        ms,
        0.0,
        8.0 * 200.0 * 2.0 * (n * n * n) as f64,
        &extra,
    );
}

/// 8 independent chains of 200 steps of (GEMM 256³ bf16 + relu), chain c pinned to
/// stream c % k, submitted step by step from one thread; wall time to the last result.
/// Two forms: `matmul` then an in-place `relu_` (two ops per step, as PyTorch eager
/// runs it), and `linear` with the fused relu epilogue (one op per step, as an rtx
/// user would write it). Extra fields: the submitting loop's own time (`submit_ms`)
/// and, with `RTX_PROFILE=1`, the actors' mean µs per phase.
pub fn suite_streams(_rt: &Runtime) {
    let n = CHAIN_N;
    let scale = chain_weight(n);
    for fused in [false, true] {
        for k in [1usize, 2, 4, 8] {
            let rt = Runtime::builder().streams(k).build().expect("runtime");
            let streams = rt.compute_streams(rt.device());
            let (ws, x0) = chain_inputs(&rt, &scale, n);
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
            let device = std::cell::RefCell::new(Vec::new());
            let run = || {
                let t = Instant::now();
                let ((xs, submitted), span) = device_span(&rt, &streams[..k], || {
                    let mut xs = x0.clone();
                    for _ in 0..200 {
                        for c in 0..8 {
                            xs[c] = step(&xs[c], &ws[c], streams[c % k]);
                        }
                    }
                    (xs, t.elapsed().as_secs_f64() * 1e3)
                });
                device.borrow_mut().push(span);
                download_all_bf16(&rt, &xs);
                (t.elapsed().as_secs_f64() * 1e3, submitted)
            };
            run();
            rt.reset_stats();
            let before = proc_counters();
            let (mut t, mut sub): (Vec<f64>, Vec<f64>) = (0..9).map(|_| run()).unzip();
            let after = proc_counters();
            let ms = median(&mut t);
            let (lo, hi) = t
                .iter()
                .fold((f64::MAX, 0f64), |(a, b), &v| (a.min(v), b.max(v)));
            let stats = rt.stats();
            let (hits, misses) = (stats.block_cache.hits, stats.block_cache.misses);
            let (pinned_hits, pinned_misses) = (stats.pinned_cache.hits, stats.pinned_cache.misses);
            let mut device = device.into_inner();
            let mut extra = vec![
                ("min_ms", lo),
                ("max_ms", hi),
                ("device_ms", median(&mut device[1..])),
                ("submit_ms", median(&mut sub)),
                ("block_cache_hits", hits as f64),
                ("block_cache_misses", misses as f64),
                ("pinned_cache_hits", pinned_hits as f64),
                ("pinned_cache_misses", pinned_misses as f64),
                // Eager launch batching (`Settings::launch_batching`): ops per launch.
                (
                    "ops_per_batch",
                    stats.launch_batches.ops as f64 / stats.launch_batches.launches.max(1) as f64,
                ),
            ];
            // The process's CPU time, page faults and context switches per run.
            extra.extend(proc_per_run(before, after, 9));
            // With RTX_PROFILE=1: each phase's mean µs per sample, and its total per run
            // summed over the actors (or watchers), in ms (`<phase>_ms`).
            let phases = stats.phases;
            let totals: Vec<(String, f64)> = phases
                .iter()
                .map(|p| {
                    let ms = p.mean_us * p.samples as f64 / 9.0 / 1e3;
                    (format!("{}_ms", p.phase), ms)
                })
                .collect();
            extra.extend(phases.iter().map(|p| (p.phase, p.mean_us)));
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
/// investigation (`docs/performance-notes.md`, "Pinned-memory page faults"): whether the first cuDNN use in a
/// process is what changes the streams suite's time. Prints its time like any case.
pub fn suite_convtiny(rt: &Runtime) {
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

/// The streams workload without the runtime (a raw prototype): 8 chains ×
/// 200 steps of GEMM 256³ bf16 with the relu epilogue through cuBLASLt, chain c on
/// stream c % k, one launching thread per stream with its own handle and plan, no
/// events (the chains are independent). Wall time from the threads' start to the last
/// stream's synchronize, median of 9 after a warm-up. For the streams investigation
/// (`docs/performance-notes.md`, "Pinned-memory page faults"): whether the driver's and cuBLASLt's per-call cost
/// depends on what the process ran before, with the runtime out of the picture.
pub fn suite_rawstreams(_rt: &Runtime) {
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
        let mut extra = proc_per_run(before, after, 9);
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
