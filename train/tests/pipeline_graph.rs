//! Pipelines run as graphs (`PipelineConfig::graph`) on the CPU backend, where a graph
//! replays its recorded ops: the same ops in the same order as the eager step, so the
//! losses and the trained weights are bit-equal to the eager pipeline's on a fixed seed
//! (for every model of the sweep: SGD, SGD with momentum and AdamW, whose step counter
//! is a graph state); several graph pipelines share a runtime; a step that reads back
//! to the host inside the graph is the typed capture error; a data-parallel graph
//! pipeline is refused.

use rtx_ops::optim::AdamW;
use rtx_runtime::{CaptureHazard, DType, Error, Runtime, StreamId, Tensor};
use rtx_train::pipeline::sweep::SweepConfig;
use rtx_train::pipeline::{
    run_concurrently, Batches, Classifier, OptimizerConfig, Pipeline, PipelineConfig,
};
use rtx_train::{Mlp, MlpConfig, Parameters};

fn small(steps: u64) -> SweepConfig {
    SweepConfig {
        dim: 32,
        batch: 64,
        steps,
        width_div: 8,
        loss_every: 3,
        ..SweepConfig::cpu()
    }
}

fn losses(p: &Pipeline) -> Vec<u32> {
    p.losses().iter().map(|l| l.1.to_bits()).collect()
}

fn weights(p: &mut Pipeline) -> Vec<u32> {
    p.model_mut()
        .params()
        .iter()
        .flat_map(|q| match q.value().dtype() {
            DType::BF16 => q
                .value()
                .to_vec::<rtx_runtime::bf16>()
                .expect("download")
                .into_iter()
                .map(|x| u32::from(x.to_bits()))
                .collect::<Vec<_>>(),
            _ => q
                .value()
                .to_vec::<f32>()
                .expect("download")
                .into_iter()
                .map(f32::to_bits)
                .collect(),
        })
        .collect()
}

fn run(p: &mut Pipeline) {
    run_concurrently(std::slice::from_mut(p), &|_, _| {}).expect("run");
}

#[test]
fn graph_pipelines_equal_eager_pipelines_bitwise() {
    let rt = Runtime::cpu(1);
    let s: Vec<StreamId> = rt.compute_streams(rt.device());
    for dtype in [DType::F32, DType::BF16] {
        let cfg = SweepConfig { dtype, ..small(10) };
        let gcfg = SweepConfig {
            graphs: true,
            ..cfg.clone()
        };
        let task = cfg.task().generate(cfg.batch * 4, cfg.batch);
        for (i, m) in cfg.models().iter().enumerate() {
            let seed = 40 + i as u64;
            let mut eager = cfg.pipeline(&rt, m, s.clone(), &task.train, seed).unwrap();
            let mut graph = gcfg.pipeline(&rt, m, s.clone(), &task.train, seed).unwrap();
            run(&mut eager);
            run(&mut graph);
            let (a, b) = (losses(&eager), losses(&graph));
            assert_eq!(
                a.len(),
                4,
                "{}: a loss every 3 of 10 steps and the last",
                m.name
            );
            assert_eq!(a, b, "{} {dtype:?}: losses differ", m.name);
            assert!(p_finite(&eager), "{}", m.name);
            // The graph's states came back into the model and the optimizer.
            assert_eq!(
                weights(&mut eager),
                weights(&mut graph),
                "{} {dtype:?}",
                m.name
            );
            assert_eq!(graph.optimizer().steps(), 10, "{}", m.name);
            let (ea, ga) = (
                eager.evaluate(&task.eval).unwrap(),
                graph.evaluate(&task.eval).unwrap(),
            );
            assert_eq!(ea.0.to_bits(), ga.0.to_bits(), "{}: eval loss", m.name);
        }
    }
}

fn p_finite(p: &Pipeline) -> bool {
    p.losses().iter().all(|l| l.1.is_finite() && l.1 > 0.0)
}

