//! CUDA launches of `kernels/cuda/attention.cu` (FlashAttention-2, f16/bf16, D 64/128),
//! of `kernels/cuda/attention_wgmma.cu` (the Hopper forward) and of
//! `kernels/cuda/attention_wgmma_bwd.cu` (the Hopper backward main kernel, D 128).
//!
//! Every kernel takes one [`FlashParams`] by value; its layout, the grids, blocks and
//! dynamic shared memory below are the ABI documented at the top of `attention.cu` (and
//! of `attention_wgmma.cu` / `attention_wgmma_bwd.cu` for their kernels). Per stream, [`AttnState`] remembers which
//! functions have had their dynamic shared memory limit raised, and keeps the backward's
//! f32 workspace (dq_accum, then dsum) for the next call: every use of it is ordered on
//! that one stream, and the preprocess kernel rewrites all of it before the other two
//! read it.
//!
//! # Which forward
//!
//! On compute capability 9.0 (H100, H200) the forward is `flash_fwd_wgmma_*`: warpgroup
//! MMA (`wgmma.mma_async`), which exists only on the architecture-specific target
//! `sm_90a` — rtx-kernels compiles that program for it by itself (its source is marked
//! arch-specific) and the CUBIN loads on 9.0 devices only. Everywhere else, and on a 9.0
//! device where that program fails to compile or load (the failure is logged once per
//! stream, which then stays on the fallback), the forward is the `mma.sync` kernel of
//! `attention.cu`. Both compute the same function (same ABI, masks, causal rule, lse
//! convention); `RTX_ATTN_WGMMA=0` in the environment forces the `mma.sync` forward.
//!
//! # Which backward
//!
//! The backward is three kernels on one stream: `attention.cu`'s preprocess (dsum,
//! dq_accum = 0), the main kernel (dK, dV, dq_accum), `attention.cu`'s convert (dq). For
//! D = 128 on compute capability 9.0 the main kernel is `flash_bwd_wgmma_d128_*` of
//! `attention_wgmma_bwd.cu` (wgmma, sm_90a, 128 keys per block), with the same fallback
//! rules as the forward (its own failure flag per stream; `RTX_ATTN_WGMMA=0` turns it off
//! too); otherwise it is `attention.cu`'s `flash_bwd_dq_dk_dv_*` (64 keys per block).

use std::collections::HashSet;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg, SyncOnDrop,
};
use half::{bf16, f16};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use super::geometry::{Geometry, MaskLayout};
use crate::kernels::{self, launch_error};

const MODULE: &str = "attention";
/// The Hopper (sm_90a) forward.
const WGMMA_MODULE: &str = "attention_wgmma";
/// The Hopper (sm_90a) backward main kernel (D = 128).
const WGMMA_BWD_MODULE: &str = "attention_wgmma_bwd";
const FWD: &str = "attention";
const BWD: &str = "attention_backward";

/// Largest backward workspace (bytes) kept per stream between calls; a larger one is
/// allocated for its call and freed (stream-ordered) after it.
const WORKSPACE_KEEP_MAX: usize = 256 << 20;

/// Mirrors `struct FlashParams` of `attention_common.cuh` field for field: twelve
/// device pointers, three `long long` mask strides, five `int` sizes, a `float` scale,
/// the `int` causal flag and an `int` of padding; 152 bytes, 8-aligned, no implicit
/// padding on either side. Unused pointers are 0 (NULL).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct FlashParams {
    q: u64,
    k: u64,
    v: u64,
    mask: u64,
    o: u64,
    lse: u64,
    dout: u64,
    dsum: u64,
    dq_accum: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    mask_stride_b: i64,
    mask_stride_h: i64,
    mask_stride_q: i64,
    b: i32,
    h: i32,
    h_kv: i32,
    lq: i32,
    lk: i32,
    scale: f32,
    causal: i32,
    pad_: i32,
}

const _: () = assert!(std::mem::size_of::<FlashParams>() == 152);
const _: () = assert!(std::mem::align_of::<FlashParams>() == 8);

// SAFETY: `FlashParams` is `repr(C)` with the field types, order and therefore layout
// of the C struct the kernels take by value (152 bytes, 8-aligned; the size is checked
// above, each offset by `tests::offsets_match_the_c_header`): `CUdeviceptr` (u64) for
// each `void*`, i64 for `long long`, i32 for `int`, f32 for `float`. It is plain old
// data, valid for any bit pattern.
unsafe impl DeviceRepr for FlashParams {}

