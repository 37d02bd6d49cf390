//! Graphs (`Runtime::capture`): replays equal eager execution over many launches with
//! changing inputs, on every backend (CUDA when a device is present: there bit-equal,
//! since a replay runs the same kernels with the same plans on the same data);
//! capture-unsafe submissions fail with `Error::NotCapturable` and leave the runtime
//! usable; outputs read from a launch are owned and survive later launches.

mod common;

use common::{check, f64s, rand_vec, rng};
use rtx_ops as ops;
use rtx_runtime::{
    CaptureHazard, DType, Error, ExecCx, Op, Plan, PlanCx, Runtime, Tensor, TensorSpec,
};

const M: usize = 8;
const K: usize = 32;

/// The chain every test captures: `relu(x·w) + x`, then squared.
fn chain_eager(rt: &Runtime, x: &Tensor, w: &Tensor) -> Tensor {
    let h = rt.submit(ops::matmul(x, w)).unwrap().wait().unwrap();
    let r = rt.submit(ops::relu(&h)).unwrap().wait().unwrap();
    let o = rt.submit(ops::add(&r, x)).unwrap().wait().unwrap();
    rt.submit(ops::mul(&o, &o)).unwrap().wait().unwrap()
}

fn chain_ref(x: &[f64], w: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; M * K];
    for i in 0..M {
        for j in 0..K {
            let h: f64 = (0..K).map(|k| x[i * K + k] * w[k * K + j]).sum();
            let o = h.max(0.0) + x[i * K + j];
            out[i * K + j] = o * o;
        }
    }
    out
}

fn down(rt: &Runtime, t: &Tensor) -> Vec<f32> {
    rt.to_vec::<f32>(t).unwrap().wait().unwrap()
}

