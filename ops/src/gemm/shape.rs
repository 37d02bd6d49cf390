//! The shape rules of `matmul` and `linear`, checked at submit time.

use rtx_runtime::{DType, Error, Result, Shape};

/// A validated batched product `C[i] = op(A[i]) · op(B[i])`, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GemmDims {
    /// Number of products (1 when neither operand has batch dims).
    pub batch: usize,
    /// Rows of `op(A)` and of `C`.
    pub m: usize,
    /// Columns of `op(B)` and of `C`.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Elements between consecutive `A` matrices (0: broadcast).
    pub a_bs: usize,
    /// Elements between consecutive `B` matrices (0: broadcast).
    pub b_bs: usize,
    /// The output shape: the batch dims, then `[m, n]`.
    pub out: Shape,
}

impl GemmDims {
    /// Multiply-adds times two.
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// The largest size a cuBLAS / cuDNN integer parameter takes.
const MAX_DIM: usize = i32::MAX as usize;

/// Dims of `matmul(a, b)`: `a` is `[.., m, k]` (`[.., k, m]` with `trans_a`), `b` is
/// `[.., k, n]` (`[.., n, k]` with `trans_b`); the batch dims are equal, or one side
/// is 2-D and is broadcast over the other's batch.
pub(crate) fn matmul_dims(
    op: &str,
    a: &Shape,
    b: &Shape,
    trans_a: bool,
    trans_b: bool,
) -> Result<GemmDims> {
    let (ad, bd) = (a.dims(), b.dims());
    if ad.len() < 2 || bd.len() < 2 {
        return Err(Error::shape(op, a, b, "both operands need at least 2 dims"));
    }
    let last2 = |d: &[usize]| (d[d.len() - 2], d[d.len() - 1]);
    let (m, ka) = if trans_a {
        let (r, c) = last2(ad);
        (c, r)
    } else {
        last2(ad)
    };
    let (kb, n) = if trans_b {
        let (r, c) = last2(bd);
        (c, r)
    } else {
        last2(bd)
    };
    if ka != kb {
        let detail = format!(
            "inner dimensions differ: a gives k = {ka}, b gives k = {kb} (trans_a {trans_a}, trans_b {trans_b})"
        );
        return Err(Error::shape(op, a, b, detail));
    }
    let (a_batch, b_batch) = (&ad[..ad.len() - 2], &bd[..bd.len() - 2]);
    let batch_dims = match (a_batch.is_empty(), b_batch.is_empty()) {
        (true, _) => b_batch,
        (_, true) => a_batch,
        _ if a_batch == b_batch => a_batch,
        _ => {
            let detail = format!(
                "batch dimensions differ: {a_batch:?} vs {b_batch:?} (equal, or one side 2-D)"
            );
            return Err(Error::shape(op, a, b, detail));
        }
    };
    let batch: usize = batch_dims.iter().product();
    let k = ka;
    let mut out = batch_dims.to_vec();
    out.extend([m, n]);
    let dims = GemmDims {
        batch,
        m,
        n,
        k,
        a_bs: if a_batch.is_empty() { 0 } else { m * k },
        b_bs: if b_batch.is_empty() { 0 } else { k * n },
        out: Shape::new(out),
    };
    check_sizes(op, &dims)?;
    Ok(dims)
}

/// Dims of `linear(x, w, bias)`: `x` is `[.., k]`, `w` is `[n, k]`, `bias` is `[n]`;
/// the product is `x · wᵀ` over the rows of `x` (one batch, `trans_b`).
pub(crate) fn linear_dims(
    op: &str,
    x: &Shape,
    w: &Shape,
    bias: Option<&Shape>,
) -> Result<GemmDims> {
    linear_dims_of(op, x, w, bias, false)
}

/// As [`linear_dims`], and also the stacked form: `w` `[s, n, k]` with `x` `[s, m, k]`,
/// `s` independent layers in one batched product, the bias `[n]` shared by all.
pub(crate) fn stacked_linear_dims(
    op: &str,
    x: &Shape,
    w: &Shape,
    bias: Option<&Shape>,
) -> Result<GemmDims> {
    linear_dims_of(op, x, w, bias, true)
}

fn linear_dims_of(
    op: &str,
    x: &Shape,
    w: &Shape,
    bias: Option<&Shape>,
    stacked: bool,
) -> Result<GemmDims> {
    let (xd, wd) = (x.dims(), w.dims());
    if stacked && wd.len() == 3 {
        if xd.len() != 3 || xd[0] != wd[0] {
            let detail = format!(
                "a stacked w [{}, out_features, in_features] takes x [{}, rows, in_features]",
                wd[0], wd[0]
            );
            return Err(Error::shape(op, x, w, detail));
        }
        let flat_x = Shape::new(xd[1..].to_vec());
        let flat_w = Shape::new(wd[1..].to_vec());
        let one = linear_dims_of(op, &flat_x, &flat_w, bias, false)?;
        let dims = GemmDims {
            batch: wd[0],
            a_bs: one.m * one.k,
            b_bs: one.n * one.k,
            out: Shape::new(vec![wd[0], one.m, one.n]),
            ..one
        };
        check_sizes(op, &dims)?;
        return Ok(dims);
    }
    if xd.is_empty() || wd.len() != 2 {
        let detail = if stacked {
            "linear takes x [.., in_features] and w [out_features, in_features], or x \
             [layers, rows, in_features] and a stacked w [layers, out_features, in_features]"
        } else {
            "linear takes x [.., in_features] and w [out_features, in_features]"
        };
        return Err(Error::shape(op, x, w, detail));
    }
    let k = xd[xd.len() - 1];
    let (n, kw) = (wd[0], wd[1]);
    if k != kw {
        let detail = format!("in_features differ: x has {k}, w has {kw}");
        return Err(Error::shape(op, x, w, detail));
    }
    if let Some(b) = bias {
        if b.dims() != [n] {
            let detail = format!("bias must be [{n}] (w's out_features)");
            return Err(Error::shape(op, b, w, detail));
        }
    }
    let m: usize = xd[..xd.len() - 1].iter().product();
    let mut out = xd[..xd.len() - 1].to_vec();
    out.push(n);
    let dims = GemmDims {
        batch: 1,
        m,
        n,
        k,
        a_bs: 0,
        b_bs: 0,
        out: Shape::new(out),
    };
    check_sizes(op, &dims)?;
    Ok(dims)
}

/// Rejects empty products (a zero-size output cannot be allocated on a device) and
/// sizes beyond the libraries' 32-bit parameters.
fn check_sizes(op: &str, d: &GemmDims) -> Result<()> {
    if d.batch == 0 || d.m == 0 || d.n == 0 || d.k == 0 {
        return Err(Error::invalid_dim(
            op,
            format!(
                "zero-size product (batch {}, m {}, n {}, k {}) is not supported",
                d.batch, d.m, d.n, d.k
            ),
        ));
    }
    let big = [d.batch, d.m, d.n, d.k].into_iter().any(|v| v > MAX_DIM);
    if big {
        return Err(Error::invalid_dim(
            op,
            format!(
                "batch {}, m {}, n {}, k {}: each must be below 2^31",
                d.batch, d.m, d.n, d.k
            ),
        ));
    }
    Ok(())
}

/// The common float dtype of all operands: f32, f16 or bf16, and all equal.
pub(crate) fn float_dtype(op: &str, dtypes: &[DType]) -> Result<DType> {
    let first = dtypes[0];
    if !first.is_float() {
        return Err(Error::dtype(op, DType::F32, first));
    }
    match dtypes.iter().find(|d| **d != first) {
        Some(other) => Err(Error::dtype(op, first, *other)),
        None => Ok(first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[usize]) -> Shape {
        Shape::new(d.to_vec())
    }

    #[test]
    fn plain_transposed_and_broadcast() {
        let d = matmul_dims("t", &s(&[3, 4]), &s(&[4, 5]), false, false).unwrap();
        assert_eq!((d.batch, d.m, d.n, d.k), (1, 3, 5, 4));
        assert_eq!(d.out.dims(), [3, 5]);
        let d = matmul_dims("t", &s(&[4, 3]), &s(&[5, 4]), true, true).unwrap();
        assert_eq!((d.m, d.n, d.k), (3, 5, 4));
        let d = matmul_dims("t", &s(&[2, 6, 3, 4]), &s(&[4, 5]), false, false).unwrap();
        assert_eq!((d.batch, d.a_bs, d.b_bs), (12, 12, 0));
        assert_eq!(d.out.dims(), [2, 6, 3, 5]);
        let d = matmul_dims("t", &s(&[3, 4]), &s(&[7, 4, 5]), false, false).unwrap();
        assert_eq!((d.batch, d.a_bs, d.b_bs), (7, 0, 20));
    }

    #[test]
    fn rejects_bad_shapes() {
        let e = |a: &[usize], b: &[usize]| matmul_dims("t", &s(a), &s(b), false, false);
        assert!(matches!(e(&[4], &[4, 5]), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(
            e(&[3, 4], &[5, 5]),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            e(&[2, 3, 4], &[3, 4, 5]),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(e(&[0, 4], &[4, 5]), Err(Error::InvalidDim { .. })));
    }

    #[test]
    fn linear_shapes() {
        let d = linear_dims("l", &s(&[2, 3, 8]), &s(&[5, 8]), Some(&s(&[5]))).unwrap();
        assert_eq!((d.batch, d.m, d.n, d.k), (1, 6, 5, 8));
        assert_eq!(d.out.dims(), [2, 3, 5]);
        assert!(linear_dims("l", &s(&[2, 8]), &s(&[5, 7]), None).is_err());
        assert!(linear_dims("l", &s(&[2, 8]), &s(&[5, 8]), Some(&s(&[4]))).is_err());
    }

    #[test]
    fn stacked_linear_shapes() {
        let d = stacked_linear_dims("l", &s(&[4, 3, 8]), &s(&[4, 5, 8]), Some(&s(&[5]))).unwrap();
        assert_eq!(
            (d.batch, d.m, d.n, d.k, d.a_bs, d.b_bs),
            (4, 3, 5, 8, 24, 40)
        );
        assert_eq!(d.out.dims(), [4, 3, 5]);
        // The 2-D form is unchanged.
        let d = stacked_linear_dims("l", &s(&[2, 3, 8]), &s(&[5, 8]), None).unwrap();
        assert_eq!((d.batch, d.m, d.out.dims()), (1, 6, &[2, 3, 5][..]));
        let e = |x: &[usize], w: &[usize], b: Option<&[usize]>| {
            let b = b.map(s);
            stacked_linear_dims("l", &s(x), &s(w), b.as_ref())
        };
        for bad in [
            e(&[3, 3, 8], &[4, 5, 8], None),          // layers differ
            e(&[4, 2, 3, 8], &[4, 5, 8], None),       // x not 3-D
            e(&[4, 3, 7], &[4, 5, 8], None),          // in_features differ
            e(&[4, 3, 8], &[4, 5, 8], Some(&[4, 5])), // a bias per layer
            e(&[4, 3, 8], &[2, 4, 5, 8], None),       // w 4-D
        ] {
            assert!(matches!(bad, Err(Error::ShapeMismatch { .. })), "{bad:?}");
        }
        // linear_train / linear_backward keep the 2-D form only.
        assert!(linear_dims("l", &s(&[4, 3, 8]), &s(&[4, 5, 8]), None).is_err());
    }
}
