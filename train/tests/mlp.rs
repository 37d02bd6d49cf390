//! The training layers: the MLP's gradients (every parameter and the input) against
//! central finite differences in f64 of the loss `L = Σ y²`, which the test computes
//! with existing ops (`mul`, `sum`; `dL/dy = y + y` with `add`); CUDA against the CPU
//! when a device is present; the parameter list an optimizer takes, in-place updates by
//! donation, and seeded initialization.
//!
//! Tolerance: the layers compute in f32; the finite differences (h = 1e-4 on values of
//! order 1, truncation about 1e-8) in f64 on the host from the same parameter values:
//! 1e-4 relative by the norm.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rtx_ops::gemm::Activation;
use rtx_runtime::{Backend, DType, Error, Runtime, Tensor};
use rtx_train::{init, Linear, LinearConfig, Mlp, MlpConfig, Module};

fn host(rt: &Runtime, t: &Tensor) -> Vec<f64> {
    let v = rt
        .to_vec::<f32>(t)
        .expect("to_vec")
        .wait()
        .expect("download");
    v.into_iter().map(f64::from).collect()
}

fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    if got.iter().any(|v| v.is_nan()) {
        return f64::NAN;
    }
    (num / den.max(1e-300)).sqrt()
}

fn act64(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::Gelu => {
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh();
            0.5 * x * (1.0 + t)
        }
    }
}

/// One layer on the host: w `[out, in]`, b, act, in, out.
type HostLayer = (Vec<f64>, Option<Vec<f64>>, Activation, usize, usize);

/// The MLP on the host in f64.
struct HostMlp {
    layers: Vec<HostLayer>,
}

impl HostMlp {
    fn of(rt: &Runtime, mlp: &Mlp) -> Self {
        let layers = mlp
            .layers()
            .iter()
            .map(|l| {
                let w = host(rt, l.weight().value());
                let b = l.bias().map(|p| host(rt, p.value()));
                (w, b, l.act(), l.in_features(), l.out_features())
            })
            .collect();
        HostMlp { layers }
    }
    /// The loss, and whether every ReLU pre-activation is at least 2e-3 from its kink (h = 1e-4 moves a pre-activation by far less).
    fn loss(&self, x: &[f64], rows: usize) -> (f64, bool) {
        let mut h = x.to_vec();
        let mut clear = true;
        for (w, b, act, inp, out) in &self.layers {
            let mut y = vec![0f64; rows * out];
            for r in 0..rows {
                for o in 0..*out {
                    let mut s = b.as_ref().map_or(0.0, |b| b[o]);
                    for i in 0..*inp {
                        s += h[r * inp + i] * w[o * inp + i];
                    }
                    if *act == Activation::Relu && s.abs() < 2e-3 {
                        clear = false;
                    }
                    y[r * out + o] = act64(*act, s);
                }
            }
            h = y;
        }
        (h.iter().map(|v| v * v).sum(), clear)
    }
}

fn central(mut f: impl FnMut(f64) -> f64) -> f64 {
    let h = 1e-4;
    (f(h) - f(-h)) / (2.0 * h)
}

/// Forward, the loss through ops, backward; returns (loss, dx).
fn step(rt: &Runtime, mlp: &mut Mlp, x: &Tensor) -> (f64, Tensor) {
    let (y, ctx) = mlp.forward(rt, x).expect("forward");
    let sq = rt
        .submit(rtx_ops::mul(&y, &y))
        .map_err(|e| e.error)
        .unwrap();
    let loss = rt
        .submit(rtx_ops::sum(sq.outputs().unwrap()))
        .map_err(|e| e.error)
        .unwrap();
    let dy = rt
        .submit(rtx_ops::add(&y, &y))
        .map_err(|e| e.error)
        .unwrap();
    let dx = mlp
        .backward(rt, dy.outputs().unwrap(), &ctx)
        .expect("backward");
    let l = host(rt, &loss.wait().unwrap())[0];
    (l, dx)
}

