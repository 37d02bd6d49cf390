//! rtx's own kernel for small f16/bf16 products (`kernels/cuda/small_gemm.cu`), launched
//! straight through the driver ([`kernels::launch_direct`]) instead of
//! `cublasLtMatmul`.
//!
//! Why: on the GPU host a `cublasLtMatmul` call costs the actor 8.7 µs of host time
//! against 4.3 µs for a plain launch, and from 8 threads at once 3.3 µs of wall time per
//! call against 1.3 (`benches/gpu/lt_floor.cu`); for a small GEMM, whose kernel runs a
//! few µs, that host cost is the op's cost when it runs eagerly. On the device
//! cuBLASLt's kernels are faster (256³: 2.8 µs in a graph against 3.7), so by default
//! ([`SmallGemm::Eager`](rtx_runtime::SmallGemm)) captured products keep cuBLASLt.
//! Which products it takes ([`eligible`]): the
//! `x·wᵀ (+ bias, activation)` form of `linear` (and `matmul` with `trans_b`), f16 or
//! bf16, at most [`SMALL_GEMM_MACS`] multiply-adds, `n` and `k` multiples of 8 and
//! every operand 16-byte aligned (the kernel's 16-byte shared-memory copies), the batch
//! within the grid's z limit, and the setting
//! [`small_gemm`](rtx_runtime::Settings::small_gemm) (`RTX_SMALL_GEMM`) applying to
//! the launch (eager, or captured with `Always`). The kernel is the same on every stream
//! and has no atomics, so its results repeat bit for bit.

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaSlice, LaunchConfig};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{DType, Element, Result};

use super::{GemmArgs, SMALL_GEMM_MACS};
use crate::gemm::Activation;
use crate::kernels::{self, device_addr, launch_error, param};

/// The kernel program.
const MODULE: &str = "small_gemm";
/// Output tile of one block (rows × columns) and its threads: `small_gemm.cu`'s
/// defaults (`SG_BM`, `SG_BN`, `SG_THREADS`).
const TILE_M: usize = 64;
const TILE_N: usize = 64;
const THREADS: u32 = 128;
/// The grid's z limit (one product of the batch per z).
const MAX_BATCH: usize = 65535;

static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// How many products (process-wide) ran on rtx's small-GEMM kernel instead of cuBLASLt
/// (see [`Settings::small_gemm`](rtx_runtime::Settings::small_gemm)).
pub fn small_gemm_launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// The device addresses of a product's operands (the bias's 0 when it has none).
#[derive(Clone, Copy)]
pub(super) struct Operands {
    x: u64,
    w: u64,
    bias: u64,
    y: u64,
}

/// The operands' addresses if `g` writing into `d` runs on the small-GEMM kernel (see
/// the module docs), for [`run`].
pub(super) fn eligible<T: Element>(
    scx: &StreamCx,
    g: &GemmArgs<'_, T>,
    d: &CudaSlice<T>,
) -> Option<Operands> {
    if !scx.settings().small_gemm.applies(scx.capturing())
        || !matches!(T::DTYPE, DType::F16 | DType::BF16)
    {
        return None;
    }
    let dm = g.dims;
    let fits = |v: usize| i32::try_from(v).is_ok();
    if g.trans_a || !g.trans_b || g.macs() > SMALL_GEMM_MACS || dm.batch > MAX_BATCH {
        return None;
    }
    if dm.batch == 0
        || dm.m == 0
        || dm.n == 0
        || dm.k == 0
        || !dm.n.is_multiple_of(8)
        || !dm.k.is_multiple_of(8)
    {
        return None;
    }
    // Batch strides that are multiples of 8 elements keep every item 16-byte aligned.
    if !dm.a_bs.is_multiple_of(8) || !dm.b_bs.is_multiple_of(8) {
        return None;
    }
    if !fits(dm.m) || !fits(dm.n) || !fits(dm.k) {
        return None;
    }
    let ops = Operands {
        x: device_addr(g.a, scx),
        w: device_addr(g.b, scx),
        bias: g.bias.map_or(0, |b| device_addr(b, scx)),
        y: device_addr(d, scx),
    };
    let aligned = |p: u64| p.is_multiple_of(16);
    (aligned(ops.x) && aligned(ops.w) && aligned(ops.y) && ops.bias.is_multiple_of(2))
        .then_some(ops)
}

