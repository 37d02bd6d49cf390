//! Device memory of dropped tensors is kept by the stream actor that allocated it and
//! handed out again for the next allocation of its size, on that stream or, when
//! another stream is short of the size, on that one. Runs only where a CUDA device is
//! present (required under `RTX_REQUIRE_CUDA=1`); the tests run one at a time
//! ([`SERIAL`]) in a process of their own, so no other test's allocations or
//! out-of-memory trims interleave with their readings of the device's free memory.

use std::sync::Mutex;
use std::time::Duration;

mod common;

use common::AllocF32;
use rtx::{Backend, Runtime};

/// One test at a time: each reads the device's free memory or the cache counters.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn freed_memory_is_cached_and_reused() {
    if !common::cuda_present() {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
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

/// A stream with no cached block of a size takes the idle one another stream of the
/// device keeps instead of allocating (without this, each stream's pool kept its own
/// high-water mark and the device memory in use crept up whenever the ops' placement
/// shifted between streams); the block is that stream's from then on.
#[test]
fn a_stream_short_of_a_size_takes_an_idle_block_of_another_stream() {
    if !common::cuda_present() {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rt = Runtime::builder()
        .backend(Backend::Cuda(vec![0]))
        .streams(2)
        .build()
        .unwrap();
    let s = rt.compute_streams(rt.device());
    assert_eq!(s.len(), 2);
    // 4 MiB of f32, a size no other allocation of this runtime has.
    let n = (1usize << 20) + 128;
    let settle = || std::thread::sleep(Duration::from_millis(200));
    let cache = || rt.stats().block_cache;

    let x = rt.on(s[0]).submit(AllocF32(n)).unwrap().wait().unwrap();
    drop(x);
    settle();
    let c0 = cache();
    assert!(
        c0.bytes >= (n * 4) as u64,
        "stream 0 keeps the freed block: {c0:?}"
    );

    let y = rt.on(s[1]).submit(AllocF32(n)).unwrap().wait().unwrap();
    let c1 = cache();
    assert_eq!(
        c1.from_other_stream,
        c0.from_other_stream + 1,
        "stream 1 took stream 0's idle block: {c0:?} -> {c1:?}"
    );
    assert_eq!(
        c1.misses, c0.misses,
        "and allocated nothing: {c0:?} -> {c1:?}"
    );
    assert_eq!(c1.hits, c0.hits + 1);

    // The block is stream 1's now: freed, stream 1 keeps it and serves itself.
    drop(y);
    settle();
    let z = rt.on(s[1]).submit(AllocF32(n)).unwrap().wait().unwrap();
    let c2 = cache();
    assert_eq!(c2.hits, c1.hits + 1, "{c1:?} -> {c2:?}");
    assert_eq!(
        c2.from_other_stream, c1.from_other_stream,
        "{c1:?} -> {c2:?}"
    );
    assert_eq!(c2.misses, c1.misses, "{c1:?} -> {c2:?}");
    drop(z);
}
