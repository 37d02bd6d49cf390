//! Random DAGs over every op family, for `tests/stress.rs` and the cancellation tests.
//!
//! Every value of a DAG is an `[R, C]` f32 tensor; a node reads one to three earlier
//! values and produces one, through one to six ops of a family (a family whose result
//! has another shape or dtype is brought back to `[R, C]` f32 by the ops of the same
//! node: an attention node casts to f16, attends and casts back). Values stay bounded
//! (no `exp`, scaled weights, `tanh` before every cast to f16) so a DAG of a few dozen
//! nodes never overflows, and the reference comparison is by the norm.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rtx::ops::{self, elementwise as ew, Conv2dOpts};
use rtx::{DType, Op, Runtime, Tensor};

/// Rows of every value.
pub const R: usize = 8;
/// Columns of every value (64: a head dimension the CUDA attention kernels take).
pub const C: usize = 64;
/// Random leaves of a DAG.
pub const LEAVES: usize = 3;
/// Op families a node draws from.
pub const FAMILIES: usize = 16;

/// The family names, by node kind (for the per-family counts).
pub const FAMILY: [&str; FAMILIES] = [
    "elementwise",
    "elementwise-unary",
    "reduce",
    "softmax",
    "gemm",
    "conv",
    "attention",
    "activation",
    "convert",
    "loss",
    "norm",
    "compare",
    "random",
    "optim",
    "layout",
    "embedding",
];

/// One node: its family, the earlier values it reads and a variant number.
#[derive(Clone, Copy, Debug)]
pub struct Node {
    /// Index into [`FAMILY`].
    pub kind: u8,
    /// Earlier values (leaves first, then nodes) it reads.
    pub a: usize,
    /// A second earlier value.
    pub b: usize,
    /// A variant within the family.
    pub v: u8,
}

/// A DAG with the data of its leaves and parameters.
#[derive(Clone, Debug)]
pub struct Dag {
    /// Seed of the DAG (its leaves, parameters and random ops).
    pub seed: u64,
    /// The nodes, in submission order.
    pub nodes: Vec<Node>,
    leaves: Vec<Vec<f32>>,
    w: Vec<f32>,
    conv_w: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    labels: Vec<u32>,
    ids: Vec<u32>,
}

fn rand_vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
        .collect()
}

impl Dag {
    /// A random DAG of `nodes` nodes from `seed`.
    pub fn random(seed: u64, nodes: usize) -> Dag {
        let mut rng = StdRng::seed_from_u64(seed);
        let nodes = (0..nodes)
            .map(|i| {
                let avail = LEAVES + i;
                // Mostly recent values, so chains get deep.
                let pick = |rng: &mut StdRng| {
                    if rng.gen_bool(0.5) {
                        avail - 1 - rng.gen_range(0..avail.min(4))
                    } else {
                        rng.gen_range(0..avail)
                    }
                };
                Node {
                    kind: rng.gen_range(0..FAMILIES as u8),
                    a: pick(&mut rng),
                    b: pick(&mut rng),
                    v: rng.gen_range(0..4),
                }
            })
            .collect();
        Dag {
            seed,
            nodes,
            leaves: (0..LEAVES)
                .map(|_| rand_vec(&mut rng, R * C, 1.0))
                .collect(),
            w: rand_vec(&mut rng, C * C, 1.0 / 8.0),
            conv_w: rand_vec(&mut rng, 4 * 4 * 3 * 3, 1.0 / 6.0),
            gamma: rand_vec(&mut rng, C, 1.0),
            beta: rand_vec(&mut rng, C, 0.5),
            labels: (0..R).map(|_| rng.gen_range(0..C as u32)).collect(),
            ids: (0..R).map(|_| rng.gen_range(0..R as u32)).collect(),
        }
    }

    /// How many ops the DAG submits (without the uploads and downloads).
    pub fn ops(&self) -> usize {
        self.nodes.iter().map(ops_of).sum()
    }
}

/// Ops a node submits.
pub fn ops_of(n: &Node) -> usize {
    match n.kind {
        0 | 1 | 3 | 4 | 10 | 12 | 15 => 1,
        2 | 5 | 7 | 9 | 11 => 2,
        8 => 2 + (n.v % 2) as usize,
        13 | 14 => 3,
        6 => 6,
        _ => unreachable!(),
    }
}

/// How a DAG is submitted: blocking `submit` or `submit_async(..).await`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `rt.submit(op)`, blocking on a full mailbox.
    Blocking,
    /// `rt.submit_async(op).await`.
    Async,
}

async fn sub<O: Op>(rt: &Runtime, mode: Mode, op: O) -> rtx::Submission<O::Output> {
    let name = op.name();
    let r = match mode {
        Mode::Blocking => rt.submit(op),
        Mode::Async => rt.submit_async(op).await,
    };
    match r {
        Ok(s) => s,
        Err(e) => panic!("submit of {name} refused: {}", e.error),
    }
}