backend_test!(a_replay_equals_eager_over_many_launches, |rt, label| {
    let (seed, mut g) = rng();
    let w_h: Vec<f32> = rand_vec(&mut g, K * K, -0.3, 0.3);
    let w = rt.upload(&w_h, [K, K]).unwrap();
    let x0 = rt
        .upload(&rand_vec::<f32>(&mut g, M * K, -1.0, 1.0), [M, K])
        .unwrap();
    let mut graph = rt
        .capture(|c| {
            let x = c.input(&x0)?;
            let h = c.submit(ops::matmul(&x, &w))?;
            let r = c.submit(ops::relu(&h))?;
            let o = c.submit(ops::add(&r, &x))?;
            let y = c.submit(ops::mul(&o, &o))?;
            c.output(&y)?;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{label}: capture failed: {e}"));
    assert_eq!(graph.outputs(), [TensorSpec::new(vec![M, K], DType::F32)]);
    for launch in 0..40 {
        let x_h: Vec<f32> = rand_vec(&mut g, M * K, -1.0, 1.0);
        let x = rt.upload(&x_h, [M, K]).unwrap();
        let got = graph.launch(&[&x]).unwrap().to_vec::<f32>(0).unwrap();
        let want = down(rt, &chain_eager(rt, &x, &w));
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{label}: launch {launch} differs from eager (seed {seed})"
        );
        if launch % 10 == 0 {
            let reference = chain_ref(&f64s(&x_h), &f64s(&w_h));
            check::<f32>(&f64s(&got), &reference, label, seed);
        }
    }
    assert_eq!(graph.launches(), 40);
});

backend_test!(
    a_graph_over_several_streams_joins_them_and_equals_eager,
    |rt, label| {
        let (seed, mut g) = rng();
        let w = rt
            .upload(&rand_vec::<f32>(&mut g, K * K, -0.3, 0.3), [K, K])
            .unwrap();
        let xs0: Vec<Tensor> = (0..4)
            .map(|_| {
                rt.upload(&rand_vec::<f32>(&mut g, M * K, -1.0, 1.0), [M, K])
                    .unwrap()
            })
            .collect();
        let mut graph = rt
            .capture(|c| {
                let streams = c.streams().to_vec();
                let mut ends = Vec::new();
                for (i, x0) in xs0.iter().enumerate() {
                    let s = streams[i % streams.len()];
                    let x = c.input(x0)?;
                    let h = c.submit_on(s, ops::matmul(&x, &w))?;
                    let r = c.submit_on(s, ops::relu(&h))?;
                    ends.push(c.submit_on(s, ops::add(&r, &x))?);
                }
                // The join reads every stream's chain: cross-stream edges.
                let a = c.submit_on(streams[0], ops::add(&ends[0], &ends[1]))?;
                let b = c.submit_on(streams[streams.len() - 1], ops::add(&ends[2], &ends[3]))?;
                let y = c.submit_on(streams[0], ops::mul(&a, &b))?;
                c.output(&y)?;
                c.output(&b)?;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{label}: capture failed: {e}"));
        if rt.compute_streams(rt.device()).len() > 1 {
            assert!(
                graph.segments() > 1,
                "{label}: one segment per stream at least"
            );
        }
        for launch in 0..15 {
            let xs: Vec<Tensor> = (0..4)
                .map(|_| {
                    rt.upload(&rand_vec::<f32>(&mut g, M * K, -1.0, 1.0), [M, K])
                        .unwrap()
                })
                .collect();
            let refs: Vec<&Tensor> = xs.iter().collect();
            let mut l = graph.launch(&refs).unwrap();
            let (y, b) = (l.to_vec::<f32>(0).unwrap(), l.to_vec::<f32>(1).unwrap());
            let ends: Vec<Tensor> = xs
                .iter()
                .map(|x| {
                    let h = rt.submit(ops::matmul(x, &w)).unwrap().wait().unwrap();
                    let r = rt.submit(ops::relu(&h)).unwrap().wait().unwrap();
                    rt.submit(ops::add(&r, x)).unwrap().wait().unwrap()
                })
                .collect();
            let a_e = rt
                .submit(ops::add(&ends[0], &ends[1]))
                .unwrap()
                .wait()
                .unwrap();
            let b_e = rt
                .submit(ops::add(&ends[2], &ends[3]))
                .unwrap()
                .wait()
                .unwrap();
            let y_e = rt.submit(ops::mul(&a_e, &b_e)).unwrap().wait().unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&y),
                bits(&down(rt, &y_e)),
                "{label}: launch {launch} (seed {seed})"
            );
            assert_eq!(
                bits(&b),
                bits(&down(rt, &b_e)),
                "{label}: launch {launch} (seed {seed})"
            );
        }
    }
);

backend_test!(
    outputs_read_from_a_launch_survive_later_launches,
    |rt, label| {
        let (seed, mut g) = rng();
        let w = rt
            .upload(&rand_vec::<f32>(&mut g, K * K, -0.3, 0.3), [K, K])
            .unwrap();
        let x0 = rt
            .upload(&rand_vec::<f32>(&mut g, M * K, -1.0, 1.0), [M, K])
            .unwrap();
        let mut graph = rt
            .capture(|c| {
                let x = c.input(&x0)?;
                let y = c.submit(ops::matmul(&x, &w))?;
                c.output(&y)?;
                Ok(())
            })
            .unwrap();
        let mut kept = Vec::new();
        let mut inputs = Vec::new();
        for _ in 0..5 {
            let x = rt
                .upload(&rand_vec::<f32>(&mut g, M * K, -1.0, 1.0), [M, K])
                .unwrap();
            kept.push(graph.launch(&[&x]).unwrap().output(0).unwrap());
            inputs.push(x);
        }
        for (t, x) in kept.iter().zip(&inputs) {
            let want = rt.submit(ops::matmul(x, &w)).unwrap().wait().unwrap();
            assert_eq!(down(rt, t), down(rt, &want), "{label} (seed {seed})");
        }
    }
);

/// An op that declares it synchronizes with the host.
struct Syncs(Tensor);

impl Op for Syncs {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "syncs"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _cx: &PlanCx) -> rtx_runtime::Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, _cx: &mut ExecCx<'_>) -> rtx_runtime::Result<()> {
        Err(Error::invalid("syncs", "never run in these tests"))
    }
    fn capture_hazard(&self) -> Option<CaptureHazard> {
        Some(CaptureHazard::HostSync)
    }
}

