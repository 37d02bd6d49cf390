//! Independent chains of ops on several streams, joined at the end.
//!
//! ```sh
//! cargo run --example multi_stream
//! ```
//!
//! Each chain is pinned to a stream of its own with `submit_on`; the final join reads
//! the last tensor of every chain, so it waits for all of them (on CUDA through events
//! recorded on the producing streams, on the CPU backend through the tensors' ready
//! state). Without pinning, `submit` lets the placement policy choose the stream.

use std::time::Instant;

use rtx::ops::{self, Activation};
use rtx::{Runtime, Tensor};

const CHAINS: usize = 8;
const STEPS: usize = 50;
const N: usize = 64;

fn main() -> Result<(), rtx::Error> {
    let rt = Runtime::builder().streams(4).build()?;
    let streams = rt.compute_streams(rt.device());
    println!("{} compute streams on {}", streams.len(), rt.device());

    // A well-conditioned weight: the identity plus a little noise, so the chain neither
    // explodes nor vanishes over its steps.
    let w: Vec<f32> = (0..N * N)
        .map(|i| {
            let (r, c) = (i / N, i % N);
            let noise = ((i * 7919) % 101) as f32 / 101.0 - 0.5;
            if r == c {
                1.0
            } else {
                0.01 * noise
            }
        })
        .collect();
    let w = rt.upload(&w, [N, N])?;

    let start = Instant::now();
    let mut ends: Vec<Tensor> = Vec::with_capacity(CHAINS);
    for chain in 0..CHAINS {
        let stream = streams[chain % streams.len()];
        let x0: Vec<f32> = (0..N * N)
            .map(|i| ((i + chain) % 13) as f32 - 6.0)
            .collect();
        let mut x = rt.upload(&x0, [N, N])?;
        for _ in 0..STEPS {
            // relu(x · wᵀ), one fused op; the output handle feeds the next step at once.
            let step = rt.submit_on(stream, ops::linear(&x, &w, None, Activation::Relu))?;
            x = step.outputs().expect("one output").clone();
        }
        ends.push(x);
    }
    let submitted = start.elapsed();

    // Join: the sum of every chain's last tensor. `add` reads tensors produced on other
    // streams; the runtime orders it behind their producers.
    let mut acc = ends[0].clone();
    for t in &ends[1..] {
        acc = rt
            .submit(ops::add(&acc, t))?
            .outputs()
            .expect("one output")
            .clone();
    }
    let total: Vec<f32> = rt.to_vec(&rt.submit(ops::sum(&acc))?.wait()?)?.wait()?;
    println!(
        "{CHAINS} chains x {STEPS} steps of relu(x·wᵀ) ({N}x{N} f32): submitted in {:.2?}, \
         done in {:.2?}; sum of the results {:.6e}",
        submitted,
        start.elapsed(),
        total[0]
    );

    // Check one chain against a plain f64 loop on the host.
    let chain = 3;
    let got: Vec<f32> = rt.to_vec(&ends[chain])?.wait()?;
    let wv: Vec<f32> = rt.to_vec(&w)?.wait()?;
    let mut x: Vec<f64> = (0..N * N)
        .map(|i| (((i + chain) % 13) as f64) - 6.0)
        .collect();
    for _ in 0..STEPS {
        let mut y = vec![0.0f64; N * N];
        for r in 0..N {
            for c in 0..N {
                let dot: f64 = (0..N).map(|k| x[r * N + k] * wv[c * N + k] as f64).sum();
                y[r * N + c] = dot.max(0.0);
            }
        }
        x = y;
    }
    let err: f64 = got
        .iter()
        .zip(&x)
        .map(|(g, r)| (*g as f64 - r).powi(2))
        .sum::<f64>();
    let norm: f64 = x.iter().map(|r| r * r).sum::<f64>();
    let rel = (err / norm.max(f64::MIN_POSITIVE)).sqrt();
    println!("chain {chain} against an f64 reference: relative error {rel:.2e}");
    assert!(rel < 1e-4, "relative error {rel}");
    Ok(())
}
