//! Eager launch batching: the launches of small ops queued behind each other on one
//! stream, run as one kernel launch.
//!
//! On the H200 host one `cuLaunchKernel` costs its thread 3.6-4.3 µs (`benches/gpu/
//! launch_floor.cu`): a chain of tiny element-wise ops is bound by it. When an actor
//! finds several such ops in its mailbox, each op's launch is *deferred* into a
//! [`LaunchBatch`] instead: a parameter block of up to [`BATCH_STEPS`] steps, which one
//! launch of a batch kernel runs in order, a barrier between steps: `ew_batch`
//! (`kernels/cuda/elementwise.cu`, small element-wise ops, one block) and
//! `small_gemm_batch` (`kernels/cuda/small_gemm.cu`, small products, a cooperative
//! launch whose blocks meet at a grid-wide barrier). Nothing waits to fill a batch: it is
//! launched as soon as the actor runs out of queued ops, before any other work of the
//! stream, or when it is full.
//!
//! # Why stream order still holds
//!
//! A deferred step is logically enqueued when its op runs, and actually when the batch
//! is launched. Nothing else may reach the stream in between, so the actor launches the
//! batch ([`LaunchBatch::flush`]):
//! - before any op that does not batch its launches ([`Op::batches_launches`](crate::Op::batches_launches))
//!   runs, and before a batching op that is timed on the device;
//! - before a launch that is not deferred ([`StreamCx::defer_launch`](super::StreamCx::defer_launch)
//!   refused it: another function, a batch turned off) — the ops' launcher calls
//!   `flush_launches` first;
//! - before it records the burst's event (the ops' completion, and every other
//!   stream's wait for them, are behind that event), i.e. when the mailbox runs empty
//!   and before it blocks on another stream;
//! - before a failed op's buffers are dropped.
//!
//! What may still reach the stream between a step's op and the batch launch is memory
//! work that no step depends on: a batching op allocating its outputs (and poisoning
//! them, under `poison_outputs`), and finished ops' keep-alives freed on the actor
//! (`Msg::Release`). Every buffer a step refers to is held by its op's envelope until
//! the burst's event, recorded after the batch launch, has passed, so such a free or
//! allocation never concerns memory a pending step uses.
//!
//! A batch launch that fails is remembered ([`LaunchBatch::take_failure`]) and fails the
//! ops of the burst it belongs to, like a failed event record.

use cudarc::driver::{CudaFunction, CudaStream};

use crate::error::Error;
use crate::stats::{Counters, Phase};

/// Steps one batch launch runs at most.
pub const BATCH_STEPS: usize = 16;

/// Bytes of one step's descriptor in a batch kernel's parameter block.
pub const BATCH_STEP_BYTES: usize = 56;

/// The batch kernel's one parameter, by value, as C lays it out:
/// `struct { uint32_t count; uint32_t pad; uint8_t steps[BATCH_STEPS][BATCH_STEP_BYTES]; }`
/// (the batch kernels' step structs are 8-byte aligned, `BATCH_STEP_BYTES` long).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Block {
    count: u32,
    pad: u32,
    steps: [[u8; BATCH_STEP_BYTES]; BATCH_STEPS],
}

/// How a batch kernel is launched: `grid` blocks of `threads` threads, cooperatively
/// (every block resident at once, so that the kernel may synchronize its blocks between
/// steps) when `coop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub threads: u32,
    /// A cooperative launch (`cuLaunchCooperativeKernel`).
    pub coop: bool,
}

/// The launches deferred on one stream (see the module docs). Lives on its actor.
pub(crate) struct LaunchBatch {
    /// Whether the op running now may defer its launch (set by the actor around it).
    open: bool,
    /// The batch kernel and its geometry, while steps are pending.
    f: Option<(CudaFunction, Geometry)>,
    block: Block,
    /// A batch launch that failed, for the burst's hand-off to report.
    failed: Option<Error>,
}

impl LaunchBatch {
    pub(crate) fn new() -> Self {
        LaunchBatch {
            open: false,
            f: None,
            block: Block {
                count: 0,
                pad: 0,
                steps: [[0; BATCH_STEP_BYTES]; BATCH_STEPS],
            },
            failed: None,
        }
    }

