//! rtx under tokio: submissions are futures, and `submit_async` waits for mailbox room
//! without blocking the executor.
//!
//! ```sh
//! cargo run --example async_tokio
//! ```
//!
//! Several tasks share one runtime (it is cheap to clone and `Send + Sync`); each builds
//! its own chain of ops and awaits the result. The runtime's actors run the ops on their
//! own threads, so no executor thread is blocked while the ops run.

use rtx::{ops, Runtime};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), rtx::Error> {
    let rt = Runtime::builder().streams(4).build()?;
    println!("backend: {:?}", rt.backend());

    let mut tasks = Vec::new();
    for task in 0..8u32 {
        let rt = rt.clone();
        tasks.push(tokio::spawn(async move {
            let k = task as f32;
            let x = rt.upload(&[k, k + 1.0, k + 2.0, k + 3.0], [4])?;
            let mut y = x.clone();
            for _ in 0..10 {
                // Waits (asynchronously) only when the chosen stream's mailbox is full.
                let sub = rt.submit_async(ops::add(&y, &x)).await?;
                y = sub.outputs().expect("one output").clone();
            }
            let total = rt.submit_async(ops::sum(&y)).await?.await?;
            let v: Vec<f32> = rt.to_vec(&total)?.await?;
            Ok::<(u32, f32), rtx::Error>((task, v[0]))
        }));
    }
    for t in tasks {
        let (task, total) = t.await.expect("task panicked")?;
        // y = 11·x, so the sum is 11·(4k + 6).
        let expected = 11.0 * (4.0 * task as f32 + 6.0);
        println!("task {task}: sum {total} (expected {expected})");
        assert_eq!(total, expected);
    }

    // Drains every accepted op and joins the actor threads, without blocking tokio.
    rt.shutdown().await?;
    Ok(())
}