impl FlashParams {
    /// Sizes, flags and mask strides of `g`; every pointer NULL.
    fn new(g: &Geometry) -> Self {
        let p = &g.p;
        // The sizes fit `int` and the strides `long long`: checked at submit.
        let MaskLayout { stride_b, stride_h } = g.mask.unwrap_or(MaskLayout {
            stride_b: 0,
            stride_h: 0,
        });
        FlashParams {
            mask_stride_b: stride_b as i64,
            mask_stride_h: stride_h as i64,
            mask_stride_q: if g.mask.is_some() { p.lk as i64 } else { 0 },
            b: p.b as i32,
            h: p.h as i32,
            h_kv: p.h_kv as i32,
            lq: p.lq as i32,
            lk: p.lk as i32,
            scale: p.scale,
            causal: p.causal as i32,
            ..FlashParams::default()
        }
    }
}

/// The kernels of `attention.cu` and `attention_wgmma.cu`, each built for D 64 and 128
/// and f16 and bf16, and of `attention_wgmma_bwd.cu` (D 128, f16 and bf16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Forward,
    Preprocess,
    DqDkDv,
    ConvertDq,
    /// The sm_90a forward of `attention_wgmma.cu`.
    ForwardWgmma,
    /// The sm_90a backward main kernel of `attention_wgmma_bwd.cu` (D = 128 only).
    DqDkDvWgmma,
}

impl Kernel {
    fn prefix(self) -> &'static str {
        match self {
            Kernel::Forward => "flash_fwd",
            Kernel::Preprocess => "flash_bwd_preprocess",
            Kernel::DqDkDv => "flash_bwd_dq_dk_dv",
            Kernel::ConvertDq => "flash_bwd_convert_dq",
            Kernel::ForwardWgmma => "flash_fwd_wgmma",
            Kernel::DqDkDvWgmma => "flash_bwd_wgmma",
        }
    }

    /// The program (`kernels/cuda/<module>.cu`) that holds it.
    fn module(self) -> &'static str {
        match self {
            Kernel::ForwardWgmma => WGMMA_MODULE,
            Kernel::DqDkDvWgmma => WGMMA_BWD_MODULE,
            _ => MODULE,
        }
    }

    /// The op that launches it (for errors).
    fn op(self) -> &'static str {
        match self {
            Kernel::Forward | Kernel::ForwardWgmma => FWD,
            _ => BWD,
        }
    }

    /// The key of this kernel for head dim `d` in the per-stream function cache.
    fn code(self, d: usize) -> u16 {
        (self as u16) << 8 | d as u16
    }

    /// Threads per block (the D=64 forward is preset 1: 4 warps, 2 blocks per SM; the
    /// wgmma kernels have 2 warpgroups of 128 threads).
    fn threads(self, d: usize) -> u32 {
        match (self, d) {
            (Kernel::DqDkDv, _) | (Kernel::Forward, 64) => 128,
            _ => 256,
        }
    }

    /// Dynamic shared memory per block, in bytes.
    fn smem(self, d: usize) -> u32 {
        match (self, d) {
            (Kernel::Forward, 64) => 65_536,
            (Kernel::Forward, _) => 131_072,
            (Kernel::DqDkDv, 64) => 58_368,
            (Kernel::DqDkDv, _) => 70_144,
            (Kernel::ForwardWgmma, 64) => 50_176,
            (Kernel::ForwardWgmma, _) => 197_632,
            (Kernel::DqDkDvWgmma, _) => 184_320,
            _ => 0,
        }
    }

    /// Keys per block of a backward main kernel (its grid is `ceil(Lk / keys)` x Hkv x B).
    fn keys_per_block(self, _d: usize) -> usize {
        match self {
            Kernel::DqDkDvWgmma => 128,
            _ => 64,
        }
    }

    /// Query rows per block of a forward (its grid is `ceil(Lq / rows)` x H x B): 128 for
    /// both forwards and head dims, kept separate from the kernel so that a tile change in
    /// a `.cu` file meets the test below.
    fn rows_per_block(self, _d: usize) -> usize {
        128
    }

    fn config(self, d: usize, grid: (u32, u32, u32)) -> LaunchConfig {
        LaunchConfig {
            grid_dim: grid,
            block_dim: (self.threads(d), 1, 1),
            shared_mem_bytes: self.smem(d),
        }
    }
}

