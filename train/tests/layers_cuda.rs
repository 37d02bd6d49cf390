//! The layers on CUDA against the CPU backend (skipped without a device; see
//! `common::cuda`): the same seed gives the same parameters on both (host-generated
//! uniform initialization, the Philox `normal` for embeddings, filled ones and zeros
//! for layer norms), the same input and output gradient go in, and the output, the
//! input's gradient and every parameter's gradient must agree.
//!
//! Tolerance: 1e-4 relative by the norm where both backends compute in f32 (cuDNN and
//! cuBLAS without TF32); 1e-2 for the attention and the block, whose attention op runs
//! in f16 on CUDA (q, k, v and the output gradient rounded to 11 bits).

mod common;

use common::{cuda, grads, host, rand_vec, rel_err, upload};
use rtx_ops::conv::Conv2dOpts;
use rtx_ops::gemm::Activation;
use rtx_runtime::{DType, Runtime, Tensor};
use rtx_train::{
    AttentionConfig, BlockConfig, CausalSelfAttention, Cnn, CnnConfig, Conv2d, Conv2dConfig,
    Embedding, LayerNorm, Module, TransformerBlock,
};

/// Output, input gradient (if any), then the parameters' gradients.
type Run = Vec<Vec<f64>>;

fn compare(what: &str, cpu: &Run, gpu: &Run, tol: f64) {
    assert_eq!(cpu.len(), gpu.len(), "{what}");
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    // A gradient that vanishes by symmetry (the key projection's bias: softmax ignores a
    // shift shared by a row) is measured against 1e-2 of the largest norm among the
    // entries instead of its own, as in `train/checks/torch_agreement.py`.
    let floor = 1e-2 * cpu.iter().map(|c| norm(c)).fold(0.0, f64::max);
    for (i, (c, g)) in cpu.iter().zip(gpu).enumerate() {
        assert_eq!(c.len(), g.len(), "{what}: entry {i} length");
        let diff: Vec<f64> = c.iter().zip(g).map(|(a, b)| a - b).collect();
        let e = norm(&diff) / norm(c).max(floor);
        assert!(
            e < tol,
            "{what}: entry {i} (0 output, 1 dx, then parameters) error {e:e} \
             (||cpu|| {:e}, floor {floor:e}; rel_err {:e})",
            norm(c),
            rel_err(g, c)
        );
    }
}

/// Runs `f` on both backends (when CUDA is present) and compares.
fn parity(what: &str, tol: f64, f: impl Fn(&Runtime) -> Run) {
    let Some(gpu) = cuda() else { return };
    let cpu = Runtime::cpu(2);
    compare(what, &f(&cpu), &f(&gpu), tol);
}

fn finish(y: &Tensor, dx: Option<&Tensor>, m: &mut impl Module) -> Run {
    let mut v = vec![host(y)];
    v.extend(dx.map(host));
    v.extend(grads(m));
    v
}

#[test]
fn conv2d_cuda_matches_cpu() {
    let seed: u64 = rand::random();
    for (act, stride, pad) in [(Activation::None, 1, 1), (Activation::Relu, 2, 0)] {
        let what = format!("conv2d {act:?} (seed {seed})");
        parity(&what, 1e-4, |rt| {
            let cfg = Conv2dConfig::new(3, 8, 3)
                .opts(Conv2dOpts::default().stride(stride).pad(pad))
                .act(act);
            let mut layer = Conv2d::new(rt, cfg, seed).unwrap();
            let x = upload(rt, &rand_vec(seed, 2 * 3 * 9 * 7, -1.0, 1.0), &[2, 3, 9, 7]);
            let (y, ctx) = layer.forward(rt, &x).unwrap();
            let dy = upload(rt, &rand_vec(seed ^ 1, y.numel(), -1.0, 1.0), y.dims());
            let dx = layer.backward(rt, &dy, &ctx).unwrap();
            finish(&y, Some(&dx), &mut layer)
        });
    }
}