/// An op that panics when run.
struct Panics(Tensor);

impl Op for Panics {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "panics"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _cx: &PlanCx) -> rtx_runtime::Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, _cx: &mut ExecCx<'_>) -> rtx_runtime::Result<()> {
        panic!("planted panic")
    }
}

/// After a failed capture the runtime runs eager ops and captures again.
fn still_usable(rt: &Runtime, label: &str) {
    let x = rt.upload(&[1.0f32, -2.0, 3.0], [3]).unwrap();
    let y = rt.submit(ops::relu(&x)).unwrap().wait().unwrap();
    assert_eq!(down(rt, &y), [1.0, 0.0, 3.0], "{label}");
    let mut graph = rt
        .capture(|c| {
            let xi = c.input(&x)?;
            let y = c.submit(ops::relu(&xi))?;
            c.output(&y)?;
            Ok(())
        })
        .unwrap();
    let x2 = rt.upload(&[-1.0f32, 5.0, -3.0], [3]).unwrap();
    let got = graph.launch(&[&x2]).unwrap().to_vec::<f32>(0).unwrap();
    assert_eq!(got, [0.0, 5.0, 0.0], "{label}");
}

backend_test!(a_capture_unsafe_submission_is_a_typed_error, |rt, label| {
    let x0 = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
    let mut refused = None;
    let r = rt.capture(|c| {
        let x = c.input(&x0)?;
        let y = c.submit(ops::relu(&x))?;
        match c.submit(Syncs(y)) {
            Ok(_) => panic!("{label}: a host-syncing op was accepted"),
            Err(e) => {
                refused = Some(e.error.clone());
                Err(e.error)
            }
        }
    });
    assert!(
        matches!(&r, Err(Error::NotCapturable { op, hazard: CaptureHazard::HostSync }) if op == "syncs"),
        "{label}: {:?}",
        r.err()
    );
    assert!(
        matches!(refused, Some(Error::NotCapturable { .. })),
        "{label}"
    );
    still_usable(rt, label);
});

backend_test!(
    an_op_failing_in_the_capture_fails_it_and_the_runtime_lives_on,
    |rt, label| {
        let x0 = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
        let r = rt.capture(|c| {
            let x = c.input(&x0)?;
            let y = c.submit(Panics(x))?;
            c.output(&y)?;
            Ok(())
        });
        assert!(
            matches!(&r, Err(Error::OpPanicked { op, .. }) if op == "panics"),
            "{label}: {:?}",
            r.err()
        );
        still_usable(rt, label);
    }
);

backend_test!(a_placeholder_read_eagerly_fails_at_once, |rt, label| {
    let x0 = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
    let mut inner = None;
    let _graph = rt
        .capture(|c| {
            let x = c.input(&x0)?;
            let y = c.submit(ops::relu(&x))?;
            c.output(&y)?;
            inner = Some(y);
            Ok(())
        })
        .unwrap();
    let y = inner.unwrap();
    let eager = rt.submit(ops::relu(&y)).unwrap().wait();
    assert!(
        matches!(eager, Err(Error::Upstream { .. })),
        "{label}: {:?}",
        eager.err()
    );
    assert!(rt.to_vec::<f32>(&y).unwrap().wait().is_err(), "{label}");
});

