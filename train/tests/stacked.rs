//! The stacked ensemble ([`StackedMlp`]) on the CPU backend: its forward is each
//! member's forward, and `K` members trained stacked in one pipeline end where each
//! trained alone ends (losses and weights), eagerly and as a captured graph; on CUDA
//! too when a device is present (skipped without one; `RTX_REQUIRE_CUDA=1` makes that a
//! failure).

mod common;

use common::{host, rand_vec, rel_err, upload, values};
use rtx_ops::gemm::Activation;
use rtx_ops::optim::Sgd;
use rtx_runtime::{Error, Runtime, Tensor};
use rtx_train::init::derive_seed;
use rtx_train::pipeline::sweep::SweepConfig;
use rtx_train::pipeline::{run_concurrently, Classifier, OptimizerConfig, Pipeline};
use rtx_train::{Linear, Mlp, MlpConfig, Module, StackedMlp};

fn seed() -> u64 {
    std::env::var("RTX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

fn random(rt: &Runtime, seed: u64, dims: &[usize]) -> Tensor {
    upload(rt, &rand_vec(seed, dims.iter().product(), -1.0, 1.0), dims)
}

#[test]
fn the_stack_computes_what_each_member_computes() {
    rtx_ops::set_poison_outputs(true);
    let s = seed();
    let rt = Runtime::cpu(2);
    let k = 3;
    for act in [Activation::Gelu, Activation::Relu] {
        let cfg = MlpConfig::new(&[6, 10, 8, 4]).act(act);
        let stack = StackedMlp::new(&rt, &cfg, k, s).expect("stack");
        assert_eq!(stack.members(), k);
        // One batch for every member, and one batch per member.
        let x = random(&rt, s ^ 1, &[5, 6]);
        let xk = random(&rt, s ^ 2, &[k, 5, 6]);
        let (y, ctx) = stack.forward(&rt, &x).expect("forward");
        let (yk, _) = stack.forward(&rt, &xk).expect("forward per member");
        assert_eq!(y.dims(), &[k, 5, 4]);
        assert_eq!(ctx.inputs.len(), 3);
        let (y, yk) = (host(&y), host(&yk));
        for i in 0..k {
            let mut alone = Mlp::new(&rt, &cfg, derive_seed(s, i as u64)).expect("member");
            let mut got = stack.member(&rt, i).expect("member of the stack");
            assert_eq!(
                values(&mut got),
                values(&mut alone),
                "member {i}: the stack holds its weights (seed {s})"
            );
            let want = host(&alone.forward(&rt, &x).expect("alone").0);
            let e = rel_err(&y[i * 20..(i + 1) * 20], &want);
            assert!(
                e < 1e-5,
                "{act:?} member {i}: shared batch, rel {e:.2e} (seed {s})"
            );
            let xi = rt
                .run(rtx_ops::narrow(&xk, 0, i, 1))
                .and_then(|t| t.reshape([5, 6]))
                .expect("batch i");
            let want = host(&alone.forward(&rt, &xi).expect("alone").0);
            let e = rel_err(&yk[i * 20..(i + 1) * 20], &want);
            assert!(
                e < 1e-5,
                "{act:?} member {i}: own batch, rel {e:.2e} (seed {s})"
            );
        }
    }
}

/// A small sweep configuration (32-d inputs, batch 64, widths divided by 8).
fn small(steps: u64, graphs: bool) -> SweepConfig {
    SweepConfig {
        dim: 32,
        batch: 64,
        steps,
        width_div: 8,
        loss_every: 4,
        graphs,
        ..SweepConfig::cpu()
    }
}

fn losses(p: &Pipeline) -> Vec<f32> {
    p.losses().iter().map(|l| l.1).collect()
}

/// Trains `k` members stacked and each alone (12 steps, AdamW, or SGD with momentum
/// `sgd`: AdamW's update does not change with the gradient's scale, SGD's does);
/// returns the pipelines (stacked first).
fn stacked_and_alone(rt: &Runtime, k: usize, graphs: bool, sgd: bool) -> (Pipeline, Vec<Pipeline>) {
    let cfg = small(12, graphs);
    let (mut spec, _) = cfg.stacked_spec();
    if sgd {
        spec.opt = OptimizerConfig::Sgd(Sgd {
            lr: 0.05,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 1e-4,
        });
    }
    let task = cfg.task().generate(cfg.batch * 4, cfg.batch * 2);
    let s0 = rt.compute_streams(rt.device())[0];
    let seed = 31;
    let mut stacked = cfg
        .stacked_pipeline(rt, &spec, k, vec![s0], &task.train, seed)
        .expect("stacked");
    let mut alone: Vec<Pipeline> = (0..k)
        .map(|i| {
            cfg.pipeline(
                rt,
                &spec,
                vec![s0],
                &task.train,
                derive_seed(seed, i as u64),
            )
            .expect("alone")
        })
        .collect();
    run_concurrently(std::slice::from_mut(&mut stacked), &|_, _| {}).expect("run stacked");
    run_concurrently(&mut alone, &|_, _| {}).expect("run alone");
    // Accuracy over the members' rows is their mean accuracy (up to ties in argmax
    // between two nearly equal logits).
    let rs = stacked.report(&task.eval).expect("report");
    let mean_acc: f32 = alone
        .iter()
        .map(|p| p.report(&task.eval).expect("report").accuracy)
        .sum::<f32>()
        / k as f32;
    assert!(
        (rs.accuracy - mean_acc).abs() < 0.02,
        "stacked accuracy {} vs the members' mean {mean_acc}",
        rs.accuracy
    );
    (stacked, alone)
}

#[test]
fn members_trained_stacked_end_where_each_alone_ends() {
    let rt = Runtime::cpu(2);
    for sgd in [true, false] {
        members_end_alike(&rt, sgd, false, 1e-6);
    }
}

/// On CUDA the stack's batched GEMMs and the members' fused `linear_train` /
/// `linear_backward` are different kernels (f32, no TF32): equal within rounding.
#[test]
fn on_cuda_members_trained_stacked_end_where_each_alone_ends() {
    let Some(rt) = common::cuda() else {
        return;
    };
    for (sgd, graphs) in [(true, false), (false, false), (true, true)] {
        members_end_alike(&rt, sgd, graphs, 1e-4);
    }
}

fn members_end_alike(rt: &Runtime, sgd: bool, graphs: bool, tol: f64) {
    let k = 3;
    let (mut stacked, mut alone) = stacked_and_alone(rt, k, graphs, sgd);
    // The stack's loss is its members' mean loss, step for step.
    let ls = losses(&stacked);
    assert_eq!(ls.len(), 3, "a loss every 4 of 12 steps");
    for (j, l) in ls.iter().enumerate() {
        let mean: f32 = alone.iter().map(|p| losses(p)[j]).sum::<f32>() / k as f32;
        assert!(
            f64::from((l - mean).abs()) <= 100.0 * tol * f64::from(mean.abs().max(1.0)),
            "sgd {sgd}, read {j}: stacked {l} vs the members' mean {mean}"
        );
    }
    assert!(ls[2] < ls[0], "sgd {sgd}: it learns: {ls:?}");
    // And each member's weights after 12 AdamW steps are the weights it reaches alone.
    let w_stack = values(&mut ModelOf(stacked.model_mut()));
    for (i, p) in alone.iter_mut().enumerate() {
        let w_alone = values(&mut ModelOf(p.model_mut()));
        assert_eq!(w_stack.len(), w_alone.len());
        for (t, (ws, wa)) in w_stack.iter().zip(&w_alone).enumerate() {
            let n = wa.len();
            assert_eq!(ws.len(), n * k, "tensor {t}: [K, ..] of the member's");
            let e = rel_err(&ws[i * n..(i + 1) * n], wa);
            assert!(
                e < tol,
                "sgd {sgd}: member {i}, tensor {t}: relative weight error {e:.2e}"
            );
        }
    }
    let rate = stacked.samples_per_s();
    assert!(rate > 0.0, "samples/s counts every member's rows: {rate}");
}

#[test]
fn a_stacked_step_captured_as_a_graph_replays_like_eager() {
    let rt = Runtime::cpu(1);
    let (eager, _) = stacked_and_alone(&rt, 2, false, false);
    let (graph, _) = stacked_and_alone(&rt, 2, true, false);
    assert_eq!(losses(&graph), losses(&eager));
}

#[test]
fn stacks_that_cannot_be_built_are_refused() {
    let rt = Runtime::cpu(1);
    let cfg = MlpConfig::new(&[4, 8, 2]);
    assert!(matches!(
        StackedMlp::new(&rt, &cfg, 0, 1),
        Err(Error::InvalidOp { .. })
    ));
    let a = Mlp::new(&rt, &cfg, 1).expect("a");
    let b = Mlp::new(&rt, &MlpConfig::new(&[4, 6, 2]), 2).expect("b");
    let r = StackedMlp::from_mlps(&rt, &[a, b]);
    assert!(matches!(&r, Err(Error::InvalidOp { .. })), "{r:?}");
    let c = Mlp::new(&rt, &cfg.clone().act(Activation::Relu), 3).expect("c");
    let d = Mlp::new(&rt, &cfg, 4).expect("d");
    assert!(
        StackedMlp::from_mlps(&rt, &[d, c]).is_err(),
        "activations differ"
    );
    let stack = StackedMlp::new(&rt, &cfg, 2, 5).expect("stack");
    let x = rt.upload(&[0.0f32; 3 * 3 * 4], [3, 3, 4]).expect("x");
    assert!(
        matches!(stack.forward(&rt, &x), Err(Error::InvalidDim { .. })),
        "3 batches for 2 members"
    );
    assert!(stack.member(&rt, 2).is_err());
    let one = Linear::from_tensors(
        rt.upload(&[1.0f32; 8], [2, 4]).expect("w"),
        None,
        Activation::None,
    )
    .expect("layer");
    let lone = Mlp::from_layers(vec![one]).expect("mlp");
    let s = StackedMlp::from_mlps(&rt, &[lone]).expect("a stack of one");
    assert_eq!(s.members(), 1);
}

/// A pipeline's model as a [`Module`].
struct ModelOf<'a>(&'a mut dyn Classifier);

impl Module for ModelOf<'_> {
    fn parameters(&mut self) -> rtx_train::Parameters<'_> {
        self.0.params()
    }
}
