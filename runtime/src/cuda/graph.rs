//! CUDA graphs on a stream actor: capture, instantiation, launch, and the per-stream
//! table of instantiated graphs (what `runtime/src/runtime/graph/` builds on).
//!
//! A capture runs entirely on the actor's thread, inside one op (`graph/segment.rs`):
//! [`begin_capture`] puts the actor's stream in capture mode with
//! `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` (other actors, watchers and the copy stream
//! go on with their work: only this thread is restricted), the recorded ops enqueue
//! their kernels, and [`end_capture`] instantiates the captured graph. The
//! [`CudaGraph`] is then stored in this stream's [`GraphTable`] (in the stream's
//! `ext` state) and launched from there by later ops of the same actor; it never
//! leaves the actor's thread (`CudaGraph` is `!Send`, since CUDA graph objects are not
//! internally synchronized).
//!
//! ```compile_fail,E0277
//! fn send<T: Send>() {}
//! send::<rtx::cuda::CudaGraph>(); // a CUDA graph lives on its actor
//! ```

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc as StdArc;

use cudarc::driver::{sys, CudaStream, PushKernelArg};

use crate::driver::{alloc, StreamCx};
use crate::error::{CaptureHazard, Error, Result};

fn check(call: &str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| Error::cuda(call, e))
}

/// An instantiated CUDA graph (its `CUgraph` and `CUgraphExec`), owned by one stream
/// actor. Destroyed when dropped: only once no launch of it can still be running (the
/// graph's release synchronizes the stream first, `graph/segment.rs`).
pub struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// Graph objects must not be used from two threads: keep it on its actor.
    _local: PhantomData<*const ()>,
}

impl CudaGraph {
    /// Launches the graph on `stream` (stream-ordered, like a kernel).
    pub(crate) fn launch(&self, stream: &CudaStream) -> Result<()> {
        // SAFETY: `exec` is a live executable graph of this stream's context (created
        // by `end_capture` on this actor, destroyed only in `drop`); the context is
        // current on this thread (the actor binds it before running ops).
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, stream.cu_stream())
        })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by `end_capture` and are destroyed exactly
        // once, here; no launch is in flight (see the type's docs).
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// The graphs instantiated on one stream actor, by (graph id, segment index); kept in
/// the stream's `ext` state.
#[derive(Default)]
pub(crate) struct GraphTable {
    pub(crate) graphs: HashMap<(u64, usize), CudaGraph>,
    /// The stream that the memory handed out during a capture is bound to
    /// ([`GraphTable::side_stream`]); made by the first capture.
    side: Option<StdArc<CudaStream>>,
}

impl GraphTable {
    /// This stream's table.
    pub(crate) fn of(scx: &mut StreamCx) -> Result<&mut GraphTable> {
        scx.ext::<GraphTable>(|_| Ok(GraphTable::default()))
    }

    /// A stream of this actor's device that never captures, ordered after everything
    /// enqueued on the actor's stream so far (call it before [`begin_capture`]). The
    /// outputs a capture hands to its ops are bound to it until the capture has
    /// accepted them (`graph/segment.rs`): an op that drops one inside the capture then
    /// frees it here, after the warm-up that wrote it, and not on the capturing stream,
    /// where `cuMemFreeAsync` of memory the graph did not allocate is
    /// `CUDA_ERROR_INVALID_VALUE` (found by compute-sanitizer memcheck).
    pub(crate) fn side_stream(scx: &mut StreamCx) -> Result<StdArc<CudaStream>> {
        let ctx = scx.context().clone();
        let own = scx.stream().clone();
        let table = Self::of(scx)?;
        let side = match &table.side {
            Some(s) => s.clone(),
            None => {
                let s = ctx
                    .new_stream()
                    .map_err(|e| Error::cuda("cuStreamCreate", e))?;
                table.side = Some(s.clone());
                s
            }
        };
        side.join(&own)
            .map_err(|e| Error::cuda("cuStreamWaitEvent", e))?;
        Ok(side)
    }
}

