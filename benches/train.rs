//! The `train` suite of the harness: the training kernels at the sizes of the training
//! issue, with the same case names and byte counts as `benches/torch_train.py`, so
//! `compare.py` joins them and both sides report TB/s against the device copy peak
//! (`copy_peak`: here `mul_scalar` by 1, which reads and writes every element once).
//! Each small case (layer norm, embedding: tens of MB) also gets `copy_<case>`, the same
//! copy moving as many bytes, timed in the same run: what a kernel of that size can
//! reach, since the big copy's peak is out of reach of a launch that short.

use rtx::ops::optim::{adamw, AdamW};
use rtx::ops::{self};
use rtx::{Backend, BackendKind, Builder, DType, Runtime, Tensor};

use crate::bench_util::*;

/// Reads once, writes once: the copy-peak reference the kernels are judged against.
fn copy_peak(rt: &Runtime) {
    let n = 1usize << 29;
    let x = upload(rt, &random_f32(n, 41), &[n], DType::F32);
    let ms = time_op(rt, 4, 9, || ops::mul_scalar(&x, 1.0));
    emit("copy_peak", ms, 2.0 * n as f64 * 4.0, 0.0, &[]);
}

/// The small cases and their byte counts (as `emit`ted below and in `torch_train.py`).
fn small_cases() -> Vec<(String, usize)> {
    let mut v = Vec::new();
    for d in [768usize, 4096] {
        let xb = 8192 * d * 2;
        v.push((format!("ln_fwd_8192x{d}_bf16"), 2 * xb));
        v.push((format!("ln_fwdbwd_8192x{d}_bf16"), 5 * xb));
    }
    let (vocab, d, n) = (50257usize, 768usize, 8192usize);
    v.push(("emb_fwd_50257x768_n8192_f32".into(), 2 * n * d * 4 + n * 4));
    v.push((
        "emb_bwd_50257x768_n8192_f32".into(),
        vocab * d * 4 + n * d * 4 + n * 4,
    ));
    v
}

/// `copy_<case>`: `mul_scalar` by 1 over bytes / 8 f32 values (bytes / 2 read, as many
/// written) for each small case.
fn copy_small(rt: &Runtime) {
    for (case, bytes) in small_cases() {
        let n = bytes / 8;
        let x = upload(rt, &random_f32(n, 51), &[n], DType::F32);
        let ms = time_op(rt, 10, 15, || ops::mul_scalar(&x, 1.0));
        emit(&format!("copy_{case}"), ms, 8.0 * n as f64, 0.0, &[]);
    }
}

fn cross_entropy(rt: &Runtime) {
    let (n, c) = (8192usize, 50304usize);
    let host: Vec<f32> = random_f32(n * c, 42).iter().map(|x| 4.0 * x).collect();
    let logits = upload(rt, &host, &[n, c], DType::BF16);
    let labels: Vec<u32> = random_f32(n, 43)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * c as f32) as u32).min(c as u32 - 1))
        .collect();
    let labels = rt.upload(&labels, [n]).expect("upload");
    let lbytes = (n * c * 2 + n * 4) as f64;
    let ms = time_op(rt, 5, 11, || ops::cross_entropy(&logits, &labels));
    emit("ce_fwd_8192x50304_bf16", ms, lbytes, 0.0, &[]);
    let ms = time_with(rt, 5, 11, |rt, s| {
        let out = rt
            .submit_on(s, ops::cross_entropy(&logits, &labels))
            .map_err(|e| e.error)
            .expect("submit");
        let out = out.outputs().expect("outputs").clone();
        let _submitted = rt
            .submit_on(
                s,
                ops::cross_entropy_backward(&logits, &labels, &out.lse, 1.0),
            )
            .map_err(|e| e.error)
            .expect("submit");
    });
    emit(
        "ce_fwdbwd_8192x50304_bf16",
        ms,
        2.0 * lbytes + (n * c * 2) as f64,
        0.0,
        &[],
    );
}

/// A one-stream CUDA runtime with one setting changed, beside `rt` (`None` on the CPU
/// backend, which has one path).
fn with_setting(rt: &Runtime, set: impl FnOnce(Builder) -> Builder) -> Option<Runtime> {
    (rt.backend() == BackendKind::Cuda).then(|| {
        set(Runtime::builder().backend(Backend::Cuda(vec![])).streams(1))
            .build()
            .expect("runtime with the setting changed")
    })
}

/// The layer-norm cases; then, on CUDA, the same on the bulk-copy kernels (the setting
/// `layer_norm_bulk`, case names ending in `_bulk`).
fn layer_norm(rt: &Runtime) {
    layer_norm_cases(rt, "");
    if let Some(bulk) = with_setting(rt, |b| b.layer_norm_bulk(true)) {
        layer_norm_cases(&bulk, "_bulk");
    }
}

