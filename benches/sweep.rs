//! The sweep benchmark: samples/s of the whole sweep (8 heterogeneous MLP training
//! pipelines at once on one runtime, `rtx_train::pipeline::sweep`) with 1, 2, 4 and 8
//! compute streams. The PyTorch side is `benches/torch_sweep.py` (same models, batch
//! and steps).
//!
//! ```text
//! cargo bench --bench sweep [-- STREAMS ...]      default: 1 2 4 8
//! ```
//!
//! One JSON line per stream count: `{"case": "sweep_rtx_streams4", "samples_per_s": ..,
//! "wall_s": .., "steps": .., "batch": ..}`. On CUDA it runs the full sweep (256-d, batch
//! 512, 200 steps, bf16 compute with f32 masters, AdamW/SGD fused steps); each batch is
//! uploaded on the copy stream double-buffered (PyTorch's forms keep the data on the
//! GPU). Each run follows a 10-step warm-up on the same runtime (kernel loads, library
//! handles, caches). On the CPU backend it runs the scaled-down CPU sweep, as `rtx` does.

use std::time::Instant;

use rtx::train::pipeline::run_concurrently;
use rtx::train::pipeline::sweep::SweepConfig;
use rtx::{BackendKind, Runtime};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let counts = if args.is_empty() {
        vec![1, 2, 4, 8]
    } else {
        args
    };
    for n in counts {
        let rt = Runtime::builder().streams(n).build().expect("runtime");
        let cfg = if rt.backend() == BackendKind::Cuda {
            SweepConfig::full()
        } else {
            SweepConfig::cpu()
        };
        let streams = rt.compute_streams(rt.device());
        let warm = SweepConfig {
            steps: 10,
            ..cfg.clone()
        };
        let (_, mut ps) = warm.build(&rt, &streams, 1, 8).expect("warm-up sweep");
        run_concurrently(&mut ps, &|_, _| {}).expect("warm-up");
        drop(ps);
        let (_, mut ps) = cfg.build(&rt, &streams, 1, 32).expect("sweep");
        let start = Instant::now();
        run_concurrently(&mut ps, &|_, _| {}).expect("sweep");
        let wall = start.elapsed().as_secs_f64();
        let samples: u64 = ps.iter().map(|p| p.steps_done() * cfg.batch as u64).sum();
        println!(
            "{{\"case\": \"sweep_rtx_streams{n}\", \"backend\": \"{:?}\", \"samples_per_s\": {:.1}, \"wall_s\": {wall:.4}, \"steps\": {}, \"batch\": {}}}",
            rt.backend(),
            samples as f64 / wall,
            cfg.steps,
            cfg.batch
        );
    }
}