/// Starts capturing `scx`'s stream (thread-local mode).
pub(crate) fn begin_capture(scx: &StreamCx) -> Result<()> {
    scx.context()
        .bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
    // Other threads' frees on this stream wait for the capture's end from here on.
    alloc::capture_begins(scx.stream());
    // SAFETY: the stream is this actor's live stream; capture is ended (or aborted) by
    // the same actor before it runs anything else (`graph/segment.rs`).
    let r = check("cuStreamBeginCapture", unsafe {
        sys::cuStreamBeginCapture_v2(
            scx.stream().cu_stream(),
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    });
    if r.is_err() {
        alloc::capture_ends(scx.stream());
    }
    r
}

/// Ends the capture of `scx`'s stream and instantiates what was captured. A capture
/// that CUDA invalidated (a forbidden call inside it) is [`Error::NotCapturable`] for
/// `op`, the last op captured.
pub(crate) fn end_capture(scx: &StreamCx, op: &str) -> Result<CudaGraph> {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: the stream is capturing (`begin_capture`); `graph` is a valid out-pointer.
    let r = unsafe { sys::cuStreamEndCapture(scx.stream().cu_stream(), &mut graph) };
    alloc::capture_ends(scx.stream());
    crate::driver::capture::restore_mode();
    if r != sys::CUresult::CUDA_SUCCESS || graph.is_null() {
        if !graph.is_null() {
            // SAFETY: a graph returned by the end of a capture, not used elsewhere.
            unsafe {
                let _ = sys::cuGraphDestroy(graph);
            }
        }
        return Err(capture_error(op, "cuStreamEndCapture", r));
    }
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: `graph` is the live graph just captured; `exec` a valid out-pointer.
    let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
    if r != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: as above; it was not instantiated.
        unsafe {
            let _ = sys::cuGraphDestroy(graph);
        }
        return Err(capture_error(op, "cuGraphInstantiateWithFlags", r));
    }
    Ok(CudaGraph {
        graph,
        exec,
        _local: PhantomData,
    })
}

/// Ends a capture that failed, discarding what it recorded.
pub(crate) fn abort_capture(scx: &StreamCx) {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: as in `end_capture`; a stream that is not capturing only returns an error.
    unsafe {
        let _ = sys::cuStreamEndCapture(scx.stream().cu_stream(), &mut graph);
        if !graph.is_null() {
            let _ = sys::cuGraphDestroy(graph);
        }
    }
    alloc::capture_ends(scx.stream());
    crate::driver::capture::restore_mode();
}

/// A failed driver call during a capture: a call CUDA refuses inside a capture (a
/// host synchronization or an event query, which invalidates it) becomes
/// [`Error::NotCapturable`] naming the op; anything else stays a CUDA error.
pub(crate) fn capture_error(op: &str, call: &str, r: sys::CUresult) -> Error {
    use sys::CUresult::*;
    match r {
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        | CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        | CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
        | CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => Error::NotCapturable {
            op: op.to_string(),
            hazard: CaptureHazard::HostSync,
        },
        _ => match r.result() {
            Err(e) => Error::cuda(call, e),
            Ok(()) => Error::invalid(op, format!("{call} captured nothing")),
        },
    }
}

/// An op's error during capture, with the driver's capture refusals turned into
/// [`Error::NotCapturable`] for `op`.
pub(crate) fn map_capture_error(op: &str, e: Error) -> Error {
    match &e {
        Error::Cuda { call, code, .. } | Error::KernelExecution { call, code, .. } => {
            match capture_error(op, call, *code) {
                n @ Error::NotCapturable { .. } => n,
                _ => e,
            }
        }
        _ => e,
    }
}