#[test]
fn graph_pipelines_share_a_runtime_and_learn() {
    let cfg = SweepConfig {
        graphs: true,
        loss_every: 10,
        ..small(60)
    };
    let rt = Runtime::cpu(2);
    let streams = rt.compute_streams(rt.device());
    let (_, mut ps) = cfg.build(&rt, &streams, 1, 8).expect("build");
    run_concurrently(&mut ps, &|_, _| {}).expect("run");
    let together: Vec<Vec<u32>> = ps.iter().map(losses).collect();
    // Each alone, eager, on its own runtime: the same losses.
    let rt1 = Runtime::cpu(1);
    let s: Vec<StreamId> = rt1.compute_streams(rt1.device());
    let eager = SweepConfig {
        graphs: false,
        ..cfg.clone()
    };
    let task = cfg.task().generate(cfg.batch * 8, cfg.batch * 4);
    for (i, m) in cfg.models().iter().enumerate() {
        let seed = rtx_train::init::derive_seed(cfg.seed, 100 + i as u64);
        let mut p = eager
            .pipeline(&rt1, m, s.clone(), &task.train, seed)
            .unwrap();
        run(&mut p);
        assert_eq!(losses(&p), together[i], "{}", m.name);
        let l: Vec<f32> = p.losses().iter().map(|l| l.1).collect();
        assert!(l[5] < l[0], "{}: {l:?}", m.name);
    }
}

/// An MLP whose step downloads its loss inside the step: not capturable.
struct Peeking(Mlp);

impl Classifier for Peeking {
    fn logits(&self, rt: &Runtime, x: &Tensor) -> rtx_runtime::Result<Tensor> {
        self.0.logits(rt, x)
    }
    fn loss_backward(
        &mut self,
        rt: &Runtime,
        x: &Tensor,
        y: &Tensor,
        scale: f32,
    ) -> rtx_runtime::Result<Tensor> {
        let loss = self.0.loss_backward(rt, x, y, scale)?;
        let _peek = rt.to_vec::<f32>(&loss)?; // a read-back inside the step
        Ok(loss)
    }
    fn params(&mut self) -> Parameters<'_> {
        self.0.params()
    }
}

#[test]
fn a_step_that_reads_back_is_the_typed_capture_error() {
    let rt = Runtime::cpu(2);
    let cfg = small(4);
    let task = cfg.task().generate(cfg.batch * 2, cfg.batch);
    let streams = rt.compute_streams(rt.device());
    let r0 = rt.on(streams[0]);
    let make = |graph: bool, streams: Vec<StreamId>| {
        let mlp = Mlp::new(&r0, &MlpConfig::new(&[cfg.dim, 16, cfg.classes]), 5).unwrap();
        let data = Batches::new(task.train.clone(), cfg.batch).unwrap();
        let pc = PipelineConfig {
            name: "peeking".into(),
            steps: 4,
            loss_every: 2,
            streams,
            graph,
            resident: false,
            prefetch: 1,
        };
        let opt = OptimizerConfig::AdamW(AdamW::default());
        Pipeline::new(&rt, pc, Box::new(Peeking(mlp)), opt, Box::new(data))
    };
    let mut p = make(true, vec![streams[0]]).unwrap();
    match p.step() {
        Err(Error::NotCapturable { op, hazard }) => {
            assert_eq!(hazard, CaptureHazard::Readback, "{op}");
        }
        other => panic!("wanted NotCapturable, got {other:?}"),
    }
    // The model got its own weights back: it still trains eagerly on the same runtime.
    let mut eager = make(false, vec![streams[0]]).unwrap();
    run(&mut eager);
    assert!(p_finite(&eager));
    // A data-parallel pipeline cannot run as a graph.
    match make(true, streams.clone()) {
        Err(Error::InvalidOp { message, .. }) => assert!(message.contains("one stream")),
        other => panic!("wanted an invalid-op error, got {:?}", other.err()),
    }
}