#[test]
fn cnn_cuda_matches_cpu() {
    let seed: u64 = rand::random();
    parity(&format!("cnn (seed {seed})"), 1e-4, |rt| {
        let mut cnn = Cnn::new(rt, CnnConfig::new(3, (10, 9), 8, 16, 5), seed).unwrap();
        let x = upload(rt, &rand_vec(seed, 4 * 3 * 90, -1.0, 1.0), &[4, 3, 10, 9]);
        let (y, ctx) = cnn.forward(rt, &x).unwrap();
        let dy = upload(rt, &rand_vec(seed ^ 1, y.numel(), -1.0, 1.0), y.dims());
        let dx = cnn.backward(rt, &dy, &ctx).unwrap();
        finish(&y, Some(&dx), &mut cnn)
    });
}

#[test]
fn layer_norm_cuda_matches_cpu() {
    let seed: u64 = rand::random();
    parity(&format!("layer_norm (seed {seed})"), 1e-4, |rt| {
        let g = upload(rt, &rand_vec(seed ^ 2, 96, 0.5, 1.5), &[96]);
        let b = upload(rt, &rand_vec(seed ^ 3, 96, -0.5, 0.5), &[96]);
        let mut ln = LayerNorm::from_tensors(g, b, 1e-5).unwrap();
        let x = upload(rt, &rand_vec(seed, 33 * 96, -2.0, 2.0), &[33, 96]);
        let (y, ctx) = ln.forward(rt, &x).unwrap();
        let dy = upload(rt, &rand_vec(seed ^ 1, y.numel(), -1.0, 1.0), y.dims());
        let dx = ln.backward(rt, &dy, &ctx).unwrap();
        finish(&y, Some(&dx), &mut ln)
    });
}

#[test]
fn embedding_cuda_matches_cpu() {
    let seed: u64 = rand::random();
    parity(&format!("embedding (seed {seed})"), 1e-5, |rt| {
        let mut emb = Embedding::new(rt, 50, 64, DType::F32, seed).unwrap();
        let ids: Vec<i32> = rand_vec(seed, 3 * 17, 0.0, 50.0)
            .into_iter()
            .map(|v| v as i32)
            .collect();
        let ids = rt.upload(&ids, [3, 17]).unwrap();
        let (y, ctx) = emb.forward(rt, &ids).unwrap();
        let dy = upload(rt, &rand_vec(seed ^ 1, y.numel(), -1.0, 1.0), y.dims());
        emb.backward(rt, &dy, &ctx).unwrap();
        finish(&y, None, &mut emb)
    });
}

#[test]
fn attention_and_block_cuda_match_cpu() {
    let seed: u64 = rand::random();
    // Head width 64: what the CUDA flash attention kernels take.
    let (b, l, d, heads) = (2, 16, 128, 2);
    parity(&format!("attention (seed {seed})"), 1e-2, |rt| {
        let cfg = AttentionConfig::new(d, heads);
        let mut attn = CausalSelfAttention::new(rt, cfg, seed).unwrap();
        let x = upload(rt, &rand_vec(seed, b * l * d, -1.0, 1.0), &[b, l, d]);
        let (y, ctx) = attn.forward(rt, &x).unwrap();
        let dy = upload(rt, &rand_vec(seed ^ 1, y.numel(), -1.0, 1.0), y.dims());
        let dx = attn.backward(rt, &dy, &ctx).unwrap();
        finish(&y, Some(&dx), &mut attn)
    });
    parity(&format!("block (seed {seed})"), 1e-2, |rt| {
        let mut block = TransformerBlock::new(rt, BlockConfig::new(d, heads), seed).unwrap();
        let x = upload(rt, &rand_vec(seed, b * l * d, -1.0, 1.0), &[b, l, d]);
        let (y, ctx) = block.forward(rt, &x).unwrap();
        let dy = upload(rt, &rand_vec(seed ^ 1, y.numel(), -1.0, 1.0), y.dims());
        let dx = block.backward(rt, &dy, &ctx).unwrap();
        finish(&y, Some(&dx), &mut block)
    });
}
