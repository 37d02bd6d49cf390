//! CUDA launches of `kernels/cuda/embedding.cu`.
//!
//! The forward is one launch, a warp per output row (8 rows per block of 256).
//! The backward is one launch, with the setting `embedding_one_launch` on (the default),
//! when the ids are few (at most [`SCAN_MAX_IDS`]):
//! `emb_bwd_scan_*`, a block of 1024 threads per SM, each block owning every G-th table
//! row; every block reads all the ids, sorts those of its rows in shared memory and
//! writes its rows once (a row's positions summed in increasing order, zeros for an empty
//! row). Its shared memory grows with the ids and the rows per block, up to 163,844
//! bytes; it is asked for once per stream and dtype, up to the device's per-block limit.
//! Where a launch needs more than was granted, or the ids are more, the backward enqueues
//! five launches on the op's stream: `emb_count_*` (ids per row and per tile of 1024
//! rows), `emb_scan` (bucket offsets, a block per tile), `emb_scatter_*` (each id's
//! position into its bucket, in any order), `emb_order_*` (each bucket sorted by
//! position: a stable sort of the positions by id) and `emb_bwd_*` (a warp per table row
//! sums its bucket in increasing position; a bucket of more than 64 by the whole block in
//! 8 segments). Its scratch (counts, offsets, cursors, slots, positions) is freed
//! stream-ordered after them. Both are deterministic; they may differ from each other in
//! the last bits of a row summed in segments.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{Buffer, DType, Element, Error, Result};

use crate::kernels::{
    self, alloc_out, config, device_addr, float_dispatch, grid, launch_error, BLOCK,
};

const MODULE: &str = "embedding";

/// Warps in a block of [`BLOCK`] threads: the rows one block of `emb_fwd_*` takes at once
/// (a warp per row).
const WARPS_PER_BLOCK: usize = BLOCK as usize / 32;
/// Counts per block of `emb_scan` (`EMB_TILE` in embedding.cu).
const SCAN_TILE: usize = 1024;
/// Table rows per block of `emb_bwd_*` (`EMB_ROWS` in embedding.cu).
const BWD_ROWS: usize = 64;

/// Most ids of the one-launch backward (`EMB_SCAN_MAX` in embedding.cu: an entry keeps
/// the id's position in 14 bits).
pub(crate) const SCAN_MAX_IDS: usize = 16384;
/// Most table rows per block of the one-launch backward (`EMB_SCAN_ROWS`).
const SCAN_MAX_ROWS: usize = 4096;
/// Threads per block of `emb_bwd_scan_*` (`EMB_SCAN_THREADS`).
const SCAN_THREADS: u32 = 1024;

/// Dynamic shared memory of `emb_bwd_scan_*` for `n` ids, `r` rows per block and
/// elements of `elem` bytes (embedding.cu's layout: entries `u32[n]`, positions
/// `u16[n]` padded to 4 bytes, offsets `u32[r + 1]`, cursors `u32[r]`, the heavy rows'
/// partials `f32[32 warps][32 lanes x 16 / elem]`).
fn scan_smem(n: usize, r: usize, elem: usize) -> usize {
    4 * n + 2 * n.next_multiple_of(2) + 4 * (r + 1) + 4 * r + 4 * 32 * 32 * (16 / elem)
}

/// Per-stream state: the dynamic shared memory `emb_bwd_scan_*` was granted, per float
/// dtype (f32, f16, bf16); 0 where none was.
#[derive(Default)]
struct EmbState {
    scan: [Option<usize>; 3],
}

/// The dynamic shared memory `emb_bwd_scan_{dt}_*` (both id types) may take on this
/// stream's device: [`scan_smem`] at the largest `n` and `r`, or less where the device's
/// per-block limit is lower (then only the launches that fit take it); asked once per
/// stream and dtype, 0 where refused (the backward takes the five launches).
fn scan_granted<T: Element>(scx: &mut StreamCx) -> Result<usize> {
    let slot = kernels::dtype_slot(T::DTYPE);
    if let Some(granted) = scx.ext::<EmbState>(|_| Ok(EmbState::default()))?.scan[slot] {
        return Ok(granted);
    }
    let mut fns = Vec::with_capacity(2);
    for (code, it) in [(0u16, "i32"), (1, "u32")] {
        fns.push(kernels::function(
            scx,
            MODULE,
            0x700 | code,
            T::DTYPE,
            || format!("emb_bwd_scan_{}_{it}", T::DTYPE.name()),
        )?);
    }
    let most = scan_smem(SCAN_MAX_IDS, SCAN_MAX_ROWS, std::mem::size_of::<T>());
    let granted =
        kernels::grant_dynamic_smem(scx, &fns, most, "emb_bwd_scan (one-launch backward)");
    scx.ext::<EmbState>(|_| Ok(EmbState::default()))?.scan[slot] = Some(granted);
    Ok(granted)
}

