//! CPU dtype conversion (the reference of `kernels/cuda/convert.cu`).

use rayon::prelude::*;
use rtx_runtime::Element;

use crate::cpu_util::{PAR_CHUNK, PAR_MIN_LEN};

/// Converts through f32 as the CUDA kernels do: `A` to the nearest f32 (exact for f16,
/// bf16 and f32), then to `B` with one rounding (nearest even).
#[inline(always)]
pub fn convert<A: Element, B: Element>(v: A) -> B {
    B::from_f64(v.to_f64() as f32 as f64)
}

/// `x` converted element by element to `B`.
pub fn cast<A: Element, B: Element + Default>(x: &[A]) -> Vec<B> {
    let mut y = vec![B::default(); x.len()];
    let kernel = |x: &[A], y: &mut [B]| y.iter_mut().zip(x).for_each(|(o, v)| *o = convert(*v));
    if x.len() < PAR_MIN_LEN {
        kernel(x, &mut y);
    } else {
        y.par_chunks_mut(PAR_CHUNK)
            .zip(x.par_chunks(PAR_CHUNK))
            .for_each(|(y, x)| kernel(x, y));
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn rounding_and_overflow() {
        assert_eq!(convert::<f32, f16>(1e6).to_f32(), f32::INFINITY);
        assert_eq!(convert::<f32, bf16>(1.0 + 1.0 / 512.0).to_f32(), 1.0);
        assert_eq!(convert::<i32, f32>(16_777_217), 16_777_216.0);
        assert_eq!(convert::<u32, f16>(2049).to_f32(), 2048.0);
        assert!(convert::<f32, f16>(f32::NAN).is_nan());
    }
}
