//! CPU layer norm (the reference of `kernels/cuda/norm.cu`): row statistics in f64, the
//! normalization in f32; the parameter gradients summed over rows in f64, in a fixed
//! order.

use rayon::prelude::*;

use crate::cpu_util::{Float, PAR_CHUNK, PAR_MIN_LEN};

/// Forward over rows of `d`: `y = (x - mean) · rstd · gamma + beta`, with the biased
/// variance (as PyTorch) and `rstd = 1 / sqrt(var + eps)`.
#[allow(clippy::too_many_arguments)]
pub fn forward<T: Float>(
    x: &[T],
    gamma: &[T],
    beta: &[T],
    d: usize,
    eps: f32,
    y: &mut [T],
    mean: &mut [f32],
    rstd: &mut [f32],
) {
    let row = |xr: &[T], yr: &mut [T], m: &mut f32, rs: &mut f32| {
        let mu = xr.iter().map(|v| v.to_f64()).sum::<f64>() / d as f64;
        let var = xr.iter().map(|v| (v.to_f64() - mu).powi(2)).sum::<f64>() / d as f64;
        let r = (1.0 / (var + eps as f64).sqrt()) as f32;
        let muf = mu as f32;
        for ((o, v), (g, b)) in yr.iter_mut().zip(xr).zip(gamma.iter().zip(beta)) {
            *o = T::from_f32((v.to_f32() - muf) * r * g.to_f32() + b.to_f32());
        }
        (*m, *rs) = (muf, r);
    };
    if x.len() < PAR_MIN_LEN {
        for (((xr, yr), m), r) in x
            .chunks(d)
            .zip(y.chunks_mut(d))
            .zip(mean.iter_mut())
            .zip(rstd.iter_mut())
        {
            row(xr, yr, m, r);
        }
    } else {
        y.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
            .with_min_len((PAR_CHUNK / d).max(1))
            .for_each(|((yr, xr), (m, r))| row(xr, yr, m, r));
    }
}

/// Backward: `dx = rstd · (g - mean(g) - x̂ · mean(g · x̂))` with `g = dy · gamma` and
/// `x̂ = (x - mean) · rstd`; `dgamma = Σ_rows dy · x̂`, `dbeta = Σ_rows dy`.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Float>(
    dy: &[T],
    x: &[T],
    mean: &[f32],
    rstd: &[f32],
    gamma: &[T],
    d: usize,
    dx: &mut [T],
    dgamma: &mut [T],
    dbeta: &mut [T],
) {
    let row = |r: usize, dyr: &[T], xr: &[T], dxr: &mut [T]| {
        let (m, rs) = (mean[r], rstd[r]);
        let (mut sg, mut sgx) = (0f64, 0f64);
        for ((g, v), w) in dyr.iter().zip(xr).zip(gamma) {
            let g = g.to_f32() * w.to_f32();
            let xh = (v.to_f32() - m) * rs;
            sg += g as f64;
            sgx += (g * xh) as f64;
        }
        let (mg, mgx) = ((sg / d as f64) as f32, (sgx / d as f64) as f32);
        for (((o, g), v), w) in dxr.iter_mut().zip(dyr).zip(xr).zip(gamma) {
            let g = g.to_f32() * w.to_f32();
            let xh = (v.to_f32() - m) * rs;
            *o = T::from_f32(rs * (g - mg - xh * mgx));
        }
    };
    // Parameter gradients over a group of rows starting at `r0`, in f64.
    let params = |r0: usize, dyg: &[T], xg: &[T]| {
        let mut acc = vec![(0f64, 0f64); d];
        for (i, (dyr, xr)) in dyg.chunks(d).zip(xg.chunks(d)).enumerate() {
            let (m, rs) = (mean[r0 + i], rstd[r0 + i]);
            for ((a, g), v) in acc.iter_mut().zip(dyr).zip(xr) {
                let xh = (v.to_f32() - m) * rs;
                a.0 += g.to_f64() * xh as f64;
                a.1 += g.to_f64();
            }
        }
        acc
    };
    let group = (PAR_CHUNK / d).max(1);
    let parts: Vec<Vec<(f64, f64)>> = if x.len() < PAR_MIN_LEN {
        for (r, ((dyr, xr), dxr)) in dy
            .chunks(d)
            .zip(x.chunks(d))
            .zip(dx.chunks_mut(d))
            .enumerate()
        {
            row(r, dyr, xr, dxr);
        }
        vec![params(0, dy, x)]
    } else {
        dx.par_chunks_mut(d)
            .zip(dy.par_chunks(d).zip(x.par_chunks(d)))
            .enumerate()
            .with_min_len(group)
            .for_each(|(r, (dxr, (dyr, xr)))| row(r, dyr, xr, dxr));
        // Fixed groups combined in order: the result does not depend on scheduling.
        dy.par_chunks(group * d)
            .zip(x.par_chunks(group * d))
            .enumerate()
            .map(|(g, (dyg, xg))| params(g * group, dyg, xg))
            .collect()
    };
    for j in 0..d {
        let (mut a, mut b) = (0f64, 0f64);
        for p in &parts {
            a += p[j].0;
            b += p[j].1;
        }
        dgamma[j] = T::from_f64(a);
        dbeta[j] = T::from_f64(b);
    }
}
