//! The cost model: predicts an op's run time from its name and [`Cost`], calibrated from
//! measured run times.
//!
//! # Model
//!
//! Per op name, `time ≈ overhead + ns_per_byte · bytes + ns_per_flop · flops`. The three
//! coefficients are kept as multipliers `θ` of the [`Defaults`]' terms
//! `x = [launch, bytes / bandwidth, flops / peak]` (in ns), so `prediction = θ · x` and an
//! uncalibrated op has `θ = [1, 1, 1]`.
//!
//! Each observation `(x, t)` updates an exponentially weighted least-squares fit of the
//! *relative* error `(θ · x − t) / t`, so a 5 µs op counts as much as a 50 ms one. Older
//! observations fade by `decay` per new one (default 0.95: about the last 20). A tiny
//! ridge term pulls `θ` toward 1; it decides the directions the observations leave open
//! (an op always run at one shape cannot separate its per-byte from its per-flop time,
//! and an op with no flops keeps the default flop rate). Coefficients are kept ≥ 0.
//!
//! # Concurrency
//!
//! One fit per op name in a [`DashMap`]: stream actors observing different ops do not
//! contend; `predict` takes a shard's read lock for a few arithmetic operations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use rtx_runtime::Cost;

/// The ridge strength per coefficient, relative to the observations' weight on it.
const RIDGE: f64 = 1e-4;

/// What the model assumes before an op kind has been observed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Defaults {
    /// Fixed time per op (launch and bookkeeping).
    pub launch: Duration,
    /// Memory bandwidth in bytes per second (positive).
    pub bytes_per_sec: f64,
    /// Arithmetic peak in flops per second (positive).
    pub flops_per_sec: f64,
}

impl Default for Defaults {
    /// 5 µs per op, 3 TB/s, 50 TFLOP/s: roughly a current data-center GPU.
    fn default() -> Self {
        Defaults {
            launch: Duration::from_micros(5),
            bytes_per_sec: 3e12,
            flops_per_sec: 50e12,
        }
    }
}

impl Defaults {
    /// The default time of each term, in ns: `[launch, bytes, flops]`.
    fn terms(&self, c: Cost) -> [f64; 3] {
        [
            self.launch.as_nanos() as f64,
            c.bytes.max(0.0) * 1e9 / self.bytes_per_sec,
            c.flops.max(0.0) * 1e9 / self.flops_per_sec,
        ]
    }
}

/// A snapshot of one op kind's fitted coefficients.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    /// Fixed time per op.
    pub overhead: Duration,
    /// Nanoseconds per byte moved.
    pub ns_per_byte: f64,
    /// Nanoseconds per flop.
    pub ns_per_flop: f64,
    /// Observations so far (all of them, though old ones weigh less).
    pub observations: u64,
}

/// Predicts op run times per op name; calibrated by [`CostModel::observe`].
///
/// Thread-safe; share it with `Arc` to inspect the calibration of a policy that owns it
/// (see [`EarliestFinish::with_model`](crate::EarliestFinish::with_model)).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rtx::Cost;
/// use rtx::scheduler::CostModel;
///
/// let m = CostModel::new();
/// let c = Cost { bytes: 3e9, flops: 0.0 };
/// // Uncalibrated: 5 µs + 3 GB at 3 TB/s.
/// assert_eq!(m.predict("copy", c), Duration::from_micros(1005));
/// // This machine is 10x slower than assumed.
/// for _ in 0..50 {
///     m.observe("copy", c, Duration::from_micros(10_050));
/// }
/// let p = m.predict("copy", c).as_secs_f64();
/// assert!((p / 10_050e-6 - 1.0).abs() < 0.01);
/// assert_eq!(m.observations("copy"), 50);
/// ```
#[derive(Debug)]
pub struct CostModel {
    defaults: Defaults,
    decay: f64,
    fits: DashMap<String, Fit>,
    total: AtomicU64,
}

impl Default for CostModel {
    fn default() -> Self {
        Self::with_defaults(Defaults::default())
    }
}

impl CostModel {
    /// A model with the default [`Defaults`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A model assuming `defaults` for op kinds not yet observed.
    ///
    /// # Panics
    ///
    /// If a rate in `defaults` is not positive and finite.
    pub fn with_defaults(defaults: Defaults) -> Self {
        for r in [defaults.bytes_per_sec, defaults.flops_per_sec] {
            assert!(
                r > 0.0 && r.is_finite(),
                "cost model rates must be positive, got {r}"
            );
        }
        CostModel {
            defaults,
            decay: 0.95,
            fits: DashMap::new(),
            total: AtomicU64::new(0),
        }
    }

    /// Sets how much each observation's weight fades per later one, in `(0, 1]`: 0.95
    /// (the default) remembers about the last 20, 1.0 everything alike.
    ///
    /// # Panics
    ///
    /// If `decay` is outside `(0, 1]`.
    pub fn with_decay(mut self, decay: f64) -> Self {
        assert!(
            decay > 0.0 && decay <= 1.0,
            "decay must be in (0, 1], got {decay}"
        );
        self.decay = decay;
        self
    }

