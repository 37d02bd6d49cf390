//! The CPU side of the random ops, and the generator both backends share.
//!
//! [`philox4x32_10`] is Philox4x32 with 10 rounds (Salmon, Moraes, Dror and Shaw,
//! "Parallel random numbers: as easy as 1, 2, 3", SC 2011), bit for bit the function of
//! Random123 and of `kernels/cuda/random.cu`. Element `i` of a tensor takes lane `i % 4`
//! of the generator at counter `[c, c >> 32, offset, offset >> 32]`, `c = i / 4`, under
//! the key `[seed, seed >> 32]`; see [`uniform_value`] and [`normal_pair`] for the maps.

use rayon::prelude::*;

use crate::cpu_util::{Float, PAR_CHUNK, PAR_MIN_LEN};

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32-10: four 32-bit outputs of counter `ctr` under key `key`.
///
/// # Examples
///
/// ```
/// // Random123's known answer for the zero counter and key.
/// let x = rtx_ops::random::cpu::philox4x32_10([0; 4], [0; 2]);
/// assert_eq!(x, [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
/// ```
#[inline]
pub fn philox4x32_10(mut ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut k0, mut k1] = key;
    for r in 0..10 {
        if r > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let p0 = M0 as u64 * ctr[0] as u64;
        let p1 = M1 as u64 * ctr[2] as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        ctr = [hi1 ^ ctr[1] ^ k0, lo1, hi0 ^ ctr[3] ^ k1, lo0];
    }
    ctr
}

/// The generator's four outputs for the `c`-th group of four elements.
#[inline]
pub fn block(seed: u64, offset: u64, c: u64) -> [u32; 4] {
    philox4x32_10(
        [
            c as u32,
            (c >> 32) as u32,
            offset as u32,
            (offset >> 32) as u32,
        ],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// A 32-bit output as a uniform value in (0, 1): `(2 * (x >> 9) + 1) * 2^-24`, an odd
/// multiple of 2^-24 (exactly representable in f32, never 0 or 1).
#[inline]
pub fn uniform_value(x: u32) -> f32 {
    (((x >> 9) << 1) | 1) as f32 * (1.0 / 16_777_216.0)
}

/// Box-Muller on two outputs: `(r cos(2 pi u2), r sin(2 pi u2))` with `r = sqrt(-2 ln
/// u1)`, in f64, rounded to f32 (CUDA computes the same in f64 with `log` and
/// `sincospi`, so the two may differ in the last bit of the f64 result, rarely visible
/// after rounding).
#[inline]
pub fn normal_pair(x1: u32, x2: u32) -> (f32, f32) {
    let r = (-2.0 * (uniform_value(x1) as f64).ln()).sqrt();
    let (s, c) = (2.0 * std::f64::consts::PI * uniform_value(x2) as f64).sin_cos();
    ((r * c) as f32, (r * s) as f32)
}

/// Which distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dist {
    /// Uniform: `lo + (hi - lo) * u`.
    Uniform {
        /// Lower bound.
        lo: f32,
        /// Upper bound.
        hi: f32,
    },
    /// Normal: `mean + std * z`.
    Normal {
        /// Mean.
        mean: f32,
        /// Standard deviation.
        std: f32,
    },
}

impl Dist {
    /// The affine map `a + b * v` applied to the unit draws: `(a, b)`.
    pub fn affine(self) -> (f32, f32) {
        match self {
            Dist::Uniform { lo, hi } => (lo, hi - lo),
            Dist::Normal { mean, std } => (mean, std),
        }
    }
}

/// The four unit draws (uniform in (0, 1), or standard normal) of group `c`.
#[inline]
pub fn unit_draws(dist: Dist, seed: u64, offset: u64, c: u64) -> [f32; 4] {
    let x = block(seed, offset, c);
    match dist {
        Dist::Uniform { .. } => x.map(uniform_value),
        Dist::Normal { .. } => {
            let (z0, z1) = normal_pair(x[0], x[1]);
            let (z2, z3) = normal_pair(x[2], x[3]);
            [z0, z1, z2, z3]
        }
    }
}

/// Fills `y` with the draws of `dist` for seed and offset (element `i` of the tensor is
/// `y[i]`).
pub fn fill<T: Float>(dist: Dist, seed: u64, offset: u64, y: &mut [T]) {
    let (a, b) = dist.affine();
    let run = |start: usize, y: &mut [T]| {
        debug_assert_eq!(start % 4, 0);
        for (j, group) in y.chunks_mut(4).enumerate() {
            let v = unit_draws(dist, seed, offset, (start / 4 + j) as u64);
            for (o, v) in group.iter_mut().zip(v) {
                *o = T::from_f32(a + b * v);
            }
        }
    };
    if y.len() < PAR_MIN_LEN {
        run(0, y);
    } else {
        // PAR_CHUNK is a multiple of 4, so every chunk starts a group.
        y.par_chunks_mut(PAR_CHUNK)
            .enumerate()
            .for_each(|(k, y)| run(k * PAR_CHUNK, y));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's `kat_vectors`, the three `philox4x32 10` lines (counter, key, result).
    #[test]
    fn philox_known_answers() {
        let cases: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
            (
                [0; 4],
                [0; 2],
                [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
            ),
            (
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0],
                [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
            ),
        ];
        for (ctr, key, want) in cases {
            assert_eq!(philox4x32_10(ctr, key), want, "ctr {ctr:x?} key {key:x?}");
        }
    }

    #[test]
    fn uniform_values_are_exact_and_open() {
        assert_eq!(uniform_value(0), 2f32.powi(-24));
        assert_eq!(uniform_value(u32::MAX), 1.0 - 2f32.powi(-24));
        for x in [1u32, 511, 512, 0x8000_0000, 0xdead_beef] {
            let u = uniform_value(x);
            let k = ((x >> 9) as f64 * 2.0 + 1.0) / 16_777_216.0;
            assert_eq!(u as f64, k, "{x:#x}");
        }
    }

    #[test]
    fn fill_is_the_counter_map() {
        let mut y = vec![f32::NAN; 70_001];
        fill(Dist::Uniform { lo: -2.0, hi: 3.0 }, 7, 9, &mut y);
        for i in [0usize, 1, 3, 4, 65_535, 65_536, 70_000] {
            let x = block(7, 9, (i / 4) as u64)[i % 4];
            assert_eq!(y[i], -2.0 + 5.0 * uniform_value(x), "element {i}");
        }
    }
}
