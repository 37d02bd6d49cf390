//! The attention tests' cases, the f64 reference and the running and checking of a case.

use crate::common::{download, rand_vec, rel_err, rel_err_scaled, rng, upload};
use rand::rngs::StdRng;
use rand::Rng;
use rayon::prelude::*;
use rtx_ops::attention::{attention, attention_backward};
use rtx_runtime::{bf16, f16, BackendKind, DType, Element, Runtime, Tensor};

// ---- cases -----------------------------------------------------------------------------

/// The additive mask a case passes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mask {
    None,
    /// `[Lq, Lk]`.
    Plane,
    /// `[B, H, Lq, Lk]`.
    Full,
    /// `[B, 1, Lq, Lk]`.
    PerBatch,
    /// `[1, H, Lq, Lk]`.
    PerHead,
}

#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub dtype: DType,
    pub b: usize,
    pub h: usize,
    pub h_kv: usize,
    pub lq: usize,
    pub lk: usize,
    pub d: usize,
    pub causal: bool,
    pub mask: Mask,
    pub scale: Option<f32>,
}

impl Case {
    pub fn q_dims(&self) -> [usize; 4] {
        [self.b, self.h, self.lq, self.d]
    }
    pub fn kv_dims(&self) -> [usize; 4] {
        [self.b, self.h_kv, self.lk, self.d]
    }
    pub fn mask_dims(&self) -> Option<Vec<usize>> {
        let (b, h, lq, lk) = (self.b, self.h, self.lq, self.lk);
        match self.mask {
            Mask::None => None,
            Mask::Plane => Some(vec![lq, lk]),
            Mask::Full => Some(vec![b, h, lq, lk]),
            Mask::PerBatch => Some(vec![b, 1, lq, lk]),
            Mask::PerHead => Some(vec![1, h, lq, lk]),
        }
    }
    /// The scale the op uses (its default is computed in f32).
    pub fn scale_f32(&self) -> f32 {
        self.scale.unwrap_or(1.0 / (self.d as f32).sqrt())
    }
    /// The `[Lk]` row of the mask for (batch, head, query row), if any.
    pub fn mask_row<'m>(
        &self,
        mask: Option<&'m [f32]>,
        b: usize,
        h: usize,
        i: usize,
    ) -> Option<&'m [f32]> {
        let plane = self.lq * self.lk;
        let at = match self.mask {
            Mask::None => return None,
            Mask::Plane => 0,
            Mask::Full => (b * self.h + h) * plane,
            Mask::PerBatch => b * plane,
            Mask::PerHead => h * plane,
        };
        mask.map(|m| &m[at + i * self.lk..][..self.lk])
    }
}

/// (B, H, Hkv, Lq, Lk).
pub type Dims = (usize, usize, usize, usize, usize);

/// Every combination of dtype × D {64, 128} × causal × mask {none, [Lq, Lk], full}
/// for `dims`; every fourth case uses a scale other than the default.
pub fn grid(dtypes: &[DType], dims: Dims) -> Vec<Case> {
    let (b, h, h_kv, lq, lk) = dims;
    let mut cases = Vec::new();
    for &dtype in dtypes {
        for d in [64, 128] {
            for causal in [false, true] {
                for mask in [Mask::None, Mask::Plane, Mask::Full] {
                    let custom = cases.len() % 4 == 3;
                    cases.push(Case {
                        dtype,
                        b,
                        h,
                        h_kv,
                        lq,
                        lk,
                        d,
                        causal,
                        mask,
                        scale: custom.then(|| 0.7 / (d as f32).sqrt()),
                    });
                }
            }
        }
    }
    cases
}

/// Every seventh case of a grid: with 3 dtypes (36 cases) this still covers every
/// dtype, D, causal flag and mask kind.
pub fn subsample(cases: Vec<Case>) -> Vec<Case> {
    cases.into_iter().step_by(7).collect()
}

/// `cases` whole on the first runtime of a test (and wherever `whole` holds), else
/// [`subsample`]d.
pub fn first_whole(label: &str, whole: bool, cases: Vec<Case>) -> Vec<Case> {
    if first(label) || whole {
        cases
    } else {
        subsample(cases)
    }
}

pub fn dtypes(rt: &Runtime) -> &'static [DType] {
    match rt.backend() {
        BackendKind::Cpu => &[DType::F32, DType::F16, DType::BF16],
        BackendKind::Cuda => &[DType::F16, DType::BF16],
    }
}

/// Relative-error bound by the norm: 1e-4 for f32 (CPU), 2e-2 for f16 and bf16.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        _ => 2e-2,
    }
}

