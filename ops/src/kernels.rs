//! Pieces shared by the op families: dtype dispatch, and for the CUDA side kernel
//! loading (NVRTC through `rtx_kernels`, cached per stream), launch geometry and output
//! allocation with optional NaN poisoning.
//!
//! # Function handles
//!
//! [`function`] keeps a per-stream map from a small key (`module`, family-defined op
//! code, dtype) to the loaded `CudaFunction`, so the hot path of a launch allocates no
//! `String`: a kernel name is formatted only the first time a stream asks for it, and the
//! module's CUBIN is compiled (or read from the disk cache) once per device.
//!
//! # Poisoned outputs
//!
//! CUDA outputs are uninitialized memory. With the runtime setting `poison_outputs`
//! (`Runtime::builder().poison_outputs(true)`, or `RTX_POISON_OUTPUTS=1` in the
//! environment), or the test hook `set_poison_outputs(true)` (feature `test-util`),
//! every freshly allocated output is filled with `0xFF` bytes first (NaN for floats,
//! `u32::MAX` for indices), and CPU outputs with NaN, so a test catches any element an
//! op forgets to write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute_enum};
use cudarc::driver::{
    CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, LaunchArgs, LaunchConfig, PushKernelArg,
};
use rtx_kernels::{Arch, KernelCache, KernelError, Options};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use crate::cpu_util::Float;

// The launch ABI of the built-in kernels (block size, grid caps, argument structs) is
// defined once, in `rtx_kernels::launch`; these are its names here.
pub(crate) use rtx_kernels::launch::MAX_BLOCKS_PER_SM as BLOCKS_PER_SM;
pub(crate) use rtx_kernels::launch::{self, BLOCK};

/// Runs `$body` with `$t` a type alias for the element type of the float dtype `$dtype`
/// (f32, f16, bf16); any other dtype is `Error::DTypeMismatch` for op `$op`.
macro_rules! float_dispatch {
    ($dtype:expr, $op:expr, |$t:ident| $body:expr) => {
        match $dtype {
            ::rtx_runtime::DType::F32 => {
                type $t = f32;
                $body
            }
            ::rtx_runtime::DType::F16 => {
                type $t = ::half::f16;
                $body
            }
            ::rtx_runtime::DType::BF16 => {
                type $t = ::half::bf16;
                $body
            }
            other => Err(::rtx_runtime::Error::dtype(
                $op,
                ::rtx_runtime::DType::F32,
                other,
            )),
        }
    };
}
pub(crate) use float_dispatch;

/// Runs `$body` with `$t` the element type of `$dtype` (any dtype).
macro_rules! any_dispatch {
    ($dtype:expr, |$t:ident| $body:expr) => {
        match $dtype {
            ::rtx_runtime::DType::F32 => {
                type $t = f32;
                $body
            }
            ::rtx_runtime::DType::F16 => {
                type $t = ::half::f16;
                $body
            }
            ::rtx_runtime::DType::BF16 => {
                type $t = ::half::bf16;
                $body
            }
            ::rtx_runtime::DType::I32 => {
                type $t = i32;
                $body
            }
            ::rtx_runtime::DType::U32 => {
                type $t = u32;
                $body
            }
        }
    };
}
pub(crate) use any_dispatch;

/// Checks that `dtype` is one of the float types the ops compute on.
pub(crate) fn check_float(op: &str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::dtype(op, DType::F32, dtype))
    }
}

// ---- donation counter ------------------------------------------------------------------

static DONATIONS: AtomicU64 = AtomicU64::new(0);

/// Test hook (feature `test-util`): how many ops of this crate have written into a
/// donated input's memory (process-wide, since start).
#[cfg(feature = "test-util")]
pub fn donations() -> u64 {
    DONATIONS.load(Ordering::Relaxed)
}

