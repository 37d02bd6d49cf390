//! Pipelines on the CPU backend: each learns on a fixed seed, data parallel equals the
//! single-stream step, and pipelines sharing a runtime give the same losses as each
//! alone.

use rtx_runtime::{Runtime, StreamId};
use rtx_train::pipeline::sweep::SweepConfig;
use rtx_train::pipeline::{run_concurrently, Pipeline};

/// A small sweep: 32-d inputs, batch 64, widths 16-256.
fn small(steps: u64) -> SweepConfig {
    SweepConfig {
        dim: 32,
        batch: 64,
        steps,
        width_div: 8,
        loss_every: 5,
        ..SweepConfig::cpu()
    }
}

fn losses(p: &Pipeline) -> Vec<f32> {
    p.losses().iter().map(|l| l.1).collect()
}

#[test]
fn every_sweep_pipeline_learns_on_a_fixed_seed() {
    let rt = Runtime::cpu(2);
    let cfg = SweepConfig {
        batch: 128,
        loss_every: 10,
        ..small(150)
    };
    let streams = rt.compute_streams(rt.device());
    let (task, mut ps) = cfg.build(&rt, &streams, 1, 16).expect("build");
    run_concurrently(&mut ps, &|_, _| {}).expect("run");
    // ln(10) = 2.30: the loss of a uniform guess over 10 classes.
    for p in &ps {
        let l = losses(p);
        assert_eq!(
            l.len(),
            15,
            "{}: a loss every 10 of 150 steps",
            p.config().name
        );
        let r = p.report(&task.eval).expect("report");
        assert!(
            l[0].is_finite() && r.final_loss < 0.9 * l[0] && r.final_loss < 2.1,
            "{}: losses {l:?}",
            r.name
        );
        // Chance is 10%.
        assert!(
            r.accuracy > 0.3 && f64::from(r.accuracy) <= task.teacher_accuracy + 0.05,
            "{}: accuracy {} (teacher {})",
            r.name,
            r.accuracy,
            task.teacher_accuracy
        );
    }
    assert!(task.teacher_accuracy > 0.9 && task.teacher_accuracy < 1.0);
}

#[test]
fn data_parallel_equals_the_single_stream_step() {
    let rt = Runtime::cpu(4);
    let cfg = small(12);
    let streams = rt.compute_streams(rt.device());
    let task = cfg.task().generate(cfg.batch * 4, cfg.batch);
    for m in [&cfg.models()[1], &cfg.models()[2]] {
        let seed = 9;
        let mut one = cfg
            .pipeline(&rt, m, vec![streams[0]], &task.train, seed)
            .expect("single");
        let mut dp = cfg
            .pipeline(&rt, m, streams.clone(), &task.train, seed)
            .expect("data parallel");
        run_concurrently(std::slice::from_mut(&mut one), &|_, _| {}).expect("run");
        run_concurrently(std::slice::from_mut(&mut dp), &|_, _| {}).expect("run");
        let (a, b) = (losses(&one), losses(&dp));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= 1e-4 * x.abs().max(1.0),
                "{}: {a:?} vs {b:?}",
                m.name
            );
        }
        // The weights after 12 steps agree too.
        let wa: Vec<f32> = weights(&rt, &mut one);
        let wb: Vec<f32> = weights(&rt, &mut dp);
        let num: f64 = wa
            .iter()
            .zip(&wb)
            .map(|(x, y)| f64::from(x - y).powi(2))
            .sum();
        let den: f64 = wa.iter().map(|x| f64::from(*x).powi(2)).sum();
        assert!(
            (num / den).sqrt() < 1e-4,
            "{}: relative weight error {}",
            m.name,
            (num / den).sqrt()
        );
    }
}

fn weights(rt: &Runtime, p: &mut Pipeline) -> Vec<f32> {
    let params = p.model_mut().params();
    params
        .iter()
        .flat_map(|q| {
            rt.to_vec::<f32>(q.value())
                .expect("download")
                .wait()
                .expect("wait")
        })
        .collect()
}

