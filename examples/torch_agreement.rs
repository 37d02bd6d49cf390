//! Exports what the PyTorch agreement check (`train/checks/torch_agreement.py`) needs:
//! an MLP and a causal transformer block built with fixed seeds, a batch, rtx's logits,
//! cross-entropy loss and every gradient of the first step, and the losses of 10
//! AdamW steps.
//!
//! ```sh
//! cargo run --release --example torch_agreement -- [OUT_DIR] [--cpu]
//! python3 train/checks/torch_agreement.py [OUT_DIR]
//! ```
//!
//! `OUT_DIR` defaults to `target/agreement`; the runtime is CUDA when a device is present
//! (the CPU backend otherwise, or with `--cpu`). The format: one raw little-endian file
//! per tensor (`f32` or `i32`) and `index.json`, which names each file with its dtype
//! and shape and carries the configuration (sizes, eps, AdamW hyperparameters, the
//! attention dtype) and the 10 losses. Small sizes: a second or two on the CPU.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rtx::ops::optim::AdamW as AdamWConfig;
use rtx::train::{AdamW, BlockConfig, Mlp, MlpConfig, Module, TransformerBlock};
use rtx::{Backend, BackendKind, DType, Error, Result, Runtime, Tensor};

const STEPS: usize = 10;

/// The AdamW hyperparameters both sides use (the block's learning rate is a tenth of
/// this: at 1e-2 it memorizes the batch in three steps, and losses near zero say little).
const ADAMW: AdamWConfig = AdamWConfig {
    lr: 1e-2,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.01,
};

/// One exported tensor: name, dtype, shape, file.
struct Entry {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    file: String,
}

struct Export {
    dir: PathBuf,
    model: &'static str,
    entries: Vec<Entry>,
}

impl Export {
    fn tensor(&mut self, name: &str, t: &Tensor) -> Result<()> {
        let (dtype, bytes): (&str, Vec<u8>) = match t.dtype() {
            DType::I32 => (
                "i32",
                t.to_vec::<i32>()?
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            _ => {
                let v = t.to_f64_vec()?;
                (
                    "f32",
                    v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
                )
            }
        };
        let file = format!("{}/{name}.bin", self.model);
        std::fs::write(self.dir.join(&file), bytes).map_err(io)?;
        self.entries.push(Entry {
            name: name.to_string(),
            dtype,
            shape: t.dims().to_vec(),
            file,
        });
        Ok(())
    }

    fn json(&self, config: &str, losses: &[f32]) -> String {
        let mut s = format!("{{\"config\": {config}, \"losses\": [");
        let l: Vec<String> = losses.iter().map(|v| format!("{v:e}")).collect();
        s += &l.join(", ");
        s += "], \"tensors\": {";
        for (i, e) in self.entries.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(
                s,
                "{sep}\"{}\": {{\"file\": \"{}\", \"dtype\": \"{}\", \"shape\": {:?}}}",
                e.name, e.file, e.dtype, e.shape
            );
        }
        s + "}}"
    }
}

fn io(e: std::io::Error) -> Error {
    Error::invalid("torch_agreement", format!("writing the export: {e}"))
}

/// Forward + cross-entropy + backward + AdamW, `STEPS` times; exports the first step's
/// logits, loss and gradients and returns every step's loss.
fn train<M: Module>(
    rt: &Runtime,
    ex: &mut Export,
    model: &mut M,
    names: &[String],
    (x, labels): (&Tensor, &Tensor),
    cfg: AdamWConfig,
    fwd_bwd: impl Fn(&mut M, &Tensor) -> Result<(Tensor, Tensor)>,
) -> Result<Vec<f32>> {
    for (p, n) in model.parameters().iter().zip(names) {
        ex.tensor(&format!("init.{n}"), p.value())?;
    }
    ex.tensor("batch.x", x)?;
    ex.tensor("batch.labels", labels)?;
    let mut opt = AdamW::new(cfg);
    let mut losses = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        // `fwd_bwd` runs the forward, the loss and the backward: (logits, loss).
        let (logits, loss) = fwd_bwd(model, labels)?;
        if step == 0 {
            ex.tensor("logits", &logits)?;
            ex.tensor("loss", &loss)?;
            for (p, n) in model.parameters().iter().zip(names) {
                ex.tensor(&format!("grad.{n}"), p.grad().expect("gradient"))?;
            }
        }
        losses.push(loss.to_vec::<f32>()?[0]);
        opt.step(rt, model.parameters())?;
    }
    Ok(losses)
}

/// Cross-entropy of `logits` `[N, C]`: (the mean loss, dlogits).
fn loss_grad(rt: &Runtime, logits: &Tensor, labels: &Tensor) -> Result<(Tensor, Tensor)> {
    let ce = rt.run(rtx::ops::cross_entropy(logits, labels))?;
    let d = rt.run(rtx::ops::cross_entropy_backward(
        logits, labels, &ce.lse, 1.0,
    ))?;
    Ok((ce.loss, d))
}

