//! Device memory of dropped tensors is kept by the stream actor that allocated it and
//! handed out again for the next allocation of its size. Runs only where a CUDA device
//! is present (required under `RTX_REQUIRE_CUDA=1`); one test in its own process, so no other test's allocations
//! or out-of-memory trims interleave with its readings of the device's free memory.

use std::time::Duration;

mod common;

use common::AllocF32;
use rtx::{Backend, Runtime};

#[test]
fn freed_memory_is_cached_and_reused() {
    if !common::cuda_present() {
        return;
    }
    let rt = Runtime::builder()
        .backend(Backend::Cuda(vec![0]))
        .streams(1)
        .build()
        .unwrap();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let free = || ctx.mem_get_info().unwrap().0 as i64;
    const MIB: i64 = 1 << 20;
    // 64 MiB of f32: the largest block the caches keep.
    let n = 16usize << 20;
    // The op's keep-alive goes back to its actor after completion: give it a moment.
    let settle = || std::thread::sleep(Duration::from_millis(200));
    // Under compute-sanitizer (`benches/gpu/run sanitize`) the device's free memory moves
    // with the sanitizer's own allocations and those of the processes sanitized beside
    // this one: only the cache counters are judged there.
    let sanitized = std::env::var_os("RTX_UNDER_SANITIZER").is_some();

    let f0 = free();
    drop(rt.submit(AllocF32(n)).unwrap().wait().unwrap());
    settle();
    let f1 = free();
    assert!(
        sanitized || f0 - f1 >= 60 * MIB,
        "the dropped tensor's 64 MiB stay with its stream: {} MiB",
        (f0 - f1) / MIB
    );
    let hits0 = rt.stats().block_cache.hits;
    let y = rt.submit(AllocF32(n)).unwrap().wait().unwrap();
    let hits1 = rt.stats().block_cache.hits;
    let f2 = free();
    assert!(
        hits1 > hits0,
        "the same size again is served from the cache"
    );
    assert!(
        sanitized || (f1 - f2).abs() < 16 * MIB,
        "reusing the cached block takes no new memory: {} MiB",
        (f1 - f2) / MIB
    );
    drop(y);
}
