//! The layers' backward passes against central finite differences in f64 (CPU
//! backend): `Conv2d`, `LayerNorm`, `Embedding`, `Cnn`, `CausalSelfAttention` and
//! `TransformerBlock`.
//!
//! Each case draws fresh parameters and inputs (the seed is printed on failure), runs
//! the rtx forward and backward with the loss `L = Σ y · r` (r random, so `dL/dy = r`),
//! and compares the forward with the f64 model of `common/reference.rs` and every
//! gradient (the input's and each parameter's) with the central differences of that
//! model. Tolerance: the layers compute in f32 (relative rounding ~1e-7 per op, a few
//! hundred terms), the differences (h = 1e-5, truncation ~1e-10) in f64: 1e-4 relative
//! by the norm for the gradients, 1e-5 for the forward.

mod common;

use common::reference::{self as r, Conv};
use common::{check_fd, dot, grads, host, jitter, rand_vec, rel_err, upload, values};
use rtx_ops::conv::Conv2dOpts;
use rtx_ops::gemm::Activation;
use rtx_runtime::{Runtime, Tensor};
use rtx_train::{
    AttentionConfig, BlockConfig, CausalSelfAttention, Cnn, CnnConfig, Conv2d, Conv2dConfig,
    Embedding, LayerNorm, Module, TransformerBlock,
};

const H: f64 = 1e-5;
const TOL: f64 = 1e-4;

fn names(m: &mut impl Module) -> Vec<String> {
    let mut v = vec!["input".to_string()];
    v.extend(m.parameters().iter().map(|p| p.name().to_string()));
    v
}

fn check_forward(what: &str, y: &Tensor, want: &[f64]) {
    let e = rel_err(&host(y), want);
    assert!(e < 1e-5, "{what}: forward error {e:e}");
}

fn conv_case(act: Activation, stride: usize, pad: usize) {
    rtx_ops::set_poison_outputs(true);
    let rt = Runtime::cpu(2);
    let base: u64 = rand::random();
    let g = Conv {
        n: 2,
        c_in: 3,
        h: 6,
        w: 5,
        c_out: 4,
        k: 3,
        stride,
        pad,
    };
    let (oh, ow) = g.out_hw();
    let xdims = [g.n, g.c_in, g.h, g.w];
    let relu = act == Activation::Relu;
    let model = |p: &[Vec<f64>]| {
        let y = r::conv2d(&g, &p[0], &p[1], Some(&p[2]));
        let kink = y.iter().fold(f64::INFINITY, |m, v| m.min(v.abs()));
        (
            if relu {
                y.iter().map(|v| v.max(0.0)).collect()
            } else {
                y
            },
            kink,
        )
    };
    // Fresh draws until no ReLU pre-activation is within 1e-4 of its kink (h = 1e-5
    // moves one by far less).
    let (seed, mut layer, at) = (0..100)
        .find_map(|i| {
            let seed = base.wrapping_add(i);
            let cfg = Conv2dConfig::new(g.c_in, g.c_out, g.k)
                .opts(Conv2dOpts::default().stride(stride).pad(pad))
                .act(act);
            let mut layer = Conv2d::new(&rt, cfg, seed).unwrap();
            let mut at = vec![rand_vec(seed, g.n * g.c_in * g.h * g.w, -1.0, 1.0)];
            at.extend(values(&mut layer));
            (!relu || model(&at).1 > 1e-4).then_some((seed, layer, at))
        })
        .expect("inputs clear of the kinks");
    let what = format!("conv2d {act:?} stride {stride} pad {pad} (seed {seed})");
    let x = upload(&rt, &at[0], &xdims);
    let (y, ctx) = layer.forward(&rt, &x).unwrap();
    assert_eq!(y.dims(), [g.n, g.c_out, oh, ow], "{what}");
    check_forward(&what, &y, &model(&at).0);
    let rv = rand_vec(seed ^ 1, y.numel(), -1.0, 1.0);
    let dx = layer
        .backward(&rt, &upload(&rt, &rv, y.dims()), &ctx)
        .unwrap();
    let mut got = vec![host(&dx)];
    got.extend(grads(&mut layer));
    let loss = |p: &[Vec<f64>]| dot(&model(p).0, &rv);
    check_fd(&what, loss, &at, &got, &names(&mut layer), H, TOL);
}

#[test]
fn conv2d_gradients_match_finite_differences() {
    conv_case(Activation::None, 1, 1);
    conv_case(Activation::None, 2, 0);
    conv_case(Activation::Relu, 2, 1);
}

