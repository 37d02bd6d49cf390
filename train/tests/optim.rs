//! `rtx_train::AdamW` over a layer's parameters: three steps against a scalar f64
//! reference written from the formulas (as `torch.optim.AdamW`), updates in place by
//! donation, and a rejected step that leaves the parameters as they were.

use rtx_ops::optim::AdamW as Cfg;
use rtx_runtime::{Error, Runtime};
use rtx_train::{AdamW, Linear, LinearConfig, Module};

fn host(t: &rtx_runtime::Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

#[test]
fn adamw_steps_match_the_formulas_in_place() {
    let rt = Runtime::cpu(1);
    let seed: u64 = rand::random();
    let mut layer = Linear::new(&rt, LinearConfig::new(5, 3), seed).unwrap();
    let cfg = Cfg {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = AdamW::new(cfg);
    let mut p64: Vec<Vec<f64>> = layer.parameters().iter().map(|p| host(p.value())).collect();
    let mut m64: Vec<Vec<f64>> = p64.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut v64 = m64.clone();
    let xs: Vec<f32> = (0..4 * 5)
        .map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0)
        .collect();
    let x = rt.upload(&xs, [4, 5]).unwrap();
    for t in 1..=3u64 {
        let (y, ctx) = layer.forward(&rt, &x).unwrap();
        let dy = rt.run(rtx_ops::add(&y, &y)).unwrap(); // d(Σ y²)/dy
        layer.backward(&rt, &dy, &ctx).unwrap();
        drop(ctx);
        let grads: Vec<Vec<f64>> = layer
            .parameters()
            .iter()
            .map(|p| host(p.grad().unwrap()))
            .collect();
        let before = rtx_ops::donations();
        opt.step(&rt, layer.parameters()).unwrap();
        let (b1, b2) = (cfg.beta1 as f64, cfg.beta2 as f64);
        for k in 0..p64.len() {
            for i in 0..p64[k].len() {
                let g = grads[k][i];
                let p = &mut p64[k][i];
                *p *= 1.0 - cfg.lr as f64 * cfg.weight_decay as f64;
                m64[k][i] = b1 * m64[k][i] + (1.0 - b1) * g;
                v64[k][i] = b2 * v64[k][i] + (1.0 - b2) * g * g;
                let mh = m64[k][i] / (1.0 - b1.powi(t as i32));
                let vh = v64[k][i] / (1.0 - b2.powi(t as i32));
                *p -= cfg.lr as f64 * mh / (vh.sqrt() + cfg.eps as f64);
            }
        }
        for (k, p) in layer.parameters().iter().enumerate() {
            let got = host(p.value());
            let err = got
                .iter()
                .zip(&p64[k])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                err < 1e-6,
                "step {t} {}: max error {err:e} (seed {seed})",
                p.name()
            );
        }
        // Counted when the step runs, which the downloads above waited for.
        let donated = rtx_ops::donations() - before;
        assert!(donated >= 2, "step {t}: {donated} in-place updates");
    }
    assert_eq!(opt.steps(), 3);
}

#[test]
fn a_rejected_step_keeps_the_parameters() {
    let rt = Runtime::cpu(1);
    let mut layer = Linear::new(&rt, LinearConfig::new(3, 2), 5).unwrap();
    let mut opt = AdamW::new(Cfg::default());
    // No gradients yet: a typed error, parameters untouched.
    let before: Vec<Vec<f64>> = layer.parameters().iter().map(|p| host(p.value())).collect();
    let e = opt.step(&rt, layer.parameters()).unwrap_err();
    assert!(matches!(e, Error::InvalidOp { .. }), "{e:?}");
    // A bad hyperparameter is rejected at submit, and the values come back.
    let x = rt.upload(&[0.5f32, -1.0, 2.0], [1, 3]).unwrap();
    let (y, ctx) = layer.forward(&rt, &x).unwrap();
    layer.backward(&rt, &y, &ctx).unwrap();
    let mut bad = AdamW::new(Cfg {
        lr: -1.0,
        ..Cfg::default()
    });
    assert!(bad.step(&rt, layer.parameters()).is_err());
    let after: Vec<Vec<f64>> = layer.parameters().iter().map(|p| host(p.value())).collect();
    assert_eq!(before, after);
    assert_eq!(bad.steps(), 0);
}
