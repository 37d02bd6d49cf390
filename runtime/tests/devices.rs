//! Several devices on the CPU backend (`Backend::CpuDevices`): placement per device,
//! copies between devices, and the collectives, each against an `f64` reference on fresh
//! random inputs, bitwise equal on every device; bad groups fail at submit with a typed
//! error; a failed input fails every member.

use rand::{Rng, SeedableRng};
use rtx_runtime::{
    Backend, BufferRef, Device, Error, ExecCx, Op, Plan, PlanCx, ReduceOp, Result, Runtime,
    StreamKind, Tensor,
};

fn runtime(n: usize) -> Runtime {
    Runtime::builder()
        .backend(Backend::CpuDevices(n))
        .streams(2)
        .build()
        .unwrap()
}

fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-2.0f32..2.0)).collect()
}

fn get(rt: &Runtime, t: &Tensor) -> Vec<f32> {
    rt.to_vec::<f32>(t).unwrap().wait().unwrap()
}

/// Relative error by the norm.
fn rel(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let d: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).powi(2))
        .sum();
    let n: f64 = want.iter().map(|w| w * w).sum();
    (d / n.max(1e-300)).sqrt()
}

#[test]
fn each_device_has_its_streams_and_ops_stay_on_their_inputs_device() {
    let rt = runtime(3);
    let info = rt.info();
    assert_eq!(info.devices.len(), 3);
    for d in 0..3 {
        let dev = Device::Cpu(d);
        assert_eq!(rt.compute_streams(dev).len(), 2, "{dev}");
        let comm = info
            .streams
            .iter()
            .filter(|s| s.device == dev && s.kind == StreamKind::Comm)
            .count();
        assert_eq!(comm, 1, "{dev}: one communication stream");
    }
    assert_eq!(Device::Cpu(0).to_string(), "cpu");
    assert_eq!(Device::Cpu(2).to_string(), "cpu:2");
    let x = rt.upload_to(Device::Cpu(2), &random(1, 64), [64]).unwrap();
    assert_eq!(x.device(), Device::Cpu(2));
    let y = rt.submit(neg(&x)).unwrap();
    let s = y.stream();
    let y = y.wait().unwrap();
    assert_eq!(y.device(), Device::Cpu(2));
    assert!(rt.compute_streams(Device::Cpu(2)).contains(&s), "{s}");
    // Inputs of two devices: refused at submit, the op given back.
    let z = rt.upload_to(Device::Cpu(1), &random(2, 64), [64]).unwrap();
    let e = rt.submit(Add(x.clone(), z.clone())).unwrap_err();
    assert!(
        matches!(e.error, Error::DeviceMismatch { .. }),
        "{}",
        e.error
    );
    assert!(e.op.0.same_storage(&x));
    // Moved explicitly, it works.
    let z2 = rt.copy_to(&z, Device::Cpu(2)).unwrap();
    let sum = rt.submit(Add(x.clone(), z2)).unwrap().wait().unwrap();
    let (xv, zv) = (get(&rt, &x), get(&rt, &z));
    let want: Vec<f32> = xv.iter().zip(&zv).map(|(a, b)| a + b).collect();
    assert_eq!(get(&rt, &sum), want);
    // A device the runtime does not have.
    assert!(matches!(
        rt.upload_to(Device::Cpu(3), &[1.0f32], [1]),
        Err(Error::DeviceNotFound(_))
    ));
    assert!(rt.copy_to(&x, Device::Cuda(0)).is_err());
}

#[test]
fn copies_between_devices_are_exact_and_ordered_after_their_producer() {
    let rt = runtime(2);
    let v = random(3, 1000);
    let x = rt.upload(&v, [10, 100]).unwrap();
    // The copy's input is still being computed (a slow op): the copy waits for it.
    let slow = rt
        .submit(Neg {
            delay_ms: 100,
            ..neg(&x)
        })
        .unwrap()
        .into_outputs()
        .unwrap();
    assert!(
        !slow.is_published(),
        "the copy is submitted before its input exists"
    );
    let y = rt.copy_to(&slow, Device::Cpu(1)).unwrap();
    assert_eq!(y.device(), Device::Cpu(1));
    assert_eq!(y.dims(), &[10, 100]);
    let want: Vec<f32> = v.iter().map(|a| -a).collect();
    assert_eq!(get(&rt, &y), want);
    // The same device: the same tensor, nothing enqueued.
    let same = rt.copy_to(&x, Device::Cpu(0)).unwrap();
    assert!(same.same_storage(&x));
}