macro_rules! out {
    ($rt:expr, $mode:expr, $op:expr) => {
        sub($rt, $mode, $op).await.outputs().unwrap().clone()
    };
}

/// The tensors of a DAG submitted to `rt` (leaves and parameters uploaded first); every
/// op is submitted without waiting for any other.
pub async fn submit(rt: &Runtime, dag: &Dag, mode: Mode) -> Vec<Tensor> {
    let up = |v: &[f32], dims: Vec<usize>| rt.upload(v, dims).unwrap();
    let mut t: Vec<Tensor> = dag.leaves.iter().map(|l| up(l, vec![R, C])).collect();
    let w = up(&dag.w, vec![C, C]);
    let conv_w = up(&dag.conv_w, vec![4, 4, 3, 3]);
    let gamma = up(&dag.gamma, vec![C]);
    let beta = up(&dag.beta, vec![C]);
    let labels = rt.upload(&dag.labels, [R]).unwrap();
    let ids = rt.upload(&dag.ids, [R]).unwrap();
    for (i, n) in dag.nodes.iter().enumerate() {
        let (a, b) = (t[n.a].clone(), t[n.b].clone());
        let m = mode;
        let y: Tensor = match n.kind {
            0 => out!(
                rt,
                m,
                match n.v {
                    0 => ew::add(&a, &b),
                    1 => ew::sub(&a, &b),
                    2 => ew::maximum(&a, &b),
                    _ => ew::minimum(&a, &b),
                }
            ),
            1 => out!(
                rt,
                m,
                match n.v {
                    0 => ew::neg(&a),
                    1 => ew::sin(&a),
                    2 => ew::cos(&a),
                    _ => ew::abs(&a),
                }
            ),
            2 => {
                let r = if n.v % 2 == 0 {
                    out!(rt, m, ops::mean_dim(&a, 1, true))
                } else {
                    out!(rt, m, ops::max_dim(&a, 1, true))
                };
                out!(rt, m, ew::sub(&a, &r))
            }
            3 => out!(rt, m, ops::softmax(&a)),
            4 => out!(rt, m, ops::matmul(&a, &w)),
            5 => {
                let x = a.reshape([2, 4, 8, 8]).unwrap();
                let y = out!(
                    rt,
                    m,
                    ops::conv2d(&x, &conv_w, Conv2dOpts::default().pad(1))
                );
                let y = y.reshape([R, C]).unwrap();
                out!(rt, m, ew::add(&y, &b))
            }
            6 => {
                let q = out!(rt, m, ops::tanh(&a));
                let k = out!(rt, m, ops::tanh(&b));
                let q = out!(rt, m, ops::cast(&q, DType::F16));
                let k = out!(rt, m, ops::cast(&k, DType::F16));
                let (q, k) = (
                    q.reshape([1, 2, 4, C]).unwrap(),
                    k.reshape([1, 2, 4, C]).unwrap(),
                );
                let o = sub(rt, m, ops::attention(&q, &k, &k).causal(n.v % 2 == 1))
                    .await
                    .outputs()
                    .unwrap()
                    .0
                    .clone();
                out!(rt, m, ops::cast(&o.reshape([R, C]).unwrap(), DType::F32))
            }
            7 => {
                let f = match n.v {
                    0 => out!(rt, m, ops::tanh(&a)),
                    1 => out!(rt, m, ops::sigmoid(&a)),
                    2 => out!(rt, m, ops::gelu(&a)),
                    _ => out!(rt, m, ops::silu(&a)),
                };
                match n.v {
                    0 => out!(rt, m, ops::tanh_backward(&b, &f)),
                    1 => out!(rt, m, ops::sigmoid_backward(&b, &f)),
                    2 => out!(rt, m, ops::gelu_backward(&b, &a)),
                    _ => out!(rt, m, ops::mul_scalar(&f, 0.5)),
                }
            }
            8 => {
                let to = if n.v % 2 == 0 {
                    DType::BF16
                } else {
                    DType::F16
                };
                let x = if to == DType::F16 {
                    // f16 holds up to 65504: bound the values first.
                    out!(rt, m, ops::softmax(&a))
                } else {
                    a.clone()
                };
                let h = out!(rt, m, ops::cast(&x, to));
                out!(rt, m, ops::cast(&h, DType::F32))
            }
            9 => {
                let ce = sub(rt, m, ops::cross_entropy(&a, &labels)).await;
                let lse = ce.outputs().unwrap().lse.clone();
                out!(rt, m, ops::cross_entropy_backward(&a, &labels, &lse, 4.0))
            }
            10 => {
                let (y, _, _) = sub(rt, m, ops::layer_norm(&a, &gamma, &beta, 1e-5))
                    .await
                    .outputs()
                    .unwrap()
                    .clone();
                y
            }
            11 => {
                let mask = if n.v % 2 == 0 {
                    out!(rt, m, ops::gt(&a, &b))
                } else {
                    out!(rt, m, ops::lt(&a, &b))
                };
                out!(rt, m, ops::where_(&mask, &a, &b))
            }
            12 => out!(
                rt,
                m,
                if n.v % 2 == 0 {
                    ops::uniform([R, C], DType::F32, -1.0, 1.0, dag.seed, i as u64 * 4096)
                } else {
                    ops::normal([R, C], DType::F32, 0.0, 1.0, dag.seed, i as u64 * 4096)
                }
            ),
            13 => {
                let mom = out!(rt, m, ops::zeros([R, C], DType::F32));
                let var = out!(rt, m, ops::zeros([R, C], DType::F32));
                let cfg = ops::optim::AdamW {
                    lr: 0.1,
                    ..Default::default()
                };
                let s = sub(
                    rt,
                    m,
                    ops::adamw(cfg, 1, vec![a], &[b], vec![mom], vec![var]),
                )
                .await;
                s.outputs().unwrap()[0].clone()
            }
            14 => {
                let l = out!(rt, m, ops::narrow(&a, 1, 0, C / 2));
                let r = out!(rt, m, ops::narrow(&b, -1, C / 2, C / 2));
                if n.v % 2 == 0 {
                    out!(rt, m, ops::concat(&[l, r], 1))
                } else {
                    out!(rt, m, ops::concat(&[r, l], -1))
                }
            }
            15 => {
                let (y, _) = sub(rt, m, ops::embedding(&a, &ids))
                    .await
                    .outputs()
                    .unwrap()
                    .clone();
                y
            }
            k => unreachable!("kind {k}"),
        };
        assert_eq!(y.dims(), [R, C], "node {i} ({})", FAMILY[n.kind as usize]);
        assert_eq!(y.dtype(), DType::F32, "node {i}");
        t.push(y);
    }
    t.split_off(LEAVES)
}

