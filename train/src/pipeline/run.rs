//! Running many pipelines at once, and what they report.

use rtx_runtime::{Result, StreamId};

use super::Pipeline;

/// A pipeline's progress after a step.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Steps submitted.
    pub step: u64,
    /// Steps in all.
    pub steps: u64,
    /// The newest loss read back: `(step, loss)`.
    pub loss: Option<(u64, f32)>,
    /// Samples per second so far.
    pub samples_per_s: f64,
}

/// A finished pipeline's numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Its name.
    pub name: String,
    /// Trainable elements.
    pub params: usize,
    /// The optimizer and learning rate.
    pub optimizer: String,
    /// The last training loss read back.
    pub final_loss: f32,
    /// Loss on the evaluation set.
    pub eval_loss: f32,
    /// Accuracy on the evaluation set (computed on the device).
    pub accuracy: f32,
    /// Training samples per second.
    pub samples_per_s: f64,
    /// The streams it ran on.
    pub streams: Vec<StreamId>,
}

/// Streams for `jobs` pipelines wanting `per_job[i]` streams each, from `streams`:
/// consecutive, wrapping, so that independent pipelines spread over all of them before
/// any stream gets a second one.
pub fn assign_streams(streams: &[StreamId], per_job: &[usize]) -> Vec<Vec<StreamId>> {
    let mut next = 0usize;
    per_job
        .iter()
        .map(|&k| {
            (0..k.max(1))
                .map(|_| {
                    let s = streams[next % streams.len().max(1)];
                    next += 1;
                    s
                })
                .collect()
        })
        .collect()
}

/// Runs every pipeline to its end, each driven by a host thread of its own (so their
/// submissions, and on CUDA their streams' launches, proceed side by side), calling
/// `progress(i, p)` after each step of pipeline `i`. Then waits for every loss. The
/// first error of any pipeline is returned (the others still run to their end).
pub fn run_concurrently(
    pipelines: &mut [Pipeline],
    progress: &(dyn Fn(usize, &Progress) + Sync),
) -> Result<()> {
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = pipelines
            .iter_mut()
            .enumerate()
            .map(|(i, p)| {
                scope.spawn(move || -> Result<()> {
                    while !p.is_done() {
                        p.step()?;
                        progress(
                            i,
                            &Progress {
                                step: p.steps_done(),
                                steps: p.config().steps,
                                loss: p.losses().last().copied(),
                                samples_per_s: p.samples_per_s(),
                            },
                        );
                    }
                    p.finish()?;
                    progress(
                        i,
                        &Progress {
                            step: p.steps_done(),
                            steps: p.config().steps,
                            loss: p.losses().last().copied(),
                            samples_per_s: p.samples_per_s(),
                        },
                    );
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(rtx_runtime::Error::invalid(
                        "run_concurrently",
                        "a pipeline thread panicked",
                    ))
                })
            })
            .collect()
    });
    results.into_iter().collect()
}