// ---- the f64 reference -----------------------------------------------------------------

/// Outputs of the reference, all `[.., D]` row-major like the op's.
pub struct Reference {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    /// Per row, the magnitude its lse is made of: the largest finite score's
    /// `scale·Σ|q·k| + |mask|`, or |lse| if larger. The lse is compared relative to it
    /// (a row's scores of both signs can give an lse near zero whose rounding error is
    /// that of the scores, e.g. a single key: lse = score).
    pub lse_scale: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

pub struct Inputs<'a> {
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub v: &'a [f64],
    pub mask: Option<&'a [f32]>,
    pub do_: &'a [f64],
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub fn axpy(y: &mut [f64], a: f64, x: &[f64]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
}

/// Query rows per parallel task of the reference.
const REF_ROWS: usize = 16;

/// `o = softmax(s)·v`, `lse = ln Σ exp(s)` with `s = scale·q·kᵀ + mask` (causal:
/// `-inf` for `j > i`); `dS = P ∘ (dO·vᵀ − rowsum(dO ∘ o))`, `dq = scale·dS·k`,
/// `dk = scale·dSᵀ·q` and `dv = Pᵀ·dO` summed over each kv head's query heads. A row
/// with no finite score gives o = 0, lse = −inf and no gradient.
pub fn reference(c: &Case, x: &Inputs<'_>) -> Reference {
    let (lq, lk, d) = (c.lq, c.lk, c.d);
    let scale = c.scale_f32() as f64;
    let mut r = Reference {
        o: vec![0.0; c.b * c.h * lq * d],
        lse: vec![0.0; c.b * c.h * lq],
        lse_scale: vec![0.0; c.b * c.h * lq],
        dq: vec![0.0; c.b * c.h * lq * d],
        dk: vec![0.0; c.b * c.h_kv * lk * d],
        dv: vec![0.0; c.b * c.h_kv * lk * d],
    };
    for bi in 0..c.b {
        for hi in 0..c.h {
            let bh = bi * c.h + hi;
            let kvh = bi * c.h_kv + hi / (c.h / c.h_kv);
            let kh = &x.k[kvh * lk * d..][..lk * d];
            let vh = &x.v[kvh * lk * d..][..lk * d];
            let qh = &x.q[bh * lq * d..][..lq * d];
            let doh = &x.do_[bh * lq * d..][..lq * d];
            let row = |i: usize,
                       o: &mut [f64],
                       dq: &mut [f64],
                       (lse, lse_scale): (&mut f64, &mut f64),
                       acc: &mut (Vec<f64>, Vec<f64>)| {
                let (qi, doi) = (&qh[i * d..][..d], &doh[i * d..][..d]);
                let m = c.mask_row(x.mask, bi, hi, i);
                let kmax = if c.causal { (i + 1).min(lk) } else { lk };
                let mut p: Vec<f64> = (0..kmax)
                    .map(|j| scale * dot(qi, &kh[j * d..][..d]) + m.map_or(0.0, |m| m[j] as f64))
                    .collect();
                let max = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                o.fill(0.0);
                dq.fill(0.0);
                if max == f64::NEG_INFINITY {
                    *lse = f64::NEG_INFINITY;
                    *lse_scale = 0.0;
                    return;
                }
                let abs_dot = |a: &[f64], b: &[f64]| -> f64 {
                    a.iter().zip(b).map(|(x, y)| (x * y).abs()).sum()
                };
                let magnitude = (0..kmax)
                    .filter(|&j| p[j].is_finite())
                    .map(|j| {
                        scale * abs_dot(qi, &kh[j * d..][..d])
                            + m.map_or(0.0, |m| (m[j] as f64).abs())
                    })
                    .fold(0.0, f64::max);
                let mut sum = 0.0;
                for s in p.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                *lse = max + sum.ln();
                *lse_scale = magnitude.max(lse.abs());
                p.iter_mut().for_each(|s| *s /= sum);
                for (j, &pj) in p.iter().enumerate() {
                    axpy(o, pj, &vh[j * d..][..d]);
                }
                let di = dot(doi, o);
                for (j, &pj) in p.iter().enumerate() {
                    let ds = pj * (dot(doi, &vh[j * d..][..d]) - di);
                    axpy(dq, scale * ds, &kh[j * d..][..d]);
                    axpy(&mut acc.0[j * d..][..d], scale * ds, qi);
                    axpy(&mut acc.1[j * d..][..d], pj, doi);
                }
            };
            let zeros = || (vec![0.0; lk * d], vec![0.0; lk * d]);
            let (dk, dv) = r.o[bh * lq * d..][..lq * d]
                .par_chunks_mut(REF_ROWS * d)
                .zip(r.dq[bh * lq * d..][..lq * d].par_chunks_mut(REF_ROWS * d))
                .zip(r.lse[bh * lq..][..lq].par_chunks_mut(REF_ROWS))
                .zip(r.lse_scale[bh * lq..][..lq].par_chunks_mut(REF_ROWS))
                .enumerate()
                .fold(zeros, |mut acc, (blk, (((o, dq), lse), lse_scale))| {
                    for (r, (l, ls)) in lse.iter_mut().zip(lse_scale.iter_mut()).enumerate() {
                        let i = blk * REF_ROWS + r;
                        row(
                            i,
                            &mut o[r * d..][..d],
                            &mut dq[r * d..][..d],
                            (l, ls),
                            &mut acc,
                        );
                    }
                    acc
                })
                .reduce(zeros, |mut a, b| {
                    axpy(&mut a.0, 1.0, &b.0);
                    axpy(&mut a.1, 1.0, &b.1);
                    a
                });
            axpy(&mut r.dk[kvh * lk * d..][..lk * d], 1.0, &dk);
            axpy(&mut r.dv[kvh * lk * d..][..lk * d], 1.0, &dv);
        }
    }
    r
}

// ---- running a case --------------------------------------------------------------------

/// Random additive mask values: uniform in [-2, 2), a tenth of them `-inf`.
pub fn mask_values<T: Element>(rng: &mut StdRng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| {
            let v = if rng.gen_bool(0.1) {
                f64::NEG_INFINITY
            } else {
                rng.gen_range(-2.0..2.0)
            };
            T::from_f64(v)
        })
        .collect()
}

