//! Opening a CUDA device: its context and the state its streams share.

use std::panic::catch_unwind;
use std::sync::Arc as StdArc;
use std::sync::Mutex as StdMutex;

use cudarc::driver::{sys, CudaContext, CudaModule};
use dashmap::DashMap;

use super::alloc::DeviceMem;
use super::pinned::PinnedCache;
use super::pool::MemPool;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stats::Counters;

/// Counts the CUDA devices, without panicking when no driver is installed.
pub fn probe() -> std::result::Result<usize, String> {
    let r = catch_unwind(|| {
        // SAFETY: `is_culib_present` only tries to dlopen the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err("CUDA driver library (libcuda) not found".to_string());
        }
        cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e}"))?;
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| format!("cuDeviceGetCount failed: {e}"))
    });
    r.unwrap_or_else(|_| {
        Err("the CUDA driver library is missing symbols (driver too old?)".to_string())
    })
}

/// For tests that need a device: whether a CUDA device is present. Without one the
/// caller should skip its CUDA part (this prints `cuda: skipped (no device)`), unless
/// `RTX_REQUIRE_CUDA=1` is set, which makes a missing device a panic (a failed test)
/// instead of a skip. (Cargo feature `test-util`.)
#[cfg(any(test, feature = "test-util"))]
pub fn present_for_tests() -> bool {
    match probe() {
        Ok(n) if n > 0 => true,
        other => {
            if std::env::var("RTX_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("RTX_REQUIRE_CUDA=1 but CUDA is unavailable: {other:?}");
            }
            eprintln!("cuda: skipped (no device)");
            false
        }
    }
}

/// A device's shared state in one runtime: context, poison flag, loaded modules, pinned
/// staging cache, its streams' memories.
pub(crate) struct DeviceShared {
    pub(crate) ordinal: usize,
    pub(crate) ctx: StdArc<CudaContext>,
    pub(crate) pinned: StdArc<PinnedCache>,
    /// The memories of this device's stream actors (for the out-of-memory path).
    pub(crate) mem: StdArc<DeviceMem>,
    pub(crate) arch: (i32, i32),
    pub(crate) sm_count: u32,
    poison: StdMutex<Option<String>>,
    /// Set (after `poison`) once the device is poisoned: every actor of the device asks
    /// before each op, and a lock shared by all of them would make them contend.
    poisoned: std::sync::atomic::AtomicBool,
    pub(crate) modules: DashMap<String, StdArc<CudaModule>>,
}

impl DeviceShared {
    pub(crate) fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }
    /// The poisoning error, if the device hit a sticky error.
    pub(crate) fn poisoned(&self) -> Option<Error> {
        // Acquire: pairs with the Release store in `poison`, made after the cause.
        if !self.poisoned.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let g = self.poison.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(|c| Error::DevicePoisoned {
            device: self.device(),
            cause: c.clone(),
        })
    }
    pub(crate) fn poison(&self, cause: String) {
        let mut g = self.poison.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            tracing::error!(device = self.ordinal, %cause, "CUDA device poisoned");
            *g = Some(cause);
            self.poisoned
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

/// Opens device `ordinal` for a runtime whose counters are `counters`.
pub(crate) fn open_device(
    ordinal: usize,
    counters: StdArc<Counters>,
) -> Result<StdArc<DeviceShared>> {
    let ctx = CudaContext::new(ordinal).map_err(|e| Error::cuda("cuCtxCreate", e))?;
    // SAFETY: called right after creating the context, before any slice exists; the
    // runtime orders every access by its own events from here on.
    unsafe { ctx.disable_event_tracking() };
    let arch = ctx
        .compute_capability()
        .map_err(|e| Error::cuda("cuDeviceGetAttribute", e))?;
    MemPool::keep_memory(&ctx).map_err(|e| Error::cuda("cuMemPoolSetAttribute", e))?;
    let sm = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| Error::cuda("cuDeviceGetAttribute", e))?;
    Ok(StdArc::new(DeviceShared {
        ordinal,
        pinned: PinnedCache::new(ctx.clone(), counters.clone()),
        mem: StdArc::new(DeviceMem::new(counters)),
        ctx,
        arch,
        sm_count: sm.max(1) as u32,
        poison: StdMutex::new(None),
        poisoned: std::sync::atomic::AtomicBool::new(false),
        modules: DashMap::new(),
    }))
}
