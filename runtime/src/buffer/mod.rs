//! Buffers: the memory behind a tensor, on the CPU or on a CUDA device.
//!
//! A buffer is typed by an enum over the supported dtypes, so every access is checked
//! without `unsafe`. Buffers are created by ops (outputs) and by uploads, and are owned by
//! a tensor's storage once published (see `storage.rs` for the protocol). Device memory
//! carries its allocator handle (`driver/alloc.rs`), so it goes back to the block cache
//! it came from without any process-wide lookup.

mod element;

use std::mem::ManuallyDrop;

use cudarc::driver::CudaSlice;
use half::{bf16, f16};

pub use element::Element;

use crate::driver::alloc::Home;
use crate::dtype::DType;
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

/// Device memory of one dtype, and where it goes when dropped: back to the block cache
/// of the stream actor whose op produced it (or freed stream-ordered; see
/// `driver/alloc.rs`). Reach the slice through [`Buffer::cuda`] or
/// [`Element::cuda`](crate::Element) and friends.
#[derive(Debug)]
pub struct CudaData {
    data: Slices,
    home: Home,
}

/// The slice of each dtype, wrapped in `ManuallyDrop` only so that the drop can hand it
/// on to its home.
#[derive(Debug)]
enum Slices {
    F32(ManuallyDrop<CudaSlice<f32>>),
    F16(ManuallyDrop<CudaSlice<f16>>),
    BF16(ManuallyDrop<CudaSlice<bf16>>),
    I32(ManuallyDrop<CudaSlice<i32>>),
    U32(ManuallyDrop<CudaSlice<u32>>),
}

impl CudaData {
    fn new(data: Slices) -> Self {
        CudaData {
            data,
            home: Home::default(),
        }
    }
    /// Moves the slice out without recycling it (for `Element::from_cuda`).
    pub(crate) fn into_slice<T: Element>(self) -> Result<CudaSlice<T>, Self> {
        if T::cuda(&self).is_none() {
            return Err(self);
        }
        let mut this = ManuallyDrop::new(self);
        let slice = T::cuda_mut(&mut this).expect("dtype checked above");
        // SAFETY: `this` is never dropped (ManuallyDrop) nor used after these reads, so
        // the slice and the home are each moved out exactly once: the memory has one
        // owner again, and the home handle is dropped once (below).
        let (slice, home) = unsafe { (std::ptr::read(slice), std::ptr::read(&this.home)) };
        drop(home);
        Ok(slice)
    }
    /// Gives memory that has no home yet the home `home` (the actor running the op that
    /// sets it as an output), if the memory is of that actor's stream (`stream`, as
    /// `CUstream` handle value).
    pub(crate) fn adopt(&mut self, home: Home, stream: usize) {
        if self.home.is_none() && self.stream_handle() == stream {
            self.home = home;
        }
    }
    /// The same memory, bound to `stream` from now on: dropped, it is freed (or cached,
    /// see `driver/alloc.rs`) stream-ordered on `stream`, after the work enqueued there
    /// before the drop. Its home is dropped (`adopt` may give it `stream`'s).
    pub(crate) fn rebind(self, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Self {
        let this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped (ManuallyDrop) nor used after these reads, so
        // the slices and the home are each moved out exactly once.
        let (data, home) = unsafe { (std::ptr::read(&this.data), std::ptr::read(&this.home)) };
        drop(home);
        use crate::driver::alloc::rebind;
        let data = match data {
            Slices::F32(v) => Slices::F32(ManuallyDrop::new(rebind(
                ManuallyDrop::into_inner(v),
                stream,
            ))),
            Slices::F16(v) => Slices::F16(ManuallyDrop::new(rebind(
                ManuallyDrop::into_inner(v),
                stream,
            ))),
            Slices::BF16(v) => Slices::BF16(ManuallyDrop::new(rebind(
                ManuallyDrop::into_inner(v),
                stream,
            ))),
            Slices::I32(v) => Slices::I32(ManuallyDrop::new(rebind(
                ManuallyDrop::into_inner(v),
                stream,
            ))),
            Slices::U32(v) => Slices::U32(ManuallyDrop::new(rebind(
                ManuallyDrop::into_inner(v),
                stream,
            ))),
        };
        CudaData::new(data)
    }
    /// The `CUstream` handle of the slice's stream, as a number.
    pub(crate) fn stream_handle(&self) -> usize {
        each_slice!(&self.data, v => v.stream().cu_stream() as usize)
    }
}

macro_rules! each_slice {
    ($e:expr, $v:ident => $body:expr) => {
        match $e {
            Slices::F32($v) => $body,
            Slices::F16($v) => $body,
            Slices::BF16($v) => $body,
            Slices::I32($v) => $body,
            Slices::U32($v) => $body,
        }
    };
}
use each_slice;

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
        let home = &self.home;
        // SAFETY: each slice is taken exactly once, here, and the enum is never used
        // again (it is being dropped); `ManuallyDrop` keeps it from being dropped twice.
        each_slice!(&mut self.data, v => home.recycle(unsafe { ManuallyDrop::take(v) }))
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
        each_slice!(&self.data, v => v.len())
    }
    /// Whether no elements are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self.data {
            Slices::F32(_) => DType::F32,
            Slices::F16(_) => DType::F16,
            Slices::BF16(_) => DType::BF16,
            Slices::I32(_) => DType::I32,
            Slices::U32(_) => DType::U32,
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
        // Checked first, the error built only when it is one (the hot path allocates
        // nothing).
        if self.cpu::<T>().is_err() {
            return Err(self.access_error::<T>("host"));
        }
        match self {
            Buffer::Cpu(d) => T::cpu_mut(d).ok_or_else(|| unreachable_access::<T>("host")),
            Buffer::Cuda(_) => Err(unreachable_access::<T>("host")),
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
        // As in `cpu_mut`: no error (two formatted strings) built on the hot path.
        if self.cuda::<T>().is_err() {
            return Err(self.access_error::<T>("device"));
        }
        match self {
            Buffer::Cuda(d) => T::cuda_mut(d).ok_or_else(|| unreachable_access::<T>("device")),
            Buffer::Cpu(_) => Err(unreachable_access::<T>("device")),
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

/// The access error of a mutable access that its immutable check let through (the same
/// test on the same buffer: not reached).
fn unreachable_access<T: Element>(side: &str) -> Error {
    Error::BufferAccess {
        wanted: format!("{side} {}", T::DTYPE),
        held: "a buffer that changed between two checks".into(),
    }
}
