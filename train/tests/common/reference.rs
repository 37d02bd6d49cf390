//! The layers in f64 on the host, written from their definitions (PyTorch's
//! semantics), for the finite-difference checks: each takes the parameters in the
//! layer's `parameters()` order.

/// `x [rows, inp] · wᵀ + b`, w `[out, inp]`.
pub fn linear(x: &[f64], rows: usize, w: &[f64], b: Option<&[f64]>, out: usize) -> Vec<f64> {
    let inp = w.len() / out;
    let mut y = vec![0.0; rows * out];
    for r in 0..rows {
        for o in 0..out {
            let mut s = b.map_or(0.0, |b| b[o]);
            for i in 0..inp {
                s += x[r * inp + i] * w[o * inp + i];
            }
            y[r * out + o] = s;
        }
    }
    y
}

/// GELU, tanh form.
pub fn gelu(x: f64) -> f64 {
    let t = ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh();
    0.5 * x * (1.0 + t)
}

/// Layer norm over rows of `d`, biased variance.
pub fn layer_norm(x: &[f64], d: usize, g: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (xr, yr) in x.chunks(d).zip(y.chunks_mut(d)) {
        let mean = xr.iter().sum::<f64>() / d as f64;
        let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for i in 0..d {
            yr[i] = (xr[i] - mean) * rstd * g[i] + b[i];
        }
    }
    y
}

/// The geometry of an NCHW convolution with a square stride and padding.
#[derive(Clone, Copy, Debug)]
pub struct Conv {
    pub n: usize,
    pub c_in: usize,
    pub h: usize,
    pub w: usize,
    pub c_out: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
}

impl Conv {
    pub fn out_hw(&self) -> (usize, usize) {
        let o = |i: usize| (i + 2 * self.pad - self.k) / self.stride + 1;
        (o(self.h), o(self.w))
    }
}

/// NCHW cross-correlation, weight `[c_out, c_in, k, k]`, bias `[c_out]`.
pub fn conv2d(p: &Conv, x: &[f64], wt: &[f64], b: Option<&[f64]>) -> Vec<f64> {
    let (oh, ow) = p.out_hw();
    let mut y = vec![0.0; p.n * p.c_out * oh * ow];
    for n in 0..p.n {
        for co in 0..p.c_out {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = b.map_or(0.0, |b| b[co]);
                    for ci in 0..p.c_in {
                        for ky in 0..p.k {
                            for kx in 0..p.k {
                                let iy = (oy * p.stride + ky) as isize - p.pad as isize;
                                let ix = (ox * p.stride + kx) as isize - p.pad as isize;
                                if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
                                    continue;
                                }
                                let xi =
                                    ((n * p.c_in + ci) * p.h + iy as usize) * p.w + ix as usize;
                                let wi = ((co * p.c_in + ci) * p.k + ky) * p.k + kx;
                                s += x[xi] * wt[wi];
                            }
                        }
                    }
                    y[((n * p.c_out + co) * oh + oy) * ow + ox] = s;
                }
            }
        }
    }
    y
}

/// Causal multi-head attention over `q, k, v` `[B, L, H·dh]` (heads interleaved as
/// after the projections), scale `1/sqrt(dh)`; the output in the same layout.
pub fn causal_attention(q: &[f64], k: &[f64], v: &[f64], b: usize, l: usize, h: usize) -> Vec<f64> {
    let d = q.len() / (b * l);
    let dh = d / h;
    let scale = 1.0 / (dh as f64).sqrt();
    let mut o = vec![0.0; q.len()];
    let at =
        |t: &[f64], bi: usize, li: usize, hi: usize, j: usize| t[(bi * l + li) * d + hi * dh + j];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..l {
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..dh)
                            .map(|e| at(q, bi, i, hi, e) * at(k, bi, j, hi, e))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                for e in 0..dh {
                    let mut acc = 0.0;
                    for (j, sj) in s.iter().enumerate() {
                        acc += (sj - m).exp() / z * at(v, bi, j, hi, e);
                    }
                    o[(bi * l + i) * d + hi * dh + e] = acc;
                }
            }
        }
    }
    o
}

/// The attention layer: x `[B, L, D]`, params q.w, q.b, k.w, k.b, v.w, v.b, o.w, o.b.
pub fn attention_layer(x: &[f64], b: usize, l: usize, heads: usize, p: &[Vec<f64>]) -> Vec<f64> {
    let d = x.len() / (b * l);
    let rows = b * l;
    let proj = |i: usize, t: &[f64]| linear(t, rows, &p[2 * i], Some(&p[2 * i + 1]), d);
    let (q, k, v) = (proj(0, x), proj(1, x), proj(2, x));
    let o = causal_attention(&q, &k, &v, b, l, heads);
    proj(3, &o)
}

/// The pre-norm block: params ln1 (2), attention (8), ln2 (2), fc1, fc2 (4).
pub fn block(x: &[f64], b: usize, l: usize, heads: usize, eps: f64, p: &[Vec<f64>]) -> Vec<f64> {
    let d = x.len() / (b * l);
    let rows = b * l;
    let n1 = layer_norm(x, d, &p[0], &p[1], eps);
    let a = attention_layer(&n1, b, l, heads, &p[2..10]);
    let h: Vec<f64> = x.iter().zip(&a).map(|(u, v)| u + v).collect();
    let n2 = layer_norm(&h, d, &p[10], &p[11], eps);
    let hidden = p[13].len();
    let m1: Vec<f64> = linear(&n2, rows, &p[12], Some(&p[13]), hidden)
        .into_iter()
        .map(gelu)
        .collect();
    let m2 = linear(&m1, rows, &p[14], Some(&p[15]), d);
    h.iter().zip(&m2).map(|(u, v)| u + v).collect()
}

/// The CNN (conv₁ 3×3 pad 1, ReLU, conv₂ 3×3 pad 1 stride 2, ReLU, flatten, linear);
/// returns the logits and the smallest |pre-activation| of the ReLUs.
pub fn cnn(
    x: &[f64],
    n: usize,
    c_in: usize,
    hw: (usize, usize),
    p: &[Vec<f64>],
) -> (Vec<f64>, f64) {
    let c1 = p[1].len();
    let c2 = p[3].len();
    let classes = p[5].len();
    let g1 = Conv {
        n,
        c_in,
        h: hw.0,
        w: hw.1,
        c_out: c1,
        k: 3,
        stride: 1,
        pad: 1,
    };
    let mut kink = f64::INFINITY;
    let mut relu = |v: Vec<f64>| -> Vec<f64> {
        v.into_iter()
            .map(|z| {
                kink = kink.min(z.abs());
                z.max(0.0)
            })
            .collect()
    };
    let h1 = relu(conv2d(&g1, x, &p[0], Some(&p[1])));
    let g2 = Conv {
        c_in: c1,
        c_out: c2,
        stride: 2,
        ..g1
    };
    let h2 = relu(conv2d(&g2, &h1, &p[2], Some(&p[3])));
    let y = linear(&h2, n, &p[4], Some(&p[5]), classes);
    (y, kink)
}
