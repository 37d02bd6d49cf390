//! Tensor shapes (row-major, contiguous).

use std::fmt;

use smallvec::SmallVec;

/// Dims held inline (no heap allocation to make or clone a shape of up to this rank;
/// with smallvec's `union` layout a shape is then as small as a `Vec`, 24 bytes).
const INLINE: usize = 2;

/// A tensor's dimensions, outermost first. The empty shape is a scalar (one element).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(SmallVec<[usize; INLINE]>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape::from(dims.into())
    }
    /// The scalar shape `[]`.
    pub fn scalar() -> Self {
        Shape(SmallVec::new())
    }
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// The number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }
    /// The number of elements, or `None` if it overflows `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }
    /// Dimension `i`, counting from the end when negative-style `from_end` is wanted use
    /// [`Shape::dim_from_end`].
    pub fn dim(&self, i: usize) -> Option<usize> {
        self.0.get(i).copied()
    }
    /// Dimension `i` counted from the end (0 is the last).
    pub fn dim_from_end(&self, i: usize) -> Option<usize> {
        self.0.len().checked_sub(i + 1).map(|j| self.0[j])
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        if v.len() <= INLINE {
            Shape(SmallVec::from_slice(&v))
        } else {
            Shape(SmallVec::from_vec(v))
        }
    }
}
impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(SmallVec::from_slice(v))
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape(SmallVec::from_slice(&v))
    }
}
impl From<usize> for Shape {
    fn from(n: usize) -> Self {
        Shape(SmallVec::from_slice(&[n]))
    }
}
impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape::scalar()
    }
}

// A shape stays the size of a `Vec` (errors hold two of them).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Shape>() == 24);