/// Counts a donation that was taken (call when `cx.donate` returned memory).
pub(crate) fn count_donation<T>(donated: &Option<T>) {
    if donated.is_some() {
        DONATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// ---- poisoning -------------------------------------------------------------------------

static POISON: AtomicBool = AtomicBool::new(false);

/// Test hook (feature `test-util`): when on, ops fill every freshly allocated output
/// with NaN (`0xFF` bytes on CUDA) before computing it, so an element an op fails to
/// write shows up in a parity test, in every runtime of the process. Per runtime, the
/// setting `poison_outputs` (`Runtime::builder().poison_outputs(true)`,
/// `RTX_POISON_OUTPUTS=1`) does the same. Costs one memset per output.
#[cfg(feature = "test-util")]
pub fn set_poison_outputs(on: bool) {
    POISON.store(on, Ordering::Relaxed);
}

/// Whether outputs are poisoned: the test hook `set_poison_outputs`, or the setting
/// `poison_outputs` of the runtime whose actor runs on this thread.
pub(crate) fn poisoning() -> bool {
    POISON.load(Ordering::Relaxed) || rtx_runtime::Settings::current().poison_outputs
}

/// A host output of `n` elements: NaN when poisoning, zeros otherwise. The op must
/// write every element.
pub(crate) fn cpu_out<T: Float>(n: usize) -> Vec<T> {
    if poisoning() {
        vec![T::from_f32(f32::NAN); n]
    } else {
        vec![T::default(); n]
    }
}

/// A host index output of `n` elements (`u32::MAX` when poisoning).
pub(crate) fn cpu_out_u32(n: usize) -> Vec<u32> {
    vec![if poisoning() { u32::MAX } else { 0 }; n]
}

/// A device output of `n` elements, uninitialized (or `0xFF` bytes when poisoning).
pub(crate) fn alloc_out<T: Element>(scx: &StreamCx, n: usize) -> Result<CudaSlice<T>> {
    let mut y = scx.alloc::<T>(n)?;
    if POISON.load(Ordering::Relaxed) || scx.settings().poison_outputs {
        let bytes = n * std::mem::size_of::<T>();
        let stream = scx.stream();
        let (ptr, _sync) = y.device_ptr_mut(stream);
        // SAFETY: `ptr` is the start of `y`'s allocation of `n` elements (`bytes` bytes),
        // alive until the end of this function and beyond (we return `y`); the memset is
        // ordered on the stream that allocated it, before any kernel that writes it.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, bytes, stream.cu_stream()) }
            .map_err(|e| Error::cuda("cuMemsetD8Async", e))?;
    }
    Ok(y)
}

/// The raw device address of `s`, for a kernel argument that aliases another one (an
/// in-place launch passes the output's address as its input too).
pub(crate) fn device_addr<T>(s: &CudaSlice<T>, scx: &StreamCx) -> u64 {
    let (ptr, _sync) = s.device_ptr(scx.stream());
    ptr
}

/// The device address of this stream's `N` words of `u32` for the kernels of `Tag` (a
/// marker type: one set per user), zeroed when first asked for and held for the stream's
/// life: a grid barrier's count and generation, a grid's work-tile counters. The kernels
/// that use them leave them at 0 after every launch; launches on one stream run in order,
/// so two never use them at once. The first call allocates (never first inside a graph
/// capture: the capture's eager run of the op makes them) and flushes the stream's
/// deferred launches before its memset.
pub(crate) fn stream_words<Tag: 'static, const N: usize>(scx: &mut StreamCx) -> Result<u64> {
    struct Words<Tag, const N: usize> {
        addr: u64,
        _words: CudaSlice<u32>,
        _tag: std::marker::PhantomData<Tag>,
    }
    Ok(scx
        .ext::<Words<Tag, N>>(|s| {
            // Memory work on the stream: what is deferred goes first.
            s.flush_launches();
            let mut words = s.alloc::<u32>(N)?;
            s.stream()
                .memset_zeros(&mut words)
                .map_err(|e| Error::cuda("cuMemsetD8Async", e))?;
            Ok(Words {
                addr: device_addr(&words, s),
                _words: words,
                _tag: std::marker::PhantomData,
            })
        })?
        .addr)
}

// ---- functions -------------------------------------------------------------------------

/// Per-stream cache of loaded functions, keyed without strings.
#[derive(Default)]
struct Functions(HashMap<(&'static str, u16, DType), CudaFunction>);

/// The kernel `name()` of program `module` (a `kernels/cuda/<module>.cu`) for this
/// stream, cached under (`module`, `code`, `dtype`): `code` must identify the kernel
/// within the module for that dtype. `name` is called only on a miss.
pub(crate) fn function(
    scx: &mut StreamCx,
    module: &'static str,
    code: u16,
    dtype: DType,
    name: impl FnOnce() -> String,
) -> Result<CudaFunction> {
    let key = (module, code, dtype);
    if let Some(f) = scx
        .ext::<Functions>(|_| Ok(Functions::default()))?
        .0
        .get(&key)
    {
        return Ok(f.clone());
    }
    let f = scx.function(module, &name(), |arch| cubin(module, arch))?;
    scx.ext::<Functions>(|_| Ok(Functions::default()))?
        .0
        .insert(key, f.clone());
    Ok(f)
}

/// Raises `f`'s dynamic shared-memory limit to `bytes` on this stream's device (above 48
/// KiB a kernel must ask); false where the device refuses, and the caller takes a kernel
/// that needs less.
pub(crate) fn allow_dynamic_smem(scx: &StreamCx, f: &CudaFunction, bytes: usize) -> bool {
    scx.context().bind_to_thread().is_ok()
        && i32::try_from(bytes).is_ok_and(|b| {
            f.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                b,
            )
            .is_ok()
        })
}

/// The dynamic shared memory granted to every function of `fns` on this stream's device:
/// `most` bytes, capped at the device's per-block opt-in limit
/// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`) less 2 KiB for the kernels'
/// static shared memory; 0 where the device refuses (the caller takes kernels that need
/// less). `what` names the kernels in the debug log of a refusal.
pub(crate) fn grant_dynamic_smem(
    scx: &StreamCx,
    fns: &[CudaFunction],
    most: usize,
    what: &str,
) -> usize {
    let optin = scx
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_or(0, |v| usize::try_from(v).unwrap_or(0));
    let want = most.min(optin.saturating_sub(2048));
    if want > 0 && fns.iter().all(|f| allow_dynamic_smem(scx, f, want)) {
        return want;
    }
    tracing::debug!(
        "{what}: {want} bytes of shared memory refused on device {}; not used",
        scx.ordinal()
    );
    0
}

/// A slot per float dtype (f32, f16, bf16), for per-stream state kept by dtype.
pub(crate) fn dtype_slot(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        _ => 2,
    }
}

/// The CUBIN of `module` for compute capability `arch`, from the global kernel cache.
pub(crate) fn cubin(module: &str, arch: (i32, i32)) -> Result<Arc<Vec<u8>>> {
    let arch = Arch::new(arch.0.max(0) as u32, arch.1.max(0) as u32);
    KernelCache::global()
        .cubin(module, arch, &Options::default())
        .map_err(|e| kernel_error(module, arch, e))
}

/// Maps a kernel-cache failure to [`Error::KernelCompile`], keeping NVRTC's status.
pub(crate) fn kernel_error(module: &str, arch: Arch, e: KernelError) -> Error {
    match e {
        KernelError::Compile {
            name,
            arch,
            status,
            log,
            ..
        } => Error::KernelCompile {
            kernel: name,
            arch,
            status: Some(status),
            log,
        },
        KernelError::Nvrtc {
            ref name,
            ref status,
            ..
        } => Error::KernelCompile {
            kernel: name.clone(),
            arch: arch.to_string(),
            status: Some(status.clone()),
            log: e.to_string(),
        },
        other => Error::KernelCompile {
            kernel: module.to_string(),
            arch: arch.to_string(),
            status: None,
            log: other.to_string(),
        },
    }
}

// ---- launch geometry -------------------------------------------------------------------

/// Blocks of [`BLOCK`] threads the device keeps resident at [`BLOCKS_PER_SM`] per SM
/// ([`launch::resident_blocks`]): the cap of every grid-stride grid.
pub(crate) fn resident(scx: &StreamCx) -> u32 {
    launch::resident_blocks(scx.sm_count(), BLOCKS_PER_SM)
}

/// A grid-stride grid: `blocks` wanted, capped at the blocks the device keeps resident.
pub(crate) fn grid(scx: &StreamCx, blocks: usize) -> u32 {
    blocks.clamp(1, resident(scx) as usize) as u32
}

/// The element type of the built-in kernels for a float `dtype` (`None` otherwise).
pub(crate) fn kernel_dtype(dtype: DType) -> Option<launch::Dtype> {
    match dtype {
        DType::F32 => Some(launch::Dtype::F32),
        DType::F16 => Some(launch::Dtype::F16),
        DType::BF16 => Some(launch::Dtype::Bf16),
        _ => None,
    }
}

/// The grid for an element-wise kernel over `n` elements of `elem` bytes (2 or 4)
/// ([`launch::elementwise_grid`]: a 16-byte vector per thread).
pub(crate) fn elementwise_grid(_scx: &StreamCx, n: usize, elem: usize) -> u32 {
    // Only the vector width (16 / elem) matters: f16 and bf16 share it.
    let dtype = if elem == 4 {
        launch::Dtype::F32
    } else {
        launch::Dtype::F16
    };
    launch::elementwise_grid(n, dtype)
}

/// A one-dimensional launch of `grid` blocks of [`BLOCK`] threads.
pub(crate) fn config(grid: u32, shared_mem_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes,
    }
}

