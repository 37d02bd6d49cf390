//! A character-level causal transformer language model, and the text it learns from:
//! the repository's own source files and docs, read at run time.
//!
//! - [`TextCorpus`]: bytes of text (every `.rs` and `.md` file under a folder, in path
//!   order), cut into a training part (the first 90 %) and a held-out part; windows of
//!   `context + 1` bytes at seeded offsets; its unigram entropy, the loss of a model
//!   that knows only how often each byte occurs (what the model must get well below).
//! - [`CharLm`]: token and position embeddings, [`TransformerBlock`]s (pre-norm, causal
//!   attention), a final layer norm and a linear head over the 256 byte values; its
//!   step is forward, cross-entropy over every position and backward, all submissions.
//! - [`train_lm`]: the training loop (AdamW; the loss read back every few steps without
//!   waiting for it).

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rtx_ops::gemm::Activation;
use rtx_ops::optim::AdamW as AdamWConfig;
use rtx_ops::reduce::sum_dim;
use rtx_runtime::{DType, Error, Result, Runtime, Submission, Tensor};

use crate::block::{BlockConfig, BlockCtx, TransformerBlock};
use crate::embedding::{Embedding, EmbeddingCtx};
use crate::init::derive_seed;
use crate::layer_norm::{LayerNorm, LayerNormCtx};
use crate::linear::{Linear, LinearConfig, LinearCtx};
use crate::param::{Module, Parameters};
use crate::pipeline::loss_and_grad;
use crate::AdamW;

/// Distinct byte values: the model's vocabulary.
pub const VOCAB: usize = 256;

/// The most text [`TextCorpus::from_dir`] reads (64 MiB).
pub const MAX_TEXT: usize = 64 << 20;

/// The repository's root, for its text: the current folder or the nearest one above it
/// that holds this crate's sources (`train/src/lm.rs`), else the folder this crate was
/// built from if it still exists; `None` elsewhere.
pub fn find_repository() -> Option<PathBuf> {
    let is_repo = |d: &Path| d.join("train/src/lm.rs").is_file() && d.join("Cargo.toml").is_file();
    if let Ok(cwd) = std::env::current_dir() {
        if let Some(d) = cwd.ancestors().find(|d| is_repo(d)) {
            return Some(d.to_path_buf());
        }
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    is_repo(built).then(|| built.to_path_buf())
}

/// Text as bytes, split into a training part and a held-out part (the last tenth).
#[derive(Clone, Debug)]
pub struct TextCorpus {
    bytes: Vec<u8>,
    split: usize,
    files: usize,
}

impl TextCorpus {
    /// A corpus of `bytes` (at least 64).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        if bytes.len() < 64 {
            return Err(Error::invalid(
                "TextCorpus::from_bytes",
                format!("{} bytes of text: need 64 at least", bytes.len()),
            ));
        }
        let split = bytes.len() - bytes.len() / 10;
        Ok(TextCorpus {
            bytes,
            split,
            files: 1,
        })
    }

    /// Every `.rs` and `.md` file under `root` (not under hidden folders or `target`),
    /// concatenated in path order, up to [`MAX_TEXT`] bytes (files past it are not
    /// read): a repository's own sources and docs.
    pub fn from_dir(root: &Path) -> Result<Self> {
        let mut paths = Vec::new();
        collect(root, &mut paths).map_err(|e| {
            Error::invalid("TextCorpus::from_dir", format!("{}: {e}", root.display()))
        })?;
        paths.sort();
        let mut bytes = Vec::new();
        let mut files = 0;
        for p in &paths {
            if bytes.len() >= MAX_TEXT {
                break;
            }
            let b = std::fs::read(p).map_err(|e| {
                Error::invalid("TextCorpus::from_dir", format!("{}: {e}", p.display()))
            })?;
            let room = MAX_TEXT - bytes.len();
            bytes.extend_from_slice(&b[..b.len().min(room)]);
            files += 1;
        }
        let mut c = Self::from_bytes(bytes).map_err(|_| {
            Error::invalid(
                "TextCorpus::from_dir",
                format!("{}: {files} text files, too little text", root.display()),
            )
        })?;
        c.files = files;
        Ok(c)
    }

    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    /// Whether there is no text (never: a corpus has 64 bytes at least).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    /// Files read (1 for [`TextCorpus::from_bytes`]).
    pub fn files(&self) -> usize {
        self.files
    }

    /// The unigram entropy of the training part in nats: `-Σ p(b) ln p(b)` over its
    /// byte frequencies, the cross-entropy of the best model that ignores context.
    pub fn unigram_entropy(&self) -> f64 {
        let mut count = [0u64; VOCAB];
        for &b in &self.bytes[..self.split] {
            count[b as usize] += 1;
        }
        let n = self.split as f64;
        count
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / n;
                -p * p.ln()
            })
            .sum()
    }

    /// Batch `k` of `batch` windows of `context + 1` bytes from the training part (or
    /// the held-out part), at offsets drawn from `seed` and `k`: the inputs (each
    /// window's first `context` bytes, `[batch·context]`) and the targets (the bytes
    /// after them).
    pub fn batch(
        &self,
        seed: u64,
        k: u64,
        batch: usize,
        context: usize,
        held_out: bool,
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        let part = if held_out {
            &self.bytes[self.split..]
        } else {
            &self.bytes[..self.split]
        };
        if part.len() <= context + 1 {
            return Err(Error::invalid(
                "TextCorpus::batch",
                format!("windows of {} bytes in {} bytes", context + 1, part.len()),
            ));
        }
        let mut r = StdRng::seed_from_u64(derive_seed(seed, k));
        let mut x = Vec::with_capacity(batch * context);
        let mut y = Vec::with_capacity(batch * context);
        for _ in 0..batch {
            let at = r.gen_range(0..part.len() - context - 1);
            let w = &part[at..at + context + 1];
            x.extend(w[..context].iter().map(|&b| u32::from(b)));
            y.extend(w[1..].iter().map(|&b| u32::from(b)));
        }
        Ok((x, y))
    }
}

