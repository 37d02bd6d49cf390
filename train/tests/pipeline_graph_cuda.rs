//! Pipelines run as graphs on CUDA (skipped without a device; `RTX_REQUIRE_CUDA=1`
//! makes that a failure): for every model of the sweep (bf16 compute with f32 masters,
//! as the GPU sweep), the graph pipeline's losses equal the eager pipeline's (the same
//! kernels on the same data; expected bit-equal, checked within 1e-4 relative, and
//! counted), every state of the captured step is updated in place (no copies at the end
//! of a launch), and its trained weights come back into the model. `RTX_TEST_SHARD=i/n` runs
//! the models `i`, `i + n`, … only (the sanitizer runs split it over processes); under
//! `RTX_UNDER_SANITIZER` each pipeline takes 4 steps instead of 30 (the same kernels
//! and graphs, a few of the launches: racecheck's host memory grows with them, past the
//! GPU host's 128 GiB for the widest model at 10 steps), and whether it learned is not
//! judged.

mod common;

use rtx_runtime::{DType, StreamId};
use rtx_train::pipeline::sweep::SweepConfig;
use rtx_train::pipeline::{run_concurrently, Pipeline};

fn losses(p: &Pipeline) -> Vec<f32> {
    p.losses().iter().map(|l| l.1).collect()
}

#[test]
fn cuda_graph_pipelines_equal_eager_pipelines() {
    let Some(rt) = common::cuda() else {
        return;
    };
    let short = std::env::var_os("RTX_UNDER_SANITIZER").is_some();
    let cfg = SweepConfig {
        dim: 64,
        batch: 128,
        steps: if short { 4 } else { 30 },
        width_div: 4,
        loss_every: if short { 2 } else { 5 },
        dtype: DType::BF16,
        ..SweepConfig::full()
    };
    let gcfg = SweepConfig {
        graphs: true,
        ..cfg.clone()
    };
    let s: Vec<StreamId> = rt.compute_streams(rt.device())[..1].to_vec();
    let task = cfg.task().generate(cfg.batch * 4, cfg.batch * 2);
    let models = cfg.models();
    let indices: Vec<usize> = (0..models.len()).collect();
    let mine = common::shard(&indices);
    assert!(!mine.is_empty(), "no model in this shard");
    let mut bitwise = 0;
    for &i in &mine {
        let m = &models[i];
        let seed = 70 + i as u64;
        let mut eager = cfg.pipeline(&rt, m, s.clone(), &task.train, seed).unwrap();
        let mut graph = gcfg.pipeline(&rt, m, s.clone(), &task.train, seed).unwrap();
        run_concurrently(std::slice::from_mut(&mut eager), &|_, _| {}).expect("eager");
        run_concurrently(std::slice::from_mut(&mut graph), &|_, _| {}).expect("graph");
        let (a, b) = (losses(&eager), losses(&graph));
        assert_eq!(a.len() as u64, cfg.steps / cfg.loss_every, "{}", m.name);
        // Every state of the captured step (bf16 parameters, f32 masters, the
        // optimizer's moments, AdamW's counter) is rewritten in place by its update's
        // op: no copy at a launch's end.
        let g = graph.graph().expect("the graph pipeline captured its step");
        assert_eq!(
            g.in_place_states(),
            g.states().len(),
            "{}: states updated in place",
            m.name
        );
        for (x, y) in a.iter().zip(&b) {
            assert!(
                x.is_finite() && (x - y).abs() <= 1e-4 * x.abs().max(1.0),
                "{}: eager {a:?} vs graph {b:?}",
                m.name
            );
        }
        if a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()) {
            bitwise += 1;
        }
        if !short {
            assert!(a[a.len() - 1] < a[0], "{}: {a:?}", m.name);
        }
        let (ea, ga) = (
            eager.evaluate(&task.eval).unwrap(),
            graph.evaluate(&task.eval).unwrap(),
        );
        assert!(
            (ea.0 - ga.0).abs() <= 1e-3 * ea.0.abs().max(1.0),
            "{}: eval loss eager {} vs graph {}",
            m.name,
            ea.0,
            ga.0
        );
    }
    println!(
        "graph pipelines bit-equal to eager: {bitwise} of {} (models {mine:?})",
        mine.len()
    );
}