/// Enqueues `emb_bwd_scan_*` when it applies (see the module docs); returns `None` where
/// the five-launch backward must run.
fn backward_scan<T: Element>(
    scx: &mut StreamCx,
    name: &'static str,
    dy: &Buffer,
    ids: &Buffer,
    rows: usize,
    d: usize,
) -> Result<Option<(Buffer, Buffer)>> {
    let (ids_ptr, icode, iname) = ids_addr(scx, ids)?;
    let n = ids.len();
    let g = (scx.sm_count() as usize).max(1);
    let r = rows.div_ceil(g);
    let fits = n <= SCAN_MAX_IDS
        && r <= SCAN_MAX_ROWS
        && (rows as u64)
            .checked_mul(g as u64)
            .is_some_and(|p| p < 1 << 32);
    let smem = scan_smem(n, r, std::mem::size_of::<T>());
    if !scx.settings().embedding_one_launch || !fits || smem > scan_granted::<T>(scx)? {
        return Ok(None);
    }
    let f = kernels::function(scx, MODULE, 0x700 | icode, T::DTYPE, || {
        format!("emb_bwd_scan_{}_{iname}", T::DTYPE.name())
    })?;
    let mut bad = scx.alloc::<u32>(1)?;
    let mut dt = alloc_out::<T>(scx, rows * d)?;
    let cfg = LaunchConfig {
        grid_dim: (g as u32, 1, 1),
        block_dim: (SCAN_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(dy.cuda::<T>()?)
        .arg(&ids_ptr)
        .arg(&n)
        .arg(&mut dt)
        .arg(&rows)
        .arg(&d)
        .arg(&mut bad);
    // SAFETY: emb_bwd_scan_{dt}_{it}(const T* dy, const I* ids, size_t n, T* dtable,
    // size_t V, size_t D, unsigned* bad), blocks of EMB_SCAN_THREADS = 1024 over a grid of
    // G = the SM count: its conditions hold (n <= EMB_SCAN_MAX, ceil(V / G) <=
    // EMB_SCAN_ROWS, V * G < 2^32, checked above), its dynamic shared memory is
    // scan_smem(n, ceil(V / G)), within what scan_granted had granted; `dy` holds n * D
    // elements, `ids_ptr` n ids, `dt` V * D (each element written once: block b writes
    // rows b, b + G, ...), `bad` one counter (written by block 0). Invalid ids are
    // never used as addresses.
    unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    Ok(Some((Buffer::from_cuda(dt), Buffer::from_cuda(bad))))
}

/// The ids' address and kernel suffix.
fn ids_addr(scx: &StreamCx, ids: &Buffer) -> Result<(u64, u16, &'static str)> {
    Ok(match ids.dtype() {
        DType::I32 => (device_addr(ids.cuda::<i32>()?, scx), 0, "i32"),
        _ => (device_addr(ids.cuda::<u32>()?, scx), 1, "u32"),
    })
}

fn zeroed(scx: &StreamCx, n: usize) -> Result<CudaSlice<u32>> {
    let mut s = scx.alloc::<u32>(n)?;
    scx.stream()
        .memset_zeros(&mut s)
        .map_err(|e| Error::cuda("cuMemsetD8Async", e))?;
    Ok(s)
}

/// Enqueues the lookup; returns (y, bad).
pub(super) fn forward(
    scx: &mut StreamCx,
    name: &'static str,
    dtype: DType,
    table: &Buffer,
    ids: &Buffer,
    rows: usize,
    d: usize,
) -> Result<(Buffer, Buffer)> {
    let (ids_ptr, icode, iname) = ids_addr(scx, ids)?;
    let n = ids.len();
    let mut bad = zeroed(scx, 1)?;
    let y = float_dispatch!(dtype, name, |T| {
        let f = kernels::function(scx, MODULE, 0x100 | icode, T::DTYPE, || {
            format!("emb_fwd_{}_{iname}", T::DTYPE.name())
        })?;
        let mut y = alloc_out::<T>(scx, n * d)?;
        let tab = table.cuda::<T>()?;
        let cfg = config(grid(scx, n.div_ceil(WARPS_PER_BLOCK)), 0);
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(tab)
            .arg(&ids_ptr)
            .arg(&mut y)
            .arg(&n)
            .arg(&rows)
            .arg(&d)
            .arg(&mut bad);
        // SAFETY: emb_fwd_{dt}_{it}(const T* table, const I* ids, T* y, size_t n, size_t V,
        // size_t D, unsigned* bad): `tab` holds V * D elements of T, `ids_ptr` n ids of I,
        // `y` n * D (each written once), `bad` one zeroed counter; invalid ids are not
        // used as addresses.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
        Ok::<_, Error>(Buffer::from_cuda(y))
    })?;
    Ok((y, Buffer::from_cuda(bad)))
}

/// Enqueues the deterministic scatter-add; returns (dtable, bad).
pub(super) fn backward(
    scx: &mut StreamCx,
    name: &'static str,
    dtype: DType,
    dy: &Buffer,
    ids: &Buffer,
    rows: usize,
    d: usize,
) -> Result<(Buffer, Buffer)> {
    let scan = float_dispatch!(dtype, name, |T| backward_scan::<T>(
        scx, name, dy, ids, rows, d
    ))?;
    if let Some(out) = scan {
        return Ok(out);
    }
    let (ids_ptr, icode, iname) = ids_addr(scx, ids)?;
    let n = ids.len();
    // Set to 0 by emb_count and counted by emb_scatter (no memset of its own).
    let mut bad = scx.alloc::<u32>(1)?;
    // counts[V], then the tile counts of emb_scan's tiles, zeroed by one memset.
    let tiles = rows.div_ceil(SCAN_TILE);
    let mut counts = zeroed(scx, rows + tiles)?;
    let tiles_addr = device_addr(&counts, scx) + (rows * 4) as u64;
    let mut offsets = scx.alloc::<u32>(rows + 1)?;
    let mut next = scx.alloc::<u32>(rows)?;
    let mut slots = scx.alloc::<u32>(n.max(1))?;
    let mut positions = scx.alloc::<u32>(n.max(1))?;
    let per_id = config(grid(scx, n.div_ceil(BLOCK as usize)), 0);
    {
        let f = kernels::function(scx, MODULE, 0x200 | icode, DType::U32, || {
            format!("emb_count_{iname}")
        })?;
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&ids_ptr)
            .arg(&n)
            .arg(&rows)
            .arg(&mut counts)
            .arg(&tiles_addr)
            .arg(&mut bad);
        // SAFETY: emb_count_{it}(const I* ids, size_t n, size_t V, unsigned* counts,
        // unsigned* tiles, unsigned* bad): n ids; `counts` holds V zeroed counters and
        // then (at `tiles_addr`) ceil(V / 1024) zeroed tile counters; `bad` one counter
        // (set to 0 here).
        unsafe { lb.launch(per_id) }.map_err(|e| launch_error(name, e))?;
    }
    {
        let f = kernels::function(scx, MODULE, 0x300, DType::U32, || "emb_scan".into())?;
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&counts)
            .arg(&tiles_addr)
            .arg(&rows)
            .arg(&mut offsets)
            .arg(&mut next);
        // SAFETY: emb_scan(const unsigned* counts, const unsigned* tiles, size_t V,
        // unsigned* offsets, unsigned* next), blocks of 256 over tiles of 1024 counts (any
        // grid): V counts and ceil(V / 1024) tile counts in (written by emb_count above),
        // V + 1 offsets and V cursors out.
        unsafe { lb.launch(config(grid(scx, tiles), 0)) }.map_err(|e| launch_error(name, e))?;
    }
    {
        let f = kernels::function(scx, MODULE, 0x400 | icode, DType::U32, || {
            format!("emb_scatter_{iname}")
        })?;
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&ids_ptr)
            .arg(&n)
            .arg(&rows)
            .arg(&mut next)
            .arg(&mut slots)
            .arg(&mut bad);
        // SAFETY: emb_scatter_{it}(const I* ids, size_t n, size_t V, unsigned* next,
        // unsigned* slots, unsigned* bad): the cursors from emb_scan (bucket v's run
        // [offsets[v], offsets[v + 1]) holds exactly counts[v] slots, so every cursor
        // stays inside it); `slots` holds n entries (at least 1), one per valid id; `bad`
        // the counter emb_count set to 0.
        unsafe { lb.launch(per_id) }.map_err(|e| launch_error(name, e))?;
    }
    {
        let f = kernels::function(scx, MODULE, 0x600 | icode, DType::U32, || {
            format!("emb_order_{iname}")
        })?;
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&ids_ptr)
            .arg(&n)
            .arg(&rows)
            .arg(&offsets)
            .arg(&slots)
            .arg(&mut positions);
        // SAFETY: emb_order_{it}(const I* ids, size_t n, size_t V, const unsigned* offsets,
        // const unsigned* slots, unsigned* positions): offsets (V + 1) and slots (n) as
        // written above; each valid id's rank within its bucket is below the bucket's
        // size, so every write lands in `positions` (n entries), each once.
        unsafe { lb.launch(per_id) }.map_err(|e| launch_error(name, e))?;
    }
    let dt = float_dispatch!(dtype, name, |T| {
        let f = kernels::function(scx, MODULE, 0x500, T::DTYPE, || {
            format!("emb_bwd_{}", T::DTYPE.name())
        })?;
        let mut dt = alloc_out::<T>(scx, rows * d)?;
        let dys = dy.cuda::<T>()?;
        let cfg = config(grid(scx, rows.div_ceil(BWD_ROWS)), 0);
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(dys)
            .arg(&offsets)
            .arg(&positions)
            .arg(&mut dt)
            .arg(&rows)
            .arg(&d);
        // SAFETY: emb_bwd_{dt}(const T* dy, const unsigned* offsets, const unsigned*
        // positions, T* dtable, size_t V, size_t D): `dys` holds n * D elements, the
        // offsets and positions (written above, stream order) index rows of it below n;
        // `dt` holds V * D, each written once.
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
        Ok::<_, Error>(Buffer::from_cuda(dt))
    })?;
    Ok((dt, Buffer::from_cuda(bad)))
}
