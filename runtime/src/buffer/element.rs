//! The element types: the Rust types a tensor can hold, and their typed views of buffers.

use std::fmt;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};

use super::{CpuData, CudaData, Slices};
use crate::dtype::DType;

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can be a tensor element. Sealed: f32, f16, bf16, i32, u32.
pub trait Element:
    sealed::Sealed
    + Copy
    + Send
    + Sync
    + fmt::Debug
    + PartialEq
    + DeviceRepr
    + ValidAsZeroBits
    + 'static
{
    /// The runtime dtype.
    const DTYPE: DType;
    /// Typed view of CPU data of this dtype.
    fn cpu(d: &CpuData) -> Option<&[Self]>;
    /// Typed mutable view of CPU data of this dtype.
    fn cpu_mut(d: &mut CpuData) -> Option<&mut [Self]>;
    /// Wraps a vector as CPU data.
    fn into_cpu(v: Vec<Self>) -> CpuData;
    /// Takes the vector back out of CPU data of this dtype.
    fn from_cpu(d: CpuData) -> Result<Vec<Self>, CpuData>;
    /// Typed view of CUDA data of this dtype.
    fn cuda(d: &CudaData) -> Option<&CudaSlice<Self>>;
    /// Typed mutable view of CUDA data of this dtype.
    fn cuda_mut(d: &mut CudaData) -> Option<&mut CudaSlice<Self>>;
    /// Wraps a device slice as CUDA data.
    fn into_cuda(s: CudaSlice<Self>) -> CudaData;
    /// Takes the device slice back out of CUDA data of this dtype.
    fn from_cuda(d: CudaData) -> Result<CudaSlice<Self>, CudaData>;
    /// Widening conversion, for references and tests.
    fn to_f64(self) -> f64;
    /// Narrowing conversion (rounds to nearest; integers truncate).
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $variant:ident, $to:expr, $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn cpu(d: &CpuData) -> Option<&[Self]> {
                match d {
                    CpuData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn cpu_mut(d: &mut CpuData) -> Option<&mut [Self]> {
                match d {
                    CpuData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn into_cpu(v: Vec<Self>) -> CpuData {
                CpuData::$variant(v)
            }
            fn from_cpu(d: CpuData) -> Result<Vec<Self>, CpuData> {
                match d {
                    CpuData::$variant(v) => Ok(v),
                    other => Err(other),
                }
            }
            fn cuda(d: &CudaData) -> Option<&CudaSlice<Self>> {
                match &d.data {
                    Slices::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn cuda_mut(d: &mut CudaData) -> Option<&mut CudaSlice<Self>> {
                match &mut d.data {
                    Slices::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn into_cuda(s: CudaSlice<Self>) -> CudaData {
                CudaData::new(Slices::$variant(std::mem::ManuallyDrop::new(s)))
            }
            fn from_cuda(d: CudaData) -> Result<CudaSlice<Self>, CudaData> {
                d.into_slice::<Self>()
            }
            fn to_f64(self) -> f64 {
                let f: fn($t) -> f64 = $to;
                f(self)
            }
            fn from_f64(v: f64) -> Self {
                let f: fn(f64) -> $t = $from;
                f(v)
            }
        }
    };
}

element!(f32, F32, |x| x as f64, |v| v as f32);
element!(f16, F16, |x| x.to_f64(), f16::from_f64);
element!(bf16, BF16, |x| x.to_f64(), bf16::from_f64);
element!(i32, I32, |x| x as f64, |v| v as i32);
element!(u32, U32, |x| x as f64, |v| v as u32);
