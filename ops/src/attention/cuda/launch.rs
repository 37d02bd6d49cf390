//! The launch side of the attention kernels: [`FlashParams`] from a validated call
//! (the struct itself is `rtx_kernels::launch::FlashParams`), the kernel table (names, blocks, dynamic shared memory, grids
//! per kernel and head dim: the ABI documented at the top of `attention.cu`,
//! `attention_wgmma.cu`, `attention_tma.cu`, `attention_wgmma_bwd.cu` and `attention_tma_bwd.cu`), which kernel runs on this device
//! (the sm_90a ones on compute capability 9.0, with the fallback rules of `cuda.rs`), and
//! the per-stream state ([`AttnState`]: functions configured, sm_90a kernels that failed
//! here, the backward's kept workspace).

use std::collections::HashSet;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
pub(crate) use rtx_kernels::launch::{FlashParams, FlashTmaBwdParams, FlashTmaParams};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{DType, Error, Result};

use crate::attention::geometry::{Geometry, MaskLayout};
use crate::kernels::{self, launch_error};

const MODULE: &str = "attention";
/// The Hopper (sm_90a) forward.
const WGMMA_MODULE: &str = "attention_wgmma";
/// The Hopper (sm_90a) forward with a producer warpgroup and bulk tensor copies (D = 128;
/// D = 64 for calls without a mask).
const TMA_MODULE: &str = "attention_tma";
/// The Hopper (sm_90a) backward main kernel (D = 128).
const WGMMA_BWD_MODULE: &str = "attention_wgmma_bwd";
/// The Hopper (sm_90a) backward main kernel with a producer warpgroup (D = 64 and 128;
/// the setting `attn_bwd_tma`, on by default).
const TMA_BWD_MODULE: &str = "attention_tma_bwd";
pub(super) const FWD: &str = "attention";
pub(super) const BWD: &str = "attention_backward";

/// The [`FlashParams`] of `g`: sizes, flags and mask strides; every pointer NULL.
pub(super) fn flash_params(g: &Geometry) -> FlashParams {
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

/// The kernels of `attention.cu` and `attention_wgmma.cu`, each built for D 64 and 128
/// and f16 and bf16, of `attention_tma.cu` and `attention_wgmma_bwd.cu` (D 128, f16 and
/// bf16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Kernel {
    Forward,
    Preprocess,
    DqDkDv,
    ConvertDq,
    /// The sm_90a forward of `attention_wgmma.cu`.
    ForwardWgmma,
    /// The sm_90a forward of `attention_tma.cu`: a producer warpgroup and bulk
    /// tensor copies (D = 128 only; takes a [`FlashTmaParams`]).
    ForwardTma,
    /// The sm_90a backward main kernel of `attention_wgmma_bwd.cu` (D = 128 only).
    DqDkDvWgmma,
    /// The sm_90a backward main kernel of `attention_tma_bwd.cu`: the wgmma one's GEMMs
    /// fed by a producer warpgroup (D = 64 and 128; takes a [`FlashTmaBwdParams`]).
    DqDkDvTma,
    /// [`Kernel::ForwardTma`] built without the additive mask's loads
    /// (`flash_fwd_tma_nm_*`: fewer registers, no spill), for calls without a mask, D = 128
    /// and D = 64 (3 consumer warpgroups, 192 rows per block); the kernel ignores `mask`,
    /// so [`Launch::launch_tma`] refuses it a call with one.
    ForwardTmaNoMask,
}