/// Submits the DAG and downloads every node's value.
pub async fn run(rt: &Runtime, dag: &Dag, mode: Mode) -> Vec<Vec<f32>> {
    let nodes = submit(rt, dag, mode).await;
    let subs: Vec<_> = nodes.iter().map(|x| rt.to_vec::<f32>(x).unwrap()).collect();
    let mut out = Vec::with_capacity(subs.len());
    for s in subs {
        out.push(s.await.unwrap_or_else(|e| panic!("DAG {}: {e}", dag.seed)));
    }
    out
}

/// ‖a − b‖ / ‖b‖ over the finite elements of `b` (non-finite ones must agree), and
/// whether the two are bitwise equal.
pub fn compare(a: &[f32], b: &[f32]) -> (f64, bool) {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den, mut bits) = (0.0f64, 0.0f64, true);
    for (&x, &y) in a.iter().zip(b) {
        bits &= x.to_bits() == y.to_bits();
        if y.is_finite() {
            num += (x as f64 - y as f64).powi(2);
            den += (y as f64).powi(2);
        } else if !(x.is_nan() && y.is_nan()) && x != y {
            return (f64::INFINITY, false);
        }
    }
    let rel = if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    };
    (rel, bits)
}

/// A seed for a stress run: `RTX_STRESS_SEED` or a fresh one.
pub fn seed() -> u64 {
    std::env::var("RTX_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// The process's thread count (`Threads:` of `/proc/self/status`; 0 where absent).
pub fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:").map(|v| v.trim().parse().ok()))
                .flatten()
        })
        .unwrap_or(0)
}

/// The process's resident set in KiB (`VmRSS:`; 0 where absent).
pub fn rss_kib() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| {
                    l.strip_prefix("VmRSS:")
                        .map(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                })
                .flatten()
        })
        .unwrap_or(0)
}

/// Waits up to 10 s for the thread count to fall to `baseline`; returns the last count.
pub fn settle_threads(baseline: usize) -> usize {
    let t0 = std::time::Instant::now();
    loop {
        let n = threads();
        if n <= baseline || t0.elapsed() > std::time::Duration::from_secs(10) {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs 40 DAGs on an 8-stream runtime of `backend` and drops it: the threads that stay
/// for the process (the rayon pool of the CPU ops, the CUDA driver's) exist before a
/// baseline thread count is read.
pub fn warm_up(backend: &rtx::Backend) {
    let rt = Runtime::builder()
        .backend(backend.clone())
        .streams(8)
        .build()
        .unwrap();
    // Enough DAGs that every family runs once: its modules, library handles' kernels
    // and plans load into the device context here, before the baseline is read (that
    // is per-process state, not memory the stress may leak).
    for seed in 1..=40 {
        rtx::block_on(run(&rt, &Dag::random(seed, 24), Mode::Blocking));
    }
    drop(rt);
    std::thread::sleep(std::time::Duration::from_millis(100));
}

/// The names of the process's threads (`/proc/self/task/*/comm`), for a failure message.
pub fn thread_names() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                .map(|s| s.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