/// The op's outputs, downloaded as f64.
pub struct Outputs {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

pub fn submit_both(
    rt: &Runtime,
    c: &Case,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    do_: &Tensor,
) -> (Tensor, Tensor, Tensor, Tensor, Tensor) {
    let mut fwd = attention(q, k, v).causal(c.causal);
    if let Some(s) = c.scale {
        fwd = fwd.scale(s);
    }
    if let Some(m) = mask {
        fwd = fwd.mask(m);
    }
    let (o, lse) = rt
        .submit(fwd)
        .expect("submit attention")
        .wait()
        .expect("attention");
    let mut bwd = attention_backward(q, k, v, &o, &lse, do_).causal(c.causal);
    if let Some(s) = c.scale {
        bwd = bwd.scale(s);
    }
    if let Some(m) = mask {
        bwd = bwd.mask(m);
    }
    let (dq, dk, dv) = rt
        .submit(bwd)
        .expect("submit attention_backward")
        .wait()
        .expect("attention_backward");
    (o, lse, dq, dk, dv)
}

/// Runs case `c` with the given host data and checks it against the reference.
pub fn check_with<T: Element>(
    rt: &Runtime,
    label: &str,
    c: &Case,
    seed: u64,
    data: [&[T]; 4],
    mask: Option<&[T]>,
) -> Outputs {
    let [q, k, v, do_] = data;
    let (tq, tk, tv) = (
        upload(rt, q, &c.q_dims()),
        upload(rt, k, &c.kv_dims()),
        upload(rt, v, &c.kv_dims()),
    );
    let tdo = upload(rt, do_, &c.q_dims());
    let tm = mask.map(|m| upload(rt, m, &c.mask_dims().expect("mask dims")));
    let (o, lse, dq, dk, dv) = submit_both(rt, c, &tq, &tk, &tv, tm.as_ref(), &tdo);
    let out = Outputs {
        o: download::<T>(rt, &o),
        lse: download::<f32>(rt, &lse),
        dq: download::<T>(rt, &dq),
        dk: download::<T>(rt, &dk),
        dv: download::<T>(rt, &dv),
    };
    let f64s = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let (q, k, v, do_) = (f64s(q), f64s(k), f64s(v), f64s(do_));
    let mask: Option<Vec<f32>> = mask.map(|m| m.iter().map(|v| v.to_f64() as f32).collect());
    let r = reference(
        c,
        &Inputs {
            q: &q,
            k: &k,
            v: &v,
            mask: mask.as_deref(),
            do_: &do_,
        },
    );
    let what = |name: &str| format!("{label} {name} {c:?} (seed {seed})");
    let tol = tol(c.dtype);
    for (name, got, want) in [
        ("o", &out.o, &r.o),
        ("dq", &out.dq, &r.dq),
        ("dk", &out.dk, &r.dk),
        ("dv", &out.dv, &r.dv),
    ] {
        let e = rel_err(got, want);
        assert!(e <= tol, "{}: relative error {e:e} > {tol:e}", what(name));
    }
    let e = lse_err(&out.lse, &r.lse, &r.lse_scale);
    assert!(e <= tol, "{}: relative error {e:e} > {tol:e}", what("lse"));
    out
}

/// [`rel_err_scaled`] over the finite entries of the reference, relative to the
/// magnitudes the lse is made of (`Reference::lse_scale`), NaN unless the `-inf` entries
/// (fully masked rows) are exactly those of `got`.
pub fn lse_err(got: &[f64], want: &[f64], scale: &[f64]) -> f64 {
    if got.len() != want.len() || scale.len() != want.len() {
        return f64::NAN;
    }
    let inf = |x: &f64| *x == f64::NEG_INFINITY;
    if got.iter().map(inf).ne(want.iter().map(inf)) {
        return f64::NAN;
    }
    let finite: Vec<usize> = (0..want.len()).filter(|&i| !inf(&want[i])).collect();
    let keep = |x: &[f64]| finite.iter().map(|&i| x[i]).collect::<Vec<_>>();
    rel_err_scaled(&keep(got), &keep(want), &keep(scale))
}

pub fn run_case_t<T: Element>(rt: &Runtime, label: &str, c: &Case) {
    let (seed, mut r) = rng();
    let q: Vec<T> = rand_vec(&mut r, c.q_dims().iter().product(), -2.0, 2.0);
    let k: Vec<T> = rand_vec(&mut r, c.kv_dims().iter().product(), -2.0, 2.0);
    let v: Vec<T> = rand_vec(&mut r, c.kv_dims().iter().product(), -2.0, 2.0);
    let do_: Vec<T> = rand_vec(&mut r, c.q_dims().iter().product(), -1.0, 1.0);
    let mask = c
        .mask_dims()
        .map(|dims| mask_values::<T>(&mut r, dims.iter().product()));
    check_with(rt, label, c, seed, [&q, &k, &v, &do_], mask.as_deref());
}

pub fn run_case(rt: &Runtime, label: &str, c: &Case) {
    match c.dtype {
        DType::F32 => run_case_t::<f32>(rt, label, c),
        DType::F16 => run_case_t::<f16>(rt, label, c),
        DType::BF16 => run_case_t::<bf16>(rt, label, c),
        other => panic!("no attention case for {other}"),
    }
}

pub fn run_all(rt: &Runtime, label: &str, cases: &[Case]) {
    let t = std::time::Instant::now();
    for c in cases {
        run_case(rt, label, c);
    }
    eprintln!("{label}: {} cases in {:.2?}", cases.len(), t.elapsed());
}

/// Whether this run is the first runtime of its backend (one stream): the others
/// (four streams) get a subsample of the long cases.
pub fn first(label: &str) -> bool {
    label.ends_with("/1")
}

pub fn is_cuda(rt: &Runtime) -> bool {
    rt.backend() == BackendKind::Cuda
}

pub fn fully_masked_t<T: Element>(rt: &Runtime, label: &str, c: &Case) {
    const ROW: usize = 3;
    let (seed, mut r) = rng();
    let n_q = c.q_dims().iter().product();
    let n_kv = c.kv_dims().iter().product();
    let q: Vec<T> = rand_vec(&mut r, n_q, -2.0, 2.0);
    let k: Vec<T> = rand_vec(&mut r, n_kv, -2.0, 2.0);
    let v: Vec<T> = rand_vec(&mut r, n_kv, -2.0, 2.0);
    let do_: Vec<T> = rand_vec(&mut r, n_q, -1.0, 1.0);
    let dims = c.mask_dims().expect("masked case");
    let mut mask: Vec<T> = rand_vec(&mut r, dims.iter().product(), -2.0, 2.0);
    // Row ROW of every (batch, head) plane.
    for plane in mask.chunks_mut(c.lq * c.lk) {
        plane[ROW * c.lk..][..c.lk].fill(T::from_f64(f64::NEG_INFINITY));
    }
    let out = check_with(rt, label, c, seed, [&q, &k, &v, &do_], Some(&mask));
    for bh in 0..c.b * c.h {
        let at = (bh * c.lq + ROW) * c.d;
        assert!(
            out.o[at..][..c.d].iter().all(|&x| x == 0.0),
            "{label} {c:?}: o of a masked row"
        );
        assert!(
            out.dq[at..][..c.d].iter().all(|&x| x == 0.0),
            "{label} {c:?}: dq of a masked row"
        );
        assert_eq!(
            out.lse[bh * c.lq + ROW],
            f64::NEG_INFINITY,
            "{label} {c:?}: lse of a masked row"
        );
    }
}