/// The `.rs` and `.md` files under `dir` (recursively; hidden folders and `target`
/// skipped).
fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if e.file_type()?.is_dir() {
            if !name.starts_with('.') && name != "target" {
                collect(&p, out)?;
            }
        } else if name.ends_with(".rs") || name.ends_with(".md") {
            out.push(p);
        }
    }
    Ok(())
}

/// The sizes of a [`CharLm`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CharLmConfig {
    /// Positions per window (`T`).
    pub context: usize,
    /// Model width `D`.
    pub d_model: usize,
    /// Attention heads (dividing `D`).
    pub heads: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
}

impl CharLmConfig {
    /// `layers` blocks of width `d_model` with `heads` heads over `context` positions.
    pub fn new(context: usize, d_model: usize, heads: usize, layers: usize) -> Self {
        CharLmConfig {
            context,
            d_model,
            heads,
            layers,
            dtype: DType::F32,
        }
    }
}

/// What [`CharLm::loss_backward`]'s backward needs from its forward.
#[derive(Clone, Debug)]
pub struct CharLmCtx {
    tok: EmbeddingCtx,
    pos: EmbeddingCtx,
    blocks: Vec<BlockCtx>,
    ln: LayerNormCtx,
    head: LinearCtx,
    batch: usize,
}

/// A character-level (byte-level) causal transformer: see the [module docs](self).
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// use rtx_train::{CharLm, CharLmConfig};
///
/// let rt = Runtime::cpu(1);
/// let lm = CharLm::new(&rt, CharLmConfig::new(8, 16, 2, 1), 1)?;
/// let ids = rt.upload(&[104u32, 105, 33, 10, 104, 105, 33, 10], [1, 8])?;
/// let (logits, _) = lm.forward(&rt, &ids)?;
/// assert_eq!(logits.dims(), &[8, 256]);   // one row of 256 byte logits per position
/// # Ok::<(), rtx_runtime::Error>(())
/// ```
#[derive(Debug)]
pub struct CharLm {
    cfg: CharLmConfig,
    tok: Embedding,
    pos: Embedding,
    /// `0..context` as a `[context]` u32 tensor.
    positions: Tensor,
    blocks: Vec<TransformerBlock>,
    ln: LayerNorm,
    head: Linear,
}

