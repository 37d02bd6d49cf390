//! Parameter initialization.
//!
//! For now the values are generated on the host from a seeded generator and uploaded
//! (one upload per parameter, at construction only). [`uniform`] is the single function
//! that produces them: when the device-side counter-based (Philox) `uniform` op is in
//! `rtx-ops`, replace its body with a submission of that op, and every layer
//! initializes on the device with no upload.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rtx_runtime::{bf16, f16, DType, Error, Result, Runtime, Shape, Tensor};

/// A tensor of `shape` and `dtype` with values uniform in `[-bound, bound)`, from
/// `seed` (the same seed gives the same values).
///
/// SWAP POINT: host generation + upload; to be replaced by the device-side Philox
/// `uniform` op (see the module docs).
pub fn uniform(
    rt: &Runtime,
    shape: impl Into<Shape>,
    dtype: DType,
    bound: f64,
    seed: u64,
) -> Result<Tensor> {
    let shape = shape.into();
    let n = shape
        .checked_numel()
        .ok_or_else(|| Error::invalid("init::uniform", format!("{shape} overflows")))?;
    let mut r = StdRng::seed_from_u64(seed);
    let mut draw = || r.gen_range(-bound..bound);
    match dtype {
        DType::F32 => rt.upload_vec((0..n).map(|_| draw() as f32).collect(), shape),
        DType::F16 => rt.upload_vec((0..n).map(|_| f16::from_f64(draw())).collect(), shape),
        DType::BF16 => rt.upload_vec(
            (0..n)
                .map(|_| <bf16 as rtx_runtime::Element>::from_f64(draw()))
                .collect(),
            shape,
        ),
        other => Err(Error::dtype("init::uniform", DType::F32, other)),
    }
}

/// A seed for part `i` of something seeded with `seed` (SplitMix64 of both), so that
/// layers built from one seed get independent streams.
pub fn derive_seed(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