/// Maps a launch failure to [`Error::KernelExecution`].
pub(crate) fn launch_error(op: &str, e: cudarc::driver::DriverError) -> Error {
    Error::kernel_execution(op, "cuLaunchKernel", e)
}

// ---- operands --------------------------------------------------------------------------

/// A kernel input: its slice, or, in an in-place launch, the output's address (the
/// kernel reads and writes the same element through two pointers).
pub(crate) enum Input<'a, T> {
    /// A separate input buffer.
    Slice(&'a CudaSlice<T>),
    /// The output's own address (donated input).
    Alias(u64),
}

impl<'a, T> Input<'a, T> {
    /// Pushes the input as the next pointer argument.
    pub(crate) fn push<'l>(&'l self, lb: &mut LaunchArgs<'l>)
    where
        'a: 'l,
    {
        match self {
            Input::Slice(s) => lb.arg(*s),
            Input::Alias(p) => lb.arg(p),
        };
    }
}

impl<T> Input<'_, T> {
    /// The input's device address (a kernel's pointer argument), for [`launch_direct`].
    pub(crate) fn addr(&self, scx: &StreamCx) -> u64 {
        match self {
            Input::Slice(s) => device_addr(s, scx),
            Input::Alias(p) => *p,
        }
    }
}

/// Launches `f` on `scx`'s stream with a prepared parameter block, straight through the
/// driver (`cuLaunchKernel`): `params` holds one pointer per kernel parameter, in order,
/// each to a value of that parameter's C type (for a pointer parameter, to a `u64`
/// device address). Unlike cudarc's launch builder this builds no argument list on the
/// heap and does not re-bind the context per launch: an actor's thread is bound to its
/// device's context once, at its start (`cuda/actor.rs` in rtx-runtime), and runs only
/// that device's ops.
///
/// Inside a graph capture, with [`Settings::programmatic_launch`](rtx_runtime::Settings::programmatic_launch)
/// on (the default) and a device of compute capability 9.0 or newer, the launch is a
/// programmatic dependent (`cuLaunchKernelEx` with `PROGRAMMATIC_STREAM_SERIALIZATION`):
/// in the graph, `f` may start before the kernel ahead of it has finished. Eager
/// launches stay plain: they are bound by the host's enqueue rate, where an early start
/// gains nothing.
///
/// # Safety
///
/// `params` must match `f`'s parameters in number, order and type, every pointee alive
/// for the call (the driver copies the values at launch), and the kernel must be safe
/// to run on what those values address (sizes, aliasing), as for cudarc's `launch`.
/// `f` must call `wait_prior_grid()` (`kernels/cuda/common.cuh`) before it touches
/// global memory, as every kernel of `elementwise.cu` does: launched as a programmatic
/// dependent, that wait is what orders it after the kernel before it.
pub(crate) unsafe fn launch_direct(
    scx: &StreamCx,
    f: &CudaFunction,
    cfg: LaunchConfig,
    params: &mut [*mut std::ffi::c_void],
) -> std::result::Result<(), cudarc::driver::DriverError> {
    // Launches deferred on the stream (`StreamCx::defer_launch`) go first.
    scx.flush_launches();
    if scx.settings().programmatic_launch && scx.arch().0 >= 9 && scx.capturing() {
        // SAFETY: as below; the kernel waits for its predecessor on the device (the
        // caller's contract), so starting it early changes no result.
        return unsafe { launch_programmatic(scx, f, cfg, params) };
    }
    scx.timed_launch(|| {
        // SAFETY: the function and the stream are alive (held by `f` and `scx`) and of
        // the context current on this thread (the actor's); the parameter block's
        // contract is the caller's (see `# Safety`).
        unsafe {
            cudarc::driver::result::launch_kernel(
                f.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                scx.stream().cu_stream(),
                params,
            )
        }
    })
}

