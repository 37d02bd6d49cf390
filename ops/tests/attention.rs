//! Attention: the forward and backward ops against an f64 reference computed here
//! (naive `softmax(scale·q·kᵀ + mask)·v` and the textbook gradients), on fresh random
//! inputs, for every flag combination (dtype × D × causal × mask × lengths, GQA), with
//! outputs poisoned (NaN) so an unwritten element fails; fully masked rows; other head
//! dims; bad inputs (typed errors at submit, the op given back).
//!
//! The CPU backend runs the full flag grid on short lengths and a subsample on long
//! ones (the f64 reference is O(Lq·Lk·D)); CUDA runs the full grid, up to 4097 × 4097.

mod common;

use common::{
    download, for_each_backend, for_each_cuda_with, rand_vec, rel_err, rel_err_scaled, rng, upload,
};
use rand::rngs::StdRng;
use rand::Rng;
use rayon::prelude::*;
use rtx_ops::attention::{attention, attention_backward};
use rtx_runtime::{bf16, f16, BackendKind, DType, Element, Error, Runtime, Tensor};

// ---- cases -----------------------------------------------------------------------------

/// The additive mask a case passes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mask {
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
struct Case {
    dtype: DType,
    b: usize,
    h: usize,
    h_kv: usize,
    lq: usize,
    lk: usize,
    d: usize,
    causal: bool,
    mask: Mask,
    scale: Option<f32>,
}

impl Case {
    fn q_dims(&self) -> [usize; 4] {
        [self.b, self.h, self.lq, self.d]
    }
    fn kv_dims(&self) -> [usize; 4] {
        [self.b, self.h_kv, self.lk, self.d]
    }
    fn mask_dims(&self) -> Option<Vec<usize>> {
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
    fn scale_f32(&self) -> f32 {
        self.scale.unwrap_or(1.0 / (self.d as f32).sqrt())
    }
    /// The `[Lk]` row of the mask for (batch, head, query row), if any.
    fn mask_row<'m>(
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
type Dims = (usize, usize, usize, usize, usize);

/// Every combination of dtype × D {64, 128} × causal × mask {none, [Lq, Lk], full}
/// for `dims`; every fourth case uses a scale other than the default.
fn grid(dtypes: &[DType], dims: Dims) -> Vec<Case> {
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
fn subsample(cases: Vec<Case>) -> Vec<Case> {
    cases.into_iter().step_by(7).collect()
}

fn dtypes(rt: &Runtime) -> &'static [DType] {
    match rt.backend() {
        BackendKind::Cpu => &[DType::F32, DType::F16, DType::BF16],
        BackendKind::Cuda => &[DType::F16, DType::BF16],
    }
}

/// Relative-error bound by the norm: 1e-4 for f32 (CPU), 2e-2 for f16 and bf16.
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        _ => 2e-2,
    }
}

// ---- the f64 reference -----------------------------------------------------------------