#[test]
fn all_reduce_matches_an_f64_reference_and_is_bitwise_equal_on_every_device() {
    for n in [2usize, 3, 4] {
        let rt = runtime(n);
        let len = 40_007; // odd, more than one rayon chunk
        let inputs: Vec<Vec<f32>> = (0..n).map(|m| random(100 + m as u64, len)).collect();
        let group: Vec<Tensor> = inputs
            .iter()
            .enumerate()
            .map(|(m, v)| rt.upload_to(Device::Cpu(m), v, [len]).unwrap())
            .collect();
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
            let out = rt.all_reduce(&group, op).unwrap();
            assert_eq!(out.len(), n);
            let want: Vec<f64> = (0..len)
                .map(|i| {
                    let vals = inputs.iter().map(|v| f64::from(v[i]));
                    match op {
                        ReduceOp::Sum => vals.sum(),
                        ReduceOp::Avg => vals.sum::<f64>() / n as f64,
                        ReduceOp::Max => vals.fold(f64::MIN, f64::max),
                    }
                })
                .collect();
            let first = get(&rt, &out[0]);
            assert!(rel(&first, &want) < 1e-7, "{n} devices {op:?}");
            for (m, t) in out.iter().enumerate() {
                assert_eq!(t.device(), Device::Cpu(m));
                let v = get(&rt, t);
                assert!(
                    v.iter()
                        .zip(&first)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{n} devices {op:?}: member {m} differs from member 0"
                );
            }
        }
    }
}

#[test]
fn a_bucket_reduces_several_tensors_per_member_at_once() {
    let rt = runtime(2);
    let shapes = [vec![3usize, 5], vec![17], vec![2, 2, 2]];
    let mut host = [Vec::new(), Vec::new()];
    let group: Vec<Vec<Tensor>> = (0..2)
        .map(|m| {
            shapes
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let v = random((10 * m + k) as u64, s.iter().product());
                    host[m].push(v.clone());
                    rt.upload_to(Device::Cpu(m), &v, s.clone()).unwrap()
                })
                .collect()
        })
        .collect();
    let out = rt.all_reduce_many(&group, ReduceOp::Avg).unwrap();
    for (m, member) in out.iter().enumerate() {
        assert_eq!(member.len(), 3);
        for (k, t) in member.iter().enumerate() {
            assert_eq!(t.dims(), shapes[k].as_slice());
            assert_eq!(t.device(), Device::Cpu(m));
            let want: Vec<f64> = host[0][k]
                .iter()
                .zip(&host[1][k])
                .map(|(a, b)| (f64::from(*a) + f64::from(*b)) / 2.0)
                .collect();
            assert!(rel(&get(&rt, t), &want) < 1e-7);
        }
    }
}

#[test]
fn reduce_scatter_all_gather_and_broadcast_match_their_definitions() {
    let n = 3;
    let rt = runtime(n);
    let (rows, cols) = (6, 7);
    let inputs: Vec<Vec<f32>> = (0..n).map(|m| random(50 + m as u64, rows * cols)).collect();
    let group: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(m, v)| rt.upload_to(Device::Cpu(m), v, [rows, cols]).unwrap())
        .collect();
    // reduce_scatter: member m keeps rows [2m, 2m + 2) of the sum.
    let rs = rt.reduce_scatter(&group, ReduceOp::Sum).unwrap();
    let share = rows / n * cols;
    for (m, t) in rs.iter().enumerate() {
        assert_eq!(t.dims(), &[rows / n, cols]);
        let want: Vec<f64> = (0..share)
            .map(|i| inputs.iter().map(|v| f64::from(v[m * share + i])).sum())
            .collect();
        assert!(rel(&get(&rt, t), &want) < 1e-7, "member {m}");
    }
    // all_gather: every member's tensor along dim 0, member 0 first.
    let ag = rt.all_gather(&group).unwrap();
    let want: Vec<f32> = inputs.concat();
    for (m, t) in ag.iter().enumerate() {
        assert_eq!(t.dims(), &[rows * n, cols]);
        assert_eq!(t.device(), Device::Cpu(m));
        assert_eq!(get(&rt, t), want);
    }
    // broadcast: device 1's tensor everywhere.
    let devices: Vec<Device> = (0..n).map(Device::Cpu).collect();
    let b = rt.broadcast(&group[1], &devices).unwrap();
    for (m, t) in b.iter().enumerate() {
        assert_eq!(t.device(), Device::Cpu(m));
        assert_eq!(get(&rt, t), inputs[1]);
    }
    assert!(
        b[1].same_storage(&group[1]),
        "its own device: the same tensor"
    );
}