/// Copies `bytes` bytes device to device, stream-ordered on `stream`.
///
/// # Safety
///
/// `dst` and `src` are live device allocations of at least `bytes` bytes of this
/// stream's context, and nothing else writes `dst` or frees either until the copy is
/// done (stream order, or the events the caller waits for).
pub(crate) unsafe fn copy_dtod(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check("cuMemcpyDtoDAsync", unsafe {
        sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.cu_stream())
    })
}

/// Most copies per launch of `copy_many` (`RTX_COPY_MAX` in `kernels/cuda/graph_copy.cu`).
const COPY_MAX: usize = 32;

/// `copy_many`'s table, passed by value (as the kernel declares it).
#[repr(C)]
#[derive(Clone, Copy)]
struct CopyTable {
    src: [u64; COPY_MAX],
    dst: [u64; COPY_MAX],
    bytes: [u64; COPY_MAX],
}

// SAFETY: plain old data laid out as the kernel's `struct CopyTable` (three arrays of
// 32 `unsigned long long`, no padding), passed by value as a kernel parameter.
unsafe impl cudarc::driver::DeviceRepr for CopyTable {}

/// The `copy_many` kernel of this stream's device (loaded once per device; call it
/// before a capture begins, so that no module loads inside one).
pub(crate) fn copy_kernel(scx: &mut StreamCx) -> Result<cudarc::driver::CudaFunction> {
    scx.function("graph_copy", "copy_many", |arch| {
        let a = rtx_kernels::Arch::new(arch.0.max(0) as u32, arch.1.max(0) as u32);
        rtx_kernels::KernelCache::global()
            .cubin("graph_copy", a, &rtx_kernels::Options::default())
            .map_err(|e| Error::KernelCompile {
                kernel: "graph_copy".into(),
                arch: a.to_string(),
                status: None,
                log: e.to_string(),
            })
    })
}

/// Device-to-device copies `(dst, src, bytes)`, stream-ordered on `scx`'s stream, in
/// launches of `copy_many` (32 copies each; a graph captures each as one kernel node,
/// not one memcpy node per copy). Empty copies are skipped.
///
/// # Safety
///
/// As [`copy_dtod`] for each copy; no destination overlaps another copy's source or
/// destination.
pub(crate) unsafe fn copy_many(
    scx: &mut StreamCx,
    copies: &[(sys::CUdeviceptr, sys::CUdeviceptr, usize)],
) -> Result<()> {
    if copies.iter().all(|c| c.2 == 0) {
        return Ok(());
    }
    let f = copy_kernel(scx)?;
    let sms = scx.sm_count().max(1) as usize;
    let stream = scx.stream().clone();
    let mut t = CopyTable {
        src: [0; COPY_MAX],
        dst: [0; COPY_MAX],
        bytes: [0; COPY_MAX],
    };
    let (mut n, mut most) = (0usize, 0usize);
    let mut rest = copies.iter().filter(|c| c.2 > 0).peekable();
    while let Some(&(dst, src, bytes)) = rest.next() {
        (t.dst[n], t.src[n], t.bytes[n]) = (dst, src, bytes as u64);
        n += 1;
        most = most.max(bytes);
        if n < COPY_MAX && rest.peek().is_some() {
            continue;
        }
        // Two 16-byte vectors per thread per step over 256 threads; at most 4 blocks
        // per SM for one copy (a large state shares the device with the others).
        let blocks = most.div_ceil(256 * 32).clamp(1, 4 * sms) as u32;
        let count = n as u32;
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (blocks, count, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut lb = stream.launch_builder(&f);
        lb.arg(&t).arg(&count);
        // SAFETY: the arguments match `copy_many(CopyTable t, unsigned n)`; the table's
        // first `count` entries are the caller's copies (live device memory of this
        // context, at least `bytes` long, not overlapping: the caller's contract); the
        // kernel reads no entry at or past `count`.
        unsafe { lb.launch(cfg) }.map_err(|e| Error::cuda("cuLaunchKernel(copy_many)", e))?;
        (n, most) = (0, 0);
    }
    Ok(())
}
