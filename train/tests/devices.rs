//! Data parallel across devices (`rtx_train::DeviceParallel`) on the CPU backend's host
//! devices (`Backend::CpuDevices`): the replicas stay bitwise identical step after step,
//! the result equals the single-device step on the whole batch within float tolerance,
//! gradients go in several buckets, and bad batches or device lists fail with typed
//! errors.

use rand::{Rng, SeedableRng};
use rtx_ops::optim::AdamW;
use rtx_runtime::{Backend, Device, Runtime};
use rtx_train::pipeline::{Classifier, Optimizer, OptimizerConfig};
use rtx_train::{DeviceParallel, Mlp, MlpConfig};

const DIM: usize = 24;
const CLASSES: usize = 5;
const ROWS: usize = 48;

fn cfg() -> MlpConfig {
    MlpConfig::new(&[DIM, 32, 16, CLASSES])
}

fn opt() -> OptimizerConfig {
    OptimizerConfig::AdamW(AdamW {
        lr: 3e-3,
        ..AdamW::default()
    })
}

fn batch(seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let x = (0..ROWS * DIM).map(|_| r.gen_range(-1.0f32..1.0)).collect();
    let y = (0..ROWS).map(|_| r.gen_range(0..CLASSES as u32)).collect();
    (x, y)
}

fn values(rt: &Runtime, m: &mut dyn Classifier) -> Vec<f32> {
    m.params()
        .iter_mut()
        .flat_map(|p| rt.to_vec::<f32>(p.value()).unwrap().wait().unwrap())
        .collect()
}

#[test]
fn replicas_stay_identical_and_equal_the_single_device_step() {
    for n in [2usize, 3] {
        let rt = Runtime::builder()
            .backend(Backend::CpuDevices(n))
            .streams(2)
            .build()
            .unwrap();
        let devices: Vec<Device> = (0..n).map(Device::Cpu).collect();
        // Replica k built from seed k: the constructor must replace them all by replica 0's.
        let mut seed = 0u64;
        let mut dp = DeviceParallel::new(
            &rt,
            &devices,
            |r| {
                seed += 1;
                Ok(Box::new(Mlp::new(r, &cfg(), seed)?) as Box<dyn Classifier>)
            },
            opt(),
        )
        .unwrap()
        .with_bucket_bytes(2048);
        assert_eq!(dp.devices(), n);
        assert_eq!(dp.max_divergence().unwrap(), 0.0, "equal at the start");
        // The reference: one device, the whole batch, replica 0's initial weights.
        let one = Runtime::cpu(1);
        let mut single = Mlp::new(&one, &cfg(), 1).unwrap();
        let mut sopt = Optimizer::new(&one, opt(), &single.params()).unwrap();
        let mut dp_losses = Vec::new();
        let mut one_losses = Vec::new();
        for step in 0..8 {
            let (x, y) = batch(100 + step);
            let loss = dp.step(&x, &y, DIM).unwrap();
            assert_eq!(loss.device(), Device::Cpu(0));
            dp_losses.push(rt.to_vec::<f32>(&loss).unwrap().wait().unwrap()[0]);
            assert_eq!(
                dp.max_divergence().unwrap(),
                0.0,
                "{n} devices, step {step}: the replicas differ"
            );
            let xs = one.upload(&x, [ROWS, DIM]).unwrap();
            let ys = one.upload(&y, [ROWS]).unwrap();
            let l = single.loss_backward(&one, &xs, &ys, 1.0).unwrap();
            sopt.step(&one, &mut single.params()).unwrap();
            one_losses.push(one.to_vec::<f32>(&l).unwrap().wait().unwrap()[0]);
        }
        assert!(
            dp.buckets() > 1,
            "gradients in several buckets: {}",
            dp.buckets()
        );
        for (a, b) in dp_losses.iter().zip(&one_losses) {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "{dp_losses:?} vs {one_losses:?}"
            );
        }
        assert!(dp_losses[7] < dp_losses[0], "it learns: {dp_losses:?}");
        let want = values(&one, &mut single);
        for i in 0..n {
            let got = values(&rt, dp.replica(i).unwrap());
            let num: f64 = got
                .iter()
                .zip(&want)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum();
            let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
            let e = (num / den).sqrt();
            assert!(
                e < 1e-5,
                "{n} devices, replica {i}: relative weight error {e:e}"
            );
        }
    }
}

#[test]
fn bad_batches_and_device_lists_fail_with_typed_errors() {
    let rt = Runtime::builder()
        .backend(Backend::CpuDevices(2))
        .build()
        .unwrap();
    let build = |r: &Runtime| Ok(Box::new(Mlp::new(r, &cfg(), 1)?) as Box<dyn Classifier>);
    assert!(DeviceParallel::new(&rt, &[], build, opt()).is_err());
    assert!(DeviceParallel::new(&rt, &[Device::Cpu(0), Device::Cpu(0)], build, opt()).is_err());
    assert!(DeviceParallel::new(&rt, &[Device::Cpu(0), Device::Cpu(5)], build, opt()).is_err());
    let mut dp = DeviceParallel::new(&rt, &[Device::Cpu(0), Device::Cpu(1)], build, opt()).unwrap();
    let (x, y) = batch(1);
    // 47 rows do not split between 2 devices; features that do not match the rows.
    let e = dp.step(&x[..47 * DIM], &y[..47], DIM).unwrap_err();
    assert!(e.to_string().contains("split evenly"), "{e}");
    assert!(dp.step(&x[..10], &y, DIM).is_err());
    // The trainer is still usable.
    let loss = dp.step(&x, &y, DIM).unwrap();
    assert!(rt.to_vec::<f32>(&loss).unwrap().wait().unwrap()[0].is_finite());
    assert_eq!(dp.max_divergence().unwrap(), 0.0);
}