#[test]
fn bad_groups_fail_at_submit_with_a_typed_error() {
    let rt = runtime(2);
    let a = rt.upload_to(Device::Cpu(0), &random(1, 8), [8]).unwrap();
    let b = rt.upload_to(Device::Cpu(1), &random(2, 8), [8]).unwrap();
    let b4 = rt.upload_to(Device::Cpu(1), &random(3, 8), [4, 2]).unwrap();
    let a2 = rt.upload_to(Device::Cpu(0), &random(4, 8), [8]).unwrap();
    let bi = rt.upload_to(Device::Cpu(1), &[1i32; 8], [8]).unwrap();
    let other = runtime(2);
    let foreign = other.upload_to(Device::Cpu(1), &random(5, 8), [8]).unwrap();
    let sum = ReduceOp::Sum;
    assert!(matches!(
        rt.all_reduce(&[], sum),
        Err(Error::InvalidOp { .. })
    ));
    assert!(matches!(
        rt.all_reduce(&[a.clone(), b4.clone()], sum),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        rt.all_reduce(&[a.clone(), bi], sum),
        Err(Error::DTypeMismatch { .. })
    ));
    let twice = rt.all_reduce(&[a.clone(), a2.clone()], sum).unwrap_err();
    assert!(twice.to_string().contains("twice"), "{twice}");
    let foreign = rt.all_reduce(&[a.clone(), foreign], sum).unwrap_err();
    assert!(
        matches!(foreign, Error::InvalidOp { .. })
            && foreign.to_string().contains("another runtime"),
        "{foreign}"
    );
    let odd = rt.upload_to(Device::Cpu(1), &random(6, 9), [9]).unwrap();
    let a9 = rt.upload_to(Device::Cpu(0), &random(7, 9), [9]).unwrap();
    assert!(matches!(
        rt.reduce_scatter(&[a9, odd], sum),
        Err(Error::InvalidDim { .. })
    ));
    assert!(matches!(
        rt.all_reduce_many(&[vec![a.clone()], vec![]], sum),
        Err(Error::InvalidOp { .. })
    ));
    // A group of one is its own result.
    let one = rt
        .all_reduce(std::slice::from_ref(&a), ReduceOp::Avg)
        .unwrap();
    assert!(one[0].same_storage(&a));
    // Nothing was enqueued by the refusals: the good group still works.
    let ok = rt.all_reduce(&[a, b], sum).unwrap();
    assert_eq!(ok.len(), 2);
    get(&rt, &ok[1]);
}

#[test]
fn a_failed_input_fails_every_member_and_the_runtime_goes_on() {
    let rt = runtime(2);
    let a = rt.upload_to(Device::Cpu(0), &random(1, 16), [16]).unwrap();
    let b = rt.upload_to(Device::Cpu(1), &random(2, 16), [16]).unwrap();
    let bad = rt.submit(Fail(b.clone())).unwrap().into_outputs().unwrap();
    let out = rt.all_reduce(&[a.clone(), bad], ReduceOp::Sum).unwrap();
    for t in &out {
        let e = rt.to_vec::<f32>(t).unwrap().wait().unwrap_err();
        assert!(e.to_string().contains("planted"), "names the cause: {e}");
    }
    let out = rt.all_reduce(&[a, b], ReduceOp::Sum).unwrap();
    get(&rt, &out[0]);
    get(&rt, &out[1]);
}

