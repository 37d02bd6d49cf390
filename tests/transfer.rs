//! Uploads and downloads go through pinned host blocks that each device's cache hands
//! out again (`runtime/src/cuda/pinned.rs`). These tests check that reuse never mixes up
//! data: many transfers of random data, of sizes that share and that do not share a
//! block size, back to back with no wait in between, each read back exactly. (That a
//! block with a copy still pending is not lent again is checked directly, with a stream
//! held back, by the unit test in `pinned.rs`.) Runs only
//! where a CUDA device is present (required under `RTX_REQUIRE_CUDA=1`); its own
//! process, so the cache counters move only with this file's transfers.

mod common;

use rtx::{bf16, Backend, Runtime};

fn random(n: usize, seed: u64) -> Vec<f32> {
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

#[test]
fn transfers_through_reused_pinned_blocks_keep_their_data() {
    if !common::cuda_present() {
        return;
    }
    let rt = Runtime::builder()
        .backend(Backend::Cuda(vec![0]))
        .streams(2)
        .build()
        .unwrap();
    // A zero-size upload is refused with a typed error, before any staging.
    let empty: &[f32] = &[];
    assert!(matches!(
        rt.upload(empty, vec![0]),
        Err(rtx::Error::InvalidOp { .. })
    ));
    // Sizes in elements: tiny, around the 4 KiB minimum block, a shared 128 KiB class
    // (32768 f32 and 20000 f32 both take a 128 KiB block), odd, and 8 MiB.
    let sizes = [1usize, 1023, 1024, 1025, 20_000, 32_768, 77_777, 2 << 20];
    for round in 0..3u64 {
        // Every upload of the round is submitted before any download is waited on, so
        // copies into and out of pinned blocks overlap with blocks being handed back.
        let hosts: Vec<Vec<f32>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| random(n, 100 * round + i as u64 + 1))
            .collect();
        let tensors: Vec<_> = hosts
            .iter()
            .zip(sizes)
            .map(|(h, n)| rt.upload(h, vec![n]).unwrap())
            .collect();
        let pending: Vec<_> = tensors
            .iter()
            .map(|t| rt.to_vec::<f32>(t).unwrap())
            .collect();
        for ((p, h), n) in pending.into_iter().zip(&hosts).zip(sizes) {
            let got = p.wait().unwrap();
            assert_eq!(got.len(), n);
            assert!(got == *h, "round {round}: {n} f32 read back differ");
        }
    }
    // A second dtype through the same blocks (bytes, not elements, pick the block).
    let h: Vec<bf16> = random(50_001, 7)
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let t = rt.upload(&h, vec![50_001]).unwrap();
    assert_eq!(rt.to_vec::<bf16>(&t).unwrap().wait().unwrap(), h);

    // A download hands its block back before its data is delivered, so sequential
    // downloads of one size reuse one block: each of these 10 is a cache hit.
    let hits0 = rt.stats().pinned_cache.hits;
    for _ in 0..10 {
        assert_eq!(rt.to_vec::<bf16>(&t).unwrap().wait().unwrap(), h);
    }
    let (hits1, misses1) = (rt.stats().pinned_cache.hits, rt.stats().pinned_cache.misses);
    assert!(
        hits1 - hits0 >= 10,
        "10 downloads of one size reuse the pinned block: {} hits ({misses1} misses in all)",
        hits1 - hits0
    );
}
