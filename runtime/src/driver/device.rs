//! Opening a CUDA device: its context and the state its streams share.

use std::collections::HashMap;
use std::panic::catch_unwind;
use std::sync::Arc as StdArc;
use std::sync::{LazyLock, Mutex as StdMutex};

use cudarc::driver::{result, sys, CudaContext, CudaModule, DriverError};
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
    /// Counts this device in [`LIVE`] while the runtime's state on it exists.
    _live: Live,
}

/// The `DeviceShared`s alive in this process, per device ordinal. A primary context
/// left with a sticky error by an earlier runtime is reset only when this is 0 for its
/// device: no runtime of this process uses the device any more.
static LIVE: LazyLock<StdMutex<HashMap<usize, usize>>> = LazyLock::new(Default::default);

/// One count in [`LIVE`], given back on drop.
struct Live(usize);

impl Drop for Live {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = live.get_mut(&self.0) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Whether `e` is one of the driver's sticky errors: after one, every call on the
/// context fails with it for the rest of the process unless the context is reset.
pub(crate) fn is_sticky(e: &DriverError) -> bool {
    use sys::cudaError_enum as C;
    matches!(
        e.0,
        C::CUDA_ERROR_ILLEGAL_ADDRESS
            | C::CUDA_ERROR_LAUNCH_TIMEOUT
            | C::CUDA_ERROR_HARDWARE_STACK_ERROR
            | C::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | C::CUDA_ERROR_MISALIGNED_ADDRESS
            | C::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | C::CUDA_ERROR_INVALID_PC
            | C::CUDA_ERROR_LAUNCH_FAILED
            | C::CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

/// Creates and destroys a stream on `ctx`: the cheapest call that reports a sticky
/// error left on the context, without waiting for anyone's work.
fn probe_context(ctx: &CudaContext) -> std::result::Result<(), DriverError> {
    ctx.bind_to_thread()?;
    let s = result::stream::create(result::stream::StreamKind::NonBlocking)?;
    // SAFETY: `s` was just created on the current context and is used by nothing else.
    unsafe { result::stream::destroy(s) }
}

/// The primary context of device `ordinal`, healthy: one left poisoned by an earlier
/// runtime of this process (a sticky error survives the runtime, because the CUDA
/// libraries' runtime keeps the primary context retained) is reset first, when no
/// runtime uses the device any more. Called with [`LIVE`] locked, so that no runtime
/// opens the device while it is reset.
fn healthy_context(ordinal: usize, live: usize) -> Result<StdArc<CudaContext>> {
    // A poisoned context already fails its retain or first binding (as on the H200):
    // that is the probe's answer too.
    let e = match CudaContext::new(ordinal) {
        Ok(ctx) => match probe_context(&ctx) {
            Ok(()) => return Ok(ctx),
            Err(e) if !is_sticky(&e) => return Err(Error::cuda("cuStreamCreate", e)),
            Err(e) => e,
        },
        Err(e) if !is_sticky(&e) => return Err(Error::cuda("cuCtxCreate", e)),
        Err(e) => e,
    };
    let device = Device::Cuda(ordinal);
    if live > 0 {
        return Err(Error::DevicePoisoned {
            device,
            cause: format!(
                "{e} (left by an earlier runtime; the context is reset once every runtime \
                 on the device has been dropped, and {live} still hold it)"
            ),
        });
    }
    tracing::warn!(device = ordinal, cause = %e, "resetting the poisoned primary context");
    let dev = result::device::get(ordinal as i32).map_err(|e| Error::cuda("cuDeviceGet", e))?;
    // SAFETY: no runtime of this process holds state on the device (`live` is 0 and
    // `LIVE` is locked, so none opens it meanwhile); whatever else still refers to the
    // old context (a cached spare pool) checks that its handle is alive before use.
    let reset = unsafe { sys::cuDevicePrimaryCtxReset_v2(dev) }.result();
    // (A reset can fail where our release was the last and the context went with it;
    // the probe of the new context decides.)
    // For some sticky errors the driver keeps the process's use of the device broken
    // even so (NVIDIA: "to continue using CUDA, the process must be terminated and
    // relaunched"): then this is the typed error, at once.
    let still = |e: DriverError| Error::DevicePoisoned {
        device,
        cause: format!(
            "{e}, left by an earlier runtime, still after resetting the primary context \
             ({reset:?}): the driver keeps it for the rest of this process; a new process \
             can use the device"
        ),
    };
    let ctx = CudaContext::new(ordinal).map_err(still)?;
    probe_context(&ctx).map_err(still)?;
    tracing::info!(
        device = ordinal,
        "the primary context was reset and works again"
    );
    Ok(ctx)
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
    let (ctx, live) = {
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        let n = live.entry(ordinal).or_insert(0);
        let ctx = healthy_context(ordinal, *n)?;
        *n += 1;
        (ctx, Live(ordinal))
    };
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
        _live: live,
    }))
}
