//! The placement policies through their public API, and end to end on the CPU backend.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rtx_runtime::*;
use rtx_scheduler::{
    CostModel, EarliestFinish, LeastLoaded, OpInfo, Policy, RoundRobin, StreamLoad,
};

/// y = a + b (f32), a minimal op (as in the runtime's smoke tests).
struct Add {
    a: Tensor,
    b: Tensor,
}
impl Op for Add {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "add"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.a, &self.b]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        if self.a.shape() != self.b.shape() {
            return Err(Error::shape("add", self.a.shape(), self.b.shape(), ""));
        }
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.a.shape().clone(), DType::F32)],
            cost: Cost::default(),
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let a = cx.input(&self.a)?;
        let b = cx.input(&self.b)?;
        let y: Vec<f32> = a
            .cpu::<f32>()?
            .iter()
            .zip(b.cpu::<f32>()?)
            .map(|(x, y)| x + y)
            .collect();
        cx.set_output(0, Buffer::from_vec(y))
    }
}

/// `n` candidate streams, each with one queued op (so `EarliestFinish` keeps its
/// estimates) and the given rough queued time.
fn loads(n: usize) -> Vec<StreamLoad> {
    (0..n)
        .map(|i| StreamLoad {
            id: StreamId::new(i),
            queued_ops: 1,
            queued_ns: 0,
        })
        .collect()
}

fn op<'a>(name: &'a str, bytes: f64, inputs: &'a [StreamId]) -> OpInfo<'a> {
    OpInfo {
        name,
        cost: Cost { bytes, flops: 0.0 },
        input_streams: inputs,
        pending_input_streams: &[],
    }
}

#[test]
fn round_robin_cycles() {
    let p = RoundRobin::default();
    let l = loads(4);
    let got: Vec<usize> = (0..9).map(|_| p.place(&op("x", 0.0, &[]), &l)).collect();
    assert_eq!(got, [0, 1, 2, 3, 0, 1, 2, 3, 0]);
    // Fewer candidates (another device): still in range.
    assert!(p.place(&op("x", 0.0, &[]), &l[..3]) < 3);
}

#[test]
fn least_loaded_picks_the_emptiest() {
    let mut l = loads(4);
    for (s, ops) in l.iter_mut().zip([5, 2, 7, 3]) {
        s.queued_ops = ops;
    }
    assert_eq!(LeastLoaded.place(&op("x", 0.0, &[StreamId::new(0)]), &l), 1);
    // Equal op counts: the least queued time wins.
    l[3].queued_ops = 2;
    l[1].queued_ns = 9_000;
    l[3].queued_ns = 1_000;
    assert_eq!(LeastLoaded.place(&op("x", 0.0, &[]), &l), 3);
}

#[test]
fn earliest_finish_keeps_a_dependent_op_on_its_producer_when_loads_are_equal() {
    let p = EarliestFinish::new();
    let l = loads(4);
    assert_eq!(p.place(&op("x", 0.0, &[StreamId::new(2)]), &l), 2);
    // Stream 2 now holds that op (5 µs), more than the 2 µs penalty: the next
    // independent op goes elsewhere, a dependent one of stream 1 stays on stream 1.
    assert_eq!(p.place(&op("x", 0.0, &[]), &l), 0);
    assert_eq!(p.place(&op("x", 0.0, &[StreamId::new(1)]), &l), 1);
    // Two inputs on different streams: one wait either way, the less loaded wins.
    assert_eq!(
        p.place(&op("x", 0.0, &[StreamId::new(3), StreamId::new(2)]), &l),
        3
    );
}

#[test]
fn earliest_finish_leaves_a_far_busier_producer_stream() {
    let p = EarliestFinish::new().with_wait_penalty(Duration::from_micros(20));
    let l = loads(2);
    // One 5 µs op on stream 0: less than the penalty, a dependent op stays.
    assert_eq!(p.place(&op("x", 0.0, &[]), &l[..1]), 0);
    assert_eq!(p.place(&op("y", 0.0, &[StreamId::new(0)]), &l), 0);
    // 20 more: stream 0 is 105 µs busier than stream 1, a dependent op moves.
    for _ in 0..20 {
        p.place(&op("x", 0.0, &[]), &l[..1]);
    }
    assert_eq!(p.queued(StreamId::new(0)), Duration::from_micros(110));
    assert_eq!(p.place(&op("y", 0.0, &[StreamId::new(0)]), &l), 1);
}