/// Enqueues `d = act(a · bᵀ + bias)` on `scx`'s stream; `ops` are what [`eligible`]
/// returned for `g` and `d` (`d`, which the kernel writes through `ops.y`, stays
/// borrowed for the launch).
pub(super) fn run<T: Element>(
    scx: &mut StreamCx,
    g: &GemmArgs<'_, T>,
    ops: Operands,
    _d: &mut CudaSlice<T>,
) -> Result<()> {
    let dm = g.dims;
    let act = match g.act {
        Activation::None => "none",
        Activation::Relu => "relu",
        Activation::Gelu => "gelu",
    };
    let code = g.act as u16;
    let f = kernels::function(scx, MODULE, code, T::DTYPE, || {
        format!("small_gemm_{act}_{}", T::DTYPE.name())
    })?;
    // The grid: (column tiles, row tiles, batch). Each fits its limit: m·n·k is at most
    // 2^27 with n, k >= 8, so m / 64 and n / 64 are at most 2^15 (the y limit is 65535),
    // and the batch is at most 65535 (checked by `eligible`).
    let cfg = LaunchConfig {
        grid_dim: (
            dm.n.div_ceil(TILE_N) as u32,
            dm.m.div_ceil(TILE_M) as u32,
            dm.batch as u32,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let Operands {
        x: mut px,
        w: mut pw,
        bias: mut pb,
        y: mut py,
    } = ops;
    // i32 by `eligible`; the batch strides in elements as i64 (`long long`).
    if dm.batch == 1 && defer(scx, g, &ops)? {
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    let (mut m, mut n, mut k) = (dm.m as i32, dm.n as i32, dm.k as i32);
    let (mut sx, mut sw, mut sb, mut sy) =
        (dm.a_bs as i64, dm.b_bs as i64, 0i64, (dm.m * dm.n) as i64);
    let mut params = [
        param(&mut px),
        param(&mut pw),
        param(&mut pb),
        param(&mut py),
        param(&mut m),
        param(&mut n),
        param(&mut k),
        param(&mut sx),
        param(&mut sw),
        param(&mut sb),
        param(&mut sy),
    ];
    // SAFETY: `small_gemm_{act}_{dt}(const T* x, const T* w, const T* bias, T* y, int m,
    // int n, int k, long long sx, long long sw, long long sb, long long sy)`
    // (small_gemm.cu), T the buffers' dtype, each entry pointing at a live local of that
    // C type. `x` holds the batch's x matrices of m·k elements `sx` apart (0: one shared),
    // `w` its n·k-element weights `sw` apart, `bias` is null or holds n elements (shared:
    // sb = 0), `y` (fresh, overlapping nothing) holds batch·m·n elements; the shapes were
    // validated at submit. `eligible` checked what the kernel requires: n and k multiples
    // of 8 and x, w, y 16-byte aligned. The kernel reads and writes only inside those
    // bounds and waits for its predecessor before touching memory (`wait_prior_grid`),
    // as a programmatic launch in a capture needs. The op keeps every buffer alive until
    // completion.
    unsafe { kernels::launch_direct(scx, &f, cfg, &mut params) }
        .map_err(|e| launch_error("small_gemm", e))?;
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Blocks of a batched launch at most (each takes tiles of a step in turn).
const BATCH_GRID: usize = 64;

/// The marker of the grid barrier's two words (count, generation) of one stream
/// ([`kernels::stream_words`]); every `small_gemm_batch` launch on the stream leaves them
/// zeroed.
struct Barrier;

/// Defers the one product `g` (batch 1) into the stream's launch batch as a step of
/// `small_gemm_batch` (`small_gemm.cu`, "batched launches"); `false` when the batch
/// declines (the caller launches its own kernel).
fn defer<T: Element>(scx: &mut StreamCx, g: &GemmArgs<'_, T>, ops: &Operands) -> Result<bool> {
    // (Before the barrier's first allocation: never inside a capture.)
    if !scx.launch_batch_open() {
        return Ok(false);
    }
    let dm = g.dims;
    let f = kernels::function(scx, MODULE, 0xff, DType::F32, || {
        "small_gemm_batch".to_string()
    })?;
    let bar = kernels::stream_words::<Barrier, 2>(scx)?;
    let act = match g.act {
        Activation::None => 0u32,
        Activation::Relu => 1,
        Activation::Gelu => 2,
    };
    let code = 2 * act + u32::from(T::DTYPE == DType::BF16);
    let tiles = dm.m.div_ceil(TILE_M) * dm.n.div_ceil(TILE_N);
    // `SgStep` as C lays it out: u32 code, i32 m, n, k, then x, w, bias, y and the
    // barrier's address.
    let mut step = [0u8; rtx_runtime::cuda::BATCH_STEP_BYTES];
    step[0..4].copy_from_slice(&code.to_ne_bytes());
    step[4..8].copy_from_slice(&(dm.m as i32).to_ne_bytes());
    step[8..12].copy_from_slice(&(dm.n as i32).to_ne_bytes());
    step[12..16].copy_from_slice(&(dm.k as i32).to_ne_bytes());
    for (i, a) in [ops.x, ops.w, ops.bias, ops.y, bar].into_iter().enumerate() {
        step[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
    }
    let geo = rtx_runtime::cuda::Geometry {
        grid: tiles.min(BATCH_GRID) as u32,
        threads: THREADS,
        coop: true,
    };
    // SAFETY: `small_gemm_batch` is a batch kernel of `StreamCx::defer_launch`'s form
    // (one `SgBatch` by value; a cooperative grid of THREADS-thread blocks whose steps
    // are separated by a grid barrier on `bar`, two words of this stream zeroed at
    // their allocation and left zeroed by every launch; x, w and bias read through L2).
    // The step is what `run`'s own launch would compute for batch 1: `eligible`
    // checked the shapes (m, n, k in i32, n and k multiples of 8) and the alignment of
    // x, w, y (16 bytes) and bias (2); y is fresh and overlaps nothing; the op holds
    // every buffer until its completion. Its code names the activation and dtype.
    Ok(unsafe { scx.defer_launch(&f, geo, &step) })
}
