//! The smallest whole rtx program: upload, a few ops that depend on each other, download.
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//!
//! It runs on CUDA when a driver and a device are present, and on the CPU backend
//! otherwise; the program is the same.

use rtx::{ops, Runtime};

fn main() -> Result<(), rtx::Error> {
    // CUDA if present, else the CPU backend (rayon); 4 streams either way.
    let rt = Runtime::builder().streams(4).build()?;
    println!("{}", rt.info());

    let a = rt.upload(&[1.0f32, -2.0, 3.0, -4.0], [2, 2])?;
    let b = rt.upload(&[10.0f32, 20.0, 30.0, 40.0], [2, 2])?;

    // `submit` validates the op and returns at once; the output handle exists before
    // the op has run, so the next op can be submitted behind it.
    let c = rt.submit(ops::add(&a, &b))?; // [[11, 18], [33, 36]]
    let d = rt.submit(ops::relu(c.outputs().expect("one output")))?;
    let e = rt.submit(ops::matmul(d.outputs().expect("one output"), &b))?;
    let total = rt.submit(ops::sum(e.outputs().expect("one output")))?;

    // Waiting: `wait()` blocks this thread; a `Submission` is also a future
    // (`.await` it under any executor, or `rtx::block_on`).
    let e = e.wait()?;
    let values: Vec<f32> = rt.to_vec(&e)?.wait()?;
    let sum: Vec<f32> = rt.to_vec(&total.wait()?)?.wait()?;
    println!(
        "relu(a + b) · b = {values:?} (shape {:?}), sum {}",
        e.dims(),
        sum[0]
    );

    // The reference, by hand.
    let d_ref = [11.0f32, 18.0, 33.0, 36.0];
    let b_ref = [10.0f32, 20.0, 30.0, 40.0];
    let mut e_ref = [0.0f32; 4];
    for i in 0..2 {
        for j in 0..2 {
            e_ref[i * 2 + j] = (0..2).map(|k| d_ref[i * 2 + k] * b_ref[k * 2 + j]).sum();
        }
    }
    assert_eq!(values, e_ref);
    assert_eq!(sum[0], e_ref.iter().sum::<f32>());

    // Bad input is refused at submit time, with a typed error, and the op comes back.
    let short = rt.upload(&[1.0f32, 2.0, 3.0], [3])?;
    match rt.submit(ops::matmul(&a, &short)) {
        Ok(_) => unreachable!("a [2, 2] · [3] product is refused"),
        Err(rejected) => println!("refused at submit: {}", rejected.error),
    }
    Ok(())
}
