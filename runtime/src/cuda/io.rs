//! Host↔device transfers on the copy stream, through pinned staging memory from the
//! device's cache (`driver/pinned.rs`).

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::{sys, CudaSlice, DevicePtr, DevicePtrMut};

use super::Devices;
use crate::buffer::{Buffer, Element};
use crate::completion::Payload;
use crate::device::{Device, StreamId};
use crate::driver::pinned::Pinned;
use crate::driver::StreamCx;
use crate::error::{Error, Result};
use crate::op::{Cost, ExecCx, Op, Plan, PlanCx, TensorSpec};
use crate::shape::Shape;
use crate::tensor::Tensor;

fn cuda_err(call: &str, e: cudarc::driver::DriverError) -> Error {
    Error::cuda(call, e)
}

/// The upload op: a copy from pinned staging memory into a new device tensor.
pub(crate) struct Upload<T: Element> {
    /// The data, staged in pinned memory (back to the cache when the op is dropped,
    /// after its completion).
    src: Pinned,
    shape: Shape,
    _t: PhantomData<T>,
}

/// Stages `data` in pinned memory from the device's cache; the op that copies it to the
/// device, and the copy stream to submit it to.
pub(crate) fn upload<T: Element>(
    devs: &Devices,
    ord: usize,
    data: &[T],
    shape: Shape,
) -> Result<(StreamId, Upload<T>)> {
    let stream = devs.copy_stream(ord)?;
    let bytes = std::mem::size_of_val(data);
    let dev = devs.device(ord)?;
    // A failed device fails the upload with its cause, before any driver call.
    if let Some(e) = dev.poisoned() {
        return Err(e);
    }
    let src = dev
        .pinned
        .take(bytes)
        .map_err(|e| cuda_err("cuMemHostAlloc", e))?;
    // SAFETY: `src` is a lent pinned block of at least `bytes` bytes that nothing else
    // uses (no copy is pending on it: `take` waited for its event); `data` is `bytes`
    // bytes of plain elements in ordinary host memory, so the ranges do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), src.as_ptr(), bytes) };
    let op = Upload::<T> {
        src,
        shape,
        _t: PhantomData,
    };
    Ok((stream, op))
}

impl<T: Element> Op for Upload<T> {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "upload"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![]
    }
    fn plan(&self, cx: &PlanCx) -> Result<Plan> {
        if !matches!(cx.device, Device::Cuda(_)) {
            return Err(Error::invalid(
                "upload",
                "CUDA upload planned on a non-CUDA device",
            ));
        }
        let bytes = (self.shape.numel() * T::DTYPE.size()) as f64;
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.shape.clone(), T::DTYPE)],
            cost: Cost { flops: 0.0, bytes },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let n = self.shape.numel();
        let scx = cx.cuda()?;
        let mut dst = scx.alloc::<T>(n)?;
        // (Event tracking is off for the runtime's context: the guard records nothing.)
        let dptr = dst.device_ptr_mut(&scx.stream).0;
        // SAFETY: `dst` holds n elements = `src.len()` bytes on this stream's device; the
        // pinned source holds that many written bytes and stays alive (in this op) until
        // the op's completion, after the copy; its event is recorded right behind.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dptr,
                self.src.as_ptr().cast::<c_void>(),
                self.src.len(),
                scx.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))?;
        // On failure the op (holding the block) is released only after the actor has
        // synchronized the stream (`actor::execute`), so the copy is done by then.
        self.src
            .record(&scx.stream)
            .map_err(|e| cuda_err("cuEventRecord", e))?;
        cx.set_output(0, Buffer::from_cuda(dst))
    }
}

/// Enqueues a device-to-host copy into a pinned block from the device's cache; the
/// returned finisher (run after the op's completion, so after the copy) hands the data
/// over as a `Vec<T>` and gives the block back.
pub(crate) fn download<T: Element>(
    scx: &mut StreamCx,
    src: &CudaSlice<T>,
) -> Result<Box<dyn FnOnce() -> Result<Payload> + Send>> {
    let n = src.len();
    let bytes = n * std::mem::size_of::<T>();
    let dst = scx
        .dev
        .pinned
        .take(bytes)
        .map_err(|e| cuda_err("cuMemHostAlloc", e))?;
    let sptr = src.device_ptr(&scx.stream).0;
    // SAFETY: `src` holds `bytes` bytes on this stream's device and is kept alive by the
    // op until completion; `dst` is a lent pinned block of at least `bytes` bytes, moved
    // into the finisher, which reads it only after the op's completion (after the copy).
    unsafe {
        sys::cuMemcpyDtoHAsync_v2(
            dst.as_ptr().cast::<c_void>(),
            sptr,
            bytes,
            scx.stream.cu_stream(),
        )
    }
    .result()
    .map_err(|e| cuda_err("cuMemcpyDtoHAsync", e))?;
    if let Err(e) = dst.record(&scx.stream) {
        // The copy is enqueued but its event is not: the block may go back to the cache
        // only once the stream has finished the copy, else it is leaked.
        if scx.stream.synchronize().is_err() {
            dst.leak();
        }
        return Err(cuda_err("cuEventRecord", e));
    }
    Ok(Box::new(move || {
        let mut v = Vec::<T>::with_capacity(n);
        // SAFETY: the watcher runs the finisher only after it has synchronized an event
        // recorded behind the copy (`finish` in `cuda/watcher.rs`; on failure the
        // finisher is dropped unrun), so the copy into `dst` completed and wrote `n`
        // elements of `T` (plain numbers, any bit pattern valid) from the device tensor; the pinned
        // block is page-aligned, so aligned for `T`; `v` has capacity `n` and does not
        // overlap pinned memory.
        unsafe {
            std::ptr::copy_nonoverlapping(dst.as_ptr().cast::<T>(), v.as_mut_ptr(), n);
            v.set_len(n);
        }
        Ok(Box::new(v) as Payload)
    }))
}
