//! Random DAGs of ops spread over 4 streams give exactly the 1-stream result, on every
//! backend present. Cross-stream dependencies (ready events on CUDA, completion flags on
//! the CPU) are exercised by the round-robin placement of dependent ops.

mod common;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rtx::ops::elementwise as ew;
use rtx::scheduler::RoundRobin;
use rtx::{Backend, Runtime, Tensor};

/// Runtimes to compare: (label, 1-stream runtime, 4-stream runtime).
fn backends() -> Vec<(String, Runtime, Runtime)> {
    let mut v = vec![(
        "cpu".to_string(),
        Runtime::builder()
            .backend(Backend::Cpu)
            .streams(1)
            .build()
            .unwrap(),
        Runtime::builder()
            .backend(Backend::Cpu)
            .streams(4)
            .policy(RoundRobin::default())
            .build()
            .unwrap(),
    )];
    if common::cuda_present() {
        v.push((
            "cuda".to_string(),
            Runtime::builder()
                .backend(Backend::Cuda(vec![]))
                .streams(1)
                .build()
                .unwrap(),
            Runtime::builder()
                .backend(Backend::Cuda(vec![]))
                .streams(4)
                .policy(RoundRobin::default())
                .build()
                .unwrap(),
        ));
    }
    v
}

#[derive(Clone, Copy, Debug)]
enum Node {
    Bin(usize, usize, u8),
    Un(usize, u8),
}

/// A random DAG over `inputs` leaves: each node reads one or two earlier nodes.
fn random_dag(rng: &mut StdRng, inputs: usize, nodes: usize) -> Vec<Node> {
    (0..nodes)
        .map(|i| {
            let avail = inputs + i;
            if rng.gen_bool(0.6) {
                Node::Bin(
                    rng.gen_range(0..avail),
                    rng.gen_range(0..avail),
                    rng.gen_range(0..5),
                )
            } else {
                Node::Un(rng.gen_range(0..avail), rng.gen_range(0..4))
            }
        })
        .collect()
}

/// Submits the DAG (without waiting in between) and downloads every node.
fn run(rt: &Runtime, leaves: &[Vec<f32>], n: usize, dag: &[Node]) -> Vec<Vec<f32>> {
    let mut t: Vec<Tensor> = leaves.iter().map(|l| rt.upload(l, [n]).unwrap()).collect();
    for node in dag {
        let op_out = match *node {
            Node::Bin(a, b, k) => {
                let (a, b) = (&t[a], &t[b]);
                let op = match k {
                    0 => ew::add(a, b),
                    1 => ew::sub(a, b),
                    2 => ew::mul(a, b),
                    3 => ew::maximum(a, b),
                    _ => ew::minimum(a, b),
                };
                rt.submit(op).unwrap().outputs().unwrap().clone()
            }
            Node::Un(a, k) => {
                let a = &t[a];
                let op = match k {
                    0 => ew::neg(a),
                    1 => ew::relu(a),
                    2 => ew::sin(a),
                    _ => ew::cos(a),
                };
                rt.submit(op).unwrap().outputs().unwrap().clone()
            }
        };
        t.push(op_out);
    }
    let subs: Vec<_> = t[leaves.len()..]
        .iter()
        .map(|x| rt.to_vec::<f32>(x).unwrap())
        .collect();
    subs.into_iter().map(|s| s.wait().unwrap()).collect()
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

#[test]
fn random_dags_on_4_streams_equal_1_stream() {
    let seed: u64 = rand::random();
    let mut rng = StdRng::seed_from_u64(seed);
    // Under compute-sanitizer (`RTX_UNDER_SANITIZER`, set by `benches/gpu/run sanitize`)
    // 100 DAGs: the same kernels and stream crossings at a tenth of the instrumented time.
    let dags = if std::env::var_os("RTX_UNDER_SANITIZER").is_some() {
        100
    } else {
        1000
    };
    for (label, one, four) in backends() {
        let mut ops = 0usize;
        for d in 0..dags {
            let n = rng.gen_range(1..200);
            let leaves: Vec<Vec<f32>> = (0..3)
                .map(|_| (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect())
                .collect();
            let len = rng.gen_range(4..16);
            let dag = random_dag(&mut rng, 3, len);
            let r1 = run(&one, &leaves, n, &dag);
            let r4 = run(&four, &leaves, n, &dag);
            ops += dag.len();
            for (i, (x, y)) in r1.iter().zip(&r4).enumerate() {
                assert!(
                    same(x, y),
                    "{label}: DAG {d} node {i} differs (seed {seed}): {dag:?}"
                );
            }
            // The 1-stream result is also right: check the last node against the host.
            let mut host: Vec<Vec<f32>> = leaves.clone();
            for node in &dag {
                let v: Vec<f32> = match *node {
                    Node::Bin(a, b, k) => host[a]
                        .iter()
                        .zip(&host[b])
                        .map(|(&x, &y)| match k {
                            0 => x + y,
                            1 => x - y,
                            2 => x * y,
                            3 => {
                                if x.is_nan() || y.is_nan() {
                                    f32::NAN
                                } else {
                                    x.max(y)
                                }
                            }
                            _ => {
                                if x.is_nan() || y.is_nan() {
                                    f32::NAN
                                } else {
                                    x.min(y)
                                }
                            }
                        })
                        .collect(),
                    Node::Un(a, k) => host[a]
                        .iter()
                        .map(|&x| match k {
                            0 => -x,
                            1 => {
                                if x < 0.0 {
                                    0.0
                                } else {
                                    x
                                }
                            }
                            2 => x.sin(),
                            _ => x.cos(),
                        })
                        .collect(),
                };
                host.push(v);
            }
            let last = host.last().unwrap();
            let got = r1.last().unwrap();
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for (&x, &y) in got.iter().zip(last) {
                if y.is_finite() {
                    num += ((x - y) as f64).powi(2);
                    den += (y as f64).powi(2);
                } else {
                    assert!(
                        x.is_nan() == y.is_nan(),
                        "{label}: DAG {d}: {x} vs host {y} (seed {seed})"
                    );
                }
            }
            let rel = (num / den.max(1e-30)).sqrt();
            let tol = if label == "cpu" { 1e-6 } else { 1e-3 };
            assert!(
                rel <= tol,
                "{label}: DAG {d}: relative error {rel} vs the host (seed {seed})"
            );
        }
        eprintln!("{label}: {dags} DAGs, {ops} ops, 4 streams == 1 stream");
    }
}