/// [`launch_direct`] as a programmatic dependent launch (`cuLaunchKernelEx`).
///
/// # Safety
///
/// As [`launch_direct`].
unsafe fn launch_programmatic(
    scx: &StreamCx,
    f: &CudaFunction,
    cfg: LaunchConfig,
    params: &mut [*mut std::ffi::c_void],
) -> std::result::Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::sys;
    // SAFETY: the attribute is plain data; an all-zero value is valid (the union's
    // padding), and the one field the id selects is set next.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: scx.stream().cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `config` and `attr` outlive the call (the driver reads them during it);
    // the function and stream are alive and of this thread's context; the parameter
    // block is the caller's contract (`launch_direct`'s `# Safety`); no `extra`.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}

/// A parameter-block entry: a pointer to `v` (for [`launch_direct`]).
pub(crate) fn param<V>(v: &mut V) -> *mut std::ffi::c_void {
    (v as *mut V).cast()
}

/// The device slice of a donated buffer.
pub(crate) fn take_cuda<T: Element>(op: &str, buf: Buffer) -> Result<CudaSlice<T>> {
    match buf {
        Buffer::Cuda(d) => T::from_cuda(d).map_err(|d| Error::dtype(op, T::DTYPE, d.dtype())),
        Buffer::Cpu(_) => Err(Error::invalid(
            op,
            "donated host memory on the CUDA backend",
        )),
    }
}

/// The output of an in-place-capable op and its input: the donated buffer with
/// [`Input::Alias`] when there is one, else a fresh output and `input`'s slice.
pub(crate) fn output_and_input<'a, T: Element>(
    scx: &StreamCx,
    op: &str,
    n: usize,
    donated: Option<Buffer>,
    input: Option<&'a Buffer>,
) -> Result<(CudaSlice<T>, Input<'a, T>)> {
    match (donated, input) {
        (Some(buf), _) => {
            let y = take_cuda::<T>(op, buf)?;
            let addr = device_addr(&y, scx);
            Ok((y, Input::Alias(addr)))
        }
        (None, Some(x)) => Ok((alloc_out::<T>(scx, n)?, Input::Slice(x.cuda::<T>()?))),
        (None, None) => Err(Error::invalid(op, "input neither donated nor readable")),
    }
}
