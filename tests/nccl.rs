//! Collectives on the CUDA backend through NCCL: on one GPU, a communicator of one rank
//! (`runtime/src/collective.rs`). Runs only where a CUDA device is present (required
//! under `RTX_REQUIRE_CUDA=1`, which also requires the NCCL library: `benches/gpu/run`
//! puts PyTorch's `libnccl.so.2` on the library path as `libnccl.so`).
//!
//! A one-rank all-reduce (sum, mean or max), reduce-scatter and all-gather each return
//! a copy of their input: the results must equal the inputs bitwise, on fresh random
//! values, in every dtype, ordered after the op that produced the input and before the
//! op that consumes the result. Each test runs twice: with the collectives on the first
//! compute stream (one device's default) and on a communication stream of their own
//! (`Builder::comm_streams(true)`), where every result must come from that stream.

mod common;

use rand::{Rng, SeedableRng};
use rtx::{ops, Backend, DType, Device, ReduceOp, Runtime, StreamKind, Tensor};

/// The CUDA runtimes the tests run on: collectives on the first compute stream, and on
/// a communication stream; empty without a device.
fn runtimes() -> Vec<(Runtime, bool)> {
    if !common::cuda_present() {
        return Vec::new();
    }
    [false, true]
        .into_iter()
        .map(|comm| {
            let rt = Runtime::builder()
                .backend(Backend::Cuda(vec![0]))
                .streams(2)
                .comm_streams(comm)
                .build()
                .expect("a CUDA runtime");
            (rt, comm)
        })
        .collect()
}

/// Checks that `t` came from the stream collectives should run on: the communication
/// stream when the runtime has one, else the first compute stream.
fn from_collective_stream(rt: &Runtime, comm: bool, t: &Tensor) {
    let info = rt.info();
    let comm_streams: Vec<_> = info
        .streams
        .iter()
        .filter(|s| s.kind == StreamKind::Comm)
        .map(|s| s.id)
        .collect();
    assert_eq!(comm_streams.len(), usize::from(comm), "{info:?}");
    let want = if comm {
        comm_streams[0]
    } else {
        rt.compute_streams(rt.device())[0]
    };
    assert_eq!(t.producer(), Some(want), "comm streams {comm}");
}

fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-4.0f32..4.0)).collect()
}

fn bits(rt: &Runtime, t: &Tensor) -> Vec<u32> {
    let t = rt.run(ops::cast(t, DType::F32)).unwrap();
    rt.to_vec::<f32>(&t)
        .unwrap()
        .wait()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn one_rank_collectives_return_their_input_bitwise() {
    for (rt, comm) in runtimes() {
        one_rank_collectives(&rt, comm);
    }
}

fn one_rank_collectives(rt: &Runtime, comm: bool) {
    let n = 3 * 1024 + 7;
    for (i, dtype) in [DType::F32, DType::F16, DType::BF16]
        .into_iter()
        .enumerate()
    {
        let x = rt.upload(&random(i as u64, n), [n]).unwrap();
        let x = rt.run(ops::cast(&x, dtype)).unwrap();
        let want = bits(rt, &x);
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
            let r = rt.all_reduce(std::slice::from_ref(&x), op).unwrap();
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].device(), Device::Cuda(0));
            assert_eq!(r[0].dtype(), dtype);
            from_collective_stream(rt, comm, &r[0]);
            assert_eq!(bits(rt, &r[0]), want, "{dtype:?} all_reduce {op:?}");
        }
        let rs = rt
            .reduce_scatter(std::slice::from_ref(&x), ReduceOp::Sum)
            .unwrap();
        from_collective_stream(rt, comm, &rs[0]);
        assert_eq!(bits(rt, &rs[0]), want, "{dtype:?} reduce_scatter");
        let ag = rt.all_gather(std::slice::from_ref(&x)).unwrap();
        from_collective_stream(rt, comm, &ag[0]);
        assert_eq!(bits(rt, &ag[0]), want, "{dtype:?} all_gather");
    }
}

#[test]
fn a_bucket_is_ordered_between_its_producer_and_its_consumer() {
    for (rt, comm) in runtimes() {
        bucket_ordered(&rt, comm);
    }
}

fn bucket_ordered(rt: &Runtime, comm: bool) {
    let n = 1 << 16;
    let a: Vec<Tensor> = (0..3)
        .map(|k| rt.upload(&random(10 + k, n), [n]).unwrap())
        .collect();
    // Produced on a compute stream, reduced on the communication stream, consumed on a
    // compute stream again, with no wait in between.
    let doubled: Vec<Tensor> = a.iter().map(|t| rt.run(ops::add(t, t)).unwrap()).collect();
    let r = rt
        .all_reduce_many(std::slice::from_ref(&doubled), ReduceOp::Sum)
        .unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].len(), 3);
    for (k, t) in r[0].iter().enumerate() {
        from_collective_stream(rt, comm, t);
        let y = rt.run(ops::add(t, &a[k])).unwrap();
        let got = rt.to_vec::<f32>(&y).unwrap().wait().unwrap();
        let host = random(10 + k as u64, n);
        for (i, (g, h)) in got.iter().zip(&host).enumerate() {
            assert_eq!(g.to_bits(), (h + h + h).to_bits(), "tensor {k} element {i}");
        }
    }
}
