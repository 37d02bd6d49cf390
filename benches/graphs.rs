//! The graph forms of the tiny-op chain and of the 8-chain workload (`Runtime::capture`,
//! `runtime/src/runtime/graph/mod.rs`): the same work as `suite_chain` (harness.rs) and
//! `suite_streams` (streams.rs), captured once and launched again and again. The
//! capture (warm-up and instantiation) is not timed; each sample is one launch with a
//! fresh bound input, up to the host having every result.

use std::time::Instant;

use crate::bench_util::*;
use crate::streams::{chain_inputs, chain_weight, stacked_inputs, CHAIN_N};
use rtx::ops::elementwise as ew;
use rtx::ops::gemm::{linear, matmul, Activation};
use rtx::{DType, Runtime, Tensor};

/// 1,000 tiny dependent adds on one stream as one graph: µs per op per launch (launch
/// to the downloaded result), and the launching thread's µs per launch.
pub fn suite_chain_graph(_rt: &Runtime) {
    const N: usize = 1000;
    let rt = Runtime::builder().streams(4).build().expect("runtime");
    let s = rt.compute_streams(rt.device())[0];
    let a = upload(&rt, &random_f32(16, 4), &[16], DType::F32);
    let x0 = upload(&rt, &random_f32(16, 5), &[16], DType::F32);
    let mut graph = rt
        .capture(|g| {
            let mut x = g.input(&x0)?;
            for _ in 0..N {
                x = g.submit_on(s, ew::add(&x, &a))?;
            }
            g.output(&x)?;
            Ok(())
        })
        .expect("capture");
    let mut run = || {
        let t0 = Instant::now();
        let mut l = graph.launch(&[&x0]).expect("launch");
        let t1 = Instant::now();
        let v = l.to_vec::<f32>(0).expect("result");
        std::hint::black_box(v);
        (
            t0.elapsed().as_secs_f64() * 1e6 / N as f64,
            (t1 - t0).as_secs_f64() * 1e6,
        )
    };
    run();
    let (mut e2e, mut launch): (Vec<f64>, Vec<f64>) = (0..7).map(|_| run()).unzip();
    let e = median(&mut e2e);
    let extra = [("us_per_op", e), ("launch_us", median(&mut launch))];
    emit(
        "chain_1000_tiny_adds_graph",
        e * N as f64 / 1e3,
        0.0,
        0.0,
        &extra,
    );
}

/// The 8 chains × 200 steps of (GEMM 256³ bf16 + relu), chain c on stream c % k, as one
/// graph (one segment per stream: the chains are independent), in both forms of
/// `suite_streams`; wall time of one launch to all 8 results on the host.
pub fn suite_streams_graph(_rt: &Runtime) {
    let n = CHAIN_N;
    let scale = chain_weight(n);
    for fused in [false, true] {
        for k in [1usize, 2, 4, 8] {
            let rt = Runtime::builder().streams(k).build().expect("runtime");
            let streams = rt.compute_streams(rt.device());
            let (ws, x0) = chain_inputs(&rt, &scale, n);
            let mut graph = rt
                .capture(|g| {
                    let mut xs: Vec<Tensor> =
                        x0.iter().map(|x| g.input(x)).collect::<rtx::Result<_>>()?;
                    for _ in 0..200 {
                        for c in 0..8 {
                            let s = streams[c % k];
                            xs[c] = if fused {
                                g.submit_on(s, linear(&xs[c], &ws[c], None, Activation::Relu))?
                            } else {
                                let y = g.submit_on(s, matmul(&xs[c], &ws[c]))?;
                                g.submit_on(s, ew::relu_(y))?
                            };
                        }
                    }
                    for x in &xs {
                        g.output(x)?;
                    }
                    Ok(())
                })
                .expect("capture");
            let inputs: Vec<&Tensor> = x0.iter().collect();
            let mut device = Vec::new();
            let run = || {
                let t = Instant::now();
                // `launched`: the host's time to launch (the span waits for the work).
                let ((mut l, launched), span) = device_span(&rt, &streams[..k], || {
                    let l = graph.launch(&inputs).expect("launch");
                    (l, t.elapsed().as_secs_f64() * 1e3)
                });
                device.push(span);
                // The 8 outputs' copies and downloads in flight together.
                let outs: Vec<Tensor> = (0..8).map(|c| l.output(c).expect("output")).collect();
                download_all_bf16(&rt, &outs);
                (t.elapsed().as_secs_f64() * 1e3, launched)
            };
            let (ms, lo, hi, sub) = warm_then_time(run, 9);
            let extra = [
                ("min_ms", lo),
                ("max_ms", hi),
                ("launch_ms", sub),
                ("device_ms", median(&mut device[1..])),
                ("segments", graph.segments() as f64),
            ];
            let form = if fused { "linear_relu" } else { "gemm256_relu" };
            emit(
                &format!("streams_8x200_{form}_{k}_graph"),
                ms,
                0.0,
                8.0 * 200.0 * 2.0 * (n * n * n) as f64,
                &extra,
            );
        }
    }
}

/// The 8 chains as one stacked `linear` per step (`suite_streams_stacked`), the 200 ops
/// captured as one graph on one stream; wall time of one launch to the downloaded
/// result.
pub fn suite_streams_stacked_graph(_rt: &Runtime) {
    let n = CHAIN_N;
    let rt = Runtime::builder().streams(1).build().expect("runtime");
    let (w, x0) = stacked_inputs(&rt, &chain_weight(n), n);
    let mut graph = rt
        .capture(|g| {
            let mut x = g.input(&x0)?;
            for _ in 0..200 {
                x = g.submit(linear(&x, &w, None, Activation::Relu))?;
            }
            g.output(&x)?;
            Ok(())
        })
        .expect("capture");
    let s = rt.compute_streams(rt.device());
    let mut device = Vec::new();
    let run = || {
        let t = Instant::now();
        let ((mut l, launched), span) = device_span(&rt, &s[..1], || {
            let l = graph.launch(&[&x0]).expect("launch");
            (l, t.elapsed().as_secs_f64() * 1e3)
        });
        device.push(span);
        std::hint::black_box(l.to_vec::<rtx::bf16>(0).expect("chain"));
        (t.elapsed().as_secs_f64() * 1e3, launched)
    };
    let (ms, lo, hi, sub) = warm_then_time(run, 9);
    let extra = [
        ("min_ms", lo),
        ("max_ms", hi),
        ("launch_ms", sub),
        ("device_ms", median(&mut device[1..])),
    ];
    emit(
        "streams_8x200_stacked_linear_relu_1_graph",
        ms,
        0.0,
        8.0 * 200.0 * 2.0 * (n * n * n) as f64,
        &extra,
    );
}