    /// The assumptions for unobserved op kinds.
    pub fn defaults(&self) -> Defaults {
        self.defaults
    }

    /// The predicted run time of op `name` with cost `cost`.
    pub fn predict(&self, name: &str, cost: Cost) -> Duration {
        Duration::from_nanos(self.predict_ns(name, cost) as u64)
    }

    /// [`CostModel::predict`] in nanoseconds, unrounded.
    pub(crate) fn predict_ns(&self, name: &str, cost: Cost) -> f64 {
        let x = self.defaults.terms(cost);
        match self.fits.get(name) {
            Some(fit) => dot(&fit.theta, &x),
            None => x.iter().sum(),
        }
    }

    /// Records that op `name` with cost `cost` took `took`, refining its fit.
    pub fn observe(&self, name: &str, cost: Cost, took: Duration) {
        let x = self.defaults.terms(cost);
        let t = took.as_nanos() as f64;
        match self.fits.get_mut(name) {
            Some(mut fit) => fit.update(x, t, self.decay),
            None => self
                .fits
                .entry(name.to_string())
                .or_insert_with(Fit::new)
                .update(x, t, self.decay),
        }
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets every op kind's fit (the total count stays): what it learnt no longer
    /// describes the times to come (host enqueue times before the first device time,
    /// [`EarliestFinish`](crate::EarliestFinish)).
    pub fn reset(&self) {
        self.fits.clear();
    }

    /// How many times op `name` has been observed.
    pub fn observations(&self, name: &str) -> u64 {
        self.fits.get(name).map_or(0, |f| f.n)
    }

    /// How many observations of all op kinds the model has had.
    pub fn total_observations(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The fitted coefficients of op `name`, if it has been observed.
    pub fn calibration(&self, name: &str) -> Option<Calibration> {
        let fit = self.fits.get(name)?;
        let d = &self.defaults;
        Some(Calibration {
            overhead: Duration::from_nanos((fit.theta[0] * d.launch.as_nanos() as f64) as u64),
            ns_per_byte: fit.theta[1] * 1e9 / d.bytes_per_sec,
            ns_per_flop: fit.theta[2] * 1e9 / d.flops_per_sec,
            observations: fit.n,
        })
    }
}

/// One op kind's exponentially weighted least-squares fit (see the module docs).
#[derive(Clone, Debug)]
struct Fit {
    /// Σ wᵢ zᵢ zᵢᵀ with zᵢ = xᵢ / tᵢ.
    zz: [[f64; 3]; 3],
    /// Σ wᵢ zᵢ (the targets are all 1).
    z: [f64; 3],
    /// The multipliers of the default terms.
    theta: [f64; 3],
    n: u64,
}

impl Fit {
    fn new() -> Self {
        Fit {
            zz: [[0.0; 3]; 3],
            z: [0.0; 3],
            theta: [1.0; 3],
            n: 0,
        }
    }

    fn update(&mut self, x: [f64; 3], t: f64, decay: f64) {
        let z = x.map(|v| v / t.max(1.0));
        for i in 0..3 {
            for j in 0..3 {
                self.zz[i][j] = decay * self.zz[i][j] + z[i] * z[j];
            }
            self.z[i] = decay * self.z[i] + z[i];
        }
        self.theta = self.solve();
        self.n += 1;
    }

    /// Ridge least squares toward θ = 1, keeping θ ≥ 0 by fixing negative coefficients
    /// at 0 and solving for the rest (at most three rounds).
    fn solve(&self) -> [f64; 3] {
        let mut free = [true; 3];
        loop {
            let mut a = [[0.0; 3]; 3];
            let mut b = [0.0; 3];
            for i in 0..3 {
                if !free[i] {
                    a[i][i] = 1.0;
                    continue;
                }
                for j in 0..3 {
                    a[i][j] = if free[j] { self.zz[i][j] } else { 0.0 };
                }
                // Scale-free: each coefficient is pulled toward 1 in proportion to how
                // much the observations say about it (nothing said: it stays 1).
                let lambda = RIDGE * self.zz[i][i] + 1e-300;
                a[i][i] += lambda;
                b[i] = self.z[i] + lambda;
            }
            let theta = solve3(a, b);
            match (0..3)
                .filter(|&i| theta[i] < 0.0)
                .min_by(|&i, &j| theta[i].total_cmp(&theta[j]))
            {
                Some(i) => free[i] = false,
                None => return theta,
            }
        }
    }
}

fn dot(a: &[f64; 3], b: &[f64; 3]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// Solves `a · x = b` by Gaussian elimination with partial pivoting. `a` is symmetric
/// positive definite here (ridge), so no pivot is zero.
fn solve3(mut a: [[f64; 3]; 3], mut b: [f64; 3]) -> [f64; 3] {
    for col in 0..3 {
        let p = (col..3)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        a.swap(col, p);
        b.swap(col, p);
        for row in col + 1..3 {
            let f = a[row][col] / a[col][col];
            let pivot = a[col];
            for (v, p) in a[row].iter_mut().zip(pivot).skip(col) {
                *v -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let s: f64 = (row + 1..3).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random sequence in [0, 1).
    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    fn rel(a: Duration, b: f64) -> f64 {
        (a.as_nanos() as f64 / b - 1.0).abs()
    }

    #[test]
    fn uncalibrated_uses_defaults() {
        let m = CostModel::new();
        let c = Cost {
            bytes: 3e6,
            flops: 50e6,
        };
        // 5 µs + 1 µs + 1 µs.
        assert_eq!(m.predict("op", c), Duration::from_micros(7));
        assert_eq!(m.observations("op"), 0);
        assert!(m.calibration("op").is_none());
    }

    #[test]
    fn converges_to_linear_bytes_truth() {
        // Truth: 2 µs + 0.02 ns/byte (50 GB/s), from 10 kB to 10 MB.
        let truth = |b: f64| 2_000.0 + 0.02 * b;
        let m = CostModel::new();
        let mut seed = 7;
        for _ in 0..200 {
            let bytes = 10f64.powf(4.0 + 3.0 * lcg(&mut seed));
            let c = Cost { bytes, flops: 0.0 };
            m.observe("copy", c, Duration::from_nanos(truth(bytes) as u64));
        }
        for bytes in [2e4, 3e5, 8e6] {
            let p = m.predict("copy", Cost { bytes, flops: 0.0 });
            assert!(
                rel(p, truth(bytes)) < 0.10,
                "{bytes} B: {p:?} vs {}",
                truth(bytes)
            );
        }
        let cal = m.calibration("copy").unwrap();
        assert!((cal.ns_per_byte / 0.02 - 1.0).abs() < 0.10, "{cal:?}");
        assert_eq!(cal.observations, 200);
        assert_eq!(m.total_observations(), 200);
    }

    #[test]
    fn converges_with_bytes_and_flops_and_noise() {
        // Truth: 8 µs + 0.001 ns/byte + 0.0001 ns/flop, ±5% noise.
        let truth = |b: f64, f: f64| 8_000.0 + 0.001 * b + 0.0001 * f;
        let m = CostModel::new();
        let mut seed = 11;
        for _ in 0..400 {
            let bytes = 10f64.powf(4.0 + 4.0 * lcg(&mut seed));
            let flops = 10f64.powf(6.0 + 5.0 * lcg(&mut seed));
            let noise = 1.0 + 0.1 * (lcg(&mut seed) - 0.5);
            let t = truth(bytes, flops) * noise;
            m.observe(
                "gemm",
                Cost { bytes, flops },
                Duration::from_nanos(t as u64),
            );
        }
        for (b, f) in [(1e5, 1e7), (1e7, 1e8), (1e5, 1e11), (1e8, 1e6)] {
            let p = m.predict("gemm", Cost { bytes: b, flops: f });
            assert!(rel(p, truth(b, f)) < 0.10, "{b} B {f} flop: {p:?}");
        }
    }

    #[test]
    fn one_shape_fits_that_shape_and_keeps_unseen_rates() {
        let m = CostModel::new();
        let c = Cost {
            bytes: 1e6,
            flops: 0.0,
        };
        m.observe("relu", c, Duration::from_micros(40));
        assert!(rel(m.predict("relu", c), 40_000.0) < 0.01);
        // Flops were never seen: the default flop rate stays.
        let cal = m.calibration("relu").unwrap();
        assert!((cal.ns_per_flop * 50e3 - 1.0).abs() < 1e-6, "{cal:?}");
        // Other op kinds are unaffected.
        assert_eq!(m.predict("other", c), Duration::from_nanos(5_333));
    }

    #[test]
    fn coefficients_stay_non_negative() {
        // Times that fall with size would need a negative rate.
        let m = CostModel::new();
        for i in 1..=50 {
            let bytes = 1e6 * i as f64;
            let t = Duration::from_nanos(100_000 - 1_000 * i);
            m.observe("odd", Cost { bytes, flops: 0.0 }, t);
        }
        let cal = m.calibration("odd").unwrap();
        assert!(cal.ns_per_byte >= 0.0 && cal.ns_per_flop >= 0.0, "{cal:?}");
        assert!(m.predict("odd", Cost::default()) > Duration::ZERO);
    }

    #[test]
    fn zero_time_observation_is_harmless() {
        let m = CostModel::new();
        m.observe("noop", Cost::default(), Duration::ZERO);
        let p = m.predict("noop", Cost::default());
        assert!(p < Duration::from_micros(5), "{p:?}");
    }
}
