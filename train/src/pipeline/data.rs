//! Data sources: a dataset in host memory, cut into batches, and the synthetic
//! classification task of the sweep (a fixed random teacher network labels random
//! inputs).

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::init::derive_seed;

/// A labelled dataset in host memory: `n` rows of `dim` f32 features and a `u32` class
/// per row.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Features, row-major `[n, dim]`.
    pub x: Vec<f32>,
    /// Labels, `[n]`, each below `classes`.
    pub y: Vec<u32>,
    /// Features per row.
    pub dim: usize,
    /// Number of classes.
    pub classes: usize,
}

impl Dataset {
    /// Rows.
    pub fn len(&self) -> usize {
        self.y.len()
    }
    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }
}

/// Where a pipeline's batches come from: batch `k` (0, 1, 2, ...) as host slices of
/// `batch` rows, features then labels. Implementations must be deterministic in `k`.
pub trait DataSource: Send {
    /// Features per row.
    fn dim(&self) -> usize;
    /// Classes.
    fn classes(&self) -> usize;
    /// Rows per batch.
    fn batch(&self) -> usize;
    /// Batch `k`: `batch * dim` features and `batch` labels.
    fn get(&self, k: u64) -> (&[f32], &[u32]);
    /// `Some(p)` when batch `k + p` always equals batch `k` (an epoch of `p` batches),
    /// which lets a pipeline keep the batches on the device after their first upload
    /// ([`PipelineConfig::resident`](super::PipelineConfig::resident)). `None` (the
    /// default): batches never repeat.
    fn period(&self) -> Option<u64> {
        None
    }
}

/// Consecutive batches of a shared [`Dataset`], cycling (batch `k` starts at row
/// `(k * batch) mod rows`, rows taken in order without wrapping inside a batch).
#[derive(Clone, Debug)]
pub struct Batches {
    data: Arc<Dataset>,
    batch: usize,
    per_epoch: usize,
}

impl Batches {
    /// Batches of `batch` rows of `data`; `None` unless `1 <= batch <= rows`.
    pub fn new(data: Arc<Dataset>, batch: usize) -> Option<Self> {
        if batch == 0 || batch > data.len() {
            return None;
        }
        let per_epoch = data.len() / batch;
        Some(Batches {
            data,
            batch,
            per_epoch,
        })
    }
}

impl DataSource for Batches {
    fn dim(&self) -> usize {
        self.data.dim
    }
    fn classes(&self) -> usize {
        self.data.classes
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn period(&self) -> Option<u64> {
        Some(self.per_epoch as u64)
    }
    fn get(&self, k: u64) -> (&[f32], &[u32]) {
        let i = (k % self.per_epoch as u64) as usize * self.batch;
        let d = self.data.dim;
        (
            &self.data.x[i * d..(i + self.batch) * d],
            &self.data.y[i..i + self.batch],
        )
    }
}

/// The synthetic task: inputs uniform in [-1, 1)^dim; the label of an input is the
/// argmax of a fixed random teacher MLP (`dim → hidden → classes`, tanh), replaced with
/// probability `noise` by a uniformly random class. The teacher's own accuracy on the
/// noisy labels bounds what a student can reach ([`Task::teacher_accuracy`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TeacherTask {
    /// Input features.
    pub dim: usize,
    /// Teacher hidden width.
    pub hidden: usize,
    /// Classes.
    pub classes: usize,
    /// Label noise probability, in [0, 1].
    pub noise: f64,
    /// The seed of the teacher's weights and of the data.
    pub seed: u64,
}

/// A generated task: training and evaluation sets and the teacher's accuracy on each.
#[derive(Clone, Debug)]
pub struct Task {
    /// Training rows.
    pub train: Arc<Dataset>,
    /// Held-out rows (drawn after the training rows, same distribution).
    pub eval: Arc<Dataset>,
    /// The fraction of evaluation labels equal to the teacher's noiseless argmax: the
    /// best accuracy any model can expect.
    pub teacher_accuracy: f64,
}

impl TeacherTask {
    /// Generates `train` training rows and `eval` evaluation rows.
    pub fn generate(&self, train: usize, eval: usize) -> Task {
        let mut wr = StdRng::seed_from_u64(derive_seed(self.seed, 0));
        let b1 = (3.0 / self.dim as f64).sqrt();
        let w1: Vec<f64> = (0..self.hidden * self.dim)
            .map(|_| wr.gen_range(-b1..b1))
            .collect();
        let b2 = (3.0 / self.hidden as f64).sqrt();
        let w2: Vec<f64> = (0..self.classes * self.hidden)
            .map(|_| wr.gen_range(-b2..b2))
            .collect();
        let mut dr = StdRng::seed_from_u64(derive_seed(self.seed, 1));
        let mut make = |n: usize| {
            let mut x = Vec::with_capacity(n * self.dim);
            let mut y = Vec::with_capacity(n);
            let mut agree = 0usize;
            let mut h = vec![0.0f64; self.hidden];
            for _ in 0..n {
                let row: Vec<f32> = (0..self.dim).map(|_| dr.gen_range(-1.0f32..1.0)).collect();
                for (j, hj) in h.iter_mut().enumerate() {
                    let w = &w1[j * self.dim..(j + 1) * self.dim];
                    *hj = w
                        .iter()
                        .zip(&row)
                        .map(|(a, b)| a * f64::from(*b))
                        .sum::<f64>()
                        .tanh();
                }
                let best = (0..self.classes)
                    .map(|c| {
                        let w = &w2[c * self.hidden..(c + 1) * self.hidden];
                        w.iter().zip(&h).map(|(a, b)| a * b).sum::<f64>()
                    })
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .map_or(0, |(c, _)| c as u32);
                let label = if dr.gen_bool(self.noise.clamp(0.0, 1.0)) {
                    dr.gen_range(0..self.classes as u32)
                } else {
                    best
                };
                agree += usize::from(label == best);
                x.extend(row);
                y.push(label);
            }
            let ds = Dataset {
                x,
                y,
                dim: self.dim,
                classes: self.classes,
            };
            (ds, agree as f64 / n.max(1) as f64)
        };
        let (tr, _) = make(train);
        let (ev, acc) = make(eval);
        Task {
            train: Arc::new(tr),
            eval: Arc::new(ev),
            teacher_accuracy: acc,
        }
    }
}