/// Outputs of the reference, all `[.., D]` row-major like the op's.
struct Reference {
    o: Vec<f64>,
    lse: Vec<f64>,
    /// Per row, the magnitude its lse is made of: the largest finite score's
    /// `scale·Σ|q·k| + |mask|`, or |lse| if larger. The lse is compared relative to it
    /// (a row's scores of both signs can give an lse near zero whose rounding error is
    /// that of the scores, e.g. a single key: lse = score).
    lse_scale: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

struct Inputs<'a> {
    q: &'a [f64],
    k: &'a [f64],
    v: &'a [f64],
    mask: Option<&'a [f32]>,
    do_: &'a [f64],
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn axpy(y: &mut [f64], a: f64, x: &[f64]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
}

/// Query rows per parallel task of the reference.
const REF_ROWS: usize = 16;

/// `o = softmax(s)·v`, `lse = ln Σ exp(s)` with `s = scale·q·kᵀ + mask` (causal:
/// `-inf` for `j > i`); `dS = P ∘ (dO·vᵀ − rowsum(dO ∘ o))`, `dq = scale·dS·k`,
/// `dk = scale·dSᵀ·q` and `dv = Pᵀ·dO` summed over each kv head's query heads. A row
/// with no finite score gives o = 0, lse = −inf and no gradient.
fn reference(c: &Case, x: &Inputs<'_>) -> Reference {
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
fn mask_values<T: Element>(rng: &mut StdRng, n: usize) -> Vec<T> {
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
struct Outputs {
    o: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

fn submit_both(
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
fn check_with<T: Element>(
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
fn lse_err(got: &[f64], want: &[f64], scale: &[f64]) -> f64 {
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

fn run_case_t<T: Element>(rt: &Runtime, label: &str, c: &Case) {
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

fn run_case(rt: &Runtime, label: &str, c: &Case) {
    match c.dtype {
        DType::F32 => run_case_t::<f32>(rt, label, c),
        DType::F16 => run_case_t::<f16>(rt, label, c),
        DType::BF16 => run_case_t::<bf16>(rt, label, c),
        other => panic!("no attention case for {other}"),
    }
}

fn run_all(rt: &Runtime, label: &str, cases: &[Case]) {
    let t = std::time::Instant::now();
    for c in cases {
        run_case(rt, label, c);
    }
    eprintln!("{label}: {} cases in {:.2?}", cases.len(), t.elapsed());
}

/// Whether this run is the first runtime of its backend (one stream): the others
/// (four streams) get a subsample of the long cases.
fn first(label: &str) -> bool {
    label.ends_with("/1")
}

fn is_cuda(rt: &Runtime) -> bool {
    rt.backend() == BackendKind::Cuda
}

// ---- parity ----------------------------------------------------------------------------

#[test]
fn parity_short() {
    for_each_backend(|rt, label| {
        for dims in [(1, 2, 2, 1, 1), (1, 2, 2, 17, 17)] {
            run_all(rt, label, &grid(dtypes(rt), dims));
        }
    });
}

#[test]
fn parity_grouped_heads() {
    for_each_backend(|rt, label| {
        // GQA with two batches, and MQA (one kv head), at lengths off the tile sizes.
        for dims in [(2, 4, 2, 77, 200), (1, 4, 1, 33, 65)] {
            let cases = grid(dtypes(rt), dims);
            let cases = if first(label) || is_cuda(rt) {
                cases
            } else {
                subsample(cases)
            };
            run_all(rt, label, &cases);
        }
    });
}

#[test]
fn parity_decode_and_cross() {
    for_each_backend(|rt, label| {
        for dims in [(1, 2, 2, 1, 1000), (1, 2, 2, 17, 1000), (1, 2, 2, 1000, 17)] {
            let cases = grid(dtypes(rt), dims);
            let cases = if first(label) || is_cuda(rt) {
                cases
            } else {
                subsample(cases)
            };
            run_all(rt, label, &cases);
        }
    });
}

#[test]
fn parity_long() {
    for_each_backend(|rt, label| {
        let cases = grid(dtypes(rt), (1, 2, 2, 1000, 1000));
        let cases = if first(label) {
            cases
        } else {
            subsample(cases)
        };
        run_all(rt, label, &cases);
    });
}

/// The longest sequences, on CUDA only (the f64 reference is O(L²·D)).
#[test]
fn parity_4097_cuda() {
    for_each_backend(|rt, label| {
        if !is_cuda(rt) {
            eprintln!("{label}: 4097 x 4097 runs on CUDA only");
            return;
        }
        let cases = grid(dtypes(rt), (1, 2, 2, 4097, 4097));
        let cases = if first(label) {
            cases
        } else {
            subsample(cases)
        };
        // `RTX_TEST_SHARD=i/n`: the sanitizer runs split this test into processes.
        run_all(rt, label, &common::shard(&cases));
    });
}

/// Masks broadcast over only the batch or only the heads.
#[test]
fn parity_partial_mask_broadcast() {
    for_each_backend(|rt, label| {
        let mut cases = Vec::new();
        for &dtype in dtypes(rt) {
            for (mask, causal) in [(Mask::PerBatch, false), (Mask::PerHead, true)] {
                cases.push(Case {
                    dtype,
                    b: 2,
                    h: 3,
                    h_kv: 1,
                    lq: 33,
                    lk: 70,
                    d: 64,
                    causal,
                    mask,
                    scale: None,
                });
            }
        }
        run_all(rt, label, &cases);
    });
}

/// Rows whose every key is masked: o = 0, lse = -inf, zero dq, and the other rows
/// unaffected.
#[test]
fn fully_masked_rows() {
    for_each_backend(|rt, label| {
        for &dtype in dtypes(rt) {
            for mask in [Mask::Plane, Mask::Full] {
                let c = Case {
                    dtype,
                    b: 1,
                    h: 2,
                    h_kv: 1,
                    lq: 17,
                    lk: 40,
                    d: 64,
                    causal: false,
                    mask,
                    scale: None,
                };
                match dtype {
                    DType::F32 => fully_masked_t::<f32>(rt, label, &c),
                    DType::F16 => fully_masked_t::<f16>(rt, label, &c),
                    _ => fully_masked_t::<bf16>(rt, label, &c),
                }
            }
        }
    });
}

fn fully_masked_t<T: Element>(rt: &Runtime, label: &str, c: &Case) {
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

/// The TMA backward main kernel (the experimental setting `attn_bwd_tma`; compute
/// capability 9.0, elsewhere the setting changes nothing): the grids above (D 64 and 128),
/// GQA and MQA, lengths off its 64-row steps and 128-key blocks, Lq ≠ Lk, 4097 × 4097,
/// fully masked rows; CUDA only.
#[test]
fn tma_backward_parity_cuda() {
    for_each_cuda_with(
        |b| b.attn_bwd_tma(true),
        "tma-bwd",
        |rt, label| {
            assert!(rt.settings().attn_bwd_tma);
            let launched = rtx_ops::attention::tma_backward_launches();

            for dims in [
                (1, 2, 2, 1, 1),
                (1, 2, 2, 17, 17),
                (2, 4, 2, 77, 200),
                (1, 4, 1, 33, 65),
                (1, 2, 2, 1, 1000),
                (1, 2, 2, 1000, 17),
                (1, 2, 2, 1000, 1000),
            ] {
                run_all(rt, label, &grid(dtypes(rt), dims));
            }
            let long = grid(dtypes(rt), (1, 2, 2, 4097, 4097));
            let long = if first(label) { long } else { subsample(long) };
            run_all(rt, label, &long);
            for (&dtype, d) in dtypes(rt).iter().flat_map(|t| [(t, 64), (t, 128)]) {
                let c = Case {
                    dtype,
                    b: 1,
                    h: 2,
                    h_kv: 1,
                    lq: 130,
                    lk: 200,
                    d,
                    causal: false,
                    mask: Mask::Full,
                    scale: None,
                };
                match dtype {
                    DType::F16 => fully_masked_t::<f16>(rt, label, &c),
                    _ => fully_masked_t::<bf16>(rt, label, &c),
                }
            }
            // On compute capability 9.0 the TMA kernel itself ran (not its fallback after
            // a failed load or refused tensor maps).
            let hopper = rt
                .info()
                .devices
                .iter()
                .any(|d| d.compute_capability == Some((9, 0)));
            if hopper {
                assert!(
                    rtx_ops::attention::tma_backward_launches() > launched,
                    "{label}: flash_bwd_tma never launched"
                );
            }
        },
    );
}

/// The TMA backward's dK and dV are bitwise those of the wgmma backward (the same GEMMs
/// in the same order; dq differs only in the order its f32 reductions land), and repeat
/// bit for bit: a race on a stage or a dS^T buffer would show here. CUDA only.
#[test]
fn tma_backward_matches_wgmma_bitwise_cuda() {
    for_each_cuda_with(
        |b| b.attn_bwd_tma(true),
        "tma-bwd",
        |tma, label| {
            let base = rtx_runtime::Runtime::builder()
                .backend(rtx_runtime::Backend::Cuda(vec![]))
                .streams(1)
                .build()
                .expect("a CUDA runtime");
            let cases = [
                (2, 4, 2, 1000, 1000, false),
                (2, 4, 2, 1000, 1000, true),
                (1, 4, 1, 777, 300, false),
            ];
            for (b, h, h_kv, lq, lk, causal) in cases {
                let c = Case {
                    dtype: DType::BF16,
                    b,
                    h,
                    h_kv,
                    lq,
                    lk,
                    d: 128,
                    causal,
                    mask: Mask::None,
                    scale: None,
                };
                let (_seed, mut r) = rng();
                let q: Vec<bf16> = rand_vec(&mut r, c.q_dims().iter().product(), -2.0, 2.0);
                let k: Vec<bf16> = rand_vec(&mut r, c.kv_dims().iter().product(), -2.0, 2.0);
                let v: Vec<bf16> = rand_vec(&mut r, c.kv_dims().iter().product(), -2.0, 2.0);
                let g: Vec<bf16> = rand_vec(&mut r, c.q_dims().iter().product(), -1.0, 1.0);
                let grads = |rt: &Runtime| {
                    let (tq, tk, tv) = (
                        upload(rt, &q, &c.q_dims()),
                        upload(rt, &k, &c.kv_dims()),
                        upload(rt, &v, &c.kv_dims()),
                    );
                    let tg = upload(rt, &g, &c.q_dims());
                    let (_, _, _, dk, dv) = submit_both(rt, &c, &tq, &tk, &tv, None, &tg);
                    let bits = |t: &Tensor| {
                        download::<bf16>(rt, t)
                            .iter()
                            .map(|x| x.to_bits())
                            .collect::<Vec<u64>>()
                    };
                    (bits(&dk), bits(&dv))
                };
                let want = grads(&base);
                for rep in 0..3 {
                    let got = grads(tma);
                    assert!(
                        got.0 == want.0 && got.1 == want.1,
                        "{label} {c:?} run {rep}: dk or dv differs from the wgmma backward's bits"
                    );
                }
            }
        },
    );
}

/// The CPU backend takes any head dim; CUDA rejects those it has no kernel for.
#[test]
fn other_head_dims() {
    for_each_backend(|rt, label| {
        for d in [8, 80] {
            let mut c = Case {
                dtype: DType::F16,
                b: 1,
                h: 2,
                h_kv: 1,
                lq: 9,
                lk: 30,
                d,
                causal: true,
                mask: Mask::Plane,
                scale: None,
            };
            if !is_cuda(rt) {
                for dtype in dtypes(rt) {
                    c.dtype = *dtype;
                    run_case(rt, label, &c);
                }
                continue;
            }
            let q = upload(rt, &vec![f16::ONE; 2 * 9 * d], &[1, 2, 9, d]);
            let kv = upload(rt, &vec![f16::ONE; 30 * d], &[1, 1, 30, d]);
            let e = rt.submit(attention(&q, &kv, &kv)).expect_err("rejected");
            assert!(
                matches!(e.error, Error::InvalidDim { .. }),
                "{label}: {}",
                e.error
            );
            assert!(e.into_op().into_inputs().0.same_storage(&q));
        }
    });
}