/// Per-stream state of the attention ops.
#[derive(Default)]
struct AttnState {
    /// Functions whose dynamic shared memory limit is set, by (kernel code, dtype).
    prepared: HashSet<(u16, DType)>,
    /// The backward's workspace, kept for the next call on this stream.
    workspace: Option<CudaSlice<f32>>,
    /// The wgmma forward failed to compile, load or configure here: use `mma.sync`.
    wgmma_failed: bool,
    /// The wgmma backward failed likewise: use the `mma.sync` backward.
    wgmma_bwd_failed: bool,
}

/// Whether `RTX_ATTN_WGMMA=0` turns the wgmma kernels off (read once).
fn wgmma_disabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("RTX_ATTN_WGMMA").is_ok_and(|v| v == "0"))
}

/// The forward for head dim `d`: the wgmma kernel on compute capability 9.0 (unless turned
/// off or failed before on this stream), else the `mma.sync` one. A failure to get the
/// wgmma kernel ready is logged and remembered, and the `mma.sync` one is returned.
fn forward_function(scx: &mut StreamCx, d: usize, dtype: DType) -> Result<Launch> {
    if scx.arch() == (9, 0) && !wgmma_disabled() && !state(scx)?.wgmma_failed {
        match function(scx, Kernel::ForwardWgmma, d, dtype) {
            Ok(f) => return Ok(f),
            Err(e) => {
                tracing::warn!(
                    "attention: the sm_90a wgmma forward is unavailable on device {}, \
                     using the mma.sync forward on this stream: {e}",
                    scx.ordinal()
                );
                state(scx)?.wgmma_failed = true;
            }
        }
    }
    function(scx, Kernel::Forward, d, dtype)
}

/// The backward main kernel for head dim `d`: the wgmma kernel for D = 128 on compute
/// capability 9.0 (unless turned off or failed before on this stream), else the `mma.sync`
/// one; a failure is handled as in [`forward_function`].
fn backward_function(scx: &mut StreamCx, d: usize, dtype: DType) -> Result<Launch> {
    if d == 128 && scx.arch() == (9, 0) && !wgmma_disabled() && !state(scx)?.wgmma_bwd_failed {
        match function(scx, Kernel::DqDkDvWgmma, d, dtype) {
            Ok(f) => return Ok(f),
            Err(e) => {
                tracing::warn!(
                    "attention: the sm_90a wgmma backward is unavailable on device {}, \
                     using the mma.sync backward on this stream: {e}",
                    scx.ordinal()
                );
                state(scx)?.wgmma_bwd_failed = true;
            }
        }
    }
    function(scx, Kernel::DqDkDv, d, dtype)
}

fn state(scx: &mut StreamCx) -> Result<&mut AttnState> {
    scx.ext::<AttnState>(|_| Ok(AttnState::default()))
}

/// The function of `kernel` for head dim `d` and `dtype`, loaded for this stream and,
/// the first time, checked against the launch and given its shared memory limit.
fn function(scx: &mut StreamCx, kernel: Kernel, d: usize, dtype: DType) -> Result<Launch> {
    let code = kernel.code(d);
    let f = kernels::function(scx, kernel.module(), code, dtype, || {
        format!("{}_d{d}_{}", kernel.prefix(), dtype.name())
    })?;
    if !state(scx)?.prepared.contains(&(code, dtype)) {
        configure(scx, &f, kernel, d, dtype)?;
        state(scx)?.prepared.insert((code, dtype));
    }
    Ok(Launch { f, kernel, d })
}

fn configure(
    scx: &StreamCx,
    f: &CudaFunction,
    kernel: Kernel,
    d: usize,
    dtype: DType,
) -> Result<()> {
    let name = format!("{}_d{d}_{}", kernel.prefix(), dtype.name());
    let cuda_err = |call: &str, e: cudarc::driver::DriverError| Error::Cuda {
        call: format!("{call}({name})"),
        message: e.to_string(),
    };
    scx.context()
        .bind_to_thread()
        .map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
    let max_threads = f
        .max_threads_per_block()
        .map_err(|e| cuda_err("cuFuncGetAttribute", e))?;
    if max_threads < kernel.threads(d) as i32 {
        return Err(Error::invalid(
            kernel.op(),
            format!(
                "{name} allows {max_threads} threads per block but is launched with {}: \
                 {}.cu and ops/src/attention/cuda.rs disagree on the launch",
                kernel.threads(d),
                kernel.module()
            ),
        ));
    }
    let smem = kernel.smem(d);
    if smem > 0 {
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| cuda_err("cuFuncSetAttribute", e))?;
    }
    Ok(())
}