#[test]
fn pipelines_sharing_a_runtime_give_the_losses_of_each_alone() {
    let cfg = small(20);
    let together = {
        let rt = Runtime::cpu(2);
        let streams = rt.compute_streams(rt.device());
        let (_, mut ps) = cfg.build(&rt, &streams, 1, 8).expect("build");
        run_concurrently(&mut ps, &|_, _| {}).expect("run");
        ps.iter().map(losses).collect::<Vec<_>>()
    };
    let rt = Runtime::cpu(1);
    let s: Vec<StreamId> = rt.compute_streams(rt.device());
    let task = cfg.task().generate(cfg.batch * 8, cfg.batch * 4);
    for (i, m) in cfg.models().iter().enumerate() {
        let seed = rtx_train::init::derive_seed(cfg.seed, 100 + i as u64);
        let mut p = cfg
            .pipeline(&rt, m, s.clone(), &task.train, seed)
            .expect("alone");
        run_concurrently(std::slice::from_mut(&mut p), &|_, _| {}).expect("run");
        assert_eq!(losses(&p), together[i], "{}", m.name);
    }
}

#[test]
fn a_bf16_model_trains_with_f32_masters() {
    let rt = Runtime::cpu(1);
    let cfg = SweepConfig {
        dtype: rtx_runtime::DType::BF16,
        ..small(40)
    };
    let s = rt.compute_streams(rt.device());
    let task = cfg.task().generate(cfg.batch * 8, cfg.batch * 4);
    let m = &cfg.models()[0];
    let mut p = cfg.pipeline(&rt, m, s, &task.train, 5).expect("pipeline");
    run_concurrently(std::slice::from_mut(&mut p), &|_, _| {}).expect("run");
    let l = losses(&p);
    assert!(
        l.iter().all(|x| x.is_finite()) && l[l.len() - 1] < 0.95 * l[0],
        "{l:?}"
    );
}

#[test]
fn bad_configurations_are_refused() {
    let rt = Runtime::cpu(3);
    let cfg = small(5);
    let streams = rt.compute_streams(rt.device());
    let task = cfg.task().generate(cfg.batch * 2, cfg.batch);
    let m = &cfg.models()[0];
    // 64 rows do not split into 3 streams.
    let e = cfg
        .pipeline(&rt, m, streams.clone(), &task.train, 1)
        .unwrap_err();
    assert!(e.to_string().contains("split"), "{e}");
    let e = cfg.pipeline(&rt, m, vec![], &task.train, 1).unwrap_err();
    assert!(e.to_string().contains("stream"), "{e}");
    let other = Runtime::cpu(8);
    let far = other.compute_streams(other.device())[7];
    assert!(cfg.pipeline(&rt, m, vec![far], &task.train, 1).is_err());
}

#[test]
fn the_first_steps_agree_between_the_cpu_and_cuda() {
    let cuda = match Runtime::builder()
        .backend(rtx_runtime::Backend::Cuda(Vec::new()))
        .streams(2)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            assert!(
                std::env::var("RTX_REQUIRE_CUDA").as_deref() != Ok("1"),
                "RTX_REQUIRE_CUDA=1 but no CUDA runtime: {e}"
            );
            eprintln!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let cpu = Runtime::cpu(2);
    let cfg = SweepConfig {
        loss_every: 1,
        ..small(5)
    };
    let task = cfg.task().generate(cfg.batch * 8, cfg.batch * 4);
    for m in &cfg.models()[..4] {
        let run = |rt: &Runtime, streams: Vec<StreamId>| {
            let mut p = cfg
                .pipeline(rt, m, streams, &task.train, 3)
                .expect("pipeline");
            run_concurrently(std::slice::from_mut(&mut p), &|_, _| {}).expect("run");
            losses(&p)
        };
        let on_cpu = run(&cpu, cpu.compute_streams(cpu.device())[..1].to_vec());
        let on_cuda = run(&cuda, cuda.compute_streams(cuda.device())[..1].to_vec());
        // And data parallel on two CUDA streams.
        let on_cuda_dp = run(&cuda, cuda.compute_streams(cuda.device()));
        for (i, ((a, b), c)) in on_cpu.iter().zip(&on_cuda).zip(&on_cuda_dp).enumerate() {
            let tol = 2e-3 * a.abs().max(1.0);
            assert!(
                (a - b).abs() <= tol && (a - c).abs() <= tol,
                "{} step {i}: cpu {a}, cuda {b}, cuda data parallel {c}",
                m.name
            );
        }
    }
}