#[test]
fn earliest_finish_keeps_an_op_whose_input_is_still_queued_on_its_producer() {
    let p = EarliestFinish::new().with_wait_penalty(Duration::from_micros(20));
    let l = loads(2);
    for _ in 0..21 {
        p.place(&op("x", 0.0, &[]), &l[..1]);
    }
    // Stream 0 is 105 µs busier, but the input is not produced yet: the op cannot start
    // before stream 0's queue has run anyway, so leaving only adds the event wait (the
    // same op with a computed input moves: the test above).
    let pending = [StreamId::new(0)];
    let dependent = OpInfo {
        pending_input_streams: &pending,
        ..op("y", 0.0, &pending)
    };
    assert_eq!(p.place(&dependent, &l), 0);
}

#[test]
fn earliest_finish_estimates_return_to_zero_after_observe() {
    let p = EarliestFinish::new();
    let l = loads(3);
    let mut placed = Vec::new();
    for i in 0..30 {
        let name = ["a", "b", "c"][i % 3];
        let bytes = 1e6 * (i % 7) as f64;
        let s = p.place(&op(name, bytes, &[]), &l);
        placed.push((name, bytes, l[s].id));
    }
    assert!(l.iter().all(|s| p.queued(s.id) > Duration::ZERO));
    // Completions in another order, with measured times unlike the predictions (which
    // recalibrates the model between place and observe).
    for (name, bytes, s) in placed.into_iter().rev() {
        let cost = Cost { bytes, flops: 0.0 };
        p.observe(name, cost, s, Duration::from_micros(50));
    }
    for s in &l {
        assert_eq!(p.queued(s.id), Duration::ZERO, "{}", s.id);
    }
    // An observation of an op it did not place (pinned) changes nothing.
    p.observe(
        "a",
        Cost::default(),
        StreamId::new(0),
        Duration::from_micros(5),
    );
    assert_eq!(p.queued(StreamId::new(0)), Duration::ZERO);
    assert_eq!(p.model().observations("a"), 11);
}

#[test]
fn earliest_finish_calibrates_from_device_times_once_they_come() {
    let p = EarliestFinish::new();
    let l = loads(1);
    let s = l[0].id;
    let cost = Cost {
        bytes: 1e6,
        flops: 0.0,
    };
    // Host times calibrate until a device time comes (the CPU backend sends no other).
    for _ in 0..3 {
        p.place(&op("g", 1e6, &[]), &l);
        p.observe("g", cost, s, Duration::from_micros(5));
    }
    assert_eq!(p.model().observations("g"), 3);
    p.observe_device("g", cost, s, Duration::from_micros(400));
    assert_eq!(
        p.model().observations("g"),
        1,
        "the host's fit is forgotten"
    );
    // From now on only device times calibrate; the host's still empty the queues.
    for _ in 0..5 {
        p.place(&op("g", 1e6, &[]), &l);
        p.observe("g", cost, s, Duration::from_micros(5));
    }
    assert_eq!(p.model().observations("g"), 1);
    assert_eq!(p.queued(s), Duration::ZERO);
    for _ in 0..40 {
        p.observe_device("g", cost, s, Duration::from_micros(400));
    }
    let predicted = p.model().predict("g", cost);
    assert!(
        (predicted.as_secs_f64() / 400e-6 - 1.0).abs() < 0.05,
        "the device time is learnt: {predicted:?}"
    );
}