fn fd_case(cfg: &MlpConfig, lead: &[usize]) {
    let rt = Runtime::cpu(2);
    let base: u64 = rand::random();
    let inp = cfg.sizes[0];
    let rows: usize = lead.iter().product();
    let mut xshape = lead.to_vec();
    xshape.push(inp);
    // Fresh parameters and inputs, drawn until no ReLU pre-activation is near its kink
    let (seed, mut mlp, host_mlp, x) = (0..100)
        .find_map(|i| {
            let seed = base.wrapping_add(i);
            let mlp = Mlp::new(&rt, cfg, seed).unwrap();
            let mut r = StdRng::seed_from_u64(seed);
            let x: Vec<f64> = (0..rows * inp)
                .map(|_| r.gen_range(-1.0f32..1.0) as f64)
                .collect();
            let h = HostMlp::of(&rt, &mlp);
            // (and a loss that is not zero: a ReLU output layer may be all off)
            let (l, clear) = h.loss(&x, rows);
            (clear && l > 1e-2).then_some((seed, mlp, h, x))
        })
        .expect("inputs clear of the ReLU kinks");
    let what = format!("{cfg:?} lead {lead:?} (seed {seed})");
    let xs: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let xt = rt.upload(&xs, xshape.clone()).unwrap();
    let (loss, dx) = step(&rt, &mut mlp, &xt);
    let want_loss = host_mlp.loss(&x, rows).0;
    assert!(
        ((loss - want_loss) / want_loss).abs() < 1e-5,
        "{what}: loss {loss} vs {want_loss}"
    );
    assert_eq!(dx.dims(), &xshape[..], "{what}");
    // dx
    let fd_x: Vec<f64> = (0..x.len())
        .map(|i| {
            central(|d| {
                let mut xp = x.clone();
                xp[i] += d;
                host_mlp.loss(&xp, rows).0
            })
        })
        .collect();
    let e = rel_err(&host(&rt, &dx), &fd_x);
    assert!(e < 1e-4, "{what}: dx error {e:e}");
    // Every parameter, in the order parameters() lists them.
    let mut hm = host_mlp;
    let mut params = mlp.parameters();
    assert_eq!(
        params.len(),
        cfg.sizes.len().saturating_sub(1) * (1 + cfg.bias as usize)
    );
    for (k, p) in params.iter_mut().enumerate() {
        let (layer, is_bias) = if cfg.bias {
            (k / 2, k % 2 == 1)
        } else {
            (k, false)
        };
        let n = p.value().numel();
        let fd: Vec<f64> = (0..n)
            .map(|i| {
                central(|d| {
                    let slot = if is_bias {
                        &mut hm.layers[layer].1.as_mut().unwrap()[i]
                    } else {
                        &mut hm.layers[layer].0[i]
                    };
                    *slot += d;
                    let l = hm.loss(&x, rows).0;
                    let slot = if is_bias {
                        &mut hm.layers[layer].1.as_mut().unwrap()[i]
                    } else {
                        &mut hm.layers[layer].0[i]
                    };
                    *slot -= d;
                    l
                })
            })
            .collect();
        let g = p
            .grad()
            .unwrap_or_else(|| panic!("{what}: {} has no gradient", p.name()));
        assert_eq!(g.shape(), p.value().shape(), "{what}");
        let e = rel_err(&host(&rt, g), &fd);
        assert!(e < 1e-4, "{what}: layer {layer} {} error {e:e}", p.name());
    }
}

#[test]
fn mlp_gradients_match_finite_differences() {
    fd_case(&MlpConfig::new(&[5, 7, 6, 3]), &[4]);
    fd_case(
        &MlpConfig::new(&[5, 7, 6, 3]).act(Activation::Relu),
        &[2, 3],
    );
    fd_case(
        &MlpConfig::new(&[3, 9, 4])
            .bias(false)
            .out_act(Activation::Gelu),
        &[5],
    );
    fd_case(
        &MlpConfig::new(&[4, 8, 2])
            .act(Activation::None)
            .out_act(Activation::Relu),
        &[3],
    );
    fd_case(&MlpConfig::new(&[6, 1]), &[7]);
}

#[test]
fn cuda_matches_cpu_when_present() {
    if !rtx_runtime::cuda::present_for_tests() {
        return;
    }
    let gpu = Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(2)
        .build()
        .expect("CUDA runtime");
    let cpu = Runtime::cpu(2);
    let seed: u64 = rand::random();
    // Widths of both kinds: multiples of 8 (fused epilogues) and odd ones.
    let cfg = MlpConfig::new(&[24, 64, 40, 17, 8]);
    let mut r = StdRng::seed_from_u64(seed);
    let x: Vec<f32> = (0..33 * 24).map(|_| r.gen_range(-1.0..1.0)).collect();
    let mut grads = Vec::new();
    for rt in [&cpu, &gpu] {
        let mut mlp = Mlp::new(rt, &cfg, seed).unwrap();
        let xt = rt.upload(&x, [33, 24]).unwrap();
        let (loss, dx) = step(rt, &mut mlp, &xt);
        let mut g = vec![vec![loss], host(rt, &dx)];
        g.extend(mlp.parameters().iter().map(|p| host(rt, p.grad().unwrap())));
        grads.push(g);
    }
    for (i, (c, g)) in grads[0].iter().zip(&grads[1]).enumerate() {
        let e = rel_err(g, c);
        assert!(
            e < 1e-4,
            "entry {i} (0 loss, 1 dx, then parameters): error {e:e} (seed {seed})"
        );
    }
}

