//! Seeing what the runtime does, op by op, through `tracing`.
//!
//! ```sh
//! cargo run --example trace_ops                          # the runtime's per-op spans
//! RTX_LOG=rtx_runtime=debug,rtx_ops=debug cargo run --example trace_ops
//! ```
//!
//! Every op runs inside a `tracing` span named `op` (target `rtx_runtime::actor` on the
//! CPU backend, `rtx_runtime::cuda::actor` on CUDA), at DEBUG level, with the fields
//! `kind` (the op's name), `stream`, `queue_wait_us` (from `submit` until its actor took
//! it) and `run_us` (the op's `run`: on CUDA, the time to enqueue its kernels). Printing
//! each span when it closes shows one line per op. The ops library logs its CUDA
//! planning decisions (cuBLASLt plans, cuDNN engines) at DEBUG under `rtx_ops`.
//!
//! rtx installs no subscriber itself: the program chooses one. This one uses
//! `tracing-subscriber` with a `Targets` filter read from `RTX_LOG`.

use rtx::{ops, Runtime};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::prelude::*;

fn main() -> Result<(), rtx::Error> {
    let spec = std::env::var("RTX_LOG").unwrap_or_else(|_| "rtx_runtime=debug".into());
    let filter: tracing_subscriber::filter::Targets = spec
        .parse()
        .map_err(|e| rtx::Error::invalid("RTX_LOG", format!("{spec}: {e}")))?;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_span_events(FmtSpan::CLOSE)
                .with_writer(std::io::stderr),
        )
        .with(filter)
        .init();

    let rt = Runtime::builder().streams(2).build()?;
    let x = rt.upload(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], [2, 3])?;
    let w = rt.upload(&[0.5f32, 0.25, 1.0, -1.0, 2.0, 0.0], [2, 3])?;
    let y = rt.submit(ops::linear(&x, &w, None, ops::Activation::Relu))?;
    let s = rt.submit(ops::softmax(y.outputs().expect("one output")))?;
    let m = rt.submit(ops::max(s.outputs().expect("one output")))?;
    let v: Vec<f32> = rt.to_vec(&m.wait()?)?.wait()?;
    println!("max of softmax(relu(x·wᵀ)) = {}", v[0]);
    Ok(())
}