impl CharLm {
    /// A model initialized from `seed` (embeddings and linears as PyTorch's defaults).
    pub fn new(rt: &Runtime, cfg: CharLmConfig, seed: u64) -> Result<Self> {
        if cfg.context == 0 || cfg.layers == 0 {
            return Err(Error::invalid(
                "CharLm::new",
                format!(
                    "context {} and layers {}: both must be at least 1",
                    cfg.context, cfg.layers
                ),
            ));
        }
        let d = cfg.d_model;
        let s = |i| derive_seed(seed, i);
        let blocks = (0..cfg.layers)
            .map(|i| {
                let bc = BlockConfig {
                    dtype: cfg.dtype,
                    ..BlockConfig::new(d, cfg.heads)
                };
                TransformerBlock::new(rt, bc, s(10 + i as u64))
            })
            .collect::<Result<Vec<_>>>()?;
        let pos: Vec<u32> = (0..cfg.context as u32).collect();
        let head = LinearConfig::new(d, VOCAB)
            .act(Activation::None)
            .dtype(cfg.dtype);
        Ok(CharLm {
            cfg,
            tok: Embedding::new(rt, VOCAB, d, cfg.dtype, s(0))?,
            pos: Embedding::new(rt, cfg.context, d, cfg.dtype, s(1))?,
            positions: rt.upload(&pos, [cfg.context])?,
            blocks,
            ln: LayerNorm::new(rt, d, 1e-5, cfg.dtype)?,
            head: Linear::new(rt, head, s(2))?,
        })
    }

    /// The sizes.
    pub fn config(&self) -> &CharLmConfig {
        &self.cfg
    }

    /// The logits `[B·T, 256]` of the next byte at every position of `ids` (`[B, T]`
    /// u32 byte values, `T` = the context), and what the backward needs.
    pub fn forward(&self, rt: &Runtime, ids: &Tensor) -> Result<(Tensor, CharLmCtx)> {
        let t = self.cfg.context;
        if ids.rank() != 2 || ids.dims()[1] != t {
            return Err(Error::invalid_dim(
                "CharLm::forward",
                format!("ids {}: expected [B, {t}]", ids.shape()),
            ));
        }
        let b = ids.dims()[0];
        let (e, tok) = self.tok.forward(rt, ids)?;
        let (p, pos) = self.pos.forward(rt, &self.positions)?;
        let mut h = crate::add(rt, &e, &p)?; // [B, T, D] + [T, D]
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for blk in &self.blocks {
            let (y, c) = blk.forward(rt, &h)?;
            blocks.push(c);
            h = y;
        }
        let (n, ln) = self.ln.forward(rt, &h)?;
        let (logits, head) = self.head.forward(rt, &n)?;
        let rows = b
            .checked_mul(t)
            .ok_or_else(|| Error::invalid("CharLm::forward", "B·T overflows"))?;
        let ctx = CharLmCtx {
            tok,
            pos,
            blocks,
            ln,
            head,
            batch: b,
        };
        Ok((logits.reshape([rows, VOCAB])?, ctx))
    }

    /// Forward, the mean cross-entropy of the next byte over every position against
    /// `targets` (`[B·T]` u32), and the backward of `scale · loss`: stores every
    /// parameter's gradient and returns the loss (`[1]` f32); submissions only.
    pub fn loss_backward(
        &mut self,
        rt: &Runtime,
        ids: &Tensor,
        targets: &Tensor,
        scale: f32,
    ) -> Result<Tensor> {
        let (logits, ctx) = self.forward(rt, ids)?;
        let (loss, dlogits) = loss_and_grad(rt, &logits, targets, scale)?;
        let (b, t) = (ctx.batch, self.cfg.context);
        let d = dlogits.reshape([b, t, VOCAB])?;
        let dn = self.head.backward(rt, &d, &ctx.head)?;
        let mut dh = self.ln.backward(rt, &dn, &ctx.ln)?;
        for (blk, c) in self.blocks.iter_mut().zip(&ctx.blocks).rev() {
            dh = blk.backward(rt, &dh, c)?;
        }
        self.tok.backward(rt, &dh, &ctx.tok)?;
        // The positions' gradient: summed over the batch.
        let dp = rt.run(sum_dim(&dh, 0, false))?;
        self.pos.backward(rt, &dp, &ctx.pos)?;
        Ok(loss)
    }
}

