//! One model trained data-parallel over several devices, on the CPU backend's host
//! devices (no GPU needed).
//!
//! ```sh
//! cargo run --example multi_device            # 4 host devices
//! cargo run --example multi_device -- 2       # 2
//! ```
//!
//! `Backend::CpuDevices(n)` presents `n` host devices (`cpu`, `cpu:1`, ...), each with its
//! own compute streams and a communication stream. `rtx_train::DeviceParallel` keeps a
//! replica of an MLP on each, splits every batch among them, all-reduces the gradients
//! in buckets (in reverse layer order, so a bucket reduces while the backward of earlier
//! layers still runs) and steps every replica's AdamW; the replicas stay bitwise
//! identical, which the example checks at the end.

use rtx::ops::optim::AdamW;
use rtx::train::pipeline::{Classifier, OptimizerConfig};
use rtx::train::{DeviceParallel, Mlp, MlpConfig};
use rtx::{Backend, Device, ReduceOp, Runtime};

const DIM: usize = 32;
const CLASSES: usize = 4;
/// Rows of each device's share of a batch.
const ROWS_PER_DEVICE: usize = 64;
const STEPS: usize = 60;

fn main() -> Result<(), rtx::Error> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4);
    let rt = Runtime::builder()
        .backend(Backend::CpuDevices(n))
        .streams(1)
        .build()?;
    let devices: Vec<Device> = rt.info().devices.iter().map(|d| d.device).collect();
    let names: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    println!("{} devices: {}", devices.len(), names.join(", "));

    // A collective on its own: each device's value, averaged on every device.
    let parts = devices
        .iter()
        .enumerate()
        .map(|(i, d)| rt.upload_to(*d, &[i as f32, 10.0 * i as f32], [2]))
        .collect::<Result<Vec<_>, _>>()?;
    let avg = rt.all_reduce(&parts, ReduceOp::Avg)?;
    let last = avg.last().expect("one result per device");
    println!(
        "all_reduce(avg) on {}: {:?}",
        last.device(),
        rt.to_vec::<f32>(last)?.wait()?
    );

    // A learnable task: the label is the index of the largest of the first CLASSES
    // features.
    let mut seed = 1u32;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
    };
    let cfg = MlpConfig::new(&[DIM, 64, CLASSES]);
    let opt = OptimizerConfig::AdamW(AdamW {
        lr: 1e-2,
        weight_decay: 0.0,
        ..AdamW::default()
    });
    let mut dp = DeviceParallel::new(
        &rt,
        &devices,
        |r| Ok(Box::new(Mlp::new(r, &cfg, 7)?) as Box<dyn Classifier>),
        opt,
    )?
    .with_bucket_bytes(1024);
    let rows = ROWS_PER_DEVICE * n;
    let mut first = None;
    let mut loss = f32::NAN;
    for step in 0..STEPS {
        let x: Vec<f32> = (0..rows * DIM).map(|_| rand()).collect();
        let y: Vec<u32> = x
            .chunks(DIM)
            .map(|r| {
                let (mut best, mut arg) = (f32::MIN, 0);
                for (c, v) in r[..CLASSES].iter().enumerate() {
                    if *v > best {
                        (best, arg) = (*v, c as u32);
                    }
                }
                arg
            })
            .collect();
        let l = dp.step(&x, &y, DIM)?;
        if step % 20 == 0 || step + 1 == STEPS {
            loss = rt.to_vec::<f32>(&l)?.wait()?[0];
            first.get_or_insert(loss);
            println!("step {step:3}: loss {loss:.4} ({} buckets)", dp.buckets());
        }
    }
    let divergence = dp.max_divergence()?;
    println!(
        "loss {:.4} -> {loss:.4} over {STEPS} steps on {n} devices; replicas differ by {divergence}",
        first.unwrap_or(f32::NAN)
    );
    if divergence != 0.0 || loss >= first.unwrap_or(0.0) {
        return Err(rtx::Error::invalid(
            "multi_device",
            "the replicas diverged or the model did not learn",
        ));
    }
    Ok(())
}
