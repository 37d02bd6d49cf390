//! Shared pieces of the CPU kernels: the [`Float`] element trait (f32, f16, bf16,
//! all computed in f32), the parallelism thresholds, and f32 conversion helpers.
//!
//! Every CPU kernel is written once, generic over [`Float`]. Storage types narrower
//! than f32 are widened on load and rounded once on store.
//!
//! Crate-private: [`Float`] and [`FloatKind`] are re-exported at the crate root (the
//! public CPU kernels are generic over them), and `Float` is sealed: only f32, f16 and
//! bf16 implement it.

use std::borrow::Cow;
use std::fmt::Debug;

use half::{bf16, f16};
use rayon::prelude::*;

/// Work (elements) per rayon task for element-wise and reduction kernels.
pub(crate) const PAR_CHUNK: usize = 64 * 1024;

/// Below this many elements a kernel runs serially on the calling thread: a rayon
/// dispatch costs a few microseconds, more than the work itself.
pub(crate) const PAR_MIN_LEN: usize = 64 * 1024;

/// Which concrete type implements [`Float`]; lets a kernel pick a native path
/// (for instance `gemm`'s f32 and f16 kernels) without `TypeId` tricks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatKind {
    /// `f32`.
    F32,
    /// `half::f16`.
    F16,
    /// `half::bf16`.
    Bf16,
}

/// A floating-point storage element: f32, f16 or bf16. Kernels compute in f32
/// (or f64 where they accumulate) and round once when they store.
pub trait Float:
    sealed::Sealed + Copy + Send + Sync + Default + PartialOrd + Debug + 'static
{
    /// The concrete type.
    const KIND: FloatKind;
    /// Widens to f32 (exact for all three types).
    fn to_f32(self) -> f32;
    /// Rounds an f32 to this type (round to nearest even).
    fn from_f32(v: f32) -> Self;
    /// Widens to f64 (exact).
    #[inline]
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    /// Rounds an f64 to this type once (no double rounding through f32).
    fn from_f64(v: f64) -> Self;
    /// The slice itself when `Self` is `f32`, so kernels can skip a conversion copy.
    #[inline]
    fn as_f32_slice(_s: &[Self]) -> Option<&[f32]> {
        None
    }
    /// The slice itself when `Self` is `f32`.
    #[inline]
    fn as_f32_slice_mut(_s: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}

mod sealed {
    /// Keeps [`Float`](super::Float) to the three types below.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

impl Float for f32 {
    const KIND: FloatKind = FloatKind::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline]
    fn as_f32_slice(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    #[inline]
    fn as_f32_slice_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
}

impl Float for f16 {
    const KIND: FloatKind = FloatKind::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

impl Float for bf16 {
    const KIND: FloatKind = FloatKind::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        // Not `bf16::from_f64`, which misrounds some values: see the runtime's `Element`.
        <bf16 as rtx_runtime::Element>::from_f64(v)
    }
}

/// Widens `x` to f32, in parallel for large inputs.
pub(crate) fn to_f32_vec<T: Float>(x: &[T]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    if x.len() < PAR_MIN_LEN {
        out.iter_mut().zip(x).for_each(|(o, v)| *o = v.to_f32());
    } else {
        out.par_chunks_mut(PAR_CHUNK)
            .zip(x.par_chunks(PAR_CHUNK))
            .for_each(|(o, x)| o.iter_mut().zip(x).for_each(|(o, v)| *o = v.to_f32()));
    }
    out
}

/// `x` as f32: borrowed when `T` is f32, a widened copy otherwise.
pub(crate) fn to_f32_cow<T: Float>(x: &[T]) -> Cow<'_, [f32]> {
    match T::as_f32_slice(x) {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(to_f32_vec(x)),
    }
}

/// Rounds `src` into `dst` (same length), in parallel for large inputs.
pub(crate) fn store_f32<T: Float>(src: &[f32], dst: &mut [T]) {
    debug_assert_eq!(src.len(), dst.len());
    if dst.len() < PAR_MIN_LEN {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = T::from_f32(*s));
    } else {
        dst.par_chunks_mut(PAR_CHUNK)
            .zip(src.par_chunks(PAR_CHUNK))
            .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, s)| *d = T::from_f32(*s)));
    }
}

