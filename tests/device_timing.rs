//! The placement policy's device times (`Settings::device_timing`): on CUDA a sample of
//! the ops is timed on the device and reported through `Policy::observe_device`, and
//! `EarliestFinish` calibrates from those; on the CPU backend no device time comes.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtx::placement::{OpInfo, Policy, StreamLoad};
use rtx::{Backend, Cost, Runtime, StreamId};

/// Records what the runtime tells a policy; places everything on the first stream.
#[derive(Default)]
struct Recorder {
    host: Mutex<Vec<(String, Duration)>>,
    device: Mutex<Vec<(String, Duration)>>,
}

struct Shared(Arc<Recorder>);

impl Policy for Shared {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn place(&self, _op: &OpInfo<'_>, _streams: &[StreamLoad]) -> usize {
        0
    }
    fn observe(&self, name: &str, _cost: Cost, _stream: StreamId, took: Duration) {
        self.0.host.lock().unwrap().push((name.to_string(), took));
    }
    fn observe_device(&self, name: &str, _cost: Cost, _stream: StreamId, device: Duration) {
        self.0
            .device
            .lock()
            .unwrap()
            .push((name.to_string(), device));
    }
}

/// Runs 64 dependent `mul`s of 1M elements (device time well above the enqueue) with
/// `every` as the device-timing setting; what the policy heard.
fn run(backend: Backend, every: u32) -> Arc<Recorder> {
    let rec = Arc::new(Recorder::default());
    let rt = Runtime::builder()
        .backend(backend)
        .streams(2)
        .device_timing(every)
        .policy(Shared(rec.clone()))
        .build()
        .unwrap();
    let v: Vec<f32> = (0..1 << 20).map(|i| 1.0 + (i % 7) as f32 * 1e-7).collect();
    let mut x = rt.upload(&v, [1 << 20]).unwrap();
    let one = rt.upload(&v, [1 << 20]).unwrap();
    for _ in 0..64 {
        x = rt.submit(rtx::ops::mul(&x, &one)).unwrap().wait().unwrap();
    }
    let got = rt.to_vec::<f32>(&x).unwrap().wait().unwrap();
    assert!(
        got.iter().all(|g| g.is_finite() && *g >= 1.0),
        "the products"
    );
    drop(rt);
    rec
}

#[test]
fn the_cpu_backend_reports_host_times_only() {
    let rec = run(Backend::Cpu, 1);
    let muls = rec
        .host
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, _)| n == "mul")
        .count();
    assert_eq!(muls, 64, "every op observed");
    assert!(
        rec.device.lock().unwrap().is_empty(),
        "no device time on the CPU"
    );
}

#[test]
fn cuda_reports_the_device_time_of_one_op_in_n() {
    if !common::cuda_present() {
        return;
    }
    for (every, want) in [(1u32, 64usize), (8, 8), (0, 0)] {
        let rec = run(Backend::Cuda(vec![0]), every);
        let host = rec.host.lock().unwrap();
        assert_eq!(
            host.iter().filter(|(n, _)| n == "mul").count(),
            64,
            "every {every}"
        );
        let device = rec.device.lock().unwrap();
        let muls: Vec<Duration> = device
            .iter()
            .filter(|(n, _)| n == "mul")
            .map(|(_, d)| *d)
            .collect();
        // The sample counts every op of the stream (uploads too), so one in `every`
        // of the 64 muls is timed, give or take one.
        assert!(
            muls.len().abs_diff(want) <= 1,
            "every {every}: {} device times",
            muls.len()
        );
        // A 1M-element f32 multiply moves 12 MB: at least ~2 µs on any current GPU.
        assert!(
            muls.iter()
                .all(|d| *d >= Duration::from_micros(2) && *d < Duration::from_secs(1)),
            "every {every}: {muls:?}"
        );
    }
}