#[test]
fn layer_norm_gradients_match_finite_differences() {
    rtx_ops::set_poison_outputs(true);
    let rt = Runtime::cpu(2);
    let seed: u64 = rand::random();
    let (rows, d, eps) = (6, 7, 1e-5);
    let mut ln = LayerNorm::new(&rt, d, eps as f32, rtx_runtime::DType::F32).unwrap();
    let mut at = vec![rand_vec(seed, rows * d, -2.0, 2.0)];
    at.extend(jitter(&rt, &mut ln, seed, 0.5));
    let what = format!("layer_norm (seed {seed})");
    let model = |p: &[Vec<f64>]| r::layer_norm(&p[0], d, &p[1], &p[2], eps);
    let x = upload(&rt, &at[0], &[2, 3, d]);
    let (y, ctx) = ln.forward(&rt, &x).unwrap();
    check_forward(&what, &y, &model(&at));
    let rv = rand_vec(seed ^ 1, y.numel(), -1.0, 1.0);
    let dx = ln.backward(&rt, &upload(&rt, &rv, y.dims()), &ctx).unwrap();
    assert_eq!(dx.dims(), [2, 3, d]);
    let mut got = vec![host(&dx)];
    got.extend(grads(&mut ln));
    let loss = |p: &[Vec<f64>]| dot(&model(p), &rv);
    check_fd(&what, loss, &at, &got, &names(&mut ln), H, TOL);
}

#[test]
fn embedding_gradient_matches_finite_differences() {
    rtx_ops::set_poison_outputs(true);
    let rt = Runtime::cpu(2);
    let seed: u64 = rand::random();
    let (v, d) = (5usize, 3usize);
    let mut emb = Embedding::new(&rt, v, d, rtx_runtime::DType::F32, seed).unwrap();
    // Repeated ids (their rows' gradients sum), and row 4 never named (gradient 0).
    let ids: Vec<u32> = vec![2, 0, 3, 2, 1, 2, 0, 3];
    let idt = rt.upload(&ids, [2, 4]).unwrap();
    let at = values(&mut emb);
    let model = |p: &[Vec<f64>]| -> Vec<f64> {
        ids.iter()
            .flat_map(|&i| p[0][i as usize * d..(i as usize + 1) * d].to_vec())
            .collect()
    };
    let what = format!("embedding (seed {seed})");
    let (y, ctx) = emb.forward(&rt, &idt).unwrap();
    assert_eq!(y.dims(), [2, 4, d]);
    check_forward(&what, &y, &model(&at));
    assert_eq!(ctx.bad.to_vec::<u32>().unwrap(), [0]);
    let rv = rand_vec(seed ^ 1, y.numel(), -1.0, 1.0);
    emb.backward(&rt, &upload(&rt, &rv, y.dims()), &ctx)
        .unwrap();
    let got = grads(&mut emb);
    assert!(
        got[0][4 * d..].iter().all(|&g| g == 0.0),
        "{what}: unnamed row"
    );
    let loss = |p: &[Vec<f64>]| dot(&model(p), &rv);
    check_fd(&what, loss, &at, &got, &["weight".into()], H, TOL);
}

#[test]
fn cnn_gradients_match_finite_differences() {
    rtx_ops::set_poison_outputs(true);
    let rt = Runtime::cpu(2);
    let base: u64 = rand::random();
    let (n, c_in, hw) = (2, 2, (5, 6));
    let cfg = CnnConfig::new(c_in, hw, 3, 4, 3);
    let (seed, mut cnn, at) = (0..100)
        .find_map(|i| {
            let seed = base.wrapping_add(i);
            let mut cnn = Cnn::new(&rt, cfg, seed).unwrap();
            let mut at = vec![rand_vec(seed, n * c_in * hw.0 * hw.1, -1.0, 1.0)];
            at.extend(values(&mut cnn));
            (r::cnn(&at[0], n, c_in, hw, &at[1..]).1 > 1e-4).then_some((seed, cnn, at))
        })
        .expect("inputs clear of the kinks");
    let what = format!("cnn (seed {seed})");
    let model = |p: &[Vec<f64>]| r::cnn(&p[0], n, c_in, hw, &p[1..]).0;
    let x = upload(&rt, &at[0], &[n, c_in, hw.0, hw.1]);
    let (y, ctx) = cnn.forward(&rt, &x).unwrap();
    assert_eq!(y.dims(), [n, 3]);
    check_forward(&what, &y, &model(&at));
    let rv = rand_vec(seed ^ 1, y.numel(), -1.0, 1.0);
    let dx = cnn
        .backward(&rt, &upload(&rt, &rv, y.dims()), &ctx)
        .unwrap();
    assert_eq!(dx.dims(), x.dims());
    let mut got = vec![host(&dx)];
    got.extend(grads(&mut cnn));
    let loss = |p: &[Vec<f64>]| dot(&model(p), &rv);
    check_fd(&what, loss, &at, &got, &names(&mut cnn), H, TOL);
}