/// Runs `f` on `y` viewed as f32: `y` itself when `T` is f32, otherwise a
/// zero-filled f32 scratch buffer that is rounded into `y` afterwards. `f` must
/// write every element: it cannot rely on what the buffer holds on entry.
pub(crate) fn with_f32_out<T: Float, R>(y: &mut [T], f: impl FnOnce(&mut [f32]) -> R) -> R {
    if let Some(s) = T::as_f32_slice_mut(y) {
        return f(s);
    }
    let mut tmp = vec![0f32; y.len()];
    let r = f(&mut tmp);
    store_f32(&tmp, y);
    r
}

/// Calls `f(i, a_i, b_i)` for the `i`-th chunks of `a` (chunks of `ca`) and `b`
/// (chunks of `cb`), with rayon when `par`, in order on this thread otherwise.
/// Both slices must split into the same number of chunks; `ca` and `cb` > 0.
pub(crate) fn for_chunk_pairs<A: Send, B: Send>(
    a: &mut [A],
    ca: usize,
    b: &mut [B],
    cb: usize,
    par: bool,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    debug_assert_eq!(a.len().div_ceil(ca), b.len().div_ceil(cb));
    if par {
        a.par_chunks_mut(ca)
            .zip(b.par_chunks_mut(cb))
            .enumerate()
            .for_each(|(i, (a, b))| f(i, a, b));
    } else {
        a.chunks_mut(ca)
            .zip(b.chunks_mut(cb))
            .enumerate()
            .for_each(|(i, (a, b))| f(i, a, b));
    }
}

/// Test helpers shared by the kernels' unit tests: seeded random inputs, NaN
/// poisoning and the relative error by the norm.
#[cfg(test)]
pub(crate) mod testing {
    use super::Float;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A fresh random seed and its generator; print the seed in assertion messages.
    /// `RTX_TEST_SEED` replays a failure's seed (as in the integration tests).
    pub fn rng() -> (u64, StdRng) {
        let seed: u64 = std::env::var("RTX_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        (seed, StdRng::seed_from_u64(seed))
    }

    /// Uniform values in [-1, 1), rounded to `T`.
    pub fn rand_vec<T: Float>(rng: &mut StdRng, n: usize) -> Vec<T> {
        (0..n)
            .map(|_| T::from_f32(rng.gen_range(-1.0f32..1.0)))
            .collect()
    }

    /// An output buffer filled with NaN, so an unwritten element fails the check.
    pub fn poison<T: Float>(n: usize) -> Vec<T> {
        vec![T::from_f32(f32::NAN); n]
    }

    /// Widens to f64 (for references computed from the rounded inputs).
    pub fn f64s<T: Float>(x: &[T]) -> Vec<f64> {
        x.iter().map(|v| v.to_f64()).collect()
    }

    /// ‖out − ref‖ / ‖ref‖ (NaN if `out` holds a NaN; ‖out − ref‖ if ‖ref‖ = 0).
    pub fn rel_err<T: Float>(out: &[T], reference: &[f64]) -> f64 {
        rel_err_f64(&f64s(out), reference)
    }

    /// [`rel_err`] for f64 values.
    pub fn rel_err_f64(out: &[f64], reference: &[f64]) -> f64 {
        assert_eq!(out.len(), reference.len(), "length mismatch");
        if out.iter().any(|v| v.is_nan()) {
            return f64::NAN;
        }
        let (mut num, mut den) = (0f64, 0f64);
        for (o, r) in out.iter().zip(reference) {
            num += (o - r) * (o - r);
            den += r * r;
        }
        if den == 0.0 {
            num.sqrt()
        } else {
            (num / den).sqrt()
        }
    }

    /// The tolerance for `T`: 1e-5 for f32, 1e-2 for f16 and bf16.
    pub fn tol<T: Float>() -> f64 {
        match T::KIND {
            super::FloatKind::F32 => 1e-5,
            _ => 1e-2,
        }
    }
}