/// A kernel ready to launch: its function, configured for head dim `d`.
struct Launch {
    f: CudaFunction,
    kernel: Kernel,
    d: usize,
}

impl Launch {
    /// Enqueues the kernel on `stream` over `grid` with `params`.
    ///
    /// # Safety
    ///
    /// Every non-NULL pointer in `params` must be the address of live device memory,
    /// allocated on or ordered before `stream`, laid out and aligned as `attention.cu`
    /// documents for the kernel (contiguous tensors of the sizes in `params`, in the
    /// kernel's element type); the pointers the kernel reads must not be NULL and the
    /// memory must stay alive until the kernel has run (stream order or a keep-alive).
    unsafe fn launch(
        &self,
        stream: &CudaStream,
        grid: (u32, u32, u32),
        params: &FlashParams,
    ) -> Result<()> {
        let mut lb = stream.launch_builder(&self.f);
        lb.arg(params);
        let cfg = self.kernel.config(self.d, grid);
        // SAFETY: every kernel of attention.cu, attention_wgmma.cu and attention_wgmma_bwd.cu
        // takes exactly one `FlashParams` by value; the block and shared memory are those documented for
        // this kernel and D (the limit was raised in `configure`); the pointers are valid
        // per this function's contract.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(self.kernel.op(), e))?;
        Ok(())
    }
}

/// A read-only device address and its (no-op with tracking off) guard.
fn addr<'a, T>(s: &'a CudaSlice<T>, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
    s.device_ptr(stream)
}

/// A written device address and its guard.
fn addr_mut<'a, T>(s: &'a mut CudaSlice<T>, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
    s.device_ptr_mut(stream)
}

// ---- forward ---------------------------------------------------------------------------

/// Enqueues the forward: `(o, lse)` as new buffers.
pub(super) fn forward(
    scx: &mut StreamCx,
    g: &Geometry,
    dtype: DType,
    qkv: [&Buffer; 3],
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer)> {
    match dtype {
        DType::F16 => forward_t::<f16>(scx, g, qkv, mask),
        DType::BF16 => forward_t::<bf16>(scx, g, qkv, mask),
        other => Err(Error::dtype(FWD, DType::F16, other)),
    }
}

fn forward_t<T: Element>(
    scx: &mut StreamCx,
    g: &Geometry,
    [q, k, v]: [&Buffer; 3],
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer)> {
    let p = &g.p;
    let f = forward_function(scx, p.d, T::DTYPE)?;
    let mut o = kernels::alloc_out::<T>(scx, p.q_len())?;
    let mut lse = kernels::alloc_out::<f32>(scx, p.lse_len())?;
    let (q, k, v) = (q.cuda::<T>()?, k.cuda::<T>()?, v.cuda::<T>()?);
    let mask = mask.map(|m| m.cuda::<T>()).transpose()?;
    {
        let stream: &CudaStream = scx.stream();
        let (qp, _gq) = addr(q, stream);
        let (kp, _gk) = addr(k, stream);
        let (vp, _gv) = addr(v, stream);
        let (mp, _gm) = mask.map(|m| addr(m, stream)).unzip();
        let (op, _go) = addr_mut(&mut o, stream);
        let (lp, _gl) = addr_mut(&mut lse, stream);
        let params = FlashParams {
            q: qp,
            k: kp,
            v: vp,
            mask: mp.unwrap_or(0),
            o: op,
            lse: lp,
            ..FlashParams::new(g)
        };
        let rows = f.kernel.rows_per_block(p.d);
        let grid = (p.lq.div_ceil(rows) as u32, p.h as u32, p.b as u32);
        // SAFETY: q, k, v are the op's inputs ([B,H,Lq,D], [B,Hkv,Lk,D] x2 of T, kept
        // alive by the op until its completion), the mask (if any) holds the planes
        // its strides in `params` address (validated at submit), o and lse are fresh
        // allocations of B*H*Lq*D T and B*H*Lq f32 on this stream; all are whole,
        // contiguous device allocations (aligned beyond the 16 bytes the kernels need).
        unsafe { f.launch(stream, grid, &params) }?;
    }
    Ok((Buffer::from_cuda(o), Buffer::from_cuda(lse)))
}