#[test]
fn attention_gradients_match_finite_differences() {
    rtx_ops::set_poison_outputs(true);
    let rt = Runtime::cpu(2);
    let seed: u64 = rand::random();
    let (b, l, d, heads) = (2, 5, 8, 2);
    let mut attn = CausalSelfAttention::new(&rt, AttentionConfig::new(d, heads), seed).unwrap();
    let mut at = vec![rand_vec(seed, b * l * d, -1.0, 1.0)];
    at.extend(values(&mut attn));
    let what = format!("causal self-attention (seed {seed})");
    let model = |p: &[Vec<f64>]| r::attention_layer(&p[0], b, l, heads, &p[1..]);
    let x = upload(&rt, &at[0], &[b, l, d]);
    let (y, ctx) = attn.forward(&rt, &x).unwrap();
    check_forward(&what, &y, &model(&at));
    let rv = rand_vec(seed ^ 1, y.numel(), -1.0, 1.0);
    let dx = attn
        .backward(&rt, &upload(&rt, &rv, y.dims()), &ctx)
        .unwrap();
    let mut got = vec![host(&dx)];
    got.extend(grads(&mut attn));
    let loss = |p: &[Vec<f64>]| dot(&model(p), &rv);
    check_fd(&what, loss, &at, &got, &names(&mut attn), H, TOL);
}

#[test]
fn transformer_block_gradients_match_finite_differences() {
    rtx_ops::set_poison_outputs(true);
    let rt = Runtime::cpu(2);
    let seed: u64 = rand::random();
    let (b, l, d, heads, eps) = (2, 4, 8, 2, 1e-5);
    let cfg = BlockConfig::new(d, heads).hidden(12);
    let mut block = TransformerBlock::new(&rt, cfg, seed).unwrap();
    let mut at = vec![rand_vec(seed, b * l * d, -1.0, 1.0)];
    at.extend(jitter(&rt, &mut block, seed, 0.3));
    assert_eq!(at.len(), 17, "input + 16 parameters");
    let what = format!("transformer block (seed {seed})");
    let model = |p: &[Vec<f64>]| r::block(&p[0], b, l, heads, eps, &p[1..]);
    let x = upload(&rt, &at[0], &[b, l, d]);
    let (y, ctx) = block.forward(&rt, &x).unwrap();
    check_forward(&what, &y, &model(&at));
    let rv = rand_vec(seed ^ 1, y.numel(), -1.0, 1.0);
    let dx = block
        .backward(&rt, &upload(&rt, &rv, y.dims()), &ctx)
        .unwrap();
    let mut got = vec![host(&dx)];
    got.extend(grads(&mut block));
    let loss = |p: &[Vec<f64>]| dot(&model(p), &rv);
    check_fd(&what, loss, &at, &got, &names(&mut block), H, TOL);
}

#[test]
fn bad_configurations_are_typed_errors() {
    use rtx_runtime::Error;
    let rt = Runtime::cpu(1);
    let e = Conv2d::new(&rt, Conv2dConfig::new(3, 4, 3).act(Activation::Gelu), 1);
    assert!(matches!(e, Err(Error::InvalidOp { .. })), "{e:?}");
    let e = Conv2d::new(&rt, Conv2dConfig::new(0, 4, 3), 1);
    assert!(matches!(e, Err(Error::InvalidDim { .. })), "{e:?}");
    let e = CausalSelfAttention::new(&rt, AttentionConfig::new(10, 3), 1);
    assert!(matches!(e, Err(Error::InvalidDim { .. })), "{e:?}");
    // A conv input of the wrong channel count fails at submit, in forward.
    let conv = Conv2d::new(&rt, Conv2dConfig::new(3, 4, 3), 1).unwrap();
    let x = rt.upload(&[0.5f32; 2 * 5 * 5], [1, 2, 5, 5]).unwrap();
    assert!(conv.forward(&rt, &x).is_err());
    // So does a block input that is not [B, L, D].
    let block = TransformerBlock::new(&rt, BlockConfig::new(8, 2), 1).unwrap();
    let x = rt.upload(&[0.5f32; 16], [2, 8]).unwrap();
    assert!(block.forward(&rt, &x).is_err());
}
