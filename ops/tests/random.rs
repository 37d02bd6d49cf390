//! Random initialization on every backend: uniform bit for bit against the generator's
//! scalar map (so CUDA equals the CPU), normal within one ulp, statistics with fixed
//! seeds, offsets, and bad input.

mod common;

use common::*;
use rtx_ops::random::cpu::{block, normal_pair, uniform_value};
use rtx_ops::random::{self, Dist};
use rtx_runtime::{bf16, f16, DType, Element, Error, Runtime, Tensor};

const SHAPES: &[&[usize]] = &[&[1], &[2], &[7], &[1_000_003], &[33, 1001]];

fn run(rt: &Runtime, op: random::Random) -> Tensor {
    match rt.submit(op) {
        Ok(s) => s.wait().expect("op failed"),
        Err(e) => panic!("submit rejected: {}", e.error),
    }
}

/// The scalar definition: element i from lane i % 4 of counter i / 4.
fn expected<T: Element>(dist: Dist, seed: u64, offset: u64, n: usize) -> Vec<f64> {
    let (a, b) = dist.affine();
    (0..n)
        .map(|i| {
            let x = block(seed, offset, (i / 4) as u64);
            let lane = i % 4;
            let v = match dist {
                Dist::Uniform { .. } => uniform_value(x[lane]),
                Dist::Normal { .. } => {
                    let p = lane / 2 * 2;
                    let (z0, z1) = normal_pair(x[p], x[p + 1]);
                    if lane % 2 == 0 {
                        z0
                    } else {
                        z1
                    }
                }
            };
            round_to::<T>(a + b * v)
        })
        .collect()
}

/// `v` rounded once from f32 to `T` (round to nearest even), as f64. (Going through
/// `T::from_f64` would round from the f64 value with half's own f64 path.)
fn round_to<T: Element>(v: f32) -> f64 {
    match T::DTYPE {
        DType::F16 => f16::from_f32(v).to_f64(),
        DType::BF16 => bf16::from_f32(v).to_f64(),
        _ => v as f64,
    }
}

/// Bits of mantissa of the dtype (for ulp bounds).
fn ulp_of<T: Element>(v: f64) -> f64 {
    let bits = match T::DTYPE {
        DType::F32 => 23,
        DType::F16 => 10,
        _ => 7,
    };
    let e = v.abs().max(1e-30).log2().floor();
    2f64.powf(e - bits as f64)
}

fn uniform_exact<T: Element>(rt: &Runtime, label: &str) {
    let (seed, _) = rng();
    for (k, shape) in SHAPES.iter().enumerate() {
        let n: usize = shape.iter().product();
        let dist = Dist::Uniform { lo: -0.75, hi: 1.5 };
        let y = run(
            rt,
            random::uniform(*shape, T::DTYPE, -0.75, 1.5, seed, k as u64),
        );
        assert_eq!(y.dims(), *shape);
        let got = download::<T>(rt, &y);
        let want = expected::<T>(dist, seed, k as u64, n);
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(
            bad.is_none(),
            "{label} {} {shape:?}: element {:?} differs (seed {seed})",
            T::DTYPE,
            bad.map(|i| (i, got[i], want[i]))
        );
        assert!(got.iter().all(|v| (-0.75..=1.5).contains(v)), "{label}");
    }
}

backend_test!(uniform_is_the_generator_bit_for_bit, |rt, label| {
    uniform_exact::<f32>(rt, label);
    uniform_exact::<f16>(rt, label);
    uniform_exact::<bf16>(rt, label);
});

fn normal_close<T: Element>(rt: &Runtime, label: &str) {
    let (seed, _) = rng();
    for (k, shape) in SHAPES.iter().enumerate() {
        let n: usize = shape.iter().product();
        let dist = Dist::Normal {
            mean: 0.25,
            std: 1.5,
        };
        let y = run(
            rt,
            random::normal(*shape, T::DTYPE, 0.25, 1.5, seed, k as u64),
        );
        let got = download::<T>(rt, &y);
        let want = expected::<T>(dist, seed, k as u64, n);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // One ulp of the dtype, plus the f32 rounding of mean + std * z near 0.
            let bound = ulp_of::<T>(*w) + 1.5 * f32::EPSILON as f64;
            assert!(
                (g - w).abs() <= bound,
                "{label} {} {shape:?}: element {i} is {g}, want {w} (seed {seed})",
                T::DTYPE
            );
        }
    }
}

