//! Tensors: a shape and a shared, read-only handle to storage.

use std::fmt;

use crate::device::{Device, StreamId};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::storage::Storage;
use crate::sync::Arc;

/// An n-dimensional array on one device, row-major and contiguous.
///
/// Cloning a tensor is cheap and shares its storage read-only: no public API gives mutable
/// access to memory that another handle can see. An op that wants to write in place takes
/// its input *by value* (donation); it reuses the memory only when that handle is the last
/// one at execution time, and allocates otherwise, so the answer never depends on it.
///
/// A tensor returned by `submit` may still be pending: it can be passed to the next op at
/// once, which then waits for it on the device (no round trip to the host).
///
/// The storage is not reachable from outside the crate:
///
/// ```compile_fail,E0616
/// fn peek(t: &rtx::Tensor) { let _ = &t.storage; }
/// ```
#[derive(Clone)]
pub struct Tensor {
    shape: Shape,
    storage: Arc<Storage>,
}

impl Tensor {
    pub(crate) fn from_storage(shape: Shape, storage: Arc<Storage>) -> Self {
        debug_assert_eq!(shape.numel(), storage.len);
        Tensor { shape, storage }
    }
    pub(crate) fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }
    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }
    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype
    }
    /// The device holding the memory.
    pub fn device(&self) -> Device {
        self.storage.device
    }
    /// The stream whose op produces this tensor, if any.
    pub fn producer(&self) -> Option<StreamId> {
        self.storage.producer
    }
    /// Whether the producing op has been enqueued (CUDA) or computed (CPU), or failed.
    pub fn is_published(&self) -> bool {
        self.storage.is_settled()
    }
    /// The same storage under another shape with the same number of elements.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        // Checked: a product that wraps (say `[(1 << 62) + 1, 4]`) must not pass for 4.
        if shape.checked_numel() != Some(self.numel()) {
            return Err(Error::shape(
                "reshape",
                &self.shape,
                &shape,
                "element counts differ",
            ));
        }
        Ok(Tensor {
            shape,
            storage: self.storage.clone(),
        })
    }
    /// Whether two tensors share storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }
    /// Whether this handle is the only one to its storage (so donating it lets the op
    /// write in place). Until the op that produced it has completed, that op's own
    /// keep-alive counts here, though it does not stop a donation (`storage.rs`, rule 3).
    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.storage) == 1
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({} {} on {}, #{})",
            self.dtype(),
            self.shape,
            self.device(),
            self.storage.id
        )
    }
}
