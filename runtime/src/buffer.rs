//! Buffers: the memory behind a tensor, on the CPU or on a CUDA device.
//!
//! A buffer is typed by an enum over the supported dtypes, so every access is checked
//! without `unsafe`. Buffers are created by ops (outputs) and by uploads, and are owned by
//! a tensor's storage once published (see `storage.rs` for the protocol).

use std::mem::ManuallyDrop;

use cudarc::driver::CudaSlice;
use half::{bf16, f16};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// Host memory of one dtype.
#[allow(missing_docs)]
#[derive(Debug, Clone)]
pub enum CpuData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    U32(Vec<u32>),
}

/// Device memory of one dtype. Dropped, it goes back to the block cache of the stream
/// actor that allocated it (or is freed stream-ordered; see the CUDA backend's
/// allocator). The slices are wrapped in `ManuallyDrop` only so that the drop can hand
/// them on; reach them through [`Element::cuda`](crate::Element) and friends.
#[allow(missing_docs)]
#[derive(Debug)]
pub enum CudaData {
    F32(ManuallyDrop<CudaSlice<f32>>),
    F16(ManuallyDrop<CudaSlice<f16>>),
    BF16(ManuallyDrop<CudaSlice<bf16>>),
    I32(ManuallyDrop<CudaSlice<i32>>),
    U32(ManuallyDrop<CudaSlice<u32>>),
}

impl CudaData {
    /// Moves the slice out without recycling it (for `Element::from_cuda`).
    pub(crate) fn into_slice<T: crate::dtype::Element>(self) -> Result<CudaSlice<T>, Self> {
        if T::cuda(&self).is_none() {
            return Err(self);
        }
        let mut this = ManuallyDrop::new(self);
        let slice = T::cuda_mut(&mut this).expect("dtype checked above");
        // SAFETY: `this` is never dropped (ManuallyDrop) nor used after this read, so
        // the slice is moved out exactly once and its memory has one owner again.
        Ok(unsafe { std::ptr::read(slice) })
    }
}

macro_rules! each {
    ($e:expr, $v:ident => $body:expr) => {
        match $e {
            Self::F32($v) => $body,
            Self::F16($v) => $body,
            Self::BF16($v) => $body,
            Self::I32($v) => $body,
            Self::U32($v) => $body,
        }
    };
}

impl Drop for CudaData {
    fn drop(&mut self) {
        // SAFETY: each slice is taken exactly once, here, and the enum is never used
        // again (it is being dropped); `ManuallyDrop` keeps it from being dropped twice.
        each!(self, v => crate::cuda::recycle(unsafe { ManuallyDrop::take(v) }))
    }
}

impl CpuData {
    /// Elements held.
    pub fn len(&self) -> usize {
        each!(self, v => v.len())
    }
    /// Whether no elements are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            Self::F32(_) => DType::F32,
            Self::F16(_) => DType::F16,
            Self::BF16(_) => DType::BF16,
            Self::I32(_) => DType::I32,
            Self::U32(_) => DType::U32,
        }
    }
}

impl CudaData {
    /// Elements held.
    pub fn len(&self) -> usize {
        each!(self, v => v.len())
    }
    /// Whether no elements are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            Self::F32(_) => DType::F32,
            Self::F16(_) => DType::F16,
            Self::BF16(_) => DType::BF16,
            Self::I32(_) => DType::I32,
            Self::U32(_) => DType::U32,
        }
    }
}

/// A tensor's memory.
#[derive(Debug)]
pub enum Buffer {
    /// Host memory (CPU backend).
    Cpu(CpuData),
    /// Device memory (CUDA backend).
    Cuda(CudaData),
}

impl Buffer {
    /// Wraps a host vector.
    pub fn from_vec<T: Element>(v: Vec<T>) -> Self {
        Buffer::Cpu(T::into_cpu(v))
    }
    /// Wraps a device slice.
    pub fn from_cuda<T: Element>(s: CudaSlice<T>) -> Self {
        Buffer::Cuda(T::into_cuda(s))
    }
    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            Buffer::Cpu(d) => d.len(),
            Buffer::Cuda(d) => d.len(),
        }
    }
    /// Whether no elements are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::Cpu(d) => d.dtype(),
            Buffer::Cuda(d) => d.dtype(),
        }
    }
    /// The host elements, if this is host memory of dtype `T` (else
    /// [`Error::BufferAccess`]).
    pub fn cpu<T: Element>(&self) -> Result<&[T]> {
        match self {
            Buffer::Cpu(d) => T::cpu(d).ok_or_else(|| self.access_error::<T>("host")),
            Buffer::Cuda(_) => Err(self.access_error::<T>("host")),
        }
    }
    /// The host elements, mutably.
    pub fn cpu_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        let err = self.access_error::<T>("host");
        match self {
            Buffer::Cpu(d) => T::cpu_mut(d).ok_or(err),
            Buffer::Cuda(_) => Err(err),
        }
    }
    /// The device slice, if this is device memory of dtype `T` (else
    /// [`Error::BufferAccess`]).
    pub fn cuda<T: Element>(&self) -> Result<&CudaSlice<T>> {
        match self {
            Buffer::Cuda(d) => T::cuda(d).ok_or_else(|| self.access_error::<T>("device")),
            Buffer::Cpu(_) => Err(self.access_error::<T>("device")),
        }
    }
    /// The device slice, mutably.
    pub fn cuda_mut<T: Element>(&mut self) -> Result<&mut CudaSlice<T>> {
        let err = self.access_error::<T>("device");
        match self {
            Buffer::Cuda(d) => T::cuda_mut(d).ok_or(err),
            Buffer::Cpu(_) => Err(err),
        }
    }
    /// The error for accessing this buffer as `side` (host or device) memory of `T`.
    fn access_error<T: Element>(&self, side: &str) -> Error {
        let held = match self {
            Buffer::Cpu(_) => "host",
            Buffer::Cuda(_) => "device",
        };
        Error::BufferAccess {
            wanted: format!("{side} {}", T::DTYPE),
            held: format!("{held} {}", self.dtype()),
        }
    }
}