backend_test!(a_launch_checks_its_inputs, |rt, label| {
    let x0 = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
    let mut graph = rt
        .capture(|c| {
            let x = c.input(&x0)?;
            let y = c.submit(ops::relu(&x))?;
            c.output(&y)?;
            Ok(())
        })
        .unwrap();
    let long = rt.upload(&[1.0f32, 2.0, 3.0, 4.0], [4]).unwrap();
    let ints = rt.upload(&[1i32, 2, 3], [3]).unwrap();
    assert!(graph.launch(&[]).is_err(), "{label}");
    assert!(
        matches!(graph.launch(&[&long]), Err(Error::ShapeMismatch { .. })),
        "{label}"
    );
    assert!(
        matches!(graph.launch(&[&ints]), Err(Error::DTypeMismatch { .. })),
        "{label}"
    );
    assert!(
        graph.launch(&[&x0]).unwrap().output(1).is_err(),
        "{label}: no output 1"
    );
    // An output must come from an op of the capture.
    let r = rt.capture(|c| {
        let x = c.input(&x0)?;
        c.output(&x)?;
        Ok(())
    });
    assert!(r.is_err(), "{label}");
});

/// A copy that allocates per-call scratch memory on CUDA (as an op without a cached
/// workspace would): capturable on the CPU, refused on CUDA.
struct Scratchy(Tensor);

impl Op for Scratchy {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "scratchy"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _cx: &PlanCx) -> rtx_runtime::Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> rtx_runtime::Result<()> {
        let x = cx.input(&self.0)?;
        let out = match cx.backend() {
            rtx_runtime::BackendCx::Cpu => rtx_runtime::Buffer::from_vec(x.cpu::<f32>()?.to_vec()),
            rtx_runtime::BackendCx::Cuda(scx) => {
                let _scratch = scx.alloc::<f32>(64)?;
                let mut y = scx.alloc::<f32>(x.len())?;
                scx.stream()
                    .memcpy_dtod(x.cuda::<f32>()?, &mut y)
                    .map_err(|e| Error::cuda("cuMemcpyDtoDAsync", e))?;
                rtx_runtime::Buffer::from_cuda(y)
            }
        };
        cx.set_output(0, out)
    }
}

backend_test!(scratch_allocations_are_refused_on_cuda, |rt, label| {
    let (seed, mut g) = rng();
    let x0 = rt
        .upload(&rand_vec::<f32>(&mut g, 64, -1.0, 1.0), [64])
        .unwrap();
    let r = rt.capture(|c| {
        let x = c.input(&x0)?;
        let s = c.submit(Scratchy(x))?;
        c.output(&s)?;
        Ok(())
    });
    if label.starts_with("cpu") {
        let mut graph = r.unwrap();
        let got = graph.launch(&[&x0]).unwrap().to_vec::<f32>(0).unwrap();
        assert_eq!(got, down(rt, &x0), "{label} (seed {seed})");
    } else {
        assert!(
            matches!(&r, Err(Error::NotCapturable { op, hazard: CaptureHazard::Allocation }) if op == "scratchy"),
            "{label}: {:?}",
            r.err()
        );
        still_usable(rt, label);
    }
});

backend_test!(
    a_reduction_with_a_stream_workspace_replays_like_eager,
    |rt, label| {
        // The full reductions keep their scratch in per-stream state, made by the warm-up:
        // capturable on every backend.
        let (seed, mut g) = rng();
        let x0 = rt
            .upload(&rand_vec::<f32>(&mut g, 4096, -1.0, 1.0), [4096])
            .unwrap();
        let mut graph = rt
            .capture(|c| {
                let x = c.input(&x0)?;
                let s = c.submit(ops::sum(&x))?;
                c.output(&s)?;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        for _ in 0..10 {
            let x = rt
                .upload(&rand_vec::<f32>(&mut g, 4096, -1.0, 1.0), [4096])
                .unwrap();
            let got = graph.launch(&[&x]).unwrap().to_vec::<f32>(0).unwrap();
            let want = down(rt, &rt.submit(ops::sum(&x)).unwrap().wait().unwrap());
            assert_eq!(got, want, "{label} (seed {seed})");
        }
    }
);