// ---- backward --------------------------------------------------------------------------

/// The backward workspace (f32: dq_accum `[B,H,Lq,D]`, then dsum `[B,H,Lq]`) of at
/// least `n` elements: this stream's cached one when big enough, else a new one (the
/// too-small one is freed, stream-ordered after its last use).
fn take_workspace(scx: &mut StreamCx, n: usize) -> Result<CudaSlice<f32>> {
    if let Some(ws) = state(scx)?.workspace.take() {
        if ws.len() >= n {
            return Ok(ws);
        }
    }
    scx.alloc::<f32>(n)
}

/// Keeps `ws` for the next backward on this stream unless it is too large to hold.
fn keep_workspace(scx: &mut StreamCx, ws: CudaSlice<f32>) -> Result<()> {
    if ws.len() * 4 <= WORKSPACE_KEEP_MAX {
        state(scx)?.workspace = Some(ws);
    }
    Ok(())
}

/// Enqueues the backward: `(dq, dk, dv)` as new buffers. `ins` is q, k, v, o, dO.
pub(super) fn backward(
    scx: &mut StreamCx,
    g: &Geometry,
    dtype: DType,
    ins: [&Buffer; 5],
    lse: &Buffer,
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer, Buffer)> {
    match dtype {
        DType::F16 => backward_t::<f16>(scx, g, ins, lse, mask),
        DType::BF16 => backward_t::<bf16>(scx, g, ins, lse, mask),
        other => Err(Error::dtype(BWD, DType::F16, other)),
    }
}