impl Module for CharLm {
    /// Token and position tables, each block's 16 tensors, the final layer norm, the
    /// head.
    fn parameters(&mut self) -> Parameters<'_> {
        let mut p = self.tok.parameters().chain(self.pos.parameters());
        for blk in &mut self.blocks {
            p = p.chain(blk.parameters());
        }
        p.chain(self.ln.parameters()).chain(self.head.parameters())
    }
}

/// What [`train_lm`] does.
#[derive(Clone, Debug)]
pub struct LmRun {
    /// Training steps.
    pub steps: u64,
    /// Windows per batch.
    pub batch: usize,
    /// The loss is read back every this many steps (and after the last).
    pub loss_every: u64,
    /// The optimizer's hyperparameters.
    pub adamw: AdamWConfig,
    /// Seeds the batches' offsets.
    pub seed: u64,
}

/// The losses of a [`train_lm`] run.
#[derive(Clone, Debug, PartialEq)]
pub struct LmReport {
    /// `(step, training loss)` at every read-back (step counts from 1).
    pub losses: Vec<(u64, f32)>,
    /// The mean loss on 4 held-out batches after training.
    pub held_out: f32,
    /// The training text's unigram entropy (nats).
    pub unigram: f64,
}

/// Trains `lm` on `corpus` for `run.steps` steps of AdamW; `progress(step, loss)` is
/// called at each loss read-back. Each step uploads its batch and submits its ops; the
/// loss of step `k` is downloaded asynchronously and read `loss_every` steps later, so
/// the host never waits for the device inside the loop.
pub fn train_lm(
    rt: &Runtime,
    lm: &mut CharLm,
    corpus: &TextCorpus,
    run: &LmRun,
    mut progress: impl FnMut(u64, f32),
) -> Result<LmReport> {
    let t = lm.config().context;
    let mut opt = AdamW::new(run.adamw);
    let mut pending: std::collections::VecDeque<(u64, Submission<Vec<f32>>)> = Default::default();
    let mut losses = Vec::new();
    let every = run.loss_every.max(1);
    let mut read = |pending: &mut std::collections::VecDeque<(u64, Submission<Vec<f32>>)>,
                    all: bool|
     -> Result<()> {
        while pending.len() > usize::from(!all) {
            let (k, s) = pending.pop_front().expect("non-empty");
            let l = s.wait()?.first().copied().unwrap_or(f32::NAN);
            progress(k, l);
            losses.push((k, l));
        }
        Ok(())
    };
    for k in 1..=run.steps {
        let (x, y) = corpus.batch(run.seed, k, run.batch, t, false)?;
        let ids = rt.upload_vec(x, [run.batch, t])?;
        let targets = rt.upload_vec(y, [run.batch * t])?;
        let loss = lm.loss_backward(rt, &ids, &targets, 1.0)?;
        opt.step(rt, lm.parameters())?;
        if k % every == 0 || k == run.steps {
            pending.push_back((k, rt.to_vec::<f32>(&loss)?));
            read(&mut pending, false)?;
        }
    }
    read(&mut pending, true)?;
    // Held out: 4 batches, forward and loss only.
    let mut held = 0.0f32;
    for k in 0..4 {
        let (x, y) = corpus.batch(run.seed ^ 0x5eed, k, run.batch, t, true)?;
        let ids = rt.upload_vec(x, [run.batch, t])?;
        let targets = rt.upload_vec(y, [run.batch * t])?;
        let (logits, _) = lm.forward(rt, &ids)?;
        let ce = rt.run(rtx_ops::cross_entropy(&logits, &targets))?;
        held += rt
            .to_vec::<f32>(&ce.loss)?
            .wait()?
            .first()
            .copied()
            .unwrap_or(f32::NAN)
            / 4.0;
    }
    Ok(LmReport {
        losses,
        held_out: held,
        unigram: corpus.unigram_entropy(),
    })
}