fn layer_norm_cases(rt: &Runtime, suffix: &str) {
    for (rows, d) in [(8192usize, 768usize), (8192, 4096)] {
        let x = upload(rt, &random_f32(rows * d, 44), &[rows, d], DType::BF16);
        let g: Vec<f32> = random_f32(d, 45).iter().map(|v| 1.0 + 0.1 * v).collect();
        let g = upload(rt, &g, &[d], DType::BF16);
        let b = upload(rt, &random_f32(d, 46), &[d], DType::BF16);
        let dy = upload(rt, &random_f32(rows * d, 47), &[rows, d], DType::BF16);
        let xb = (rows * d * 2) as f64;
        let ms = time_op(rt, 10, 15, || ops::layer_norm(&x, &g, &b, 1e-5));
        emit(
            &format!("ln_fwd_{rows}x{d}_bf16{suffix}"),
            ms,
            2.0 * xb,
            0.0,
            &[],
        );
        let ms = time_with(rt, 10, 15, |rt, s| {
            let f = rt
                .submit_on(s, ops::layer_norm(&x, &g, &b, 1e-5))
                .map_err(|e| e.error)
                .expect("submit");
            let (_y, mean, rstd) = f.outputs().expect("outputs").clone();
            let _submitted = rt
                .submit_on(s, ops::layer_norm_backward(&dy, &x, &mean, &rstd, &g))
                .map_err(|e| e.error)
                .expect("submit");
        });
        emit(
            &format!("ln_fwdbwd_{rows}x{d}_bf16{suffix}"),
            ms,
            5.0 * xb,
            0.0,
            &[],
        );
    }
}

/// GPT-2 small's parameter tensors (124M values), as `torch_train.py` lays them out.
fn gpt2_small_sizes() -> Vec<usize> {
    let (v, d, l, ctx) = (50257usize, 768usize, 12usize, 1024usize);
    let mut sizes = vec![v * d, ctx * d];
    for _ in 0..l {
        sizes.extend([
            d,
            d,
            3 * d * d,
            3 * d,
            d * d,
            d,
            d,
            d,
            4 * d * d,
            4 * d,
            4 * d * d,
            d,
        ]);
    }
    sizes.extend([d, d]);
    sizes
}

fn adamw_step(rt: &Runtime) {
    let sizes = gpt2_small_sizes();
    let total: usize = sizes.iter().sum();
    let up = |seed: u64, scale: f32| -> Vec<Tensor> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let v: Vec<f32> = random_f32(n, seed + i as u64)
                    .iter()
                    .map(|x| x * scale)
                    .collect();
                upload(rt, &v, &[n], DType::F32)
            })
            .collect()
    };
    let grads = up(1000, 1e-3);
    // Each step consumes the previous step's outputs (donated: in place when unique).
    let state = std::cell::RefCell::new((up(2000, 0.02), up(3000, 0.0), up(4000, 0.0), 0u64));
    let cfg = AdamW {
        lr: 1e-4,
        weight_decay: 0.1,
        ..AdamW::default()
    };
    let n = sizes.len();
    let ms = time_with(rt, 3, 9, |rt, s| {
        let mut st = state.borrow_mut();
        let (p, m, v, t) = &mut *st;
        *t += 1;
        let sub = rt
            .submit_on(
                s,
                adamw(
                    cfg,
                    *t,
                    std::mem::take(p),
                    &grads,
                    std::mem::take(m),
                    std::mem::take(v),
                ),
            )
            .map_err(|e| e.error)
            .expect("submit");
        let mut out = sub.outputs().expect("outputs").clone();
        drop(sub);
        *v = out.split_off(2 * n);
        *m = out.split_off(n);
        *p = out;
    });
    emit(
        &format!("adamw_{}m_f32", total / 1_000_000),
        ms,
        7.0 * 4.0 * total as f64,
        0.0,
        &[],
    );
}

fn embedding(rt: &Runtime) {
    let (v, d, n) = (50257usize, 768usize, 8192usize);
    let table = upload(rt, &random_f32(v * d, 48), &[v, d], DType::F32);
    let ids_host: Vec<u32> = random_f32(n, 49)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * v as f32) as u32).min(v as u32 - 1))
        .collect();
    let ids = rt.upload(&ids_host, [n]).expect("upload");
    let dy = upload(rt, &random_f32(n * d, 50), &[n, d], DType::F32);
    let ms = time_op(rt, 10, 15, || ops::embedding(&table, &ids));
    emit(
        "emb_fwd_50257x768_n8192_f32",
        ms,
        (2 * n * d * 4 + n * 4) as f64,
        0.0,
        &[],
    );
    let bwd_bytes = (v * d * 4 + n * d * 4 + n * 4) as f64;
    let ms = time_op(rt, 10, 15, || ops::embedding_backward(&dy, &ids, v));
    emit("emb_bwd_50257x768_n8192_f32", ms, bwd_bytes, 0.0, &[]);
    // The five-launch backward (the setting `embedding_one_launch` off), on a runtime of
    // its own with the same inputs.
    if let Some(five) = with_setting(rt, |b| b.embedding_one_launch(false)) {
        let ids = five.upload(&ids_host, [n]).expect("upload");
        let dy = upload(&five, &random_f32(n * d, 50), &[n, d], DType::F32);
        let ms = time_op(&five, 10, 15, || ops::embedding_backward(&dy, &ids, v));
        emit(
            "emb_bwd_50257x768_n8192_f32_five_launch",
            ms,
            bwd_bytes,
            0.0,
            &[],
        );
    }
}

/// Every case of the suite.
pub fn suite_train(rt: &Runtime) {
    copy_peak(rt);
    copy_small(rt);
    cross_entropy(rt);
    layer_norm(rt);
    adamw_step(rt);
    embedding(rt);
}
