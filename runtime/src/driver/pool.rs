//! The device's stream-ordered memory pool (raw driver calls, kept to this module).
//!
//! By default the pool's release threshold is 0: at every event or stream synchronize
//! it hands unused memory back to the OS, so the next allocation maps fresh pages. The
//! completion watchers synchronize constantly, which made every op's output allocation
//! pay for new mappings (measured on the H200: element-wise ops at half bandwidth). Like
//! PyTorch's caching allocator, rtx keeps freed memory in the pool (threshold: max) and
//! trims it only when an allocation fails for lack of memory.
//!
//! Each stream actor also owns a pool of its own ([`StreamPool`], see `alloc.rs` for
//! why and how it is used). Free memory inside one stream's pool is not reused by
//! another until it is trimmed, which the out-of-memory path does for every pool; the
//! blocks a stream's cache keeps can be (`alloc.rs`, `steal`).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex as StdMutex};

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

/// A memory pool of one stream actor (see the module docs), keeping freed memory like
/// the default pool: the pool's handle and its device's ordinal.
///
/// Pools are never destroyed: dropped, a pool is trimmed and kept in a per-device list
/// ([`SPARE`]) for the next actor of that device, so the process holds at most as many
/// pools as it ever had actors alive at once. Destroying a pool while allocations from
/// it are outstanding (tensors outliving their actor, frees still enqueued) is legal
/// but leaves the driver to release it later; with that, and with an actor's handles
/// dropped concurrently with its runtime's other actors', GPU runs 20-21 saw the driver
/// deadlock at actor teardown in 3 of 17 test processes (none of 20 without per-stream
/// pools), and runs 22-23 saw none in 60 with this and `teardown.rs`'s one-at-a-time
/// teardown (`benches/RESULTS.md`).
pub(crate) struct StreamPool(sys::CUmemoryPool, usize);

/// Spare pools by device ordinal (raw `CUmemoryPool` handles), trimmed, owned by no
/// actor. See [`StreamPool`].
static SPARE: LazyLock<StdMutex<HashMap<usize, Vec<usize>>>> = LazyLock::new(Default::default);

// SAFETY: as for `MemPool`: an opaque driver handle, used through thread-safe calls.
unsafe impl Send for StreamPool {}
// SAFETY: as above.
unsafe impl Sync for StreamPool {}

impl StreamPool {
    /// A device-memory pool on the context's device: a spare one if there is one, else
    /// a new one.
    pub(crate) fn create(ctx: &CudaContext) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let spare = SPARE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&ctx.ordinal())
            .and_then(Vec::pop);
        if let Some(pool) = spare {
            let pool = pool as sys::CUmemoryPool;
            let mut threshold: u64 = 0;
            // SAFETY: the attribute takes a pointer to a cuuint64_t, which `threshold`
            // is; a pool handle the driver no longer knows (its context was destroyed
            // and the pool with it) only makes the call fail.
            let alive = unsafe {
                sys::cuMemPoolGetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                )
            }
            .result()
            .is_ok();
            if alive {
                return Ok(StreamPool(pool, ctx.ordinal()));
            }
            // Forgotten, not destroyed: the driver no longer has it.
        }
        let props = sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ctx.ordinal() as i32,
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        };
        let mut pool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer; `props` is fully initialized and alive
        // for the call.
        unsafe { sys::cuMemPoolCreate(&mut pool, &props) }.result()?;
        let pool = StreamPool(pool, ctx.ordinal());
        let mut threshold: u64 = u64::MAX;
        // SAFETY: the pool was just created; the attribute takes a pointer to a
        // cuuint64_t, which `threshold` is, alive for the call.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool.0,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        }
        .result()?;
        Ok(pool)
    }

    /// Allocates `bytes` stream-ordered on `stream` from this pool.
    ///
    /// # Safety
    /// `stream` must be a live stream of this pool's device; the memory is
    /// uninitialized.
    pub(crate) unsafe fn alloc(
        &self,
        bytes: usize,
        stream: sys::CUstream,
    ) -> Result<sys::CUdeviceptr, DriverError> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the pool is live; the caller guarantees
        // the stream.
        unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, self.0, stream) }.result()?;
        Ok(ptr)
    }

    /// Returns every unused byte of this pool to the OS.
    pub(crate) fn trim(&self) -> Result<(), DriverError> {
        // SAFETY: the pool is live until dropped.
        unsafe { sys::cuMemPoolTrimTo(self.0, 0) }.result()
    }
}

/// Trims the spare pools of device `ordinal` (the out-of-memory path: memory freed into
/// a pool after its actor exited stays there until the pool is reused or trimmed).
pub(crate) fn trim_spare(ordinal: usize) {
    let spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    for &pool in spare.get(&ordinal).into_iter().flatten() {
        // SAFETY: a pool handle this module created; trimming a pool the driver no
        // longer knows only fails.
        let _ = unsafe { sys::cuMemPoolTrimTo(pool as sys::CUmemoryPool, 0) };
    }
}

impl Drop for StreamPool {
    fn drop(&mut self) {
        // Unused memory goes back to the driver now; blocks still allocated (or whose
        // frees are still enqueued) come back to this pool when freed, wherever it is.
        let _ = self.trim();
        SPARE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(self.1)
            .or_default()
            .push(self.0 as usize);
    }
}
