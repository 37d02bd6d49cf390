//! Stress: random DAGs over every op family on 8 streams with a mailbox of 2, submitted
//! at once by blocking threads and by tokio tasks (`submit_async`), each DAG's every
//! value compared with the same DAG on a 1-stream runtime; afterwards the process's
//! threads, the host RSS (within 64 MiB) and on CUDA the device's free memory are back
//! at their baseline once the runtimes drop. Runs on the CPU backend, and on CUDA when a device is present.
//!
//! `RTX_STRESS_OPS=N` sets the ops per backend (default 20,000: well under a minute on
//! 2 cores); `RTX_STRESS_SEED=S` replays a run (the seed is printed). One test in its
//! own process, so no other test's threads move the thread count.
//!
//! Device memory: the check compares the device's free memory before the runtimes are
//! built (after a warm-up of every family) with after they dropped, and must stay
//! within 64 MiB. Memory the CUDA driver and the libraries keep for the process, not
//! rtx, counts against it: with the driver's lazy module loading (its default), a
//! kernel's module is loaded into the context on its first launch, so first uses of
//! new shapes during the run (cuBLASLt and cuDNN kernels the warm-up did not reach) grow
//! the context. To tell that apart from memory rtx keeps, run with the driver's eager
//! loading, which loads every module of a library when the library loads:
//!
//! ```sh
//! CUDA_MODULE_LOADING=EAGER cargo test --test stress -- --nocapture
//! RTX_STRESS_EAGER=1 cargo test --test stress -- --nocapture   # the same, set by the test
//! ```
//!
//! `CUDA_MODULE_LOADING` is read by the driver once, at `cuInit`; `RTX_STRESS_EAGER=1`
//! sets it to `EAGER` at the start of the test, before anything in the process calls
//! the driver (unless it is set already). The test prints the loading mode the driver
//! reports (`cuModuleGetLoadingMode`) and a breakdown of the device memory: free
//! before, while the runtimes live, after they dropped, and rtx's own caches (block
//! cache and pinned host cache bytes from `Runtime::stats`) at the end of the run.
//! Under compute-sanitizer (`RTX_UNDER_SANITIZER`, set by `benches/gpu/run sanitize`)
//! the device-memory check is skipped: the sanitizer keeps device memory of its own.

mod common;
#[path = "stress/dag.rs"]
mod dag;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dag::{Dag, Mode};
use rtx::{Backend, Runtime};

/// Figures of one run.
#[derive(Default)]
struct Tally {
    dags: usize,
    ops: usize,
    nodes: usize,
    bitwise: usize,
    max_rel: f64,
    per_family: [usize; dag::FAMILIES],
}

/// Both runtimes plan their small GEMMs for the same share of the device (what the
/// 8-stream runtime takes by default, `Builder::gemm_sm_share`): a different share can
/// pick another cuBLASLt algorithm, whose rounding differs, and the check is bitwise.
fn build(backend: &Backend, streams: usize, mailbox: usize) -> Runtime {
    Runtime::builder()
        .backend(backend.clone())
        .streams(streams)
        .mailbox(mailbox)
        .gemm_sm_share(8)
        .build()
        .unwrap()
}

/// One DAG on both runtimes, compared node by node.
async fn check(
    one: &Runtime,
    eight: &Runtime,
    d: &Dag,
    mode: Mode,
    tol: f64,
    tally: &Mutex<Tally>,
) {
    let got = dag::run(eight, d, mode).await;
    let want = dag::run(one, d, mode).await;
    let mut t = tally.lock().unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (rel, bits) = dag::compare(g, w);
        let fam = dag::FAMILY[d.nodes[i].kind as usize];
        assert!(
            rel <= tol,
            "DAG seed {}: node {i} ({fam}) differs from the 1-stream run: {rel:e}\n{:?}",
            d.seed,
            d.nodes
        );
        t.bitwise += bits as usize;
        t.max_rel = t.max_rel.max(rel);
        t.per_family[d.nodes[i].kind as usize] += 1;
    }
    t.nodes += got.len();
    t.dags += 1;
    t.ops += d.ops();
}