#[test]
fn parameters_update_in_place_by_donation() {
    let rt = Runtime::cpu(1);
    let mut layer = Linear::new(&rt, LinearConfig::new(3, 2), 11).unwrap();
    let x = rt.upload(&[0.5f32, -1.0, 2.0], [1, 3]).unwrap();
    let (_, ctx) = layer.forward(&rt, &x).unwrap();
    let dy = rt.upload(&[1.0f32, -2.0], [1, 2]).unwrap();
    layer.backward(&rt, &dy, &ctx).unwrap();
    drop(ctx); // the context holds x only; the weight handle is the parameter's own
    let mut params = layer.parameters();
    assert_eq!(params.len(), 2);
    let names: Vec<&str> = params.iter().map(|p| p.name()).collect();
    assert_eq!(names, ["weight", "bias"]);
    for p in params.iter_mut() {
        let before = host(&rt, p.value());
        let grad = host(&rt, p.grad().unwrap());
        let g = p.grad().unwrap().clone();
        let donations = rtx_ops::donations();
        // An SGD step with lr = -1 as an optimizer would write it: value += grad, in place.
        p.update(|v| {
            rt.submit(rtx_ops::add_(v, &g))
                .map(|s| s.outputs().unwrap().clone())
                .map_err(|e| {
                    let (v, _) = e.op.into_inputs();
                    Box::new((e.error, v))
                })
        })
        .unwrap();
        let after = host(&rt, p.value());
        let want: Vec<f64> = before
            .iter()
            .zip(&grad)
            .map(|(a, b)| f64::from(*a as f32 + *b as f32))
            .collect();
        assert_eq!(after, want);
        assert!(
            rtx_ops::donations() > donations,
            "{}: no donation",
            p.name()
        );
    }
    // Wrong gradient shapes and dtypes are typed errors.
    let bad = rt.upload(&[1.0f32; 3], [3]).unwrap();
    let mut params = layer.parameters();
    let w = params.iter_mut().next().unwrap();
    assert!(matches!(w.set_grad(bad), Err(Error::ShapeMismatch { .. })));
    let half = rt.upload(&[rtx_runtime::f16::ONE; 6], [2, 3]).unwrap();
    assert!(matches!(w.set_grad(half), Err(Error::DTypeMismatch { .. })));
}

#[test]
fn initialization_is_seeded_and_bounded() {
    let rt = Runtime::cpu(1);
    let a = init::uniform(&rt, [40, 30], DType::F32, 0.25, 5).unwrap();
    let b = init::uniform(&rt, [40, 30], DType::F32, 0.25, 5).unwrap();
    let c = init::uniform(&rt, [40, 30], DType::F32, 0.25, 6).unwrap();
    let (a, b, c) = (host(&rt, &a), host(&rt, &b), host(&rt, &c));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|v| v.abs() <= 0.25));
    let mean = a.iter().sum::<f64>() / a.len() as f64;
    let var = a.iter().map(|v| v * v).sum::<f64>() / a.len() as f64;
    assert!(
        mean.abs() < 0.02 && (var - 0.25f64.powi(2) / 3.0).abs() < 0.004,
        "{mean} {var}"
    );
    // Layers of an MLP get different values from one seed.
    let mlp = Mlp::new(&rt, &MlpConfig::new(&[8, 8, 8]), 1).unwrap();
    let w0 = host(&rt, mlp.layers()[0].weight().value());
    let w1 = host(&rt, mlp.layers()[1].weight().value());
    assert_ne!(w0, w1);
    // Bad configurations are typed errors.
    assert!(matches!(
        Mlp::new(&rt, &MlpConfig::new(&[8]), 1),
        Err(Error::InvalidOp { .. })
    ));
    assert!(matches!(
        Linear::new(&rt, LinearConfig::new(0, 3), 1),
        Err(Error::InvalidDim { .. })
    ));
    let l1 = Linear::new(&rt, LinearConfig::new(4, 5), 1).unwrap();
    let l2 = Linear::new(&rt, LinearConfig::new(6, 2), 2).unwrap();
    assert!(matches!(
        Mlp::from_layers(vec![l1, l2]),
        Err(Error::ShapeMismatch { .. })
    ));
}