#[test]
fn earliest_finish_queues_calibrated_predictions() {
    let model = Arc::new(CostModel::new());
    for _ in 0..20 {
        model.observe("slow", Cost::default(), Duration::from_millis(1));
    }
    let p = EarliestFinish::with_model(model);
    let l = loads(2);
    assert_eq!(p.place(&op("slow", 0.0, &[]), &l), 0);
    let q = p.queued(StreamId::new(0)).as_secs_f64();
    assert!((q / 1e-3 - 1.0).abs() < 0.01, "{q}");
    // A 5 µs op avoids the 1 ms queue even if its input is there.
    assert_eq!(p.place(&op("fast", 0.0, &[StreamId::new(0)]), &l), 1);
}

#[test]
fn cost_model_converges_to_a_linear_truth() {
    // Truth: 10 µs + 0.05 ns/byte (20 GB/s), observed from 1 kB to 100 MB.
    let truth = |bytes: f64| 10_000.0 + 0.05 * bytes;
    let m = CostModel::new();
    let mut bytes = 1e3;
    for _ in 0..100 {
        for _ in 0..3 {
            let c = Cost { bytes, flops: 0.0 };
            m.observe("copy", c, Duration::from_nanos(truth(bytes) as u64));
            bytes = if bytes > 1e8 { 1e3 } else { bytes * 1.7 };
        }
    }
    assert_eq!(m.observations("copy"), 300);
    for b in [1e3, 1e5, 3e6, 5e7] {
        let p = m
            .predict(
                "copy",
                Cost {
                    bytes: b,
                    flops: 0.0,
                },
            )
            .as_nanos() as f64;
        assert!(
            (p / truth(b) - 1.0).abs() < 0.10,
            "{b} B: {p} ns vs {}",
            truth(b)
        );
    }
}

/// Delegates to a shared policy, so a test can inspect it after handing it over.
struct Shared<P>(Arc<P>);
impl<P: Policy> Policy for Shared<P> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn place(&self, op: &OpInfo<'_>, streams: &[StreamLoad]) -> usize {
        self.0.place(op, streams)
    }
    fn observe(&self, name: &str, cost: Cost, stream: StreamId, took: Duration) {
        self.0.observe(name, cost, stream, took)
    }
}

/// 16 independent adds and a chain of 20 on 4 CPU streams; returns the streams the
/// independent adds ran on.
fn workload(policy: impl Policy) -> BTreeSet<StreamId> {
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(4)
        .policy(policy)
        .build()
        .unwrap();
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let b = rt.upload(&[10.0f32, 20.0], [2]).unwrap();
    let subs: Vec<_> = (0..16)
        .map(|_| {
            rt.submit(Add {
                a: a.clone(),
                b: b.clone(),
            })
            .unwrap()
        })
        .collect();
    let mut x = a.clone();
    for _ in 0..20 {
        let sub = rt.submit(Add { a: x, b: a.clone() });
        x = sub.unwrap().outputs().unwrap().clone();
    }
    let mut used = BTreeSet::new();
    for s in subs {
        used.insert(s.stream());
        let y = s.wait().unwrap();
        assert_eq!(
            block_on(rt.to_vec::<f32>(&y).unwrap()).unwrap(),
            [11.0, 22.0]
        );
    }
    assert_eq!(
        block_on(rt.to_vec::<f32>(&x).unwrap()).unwrap(),
        [21.0, 42.0]
    );
    let streams: BTreeSet<StreamId> = rt.compute_streams(rt.device()).into_iter().collect();
    assert!(used.is_subset(&streams));
    used
}

#[test]
fn end_to_end_round_robin_uses_every_stream() {
    assert_eq!(workload(RoundRobin::default()).len(), 4);
}

#[test]
fn end_to_end_least_loaded() {
    assert!(!workload(LeastLoaded).is_empty());
}

#[test]
fn end_to_end_earliest_finish() {
    let p = Arc::new(EarliestFinish::new());
    workload(Shared(p.clone()));
    // Every add was observed before its submission completed.
    assert_eq!(p.model().observations("add"), 36);
    assert!(p.model().calibration("add").is_some());
    for s in 0..4 {
        assert_eq!(p.queued(StreamId::new(s)), Duration::ZERO);
    }
}

#[test]
fn end_to_end_default_affinity() {
    assert!(!workload(rtx_scheduler::Affinity).is_empty());
}