impl Kernel {
    fn prefix(self) -> &'static str {
        match self {
            Kernel::Forward => "flash_fwd",
            Kernel::Preprocess => "flash_bwd_preprocess",
            Kernel::DqDkDv => "flash_bwd_dq_dk_dv",
            Kernel::ConvertDq => "flash_bwd_convert_dq",
            Kernel::ForwardWgmma => "flash_fwd_wgmma",
            Kernel::ForwardTma => "flash_fwd_tma",
            Kernel::DqDkDvWgmma => "flash_bwd_wgmma",
            Kernel::DqDkDvTma => "flash_bwd_tma",
            Kernel::ForwardTmaNoMask => "flash_fwd_tma_nm",
        }
    }

    /// The kernel's name without the head dim and dtype (for logs).
    pub(super) fn name(self) -> &'static str {
        self.prefix()
    }

    /// The program (`kernels/cuda/<module>.cu`) that holds it.
    fn module(self) -> &'static str {
        match self {
            Kernel::ForwardWgmma => WGMMA_MODULE,
            Kernel::ForwardTma | Kernel::ForwardTmaNoMask => TMA_MODULE,
            Kernel::DqDkDvWgmma => WGMMA_BWD_MODULE,
            Kernel::DqDkDvTma => TMA_BWD_MODULE,
            _ => MODULE,
        }
    }

    /// The op that launches it (for errors).
    fn op(self) -> &'static str {
        match self {
            Kernel::Forward
            | Kernel::ForwardWgmma
            | Kernel::ForwardTma
            | Kernel::ForwardTmaNoMask => FWD,
            _ => BWD,
        }
    }

    /// The key of this kernel for head dim `d` in the per-stream function cache.
    fn code(self, d: usize) -> u16 {
        (self as u16) << 8 | d as u16
    }

    /// Threads per block (the D=64 forward is preset 1: 4 warps, 2 blocks per SM; the
    /// wgmma kernels have 2 warpgroups of 128 threads, the TMA kernels 3).
    fn threads(self, d: usize) -> u32 {
        match (self, d) {
            (Kernel::ForwardTmaNoMask, 64) => 512,
            (Kernel::ForwardTma | Kernel::ForwardTmaNoMask | Kernel::DqDkDvTma, _) => 384,
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
            (Kernel::ForwardTmaNoMask, 64) => 91_224,
            (Kernel::ForwardTma | Kernel::ForwardTmaNoMask, _) => 164_952,
            (Kernel::DqDkDvWgmma, _) => 217_600,
            (Kernel::DqDkDvTma, 64) => 199_720,
            (Kernel::DqDkDvTma, _) => 198_696,
            _ => 0,
        }
    }

    /// Keys per block of a backward main kernel (its grid is `ceil(Lk / keys)` x Hkv x B).
    pub(super) fn keys_per_block(self, _d: usize) -> usize {
        match self {
            Kernel::DqDkDvWgmma | Kernel::DqDkDvTma => 128,
            _ => 64,
        }
    }

    /// Query rows per step of the TMA backward main kernel, which are the rows of its q and
    /// dO tensor maps' boxes: FlashAttention-3's 128 at D = 64, 64 at D = 128.
    pub(super) fn tma_bwd_query_rows(d: usize) -> u32 {
        if d == 64 {
            128
        } else {
            64
        }
    }

    /// Query rows per block of a forward (its grid is `ceil(Lq / rows)` x H x B): 192 for
    /// the mask-less TMA forward at D = 64 (3 consumer warpgroups), else 128, kept
    /// separate from the kernel so that a tile change in a `.cu` file meets the test below.
    pub(super) fn rows_per_block(self, d: usize) -> usize {
        match (self, d) {
            (Kernel::ForwardTmaNoMask, 64) => 192,
            _ => 128,
        }
    }

    /// Rows of the TMA forward's q tensor map box: 64 at D = 64 (three copies per
    /// 192-row block), else 128.
    pub(super) fn tma_fwd_q_rows(d: usize) -> u32 {
        if d == 64 {
            64
        } else {
            128
        }
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
pub(super) struct AttnState {
    /// Functions whose dynamic shared memory limit is set, by (kernel code, dtype).
    prepared: HashSet<(u16, DType)>,
    /// The backward's workspace, kept for the next call on this stream.
    pub(super) workspace: Option<CudaSlice<f32>>,
    /// The sm_90a kernels that failed to compile, load or configure here (their
    /// `mma.sync` fallbacks run instead).
    wgmma_failed: HashSet<Kernel>,
}

/// The forward for head dim `d` on compute capability 9.0: the TMA kernel's build without
/// the mask's loads for a call without a mask (`masked` false; D = 64 and 128), the masked
/// TMA kernel for D = 128, else (or where those are unavailable) the wgmma kernel;
/// elsewhere the `mma.sync` one (see [`hopper_or`]).
pub(super) fn forward_function(
    scx: &mut StreamCx,
    d: usize,
    dtype: DType,
    masked: bool,
) -> Result<Launch> {
    if !masked {
        if let Some(f) = hopper(scx, Kernel::ForwardTmaNoMask, d, dtype)? {
            return Ok(f);
        }
    }
    if d == 128 {
        if let Some(f) = hopper(scx, Kernel::ForwardTma, d, dtype)? {
            return Ok(f);
        }
    }
    wgmma_forward_function(scx, d, dtype)
}

/// The forward for head dim `d` without the TMA kernel: the wgmma kernel on compute
/// capability 9.0, else the `mma.sync` one (see [`hopper_or`]).
pub(super) fn wgmma_forward_function(scx: &mut StreamCx, d: usize, dtype: DType) -> Result<Launch> {
    hopper_or(scx, Some(Kernel::ForwardWgmma), Kernel::Forward, d, dtype)
}

/// The backward main kernel for head dim `d`: on compute capability 9.0 the TMA kernel
/// where the setting `attn_bwd_tma` is on, else (or where that one is unavailable) the
/// wgmma kernel for D = 128; elsewhere the `mma.sync` one (see [`hopper_or`]).
pub(super) fn backward_function(scx: &mut StreamCx, d: usize, dtype: DType) -> Result<Launch> {
    if scx.settings().attn_bwd_tma {
        if let Some(f) = hopper(scx, Kernel::DqDkDvTma, d, dtype)? {
            return Ok(f);
        }
    }
    wgmma_backward_function(scx, d, dtype)
}

/// The backward main kernel for head dim `d` without the TMA kernel: the wgmma kernel
/// for D = 128 on compute capability 9.0, else the `mma.sync` one (see [`hopper_or`]).
pub(super) fn wgmma_backward_function(
    scx: &mut StreamCx,
    d: usize,
    dtype: DType,
) -> Result<Launch> {
    let hopper = (d == 128).then_some(Kernel::DqDkDvWgmma);
    hopper_or(scx, hopper, Kernel::DqDkDv, d, dtype)
}

/// `hopper_kernel` (an sm_90a kernel) on compute capability 9.0 unless the runtime's
/// setting `attn_wgmma` is off (`Runtime::builder().attn_wgmma(false)`,
/// `RTX_ATTN_WGMMA=0`) or it failed before on this stream, else `fallback` (see
/// [`hopper`]).
fn hopper_or(
    scx: &mut StreamCx,
    hopper_kernel: Option<Kernel>,
    fallback: Kernel,
    d: usize,
    dtype: DType,
) -> Result<Launch> {
    if let Some(k) = hopper_kernel {
        if let Some(f) = hopper(scx, k, d, dtype)? {
            return Ok(f);
        }
    }
    function(scx, fallback, d, dtype)
}

/// The sm_90a kernel `k` when this stream may use it (compute capability 9.0, the
/// setting `attn_wgmma` on, not failed here before), else `None`. A failure to get it
/// ready is logged once and remembered for the stream (its fallback then runs).
fn hopper(scx: &mut StreamCx, k: Kernel, d: usize, dtype: DType) -> Result<Option<Launch>> {
    if scx.arch() != (9, 0) || !scx.settings().attn_wgmma || state(scx)?.wgmma_failed.contains(&k) {
        return Ok(None);
    }
    match function(scx, k, d, dtype) {
        Ok(f) => Ok(Some(f)),
        Err(e) => {
            tracing::warn!(
                "attention: the sm_90a kernel {} is unavailable on device {}, \
                 using its fallback on this stream: {e}",
                k.prefix(),
                scx.ordinal(),
            );
            state(scx)?.wgmma_failed.insert(k);
            Ok(None)
        }
    }
}

pub(super) fn state(scx: &mut StreamCx) -> Result<&mut AttnState> {
    scx.ext::<AttnState>(|_| Ok(AttnState::default()))
}

/// The function of `kernel` for head dim `d` and `dtype`, loaded for this stream and,
/// the first time, checked against the launch and given its shared memory limit.
pub(super) fn function(
    scx: &mut StreamCx,
    kernel: Kernel,
    d: usize,
    dtype: DType,
) -> Result<Launch> {
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
    let cuda_err =
        |call: &str, e: cudarc::driver::DriverError| Error::cuda(format!("{call}({name})"), e);
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
                 {}.cu and ops/src/attention/cuda/ disagree on the launch",
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
pub(super) struct Launch {
    f: CudaFunction,
    pub(super) kernel: Kernel,
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
    pub(super) unsafe fn launch(
        &self,
        stream: &CudaStream,
        grid: (u32, u32, u32),
        params: &FlashParams,
    ) -> Result<()> {
        if matches!(
            self.kernel,
            Kernel::ForwardTma | Kernel::ForwardTmaNoMask | Kernel::DqDkDvTma
        ) {
            return Err(Error::invalid(
                self.kernel.op(),
                format!(
                    "{} takes tensor maps: it is launched by launch_tma or launch_tma_bwd",
                    self.kernel.name()
                ),
            ));
        }
        // SAFETY: every kernel of attention.cu, attention_wgmma.cu and
        // attention_wgmma_bwd.cu (all but the TMA kernels, refused above) takes exactly
        // one `FlashParams` by value; the pointers are valid per this function's contract.
        unsafe { self.enqueue(stream, grid, params) }
    }

    /// Enqueues the TMA forward on `stream` over `grid` with `params`.
    ///
    /// # Safety
    ///
    /// As [`Launch::launch`], for `params.p`; and the tensor maps of `params` describe q,
    /// k and v of that call as [`super::tensor_map::tensor_map`] makes them (the kernel reads the tensors
    /// through them).
    pub(super) unsafe fn launch_tma(
        &self,
        stream: &CudaStream,
        grid: (u32, u32, u32),
        params: &FlashTmaParams,
    ) -> Result<()> {
        if !matches!(self.kernel, Kernel::ForwardTma | Kernel::ForwardTmaNoMask) {
            return Err(Error::invalid(
                self.kernel.op(),
                format!(
                    "{} takes a FlashParams: it is launched by launch",
                    self.kernel.name()
                ),
            ));
        }
        if self.kernel == Kernel::ForwardTmaNoMask && params.p.mask != 0 {
            return Err(Error::invalid(
                self.kernel.op(),
                format!(
                    "{} ignores the mask: a call with one takes flash_fwd_tma",
                    self.kernel.name()
                ),
            ));
        }
        // SAFETY: flash_fwd_tma_d128_* and flash_fwd_tma_nm_d{64,128}_* take exactly one
        // `FlashTmaParams` by value; the pointers and maps are valid per this function's
        // contract (and a call with a mask does not reach the kernel that ignores it).
        unsafe { self.enqueue(stream, grid, params) }
    }

    /// Enqueues the TMA backward main kernel on `stream` over `grid` with `params`.
    ///
    /// # Safety
    ///
    /// As [`Launch::launch`], for `params.p` (a backward call's pointers); and the tensor
    /// maps of `params` describe q, k, v and dO of that call as [`super::tensor_map::tensor_map`] makes them
    /// (boxes of [`Kernel::tma_bwd_query_rows`] rows for q and dO, 128-row ones for k and
    /// v; the kernel reads the tensors
    /// through them).
    pub(super) unsafe fn launch_tma_bwd(
        &self,
        stream: &CudaStream,
        grid: (u32, u32, u32),
        params: &FlashTmaBwdParams,
    ) -> Result<()> {
        if self.kernel != Kernel::DqDkDvTma {
            return Err(Error::invalid(
                self.kernel.op(),
                format!("{} does not take a FlashTmaBwdParams", self.kernel.name()),
            ));
        }
        // SAFETY: flash_bwd_tma_d{64,128}_* takes exactly one `FlashTmaBwdParams` by value;
        // the pointers and maps are valid per this function's contract.
        unsafe { self.enqueue(stream, grid, params) }
    }

    /// Launches the kernel over `grid` with its one argument `arg`, in the block and
    /// dynamic shared memory documented for it and this D (the limit was raised in
    /// `configure`).
    ///
    /// # Safety
    ///
    /// `A` is the argument struct the kernel takes by value, and what it points at is as
    /// the kernel documents (the callers' contracts).
    unsafe fn enqueue<A: DeviceRepr>(
        &self,
        stream: &CudaStream,
        grid: (u32, u32, u32),
        arg: &A,
    ) -> Result<()> {
        let mut lb = stream.launch_builder(&self.f);
        lb.arg(arg);
        let cfg = self.kernel.config(self.d, grid);
        // SAFETY: the argument and launch shape the kernel expects, per this function's
        // contract.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(self.kernel.op(), e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// `k`'s launch at head dim `d` is what `{module}.cu` asserts for `cfg`: its shared
    /// memory, threads, and rows per block (`BR`, a forward) or keys per block (`BC`, a
    /// backward main kernel).
    fn assert_launch(k: Kernel, d: usize, module: &str, cfg: &str) {
        assert_eq!(k.smem(d), asserted(module, cfg, "SMEM_BYTES"), "{cfg}");
        assert_eq!(k.threads(d), asserted(module, cfg, "NTHREADS"), "{cfg}");
        let blocks = if k.op() == FWD {
            (k.rows_per_block(d), "BR")
        } else {
            (k.keys_per_block(d), "BC")
        };
        assert_eq!(blocks.0, asserted(module, cfg, blocks.1) as usize, "{cfg}");
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

    /// The wgmma and TMA forwards' launches (smem, threads, rows per block) are what
    /// `attention_wgmma.cu` and `attention_tma.cu` assert for their default tiles, and
    /// those programs are compiled for sm_90a.
    #[test]
    fn wgmma_launch_matches_the_kernel_asserts() {
        for (d, cfg) in [(64, "AttnWgCfgD64"), (128, "AttnWgCfgD128")] {
            assert_launch(Kernel::ForwardWgmma, d, WGMMA_MODULE, cfg);
        }
        let k = Kernel::ForwardTma;
        assert_launch(k, 128, TMA_MODULE, "AttnTmaLaunchD128");
        assert_eq!(k.module(), TMA_MODULE);
        let program = rtx_kernels::source(TMA_MODULE).expect("attention_tma.cu is built in");
        assert!(program.arch_specific());
        // The mask-less build: at D = 64 with 3 consumer warpgroups (and no masked build),
        // at D = 128 the masked one's launch; both compiled by default.
        let nm = Kernel::ForwardTmaNoMask;
        assert_launch(nm, 64, TMA_MODULE, "AttnTmaLaunchD64");
        assert_eq!(nm.threads(64), 512);
        assert!(program.source.contains("flash_fwd_tma_nm_d64_bf16"));
        assert_eq!(
            (
                nm.smem(128),
                nm.threads(128),
                nm.rows_per_block(128),
                nm.module()
            ),
            (
                k.smem(128),
                k.threads(128),
                k.rows_per_block(128),
                k.module()
            )
        );
        assert!(program.source.contains("#define ATTN_TMA_NOMASK 1"));
        assert!(program.source.contains("flash_fwd_tma_nm_d128_bf16"));
        let program = rtx_kernels::source(WGMMA_MODULE).expect("attention_wgmma.cu is built in");
        assert!(program.arch_specific());
        assert_eq!(Kernel::ForwardWgmma.module(), WGMMA_MODULE);
        assert_eq!(Kernel::Forward.rows_per_block(64), 128);
    }

    /// The wgmma and TMA backwards' launches (smem, threads, keys per block) are what
    /// `attention_wgmma_bwd.cu` and `attention_tma_bwd.cu` assert for their tiles, and
    /// those programs are compiled for sm_90a.
    #[test]
    fn wgmma_backward_launch_matches_the_kernel_asserts() {
        let k = Kernel::DqDkDvWgmma;
        assert_launch(k, 128, WGMMA_BWD_MODULE, "AttnWgBwdCfgD128");
        let program =
            rtx_kernels::source(WGMMA_BWD_MODULE).expect("attention_wgmma_bwd.cu is built in");
        assert!(program.arch_specific());
        assert_eq!(k.module(), WGMMA_BWD_MODULE);
        assert_eq!(Kernel::DqDkDv.keys_per_block(128), 64);
        let k = Kernel::DqDkDvTma;
        for (d, cfg) in [(64, "TmaBwdCfgD64"), (128, "TmaBwdCfgD128")] {
            assert_launch(k, d, TMA_BWD_MODULE, cfg);
            assert_eq!(
                Kernel::tma_bwd_query_rows(d),
                asserted(TMA_BWD_MODULE, cfg, "BR")
            );
        }
        let program =
            rtx_kernels::source(TMA_BWD_MODULE).expect("attention_tma_bwd.cu is built in");
        assert!(program.arch_specific());
        assert_eq!(k.module(), TMA_BWD_MODULE);
    }

    #[test]
    fn params_from_geometry() {
        use crate::attention::{AttnParams, MaskKind};
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
        let f = flash_params(&g);
        assert_eq!((f.b, f.h, f.h_kv, f.lq, f.lk), (2, 4, 2, 17, 33));
        assert_eq!(
            (f.mask_stride_b, f.mask_stride_h, f.mask_stride_q),
            (4 * 17 * 33, 17 * 33, 33)
        );
        assert_eq!((f.scale, f.causal, f.q, f.mask), (0.125, 1, 0, 0));
        assert_eq!(Kernel::DqDkDv.code(128), 2 << 8 | 128);
    }
}