/// The sweep of `cfg` on a 2-stream CPU runtime, 8 batches per epoch, each pipeline
/// handed to `before` first; the pipelines after their run.
fn sweep_run(cfg: &SweepConfig, before: impl Fn(&mut Pipeline)) -> Vec<Pipeline> {
    let rt = Runtime::cpu(2);
    let streams = rt.compute_streams(rt.device());
    let (_, mut ps) = cfg.build(&rt, &streams, 1, 8).expect("build");
    ps.iter_mut().for_each(before);
    run_concurrently(&mut ps, &|_, _| {}).expect("run");
    ps
}

#[test]
fn resident_batches_give_the_losses_of_uploaded_ones() {
    // 20 steps over an epoch of 8 batches: from step 8 on the resident pipelines reuse
    // the batches kept on the device, and must see the same data (bitwise equal losses),
    // eagerly and as graphs.
    for graphs in [false, true] {
        let run = |resident: bool| {
            let cfg = SweepConfig {
                resident,
                graphs,
                ..small(20)
            };
            let ps = sweep_run(&cfg, |_| {});
            assert!(
                ps.iter().all(|p| p.losses().len() == 4),
                "a loss every 5 steps"
            );
            ps.iter().map(losses).collect::<Vec<_>>()
        };
        assert_eq!(run(true), run(false), "graphs: {graphs}");
    }
}

#[test]
fn batches_uploaded_further_ahead_give_the_same_losses() {
    // `PipelineConfig::prefetch`: 1 (double buffering), 3 (the sweep's) or more steps
    // than the run has; the steps read the same batches in the same order.
    for graphs in [false, true] {
        let run = |prefetch: usize| {
            let cfg = SweepConfig {
                prefetch,
                graphs,
                ..small(12)
            };
            sweep_run(&cfg, |_| {})
                .iter()
                .map(losses)
                .collect::<Vec<_>>()
        };
        let one = run(1);
        assert_eq!(run(3), one, "graphs: {graphs}");
        assert_eq!(run(40), one, "graphs: {graphs}");
    }
}

#[test]
fn preloaded_batches_give_the_losses_of_uploaded_ones() {
    // `Pipeline::preload` puts the whole epoch (8 batches) on the device before the
    // first step; the steps then see the same data as pipelines that upload as they go.
    for graphs in [false, true] {
        let run = |preload: bool| {
            let cfg = SweepConfig {
                resident: true,
                graphs,
                ..small(20)
            };
            let ps = sweep_run(&cfg, |p| {
                if preload {
                    assert_eq!(p.preload().expect("preload"), 8, "the epoch's batches");
                    assert_eq!(p.preload().expect("preload"), 0, "kept already");
                }
            });
            ps.iter().map(losses).collect::<Vec<_>>()
        };
        assert_eq!(run(true), run(false), "graphs: {graphs}");
    }
    // Without `resident` there is nothing to keep.
    let rt = Runtime::cpu(1);
    let streams = rt.compute_streams(rt.device());
    let (_, mut ps) = small(5).build(&rt, &streams, 1, 8).expect("build");
    assert_eq!(ps[0].preload().expect("preload"), 0);
}

#[test]
fn the_cnn_pipeline_learns_the_teacher_task() {
    let rt = Runtime::cpu(1);
    let cfg = SweepConfig {
        dim: 64,
        batch: 128,
        loss_every: 10,
        ..small(150)
    };
    let task = cfg.task().generate(cfg.batch * 16, cfg.batch * 4);
    let s = rt.compute_streams(rt.device());
    let mut p = cfg
        .cnn_pipeline(&rt, s, &task.train, 7)
        .expect("cnn pipeline");
    assert_eq!(p.config().name, "cnn-8x8");
    run_concurrently(std::slice::from_mut(&mut p), &|_, _| {}).expect("run");
    let l = losses(&p);
    let r = p.report(&task.eval).expect("report");
    assert!(
        r.final_loss < 0.8 * l[0] && r.accuracy > 0.3,
        "cnn: losses {l:?}, accuracy {}",
        r.accuracy
    );
    // Features that are not a square image are refused.
    let odd = SweepConfig { dim: 60, ..cfg };
    let t = odd.task().generate(odd.batch * 2, odd.batch);
    let s = rt.compute_streams(rt.device());
    assert!(odd.cnn_pipeline(&rt, s, &t.train, 1).is_err());
}
