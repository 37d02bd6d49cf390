//! Moving data between the host and a runtime's devices.

use crate::buffer::{Buffer, Element};
use crate::completion::{Payload, Submission};
use crate::device::{Device, StreamId};
use crate::error::{Error, Result};
use crate::op::{BackendCx, Cost, ExecCx, Op, Plan, PlanCx};
use crate::runtime::{BackendState, Runtime};
use crate::shape::Shape;
use crate::storage::Storage;
use crate::sync::Arc;
use crate::tensor::Tensor;

impl Runtime {
    /// Copies host data into a new tensor on the default device. On CUDA the copy runs on
    /// the device's copy stream from pinned staging memory, overlapping compute; the
    /// tensor can be used at once (consumers wait for the copy on the device). Fails with
    /// [`Error::Shutdown`] once [`Runtime::shutdown`] has begun, as submits do.
    pub fn upload<T: Element>(&self, data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        self.upload_to(self.device(), data, shape)
    }

    /// Like [`Runtime::upload`], taking ownership (no copy on the CPU backend).
    pub fn upload_vec<T: Element>(&self, data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        self.check_open()?;
        check_len(data.len(), &shape)?;
        match self.device() {
            d @ Device::Cpu(_) => Ok(Tensor::from_storage(
                shape,
                Arc::new(Storage::ready(Buffer::from_vec(data), d, self.inner.id)),
            )),
            d @ Device::Cuda(_) => self.upload_to(d, &data, shape),
        }
    }

    /// Copies host data into a new tensor on `device`.
    pub fn upload_to<T: Element>(
        &self,
        device: Device,
        data: &[T],
        shape: impl Into<Shape>,
    ) -> Result<Tensor> {
        let shape = shape.into();
        self.check_open()?;
        check_len(data.len(), &shape)?;
        match (&self.inner.backend, device) {
            (BackendState::Cpu, Device::Cpu(_)) if self.has_device(device) => {
                Ok(Tensor::from_storage(
                    shape,
                    Arc::new(Storage::ready(
                        Buffer::from_vec(data.to_vec()),
                        device,
                        self.inner.id,
                    )),
                ))
            }
            (BackendState::Cuda(devs), Device::Cuda(ord)) => {
                let (stream, op) = crate::cuda::io::upload(devs, ord, data, shape)?;
                let sub = self.submit_on(stream, op).map_err(|e| e.error)?;
                Ok(sub
                    .outputs()
                    .cloned()
                    .expect("an upload has one output tensor"))
            }
            _ => Err(Error::DeviceNotFound(format!(
                "{device} is not a device of this runtime"
            ))),
        }
    }

    /// Copies a tensor to the host once its producer has finished: `.await` the
    /// submission (or `.wait()` it) for the data.
    pub fn to_vec<T: Element>(&self, t: &Tensor) -> Result<Submission<Vec<T>>> {
        if t.dtype() != T::DTYPE {
            return Err(Error::dtype("to_vec", t.dtype(), T::DTYPE));
        }
        let stream = match t.device() {
            d @ Device::Cpu(_) => match t.producer() {
                Some(s) => s,
                None => self.first_stream(d)?,
            },
            Device::Cuda(ord) => match &self.inner.backend {
                BackendState::Cuda(devs) => devs.copy_stream(ord)?,
                BackendState::Cpu => {
                    return Err(Error::DeviceNotFound(format!(
                        "cuda:{ord} is not a device of this runtime"
                    )))
                }
            },
        };
        self.submit_payload(
            stream,
            Download::<T> {
                t: t.clone(),
                _t: std::marker::PhantomData,
            },
        )
    }
}

impl Runtime {
    /// Whether `device` is one of this runtime's.
    pub(crate) fn has_device(&self, device: Device) -> bool {
        self.inner.devices.iter().any(|d| d.device == device)
    }

    /// The first compute stream of `device`, or [`Error::DeviceNotFound`].
    pub(crate) fn first_stream(&self, device: Device) -> Result<StreamId> {
        self.compute_streams(device)
            .first()
            .copied()
            .ok_or_else(|| {
                Error::DeviceNotFound(format!("{device} is not a device of this runtime"))
            })
    }

    /// `Err(Shutdown)` once shutdown has begun: uploads then fail like submits and
    /// downloads (on the CPU backend an upload enqueues nothing, so it checks here).
    fn check_open(&self) -> Result<()> {
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        Ok(())
    }
}

fn check_len(len: usize, shape: &Shape) -> Result<()> {
    let Some(numel) = shape.checked_numel() else {
        return Err(Error::invalid_dim(
            "upload",
            format!("the shape {shape} has more elements than fit in usize"),
        ));
    };
    if len != numel {
        return Err(Error::ShapeMismatch {
            op: "upload".into(),
            lhs: Shape::new(vec![len]),
            rhs: shape.clone(),
            detail: format!("{len} elements for a shape of {numel}"),
        });
    }
    if numel == 0 {
        return Err(Error::invalid(
            "upload",
            format!("zero-size tensors ({shape}) are not supported"),
        ));
    }
    Ok(())
}

/// Copies one tensor to the host (internal op behind [`Runtime::to_vec`]).
struct Download<T: Element> {
    t: Tensor,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: Element> Op for Download<T> {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        "to_vec"
    }
    fn capture_hazard(&self) -> Option<crate::error::CaptureHazard> {
        Some(crate::error::CaptureHazard::Readback)
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.t]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        Ok(Plan {
            outputs: vec![],
            cost: Cost {
                flops: 0.0,
                bytes: (self.t.numel() * T::DTYPE.size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let buf = cx.input(&self.t)?;
        match cx.backend() {
            BackendCx::Cpu => {
                let v: Vec<T> = buf.cpu::<T>()?.to_vec();
                cx.finish_with(Box::new(move || Ok(Box::new(v) as Payload)));
                Ok(())
            }
            BackendCx::Cuda(scx) => {
                let f = crate::cuda::io::download::<T>(scx, buf.cuda::<T>()?)?;
                cx.finish_with(f);
                Ok(())
            }
        }
    }
}