backend_test!(normal_is_box_muller_within_an_ulp, |rt, label| {
    normal_close::<f32>(rt, label);
    normal_close::<f16>(rt, label);
    normal_close::<bf16>(rt, label);
});

fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var)
}

// Fixed seeds: the numbers are a pure function of them, so these bounds (about 5
// standard errors at n = 2^20) decide once and for all; they also hold for CUDA, which
// produces the same values.
backend_test!(moments_with_fixed_seeds, |rt, label| {
    let n = 1 << 20;
    for seed in [0u64, 1, 0x5eed_1234_abcd_0001] {
        let u = download::<f32>(
            rt,
            &run(rt, random::uniform([n], DType::F32, -1.0, 3.0, seed, 0)),
        );
        let (m, v) = moments(&u);
        assert!(
            (m - 1.0).abs() < 6e-3,
            "{label} uniform mean {m} seed {seed}"
        );
        assert!(
            (v / (16.0 / 12.0) - 1.0).abs() < 1e-2,
            "{label} uniform var {v}"
        );
        let below = u.iter().filter(|x| **x < 0.0).count() as f64 / n as f64;
        assert!((below - 0.25).abs() < 3e-3, "{label} uniform cdf {below}");

        let z = download::<f32>(
            rt,
            &run(rt, random::normal([n], DType::F32, 0.5, 2.0, seed, 1)),
        );
        let (m, v) = moments(&z);
        assert!(
            (m - 0.5).abs() < 1e-2,
            "{label} normal mean {m} seed {seed}"
        );
        assert!(
            (v / 4.0 - 1.0).abs() < 1e-2,
            "{label} normal var {v} seed {seed}"
        );
        let within = z.iter().filter(|x| (*x - 0.5).abs() < 2.0).count() as f64 / n as f64;
        assert!(
            (within - 0.682_689).abs() < 3e-3,
            "{label} normal 1-sigma {within}"
        );
        let k4 = z.iter().map(|x| ((x - m) / v.sqrt()).powi(4)).sum::<f64>() / n as f64;
        assert!((k4 - 3.0).abs() < 0.05, "{label} normal kurtosis {k4}");
    }
});

backend_test!(offsets_and_seeds_give_independent_streams, |rt, label| {
    let n = 1 << 20;
    let draw = |seed, offset| {
        download::<f32>(
            rt,
            &run(rt, random::normal([n], DType::F32, 0.0, 1.0, seed, offset)),
        )
    };
    let a = draw(11, 0);
    assert_eq!(a, draw(11, 0), "{label}: the same call repeats");
    for b in [draw(11, 1), draw(12, 0), draw(11, 1 << 32)] {
        let corr = a.iter().zip(&b).map(|(x, y)| x * y).sum::<f64>() / n as f64;
        assert!(corr.abs() < 5e-3, "{label}: correlation {corr}");
        assert!(
            a.iter().zip(&b).filter(|(x, y)| x == y).count() < 16,
            "{label}"
        );
    }
});

backend_test!(bad_parameters_are_rejected, |rt, label| {
    let cases = [
        random::uniform([4], DType::U32, 0.0, 1.0, 0, 0),
        random::uniform([4], DType::F32, 1.0, 0.0, 0, 0),
        random::uniform([4], DType::F32, f32::NAN, 1.0, 0, 0),
        random::uniform([4], DType::F32, -f32::MAX, f32::MAX, 0, 0),
        random::normal([4], DType::F32, 0.0, -1.0, 0, 0),
        random::normal([4], DType::F32, f32::INFINITY, 1.0, 0, 0),
        random::normal([4, 0], DType::F32, 0.0, 1.0, 0, 0),
    ];
    for (k, op) in cases.into_iter().enumerate() {
        let dist = op.dist();
        let e = rt.submit(op).unwrap_err();
        let typed = if k == 0 {
            matches!(e.error, Error::DTypeMismatch { .. })
        } else {
            matches!(e.error, Error::InvalidOp { .. })
        };
        assert!(typed, "{label} case {k}: {}", e.error);
        assert_eq!(
            format!("{:?}", e.into_op().dist()),
            format!("{dist:?}"),
            "{label}: the op comes back"
        );
    }
});
