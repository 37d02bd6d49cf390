//! The device's stream-ordered memory pool (raw driver calls, kept to this module).
//!
//! By default the pool's release threshold is 0: at every event or stream synchronize
//! it hands unused memory back to the OS, so the next allocation maps fresh pages. The
//! completion watchers synchronize constantly, which made every op's output allocation
//! pay for new mappings (measured on the H200: element-wise ops at half bandwidth). Like
//! PyTorch's caching allocator, rtx keeps freed memory in the pool (threshold: max) and
//! trims it only when an allocation fails for lack of memory.

use cudarc::driver::{sys, CudaContext, DriverError};

/// The default memory pool of a device.
pub(crate) struct MemPool(sys::CUmemoryPool);

// SAFETY: a CUmemoryPool is an opaque driver handle; pool attribute calls and trims are
// thread-safe in the driver API.
unsafe impl Send for MemPool {}
// SAFETY: as above; no method needs exclusive access on the Rust side.
unsafe impl Sync for MemPool {}

impl MemPool {
    /// The device's default pool, set to keep freed memory for reuse.
    pub(crate) fn keep_memory(ctx: &CudaContext) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer and the device handle comes from a live
        // context.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }.result()?;
        let mut threshold: u64 = u64::MAX;
        // SAFETY: the release threshold attribute takes a pointer to a cuuint64_t, which
        // `threshold` is, alive for the duration of the call.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        }
        .result()?;
        Ok(MemPool(pool))
    }

    /// The device's default pool as it is (for trimming).
    pub(crate) fn default_of(ctx: &CudaContext) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer and the device handle comes from a live
        // context.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }.result()?;
        Ok(MemPool(pool))
    }

    /// Returns every unused byte of the pool to the OS (before retrying an allocation
    /// that ran out of memory).
    pub(crate) fn trim(&self) -> Result<(), DriverError> {
        // SAFETY: the pool handle is the device's default pool, valid while the context is.
        unsafe { sys::cuMemPoolTrimTo(self.0, 0) }.result()
    }
}