fn batch(
    rt: &Runtime,
    seed: u64,
    dims: &[usize],
    rows: usize,
    classes: usize,
) -> Result<(Tensor, Tensor)> {
    let mut r = StdRng::seed_from_u64(seed);
    let n: usize = dims.iter().product();
    let x: Vec<f32> = (0..n).map(|_| r.gen_range(-1.0..1.0)).collect();
    let y: Vec<i32> = (0..rows).map(|_| r.gen_range(0..classes as i32)).collect();
    Ok((rt.upload(&x, dims.to_vec())?, rt.upload(&y, [rows])?))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cpu = args.iter().any(|a| a == "--cpu");
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or_else(|| PathBuf::from("target/agreement"), PathBuf::from);
    let backend = if cpu { Backend::Cpu } else { Backend::Auto };
    let rt = Runtime::builder().backend(backend).streams(2).build()?;
    let on = match rt.backend() {
        BackendKind::Cpu => "cpu",
        BackendKind::Cuda => "cuda",
    };
    for m in ["mlp", "block"] {
        std::fs::create_dir_all(dir.join(m)).map_err(io)?;
    }
    let adamw = |c: AdamWConfig| {
        format!(
            "{{\"lr\": {:e}, \"beta1\": {}, \"beta2\": {}, \"eps\": {:e}, \"weight_decay\": {}}}",
            c.lr, c.beta1, c.beta2, c.eps, c.weight_decay
        )
    };
    let block_adamw = AdamWConfig {
        lr: ADAMW.lr / 10.0,
        ..ADAMW
    };
    let mut parts = Vec::new();

    // The MLP: 32 -> 64 -> 64 -> 10, GELU (tanh form) between, a batch of 16.
    let sizes = [32usize, 64, 64, 10];
    let mut mlp = Mlp::new(&rt, &MlpConfig::new(&sizes), 1)?;
    let names: Vec<String> = (0..sizes.len() - 1)
        .flat_map(|i| [format!("{i}.weight"), format!("{i}.bias")])
        .collect();
    let (x, labels) = batch(&rt, 2, &[16, sizes[0]], 16, sizes[3])?;
    let mut ex = Export {
        dir: dir.clone(),
        model: "mlp",
        entries: Vec::new(),
    };
    let losses = train(
        &rt,
        &mut ex,
        &mut mlp,
        &names,
        (&x, &labels),
        ADAMW,
        |m, lab| {
            let (y, ctx) = m.forward(&rt, &x)?;
            let (loss, d) = loss_grad(&rt, &y, lab)?;
            m.backward(&rt, &d, &ctx)?;
            Ok((y, loss))
        },
    )?;
    let config = format!(
        "{{\"sizes\": {sizes:?}, \"act\": \"gelu_tanh\", \"backend\": \"{on}\", \"adamw\": {}}}",
        adamw(ADAMW)
    );
    parts.push(format!("\"mlp\": {}", ex.json(&config, &losses)));
    println!("mlp losses:   {losses:?}");

    // The block: B 2, L 8, D 128, 2 heads of 64 (what the CUDA kernels take), MLP 512;
    // the loss is the cross-entropy of each position's D outputs as logits.
    let (b, l, d, heads) = (2usize, 8usize, 128usize, 2usize);
    let cfg = BlockConfig::new(d, heads);
    let mut block = TransformerBlock::new(&rt, cfg, 3)?;
    let attn_dtype = block.parts().1.attn_dtype(&rt);
    let mut names: Vec<String> = vec!["ln1.weight".into(), "ln1.bias".into()];
    for p in ["q", "k", "v", "out"] {
        names.extend([format!("attn.{p}.weight"), format!("attn.{p}.bias")]);
    }
    names.extend(
        [
            "ln2.weight",
            "ln2.bias",
            "fc1.weight",
            "fc1.bias",
            "fc2.weight",
            "fc2.bias",
        ]
        .map(String::from),
    );
    let (x, labels) = batch(&rt, 4, &[b, l, d], b * l, d)?;
    let mut ex = Export {
        dir: dir.clone(),
        model: "block",
        entries: Vec::new(),
    };
    let losses = train(
        &rt,
        &mut ex,
        &mut block,
        &names,
        (&x, &labels),
        block_adamw,
        |m, lab| {
            let (y, ctx) = m.forward(&rt, &x)?;
            let logits = y.reshape([b * l, d])?;
            let (loss, dl) = loss_grad(&rt, &logits, lab)?;
            m.backward(&rt, &dl.reshape([b, l, d])?, &ctx)?;
            Ok((logits, loss))
        },
    )?;
    let config = format!(
        "{{\"b\": {b}, \"l\": {l}, \"d\": {d}, \"heads\": {heads}, \"hidden\": {}, \"eps\": {:e}, \"act\": \"gelu_tanh\", \"attn_dtype\": \"{}\", \"backend\": \"{on}\", \"adamw\": {}}}",
        cfg.hidden,
        cfg.eps,
        attn_dtype.name(),
        adamw(block_adamw)
    );
    parts.push(format!("\"block\": {}", ex.json(&config, &losses)));
    println!("block losses: {losses:?}");

    let index = format!("{{{}}}\n", parts.join(", "));
    std::fs::write(Path::new(&dir).join("index.json"), index).map_err(io)?;
    println!(
        "wrote {} ({on}); check with: python3 train/checks/torch_agreement.py {}",
        dir.display(),
        dir.display()
    );
    Ok(())
}
