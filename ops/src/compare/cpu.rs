//! CPU comparisons and selection (the reference of `kernels/cuda/compare.cu`).

use rayon::prelude::*;
use rtx_runtime::Element;

use crate::cpu_util::{PAR_CHUNK, PAR_MIN_LEN};

/// An element-wise comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `a == b`.
    Eq,
    /// `a > b`.
    Gt,
    /// `a < b`.
    Lt,
}

impl CmpOp {
    /// The comparison of two values (exact in f64 for every dtype; NaN compares false).
    #[inline(always)]
    pub fn apply<T: Element>(self, a: T, b: T) -> bool {
        let (a, b) = (a.to_f64(), b.to_f64());
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Gt => a > b,
            CmpOp::Lt => a < b,
        }
    }
}

/// `y[i] = op(a[i], b[i]) as u32`.
pub fn compare<T: Element>(op: CmpOp, a: &[T], b: &[T], y: &mut [u32]) {
    let kernel = |a: &[T], b: &[T], y: &mut [u32]| {
        for ((o, x), z) in y.iter_mut().zip(a).zip(b) {
            *o = op.apply(*x, *z) as u32;
        }
    };
    if y.len() < PAR_MIN_LEN {
        kernel(a, b, y);
    } else {
        y.par_chunks_mut(PAR_CHUNK)
            .zip(a.par_chunks(PAR_CHUNK).zip(b.par_chunks(PAR_CHUNK)))
            .for_each(|(y, (a, b))| kernel(a, b, y));
    }
}

/// `mask[i] != 0 ? a[i] : b[i]`.
pub fn select<T: Element>(mask: &[u32], a: &[T], b: &[T]) -> Vec<T> {
    let pick = |((m, x), z): ((&u32, &T), &T)| if *m != 0 { *x } else { *z };
    if a.len() < PAR_MIN_LEN {
        mask.iter().zip(a).zip(b).map(pick).collect()
    } else {
        mask.par_iter()
            .zip(a.par_iter())
            .zip(b.par_iter())
            .map(pick)
            .collect()
    }
}
