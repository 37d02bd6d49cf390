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
element!(bf16, BF16, |x| x.to_f64(), bf16_from_f64);
element!(i32, I32, |x| x as f64, |v| v as i32);
element!(u32, U32, |x| x as f64, |v| v as u32);

/// f64 to bf16, rounded once to nearest (ties to even).
///
/// `half::bf16::from_f64` (2.7) misrounds some values (e.g. the f32 `0xb9c48001`, whose
/// dropped bits `0x8001` are above the halfway point, comes out rounded down), so go
/// through f32 with round-to-odd: the f32 keeps 16 more bits than bf16, and making its
/// last bit sticky when the f64 was not exact keeps the second rounding correct.
pub(crate) fn bf16_from_f64(v: f64) -> bf16 {
    let f = v as f32;
    if !f.is_finite() || f64::from(f) == v {
        return bf16::from_f32(f);
    }
    let mut bits = f.to_bits();
    if f64::from(f).abs() > v.abs() {
        bits -= 1; // `as` rounded away from zero: step back to the truncation
    }
    bf16::from_f32(f32::from_bits(bits | 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_from_f64_rounds_once() {
        // From f32 values the conversion must equal bf16::from_f32 (exact RNE).
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = f32::from_bits((s >> 32) as u32);
            if x.is_nan() {
                continue;
            }
            assert_eq!(
                bf16_from_f64(f64::from(x)).to_bits(),
                bf16::from_f32(x).to_bits(),
                "{x:e}"
            );
        }
        let x = f32::from_bits(0xb9c4_8001);
        assert_eq!(bf16_from_f64(f64::from(x)), bf16::from_f32(x));
        // A tie in f64 that f32 cannot hold: just above the halfway point of two bf16
        // values must round up even though `as f32` lands exactly on the midpoint.
        let lo = f64::from(bf16::from_bits(0x3f80).to_f32()); // 1.0
        let hi = f64::from(bf16::from_bits(0x3f81).to_f32());
        let mid = (lo + hi) / 2.0;
        assert_eq!(bf16_from_f64(mid + 1e-12).to_bits(), 0x3f81);
        assert_eq!(bf16_from_f64(mid - 1e-12).to_bits(), 0x3f80);
        assert_eq!(bf16_from_f64(mid).to_bits(), 0x3f80); // tie to even
    }
}