fn backward_t<T: Element>(
    scx: &mut StreamCx,
    g: &Geometry,
    [q, k, v, o, dout]: [&Buffer; 5],
    lse: &Buffer,
    mask: Option<&Buffer>,
) -> Result<(Buffer, Buffer, Buffer)> {
    let p = &g.p;
    let d = p.d;
    let pre = function(scx, Kernel::Preprocess, d, T::DTYPE)?;
    let main = backward_function(scx, d, T::DTYPE)?;
    let conv = function(scx, Kernel::ConvertDq, d, T::DTYPE)?;
    let mut dq = kernels::alloc_out::<T>(scx, p.q_len())?;
    let mut dk = kernels::alloc_out::<T>(scx, p.kv_len())?;
    let mut dv = kernels::alloc_out::<T>(scx, p.kv_len())?;
    let mut ws = take_workspace(scx, p.q_len() + p.lse_len())?;
    let (q, k, v) = (q.cuda::<T>()?, k.cuda::<T>()?, v.cuda::<T>()?);
    let (o, dout, lse) = (o.cuda::<T>()?, dout.cuda::<T>()?, lse.cuda::<f32>()?);
    let mask = mask.map(|m| m.cuda::<T>()).transpose()?;
    {
        let stream: &CudaStream = scx.stream();
        let (qp, _gq) = addr(q, stream);
        let (kp, _gk) = addr(k, stream);
        let (vp, _gv) = addr(v, stream);
        let (mp, _gm) = mask.map(|m| addr(m, stream)).unzip();
        let (op, _go) = addr(o, stream);
        let (lp, _gl) = addr(lse, stream);
        let (dop, _gdo) = addr(dout, stream);
        let (wp, _gw) = addr_mut(&mut ws, stream);
        let (dqp, _gdq) = addr_mut(&mut dq, stream);
        let (dkp, _gdk) = addr_mut(&mut dk, stream);
        let (dvp, _gdv) = addr_mut(&mut dv, stream);
        let params = FlashParams {
            q: qp,
            k: kp,
            v: vp,
            mask: mp.unwrap_or(0),
            o: op,
            lse: lp,
            dout: dop,
            dq_accum: wp,
            // After dq_accum's B*H*Lq*D floats: a multiple of 256 bytes in (D >= 64).
            dsum: wp + 4 * p.q_len() as u64,
            dq: dqp,
            dk: dkp,
            dv: dvp,
            ..FlashParams::new(g)
        };
        let rows = p.b * p.h * p.lq;
        let rows_per_block = 256 / (d / 8);
        let pre_grid = (rows.div_ceil(rows_per_block) as u32, 1, 1);
        let keys = main.kernel.keys_per_block(d);
        let main_grid = (p.lk.div_ceil(keys) as u32, p.h_kv as u32, p.b as u32);
        let conv_grid = ((p.q_len() / 4).div_ceil(256).clamp(1, 65_535) as u32, 1, 1);
        // SAFETY (all three): q, k, v, o, dO, lse and the mask are the op's inputs in
        // the shapes and dtypes validated at submit (o/dO/dq [B,H,Lq,D] and k/v/dk/dv
        // [B,Hkv,Lk,D] of T, lse [B,H,Lq] f32), kept alive by the op until completion;
        // dq, dk, dv are fresh allocations on this stream; the workspace holds
        // B*H*Lq*(D+1) f32 (dq_accum then dsum, both 16-byte aligned) and is only
        // used on this stream. All are whole, contiguous device allocations (aligned
        // beyond the 16 bytes the kernels need). The launches are ordered on one stream
        // as attention.cu requires: preprocess, dq/dk/dv (either main kernel: the same
        // inputs and outputs; its grid covers Lk in blocks of its keys), convert dq.
        unsafe {
            pre.launch(stream, pre_grid, &params)?;
            main.launch(stream, main_grid, &params)?;
            conv.launch(stream, conv_grid, &params)?;
        }
    }
    keep_workspace(scx, ws)?;
    Ok((
        Buffer::from_cuda(dq),
        Buffer::from_cuda(dk),
        Buffer::from_cuda(dv),
    ))
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    /// The `ATTN_CHECK_OFFSET(field, offset)` lines of `attention_common.cuh`.
    fn header_offsets() -> Vec<(String, usize)> {
        let header = rtx_kernels::headers()
            .iter()
            .find(|h| h.name == "attention_common.cuh")
            .expect("attention_common.cuh is built into rtx-kernels");
        header
            .source
            .lines()
            .filter_map(|l| l.trim().strip_prefix("ATTN_CHECK_OFFSET("))
            .filter_map(|l| l.split_once(')'))
            .map(|(args, _)| {
                let (f, off) = args.split_once(',').expect("field, offset");
                (f.trim().to_string(), off.trim().parse().expect("offset"))
            })
            .collect()
    }

    #[test]
    fn offsets_match_the_c_header() {
        let rust: [(&str, usize); 23] = [
            ("q", offset_of!(FlashParams, q)),
            ("k", offset_of!(FlashParams, k)),
            ("v", offset_of!(FlashParams, v)),
            ("mask", offset_of!(FlashParams, mask)),
            ("o", offset_of!(FlashParams, o)),
            ("lse", offset_of!(FlashParams, lse)),
            ("dout", offset_of!(FlashParams, dout)),
            ("dsum", offset_of!(FlashParams, dsum)),
            ("dq_accum", offset_of!(FlashParams, dq_accum)),
            ("dq", offset_of!(FlashParams, dq)),
            ("dk", offset_of!(FlashParams, dk)),
            ("dv", offset_of!(FlashParams, dv)),
            ("mask_stride_b", offset_of!(FlashParams, mask_stride_b)),
            ("mask_stride_h", offset_of!(FlashParams, mask_stride_h)),
            ("mask_stride_q", offset_of!(FlashParams, mask_stride_q)),
            ("B", offset_of!(FlashParams, b)),
            ("H", offset_of!(FlashParams, h)),
            ("Hkv", offset_of!(FlashParams, h_kv)),
            ("Lq", offset_of!(FlashParams, lq)),
            ("Lk", offset_of!(FlashParams, lk)),
            ("scale", offset_of!(FlashParams, scale)),
            ("causal", offset_of!(FlashParams, causal)),
            ("pad_", offset_of!(FlashParams, pad_)),
        ];
        // The offsets documented at the top of attention.cu.
        let documented = [
            0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 124, 128, 132, 136,
            140, 144, 148,
        ];
        for ((name, off), doc) in rust.iter().zip(documented) {
            assert_eq!(*off, doc, "FlashParams::{name}");
        }
        let header = header_offsets();
        let names: Vec<&str> = header.iter().map(|(n, _)| n.as_str()).collect();
        let ours: Vec<&str> = rust.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ours, "the C struct's fields, in order");
        for ((name, off), (_, c)) in rust.iter().zip(&header) {
            assert_eq!(off, c, "FlashParams::{name} vs attention_common.cuh");
        }
        assert_eq!(std::mem::size_of::<FlashParams>(), 152);
    }

    /// The number after `{cfg}::{field} == ` in a static_assert of program `module`.
    fn asserted(module: &str, cfg: &str, field: &str) -> u32 {
        let cu = rtx_kernels::source(module).expect("the program is built in");
        let key = format!("{cfg}::{field} == ");
        let at = cu
            .source
            .find(&key)
            .unwrap_or_else(|| panic!("no static_assert on {key} in {module}.cu"));
        let rest = &cu.source[at + key.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().expect("a number")
    }

    /// The documented shared memory sizes are those `attention.cu` asserts.
    #[test]
    fn smem_matches_the_kernel_asserts() {
        let a = |cfg| asserted(MODULE, cfg, "SMEM_BYTES");
        assert_eq!(Kernel::Forward.smem(64), a("AttnFwdCfgD64"));
        assert_eq!(Kernel::Forward.smem(128), a("AttnFwdCfgD128"));
        assert_eq!(Kernel::DqDkDv.smem(64), a("AttnBwdCfgD64"));
        assert_eq!(Kernel::DqDkDv.smem(128), a("AttnBwdCfgD128"));
    }

    /// The wgmma forward's launch (smem, threads, rows per block) is what
    /// `attention_wgmma.cu` asserts for its default tiles, and that program is the one
    /// compiled for sm_90a.
    #[test]
    fn wgmma_launch_matches_the_kernel_asserts() {
        for (d, cfg) in [(64, "AttnWgCfgD64"), (128, "AttnWgCfgD128")] {
            let k = Kernel::ForwardWgmma;
            assert_eq!(k.smem(d), asserted(WGMMA_MODULE, cfg, "SMEM_BYTES"));
            assert_eq!(k.threads(d), asserted(WGMMA_MODULE, cfg, "NTHREADS"));
            assert_eq!(
                k.rows_per_block(d),
                asserted(WGMMA_MODULE, cfg, "BR") as usize
            );
        }
        let program = rtx_kernels::source(WGMMA_MODULE).expect("attention_wgmma.cu is built in");
        assert!(program.arch_specific());
        assert_eq!(Kernel::ForwardWgmma.module(), WGMMA_MODULE);
        assert_eq!(Kernel::Forward.rows_per_block(64), 128);
    }

    /// The wgmma backward's launch (smem, threads, keys per block) is what
    /// `attention_wgmma_bwd.cu` asserts for its default tiles, and that program is the one
    /// compiled for sm_90a.
    #[test]
    fn wgmma_backward_launch_matches_the_kernel_asserts() {
        let (k, cfg) = (Kernel::DqDkDvWgmma, "AttnWgBwdCfgD128");
        assert_eq!(k.smem(128), asserted(WGMMA_BWD_MODULE, cfg, "SMEM_BYTES"));
        assert_eq!(k.threads(128), asserted(WGMMA_BWD_MODULE, cfg, "NTHREADS"));
        assert_eq!(
            k.keys_per_block(128),
            asserted(WGMMA_BWD_MODULE, cfg, "BC") as usize
        );
        let program =
            rtx_kernels::source(WGMMA_BWD_MODULE).expect("attention_wgmma_bwd.cu is built in");
        assert!(program.arch_specific());
        assert_eq!(k.module(), WGMMA_BWD_MODULE);
        assert_eq!(Kernel::DqDkDv.keys_per_block(128), 64);
    }

    #[test]
    fn params_from_geometry() {
        use crate::attention::cpu::{AttnParams, MaskKind};
        let g = Geometry {
            p: AttnParams {
                b: 2,
                h: 4,
                h_kv: 2,
                lq: 17,
                lk: 33,
                d: 64,
                scale: 0.125,
                causal: true,
                mask: MaskKind::Full,
            },
            mask: Some(MaskLayout {
                stride_b: 4 * 17 * 33,
                stride_h: 17 * 33,
            }),
        };
        let f = FlashParams::new(&g);
        assert_eq!((f.b, f.h, f.h_kv, f.lq, f.lk), (2, 4, 2, 17, 33));
        assert_eq!(
            (f.mask_stride_b, f.mask_stride_h, f.mask_stride_q),
            (4 * 17 * 33, 17 * 33, 33)
        );
        assert_eq!((f.scale, f.causal, f.q, f.mask), (0.125, 1, 0, 0));
        assert_eq!(Kernel::DqDkDv.code(128), 2 << 8 | 128);
    }
}
