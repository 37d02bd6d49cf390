//! Host↔device transfers on the copy stream, through pinned staging memory.

use std::sync::Arc as StdArc;

use cudarc::driver::PinnedHostSlice;

use super::StreamCx;
use crate::buffer::Buffer;
use crate::completion::Payload;
use crate::device::{Device, StreamId};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::{Cost, ExecCx, Op, Plan, PlanCx, TensorSpec};
use crate::runtime::Runtime;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Uploads below this many bytes skip pinned staging (pinning costs more than it saves).
const PINNED_MIN: usize = 1 << 16;

fn cuda_err(call: &str, e: impl std::fmt::Display) -> Error {
    Error::Cuda {
        call: call.into(),
        message: e.to_string(),
    }
}

/// The copy stream of device `ord`.
pub(crate) fn copy_stream(rt: &Runtime, ord: usize) -> Result<StreamId> {
    rt.inner
        .cuda
        .as_ref()
        .and_then(|c| {
            c.copy_streams
                .iter()
                .find(|(o, _)| *o == ord)
                .map(|(_, s)| *s)
        })
        .ok_or_else(|| Error::DeviceNotFound(format!("cuda:{ord} is not a device of this runtime")))
}

enum Staging<T> {
    Pageable(Vec<T>),
    Pinned(PinnedHostSlice<T>),
}

struct Upload<T: Element> {
    src: Staging<T>,
    shape: Shape,
}

/// Stages `data` on the host (pinned when large) and submits the copy to the copy stream.
pub(crate) fn upload<T: Element>(
    rt: &Runtime,
    ord: usize,
    data: &[T],
    shape: Shape,
) -> Result<Tensor> {
    let stream = copy_stream(rt, ord)?;
    let bytes = std::mem::size_of_val(data);
    let src = if bytes < PINNED_MIN {
        Staging::Pageable(data.to_vec())
    } else {
        let dev = rt
            .inner
            .cuda
            .as_ref()
            .and_then(|c| c.shared.iter().find(|d| d.ordinal == ord))
            .expect("checked");
        // SAFETY: the staging memory is fully written by `copy_from_slice` below before
        // any read of it.
        let mut p = unsafe { dev.ctx.alloc_pinned::<T>(data.len()) }
            .map_err(|e| cuda_err("cuMemHostAlloc", e))?;
        p.as_mut_slice()
            .map_err(|e| cuda_err("cuEventSynchronize", e))?
            .copy_from_slice(data);
        Staging::Pinned(p)
    };
    let sub = rt
        .submit_on(stream, Upload { src, shape })
        .map_err(|e| e.error)?;
    Ok(sub
        .outputs()
        .cloned()
        .expect("an upload has one output tensor"))
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
        match &self.src {
            Staging::Pageable(v) => scx.stream.memcpy_htod(v, &mut dst),
            Staging::Pinned(p) => scx.stream.memcpy_htod(p, &mut dst),
        }
        .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))?;
        cx.set_output(0, Buffer::from_cuda(dst))
    }
}

/// Enqueues a device-to-host copy into pinned memory; the returned finisher (run after the
/// copy's event completes) hands the data over as a `Vec<T>`.
pub(crate) fn download<T: Element>(
    scx: &mut StreamCx,
    src: &cudarc::driver::CudaSlice<T>,
) -> Result<Box<dyn FnOnce() -> Result<Payload> + Send>> {
    let ctx: &StdArc<cudarc::driver::CudaContext> = scx.context();
    // SAFETY: the memory is written by the copy below before the finisher reads it (the
    // finisher runs after the copy's event has completed).
    let mut dst = unsafe { ctx.alloc_pinned_with_flags::<T>(src.len(), 0) }
        .map_err(|e| cuda_err("cuMemHostAlloc", e))?;
    scx.stream
        .memcpy_dtoh(src, &mut dst)
        .map_err(|e| cuda_err("cuMemcpyDtoHAsync", e))?;
    Ok(Box::new(move || {
        let v = dst
            .as_slice()
            .map_err(|e| cuda_err("cuEventSynchronize", e))?
            .to_vec();
        Ok(Box::new(v) as Payload)
    }))
}