fn stress(label: &str, backend: Backend, ops: usize, tol: f64) {
    let seed = dag::seed();
    // DAGs of 8 to 40 nodes until the op budget is spent.
    let mut dags = Vec::new();
    let mut planned = 0;
    let mut i = 0u64;
    while planned < ops {
        let n = 8 + (seed.wrapping_add(i) % 33) as usize;
        let d = Dag::random(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15), n);
        planned += d.ops();
        dags.push(d);
        i += 1;
    }
    dag::warm_up(&backend);
    let free0 = device_free(&backend);
    let lmem0 = local_memory(&backend);
    let threads0 = dag::threads();
    let rss0 = dag::rss_kib();

    let dags = Arc::new(dags);
    let next = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));

    let t0 = Instant::now();
    let one = build(&backend, 1, 4);
    let eight = build(&backend, 8, 2);
    let threads_live;
    {
        // Four blocking submitter threads...
        let mut handles = Vec::new();
        for _ in 0..4 {
            let (one, eight) = (one.clone(), eight.clone());
            let (dags, next, tally) = (dags.clone(), next.clone(), tally.clone());
            handles.push(std::thread::spawn(move || loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(d) = dags.get(k) else { break };
                rtx::block_on(check(&one, &eight, d, Mode::Blocking, tol, &tally));
            }));
        }
        // ...and six tokio tasks on a 2-worker multi-thread executor, all at once.
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        tokio.block_on(async {
            let tasks: Vec<_> = (0..6)
                .map(|_| {
                    let (one, eight) = (one.clone(), eight.clone());
                    let (dags, next, tally) = (dags.clone(), next.clone(), tally.clone());
                    tokio::spawn(async move {
                        loop {
                            let k = next.fetch_add(1, Ordering::Relaxed);
                            let Some(d) = dags.get(k) else { break };
                            check(&one, &eight, d, Mode::Async, tol, &tally).await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        for h in handles {
            h.join().unwrap();
        }
        threads_live = dag::threads();
        drop(tokio);
    }
    let wall = t0.elapsed();
    let stats = eight.stats();
    let stats_one = one.stats();
    let free_live = device_free(&backend);
    drop(one);
    drop(eight);
    let threads1 = dag::settle_threads(threads0);
    let rss1 = dag::rss_kib();
    let free1 = device_free(&backend);
    let lmem1 = local_memory(&backend);
    // The DAGs' own data (made before the baseline) lives until after the readings.
    drop(dags);

    let t = tally.lock().unwrap();
    eprintln!(
        "stress {label}: seed {seed}: {} ops in {} DAGs ({} values, {} bitwise equal to the \
         1-stream run, max relative error {:.1e}) on 8 streams (mailbox 2) from 4 threads + 6 \
         tokio tasks, checked against 1 stream: {:.2} s (both runtimes)",
        t.ops,
        t.dags,
        t.nodes,
        t.bitwise,
        t.max_rel,
        wall.as_secs_f64()
    );
    let fams: Vec<String> = dag::FAMILY
        .iter()
        .zip(t.per_family)
        .map(|(f, n)| format!("{f} {n}"))
        .collect();
    eprintln!("stress {label}: nodes per family: {}", fams.join(", "));
    eprintln!(
        "stress {label}: threads {threads0} before, {threads_live} with the runtimes and \
         tokio, {threads1} after; RSS {} -> {} MiB; block cache {:?}, pinned cache {:?}",
        rss0 / 1024,
        rss1 / 1024,
        stats.block_cache,
        stats.pinned_cache
    );
    assert_eq!(t.ops, planned, "every DAG ran");
    assert!(
        t.per_family.iter().all(|&n| n > 0),
        "every family ran: {fams:?}"
    );
    assert!(
        threads1 <= threads0,
        "{label}: threads back at baseline after the runtimes drop: {threads0} -> {threads1}: {:?}",
        dag::thread_names()
    );
    // Host memory: what the runtimes and their ops held is freed (allocator slack aside).
    // compute-sanitizer keeps host memory of its own per launch (73 MiB in one run).
    let sanitized = std::env::var_os("RTX_UNDER_SANITIZER").is_some();
    assert!(
        sanitized || rss1 < rss0 + (64 << 10),
        "{label}: host RSS {} MiB -> {} MiB after the runtimes drop",
        rss0 / 1024,
        rss1 / 1024
    );
    if let (Some(f0), Some(f1)) = (free0, free1) {
        let mib = |b: i64| b / (1 << 20);
        let live = free_live.unwrap_or(f1);
        let cached = stats.block_cache.bytes + stats_one.block_cache.bytes;
        let pinned = stats.pinned_cache.bytes + stats_one.pinned_cache.bytes;
        let breakdown = format!(
            "module loading {}; device free {} MiB before, {} MiB with the runtimes live \
             ({} MiB in use by them), {} MiB after they dropped; rtx's caches at the end of \
             the run: block cache {} bytes (device), pinned cache {} bytes (host); \
             {} MiB not back after the drop",
            module_loading(),
            mib(f0),
            mib(live),
            mib(f0 - live),
            mib(f1),
            cached,
            pinned,
            mib(f0 - f1)
        );
        // The driver's local-memory (stack) reservation: it grows to the largest stack a
        // launched kernel needed (cuBLAS / cuDNN kernels that spill) and is kept for the
        // context's life, a driver cache like the loaded modules, not memory of rtx's.
        let (l0, l1) = (lmem0.unwrap_or(0), lmem1.unwrap_or(0));
        let grown = (l1 - l0).max(0);
        let breakdown = format!(
            "{breakdown}; the driver's local-memory reservation {} -> {} MiB (stack {} -> {} \
             bytes per thread), {} MiB of the rest",
            mib(l0),
            mib(l1),
            lmem_stack(l0),
            lmem_stack(l1),
            mib(f0 - f1 - grown)
        );
        eprintln!("stress {label}: {breakdown}");
        if std::env::var_os("RTX_UNDER_SANITIZER").is_some() {
            // compute-sanitizer keeps device memory of its own per launch and module.
            eprintln!("stress {label}: under the sanitizer: device memory not checked");
            return;
        }
        assert!(
            f0 - f1 - grown < 64 << 20,
            "{label}: device memory back at baseline (pools trimmed, caches freed, the \
             driver's local-memory reservation accounted for): {} MiB still in use; {breakdown}",
            mib(f0 - f1 - grown)
        );
    }
}

/// The device's free memory (CUDA only), as the driver reports it.
fn device_free(backend: &Backend) -> Option<i64> {
    match backend {
        Backend::Cuda(_) => {
            let ctx = cudarc::driver::CudaContext::new(0).ok()?;
            ctx.mem_get_info().ok().map(|(free, _)| free as i64)
        }
        _ => None,
    }
}

/// Threads the local-memory reservation is made for: SMs x resident threads per SM.
fn lmem_threads() -> i64 {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let Ok(ctx) = cudarc::driver::CudaContext::new(0) else {
        return 0;
    };
    let sms = ctx
        .attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .unwrap_or(0);
    let per = ctx
        .attribute(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
        .unwrap_or(0);
    sms as i64 * per as i64
}

/// The per-thread stack of a reservation of `bytes`.
fn lmem_stack(bytes: i64) -> i64 {
    bytes / lmem_threads().max(1)
}

/// The device memory the driver reserves for local memory (CUDA only): the context's
/// stack size per thread (`cuCtxGetLimit`, which grows when a kernel needs more) times
/// the threads that can be resident.
fn local_memory(backend: &Backend) -> Option<i64> {
    use cudarc::driver::sys;
    let Backend::Cuda(_) = backend else {
        return None;
    };
    let ctx = cudarc::driver::CudaContext::new(0).ok()?;
    ctx.bind_to_thread().ok()?;
    let mut stack: usize = 0;
    // SAFETY: `stack` is a valid out-pointer; the context is current on this thread.
    let r = unsafe { sys::cuCtxGetLimit(&mut stack, sys::CUlimit::CU_LIMIT_STACK_SIZE) };
    (r == sys::CUresult::CUDA_SUCCESS).then(|| stack as i64 * lmem_threads())
}

/// The driver's module loading mode (`cuModuleGetLoadingMode`), as a word.
fn module_loading() -> String {
    use cudarc::driver::sys;
    let mut mode = sys::CUmoduleLoadingMode::CU_MODULE_LAZY_LOADING;
    // SAFETY: `mode` is a valid out-pointer; the call only reads the driver's setting
    // (cuInit has run: the runtimes were built). A driver without the entry point
    // makes the loader panic, caught here.
    let r = std::panic::catch_unwind(move || {
        let r = unsafe { sys::cuModuleGetLoadingMode(&mut mode) };
        (r, mode)
    });
    match r {
        Ok((sys::CUresult::CUDA_SUCCESS, sys::CUmoduleLoadingMode::CU_MODULE_EAGER_LOADING)) => {
            "EAGER".into()
        }
        Ok((sys::CUresult::CUDA_SUCCESS, _)) => "LAZY".into(),
        Ok((e, _)) => format!("unknown ({e:?})"),
        Err(_) => "unknown (no cuModuleGetLoadingMode)".into(),
    }
}

/// `RTX_STRESS_EAGER=1`: the driver's eager module loading for this process (see the
/// module docs); must run before anything calls the driver.
fn eager_module_loading_if_asked() {
    let asked = std::env::var("RTX_STRESS_EAGER").is_ok_and(|v| v == "1");
    if asked && std::env::var_os("CUDA_MODULE_LOADING").is_none() {
        // The test is the only one in its process and runs this first, before any
        // thread of its own or any driver call.
        std::env::set_var("CUDA_MODULE_LOADING", "EAGER");
    }
}

fn ops_budget() -> usize {
    std::env::var("RTX_STRESS_OPS")
        .ok()
        .and_then(|s| s.replace('_', "").parse().ok())
        .unwrap_or(20_000)
}

#[test]
fn random_dags_of_every_family_on_8_streams_equal_1_stream_and_leak_nothing() {
    eager_module_loading_if_asked();
    stress("cpu", Backend::Cpu, ops_budget(), 1e-5);
    if common::cuda_present() {
        // Other cuDNN engines per stream and f16 rounding flips: equal by the norm.
        stress("cuda", Backend::Cuda(vec![0]), ops_budget(), 5e-3);
    }
}