#[test]
fn collectives_overlap_compute_and_shut_down_cleanly() {
    // Many groups in flight, interleaved with compute on every device; then the runtime
    // drops with work pending: every accepted op runs, every thread is joined.
    let rt = runtime(3);
    let mut last = Vec::new();
    for round in 0..50u64 {
        let group: Vec<Tensor> = (0..3)
            .map(|m| {
                let x = rt
                    .upload_to(Device::Cpu(m), &random(round * 3 + m as u64, 257), [257])
                    .unwrap();
                rt.submit(neg(&x)).unwrap().into_outputs().unwrap()
            })
            .collect();
        last = rt.all_reduce(&group, ReduceOp::Max).unwrap();
    }
    let v0 = get(&rt, &last[0]);
    assert_eq!(v0, get(&rt, &last[2]));
    drop(last);
    rtx_runtime::block_on(rt.shutdown()).unwrap();
}

#[test]
fn a_custom_op_can_run_off_its_inputs_device_but_not_in_a_graph() {
    let rt = runtime(2);
    let v = random(9, 33);
    let x = rt.upload(&v, [33]).unwrap();
    // `Op::device`: the op runs on cpu:1, reading its input on cpu.
    let sub = rt
        .submit(Neg {
            device: Some(Device::Cpu(1)),
            ..neg(&x)
        })
        .unwrap();
    assert!(rt.compute_streams(Device::Cpu(1)).contains(&sub.stream()));
    let y = sub.wait().unwrap();
    assert_eq!(y.device(), Device::Cpu(1));
    let want: Vec<f32> = v.iter().map(|a| -a).collect();
    assert_eq!(get(&rt, &y), want);
    // Pinned to a stream of another device than the one it names: refused.
    let s0 = rt.compute_streams(Device::Cpu(0))[0];
    let e = rt
        .submit_on(
            s0,
            Neg {
                device: Some(Device::Cpu(1)),
                ..neg(&x)
            },
        )
        .unwrap_err();
    assert!(matches!(e.error, Error::InvalidOp { .. }), "{}", e.error);
    // A graph is of one device.
    let e = rt
        .capture(|c| {
            let xi = c.input(&x)?;
            let y = c
                .submit(Neg {
                    device: Some(Device::Cpu(1)),
                    ..neg(&xi)
                })
                .map_err(|e| e.error)?;
            c.output(&y)?;
            Ok(())
        })
        .err()
        .expect("refused");
    assert!(e.to_string().contains("one device"), "{e}");
}

// Small test ops (element-wise on the CPU).

/// `-x`, after `delay_ms`, on `device` when named (`Op::device`), else on `x`'s.
struct Neg {
    x: Tensor,
    device: Option<Device>,
    delay_ms: u64,
}

fn neg(x: &Tensor) -> Neg {
    Neg {
        x: x.clone(),
        device: None,
        delay_ms: 0,
    }
}

impl Op for Neg {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "neg"
    }
    fn device(&self) -> Option<Device> {
        self.device
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.x))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        std::thread::sleep(std::time::Duration::from_millis(self.delay_ms));
        let x: BufferRef = cx.input(&self.x)?;
        let v: Vec<f32> = x.cpu::<f32>()?.iter().map(|a| -a).collect();
        cx.set_output(0, rtx_runtime::Buffer::from_vec(v))
    }
}

struct Add(Tensor, Tensor);
impl Op for Add {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "add"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0, &self.1]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let (a, b) = (cx.input(&self.0)?, cx.input(&self.1)?);
        let v: Vec<f32> = a
            .cpu::<f32>()?
            .iter()
            .zip(b.cpu::<f32>()?)
            .map(|(x, y)| x + y)
            .collect();
        cx.set_output(0, rtx_runtime::Buffer::from_vec(v))
    }
}

/// Always fails.
struct Fail(Tensor);
impl Op for Fail {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "fail"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, _cx: &mut ExecCx<'_>) -> Result<()> {
        Err(Error::invalid("fail", "planted failure"))
    }
}