    /// Lets the op about to run defer its launches (`on`), or stops it.
    pub(crate) fn set_open(&mut self, on: bool) {
        self.open = on;
    }

    /// Whether the op running now may defer.
    pub(crate) fn is_open(&self) -> bool {
        self.open
    }

    /// Whether steps are waiting for their launch.
    pub(crate) fn pending(&self) -> bool {
        self.block.count > 0
    }

    /// Appends a step for `f` (launched as `geo` says), if the op running now may defer
    /// and `f` is the batch's function with the batch's geometry (else the pending steps
    /// are launched first and a batch for `f` starts). `false`: not deferred, the caller
    /// launches as usual (after [`LaunchBatch::flush`]).
    pub(crate) fn defer(
        &mut self,
        f: &CudaFunction,
        geo: Geometry,
        step: &[u8; BATCH_STEP_BYTES],
        stream: &CudaStream,
        counters: &Counters,
    ) -> bool {
        if !self.open {
            return false;
        }
        let same = self
            .f
            .as_ref()
            .is_some_and(|(g, t)| g.cu_function() == f.cu_function() && *t == geo);
        if !same {
            self.flush(stream, counters);
            self.f = Some((f.clone(), geo));
        }
        let i = self.block.count as usize;
        self.block.steps[i] = *step;
        self.block.count += 1;
        if self.block.count as usize == BATCH_STEPS {
            self.flush(stream, counters);
        }
        true
    }

    /// Launches the pending steps, if any, as one batch on `stream`. A failure is kept
    /// for [`LaunchBatch::take_failure`].
    pub(crate) fn flush(&mut self, stream: &CudaStream, counters: &Counters) {
        if self.block.count == 0 {
            return;
        }
        let (f, geo) = self
            .f
            .as_ref()
            .expect("a batch with steps has its function");
        let t = counters.clock();
        let mut param = self.block;
        let mut params = [(&mut param as *mut Block).cast::<std::ffi::c_void>()];
        // SAFETY: the batch kernels take exactly one parameter, the `Block` struct by
        // value (the layout documented on `Block`, `repr(C)`), which `params` points at
        // for the call (the driver copies it). Each step was appended by its op's
        // launcher, which vouched for it as it would for a launch of its own
        // (`StreamCx::defer_launch`'s contract), and for the geometry; every buffer a
        // step addresses is held by its op until the burst's event, recorded after this
        // launch, has passed. `f` and `stream` are alive and of the context current on
        // the actor's thread.
        let r = unsafe {
            if geo.coop {
                cudarc::driver::sys::cuLaunchCooperativeKernel(
                    f.cu_function(),
                    geo.grid,
                    1,
                    1,
                    geo.threads,
                    1,
                    1,
                    0,
                    stream.cu_stream(),
                    params.as_mut_ptr(),
                )
                .result()
            } else {
                cudarc::driver::result::launch_kernel(
                    f.cu_function(),
                    (geo.grid, 1, 1),
                    (geo.threads, 1, 1),
                    0,
                    stream.cu_stream(),
                    &mut params,
                )
            }
        };
        if let Some(t) = t {
            counters.add(Phase::Launch, t.elapsed());
        }
        counters.batched(u64::from(self.block.count));
        self.block.count = 0;
        if let Err(e) = r {
            self.failed
                .get_or_insert_with(|| Error::cuda("cuLaunchKernel(batch)", e));
        }
    }

    /// The failure of a batch launched since the last call, if any.
    pub(crate) fn take_failure(&mut self) -> Option<Error> {
        self.failed.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_block_has_the_c_layout() {
        assert_eq!(
            std::mem::size_of::<Block>(),
            8 + BATCH_STEPS * BATCH_STEP_BYTES
        );
        assert_eq!(std::mem::align_of::<Block>(), 8);
        // Steps start 8 bytes in, as in the kernel's struct (whose steps hold 8-byte
        // fields: 8 is their alignment too).
        assert_eq!(std::mem::offset_of!(Block, steps), 8);
        assert_eq!(BATCH_STEP_BYTES % 8, 0);
    }
}
