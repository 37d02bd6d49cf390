//! [`Dim`]: a dim index that may count from the end (`-1` is the last dim), as in
//! PyTorch. Ops that take one dim take `impl Into<Dim>`, so `0`, `1usize`, `-1` and
//! `-2isize` all work; the dim is resolved against the input's rank at submit, and one
//! out of range is `Error::InvalidDim` there.

use rtx_runtime::Result;

/// A dim index: `0..rank` from the front, `-rank..0` from the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dim(pub isize);

impl Dim {
    /// The index below `rank`, or `Error::InvalidDim` naming `op`.
    pub fn resolve(self, op: &str, rank: usize) -> Result<usize> {
        crate::layout::resolve_dim(op, self.0, rank)
    }
}

macro_rules! dim_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Dim {
            fn from(d: $t) -> Dim {
                // Saturates: a dim beyond isize::MAX is out of range for every rank.
                Dim(isize::try_from(d).unwrap_or(isize::MAX))
            }
        }
    )*};
}
dim_from!(usize, isize, i32, i64, u32);
