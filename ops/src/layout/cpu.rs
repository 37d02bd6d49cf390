//! The layout ops' copy plan and its CPU execution.
//!
//! Every layout op is one or more *strided copies*: walk a row-major index space
//! `shape`, and copy `x[src_base + sum c[d] * src[d]]` to `y[dst_base + sum c[d] *
//! dst[d]]`. [`CopyPlan::coalesced`] drops size-1 dims and merges dims that are
//! contiguous in both, so a copy that is really a block move becomes one long dim.

/// One strided copy (strides and bases in elements).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyPlan {
    /// The index space, outermost first.
    pub shape: Vec<usize>,
    /// Source strides, per dim of `shape`.
    pub src: Vec<usize>,
    /// Destination strides.
    pub dst: Vec<usize>,
    /// Source offset of the first element.
    pub src_base: usize,
    /// Destination offset of the first element.
    pub dst_base: usize,
}

/// Row-major contiguous strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

impl CopyPlan {
    /// Elements copied.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The same copy with size-1 dims dropped and mergeable neighbours merged (at least
    /// one dim remains).
    pub fn coalesced(&self) -> CopyPlan {
        let mut dims: Vec<(usize, usize, usize)> = Vec::new();
        for i in 0..self.shape.len() {
            let d = (self.shape[i], self.src[i], self.dst[i]);
            if d.0 == 1 {
                continue;
            }
            match dims.last_mut() {
                // The outer dim steps exactly over the inner one in both tensors.
                Some(o) if o.1 == d.1 * d.0 && o.2 == d.2 * d.0 => {
                    *o = (o.0 * d.0, d.1, d.2);
                }
                _ => dims.push(d),
            }
        }
        if dims.is_empty() {
            dims.push((1, 1, 1));
        }
        CopyPlan {
            shape: dims.iter().map(|d| d.0).collect(),
            src: dims.iter().map(|d| d.1).collect(),
            dst: dims.iter().map(|d| d.2).collect(),
            src_base: self.src_base,
            dst_base: self.dst_base,
        }
    }

    /// Runs the copy from `x` into `y` (an odometer over the index space; the innermost
    /// dim is a strided slice copy).
    pub fn run<T: Copy>(&self, x: &[T], y: &mut [T]) {
        let p = self.coalesced();
        let nd = p.shape.len();
        let (inner, si, di) = (p.shape[nd - 1], p.src[nd - 1], p.dst[nd - 1]);
        let rows: usize = p.shape[..nd - 1].iter().product();
        let mut c = vec![0usize; nd - 1];
        let (mut so, mut d) = (p.src_base, p.dst_base);
        for _ in 0..rows {
            if si == 1 && di == 1 {
                y[d..d + inner].copy_from_slice(&x[so..so + inner]);
            } else {
                for j in 0..inner {
                    y[d + j * di] = x[so + j * si];
                }
            }
            // Advance the outer coordinates.
            for k in (0..nd - 1).rev() {
                c[k] += 1;
                so += p.src[k];
                d += p.dst[k];
                if c[k] < p.shape[k] {
                    break;
                }
                so -= p.src[k] * p.shape[k];
                d -= p.dst[k] * p.shape[k];
                c[k] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing() {
        // A contiguous [2, 3, 4] copy is one dim of 24.
        let p = CopyPlan {
            shape: vec![2, 3, 4],
            src: strides(&[2, 3, 4]),
            dst: strides(&[2, 3, 4]),
            src_base: 0,
            dst_base: 0,
        };
        assert_eq!(p.coalesced().shape, vec![24]);
        // A transpose of the last two dims keeps them apart.
        let t = CopyPlan {
            shape: vec![2, 4, 3],
            src: vec![12, 1, 4],
            dst: strides(&[2, 4, 3]),
            src_base: 0,
            dst_base: 0,
        };
        assert_eq!(t.coalesced().shape, vec![2, 4, 3]);
        let x: Vec<u32> = (0..24).collect();
        let mut y = vec![0u32; 24];
        t.run(&x, &mut y);
        assert_eq!(&y[..6], &[0, 4, 8, 1, 5, 9]);
    }
}
