//! The TMA forward's grid of work tiles (`kernels/cuda/attention_tma.cu`, "Work tiles"):
//! how many blocks a call launches, and the per-stream counters by which the blocks of a
//! persistent grid claim their tiles.

use rtx_runtime::cuda::StreamCx;
use rtx_runtime::Result;

use super::launch::Kernel;
use crate::kernels;

/// The longest key sequence for which the TMA forward runs on a persistent grid
/// ([`tma_forward_grid`]). Measured on an H100 (`attention_wgmma_check.py`, variants
/// `tmad` and `tma64d` against `tmanm` and `tma64w3`, bf16, B·L = 16384): the persistent
/// grid took L = 1024 9-17 % faster at D = 128 and 12-17 % at D = 64, L = 4096 1-8 % and
/// 2-5 %, but L = 16384 10-18 % and 3-11 % slower (cause not found; a fixed share of tiles
/// per block was slower still), so longer sequences keep a block per tile. (A persistent
/// block holds its SM until the tiles run out; blocks that start late, their SMs busy with
/// other streams' kernels, simply claim fewer tiles.)
pub(super) const PERSISTENT_MAX_KEYS: usize = 4096;

/// The grid of the TMA forward `kernel` for head dim `d` and `(Lq, Lk, H, B)`: its work
/// tiles are `ceil(Lq / rows) * H * B` ([`Kernel::rows_per_block`] rows of one batch and
/// head). Up to [`PERSISTENT_MAX_KEYS`] keys, a persistent grid of at most one block per
/// SM (`sms`; the kernel's shared memory holds one), whose blocks claim the tiles one
/// after another through the stream's counters ([`tile_counters`]) and load a tile's first
/// K and V while they finish the last; beyond, a block per tile. `None` when the tiles do
/// not fit the kernel's count (below 2^31).
pub(super) fn tma_forward_grid(
    kernel: Kernel,
    d: usize,
    (lq, lk, h, b): (usize, usize, usize, usize),
    sms: u32,
) -> Option<(u32, u32, u32)> {
    let tiles = lq
        .div_ceil(kernel.rows_per_block(d))
        .checked_mul(h)?
        .checked_mul(b)?;
    let tiles = u32::try_from(tiles).ok().filter(|&t| t < 1 << 31)?;
    let blocks = if lk <= PERSISTENT_MAX_KEYS {
        tiles.min(sms.max(1))
    } else {
        tiles
    };
    Some((blocks, 1, 1))
}

/// The marker of the TMA forward's work-tile counters ([`kernels::stream_words`]).
struct TileCounters;

/// This stream's work-tile counters of the TMA forward (two `u32`, `FlashTmaParams`'s
/// `sched`), zeroed once and left at 0 by every launch ([`kernels::stream_words`]).
pub(super) fn tile_counters(scx: &mut StreamCx) -> Result<u64> {
    kernels::stream_words::<TileCounters, 2>(scx)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The TMA forward's grid: at most one block per SM up to `PERSISTENT_MAX_KEYS` keys,
    /// a block per work tile beyond, and no grid when the tiles overflow the kernel's 31-bit
    /// count.
    #[test]
    fn tma_forward_grid_is_persistent_up_to_4096_keys() {
        let (k, nm) = (Kernel::ForwardTma, Kernel::ForwardTmaNoMask);
        // 1000 rows: 8 tiles of 128 at D = 128, 6 of 192 at D = 64 (the 3-warpgroup build);
        // a device reporting no SMs still gets one block.
        for (kernel, d, dims, sms, want) in [
            (k, 128, (1000, 1000, 8, 3), 132, Some((132, 1, 1))),
            (nm, 64, (1000, 4096, 8, 3), 132, Some((132, 1, 1))),
            (nm, 64, (1000, 4097, 8, 3), 132, Some((144, 1, 1))),
            (k, 128, (1000, 16384, 8, 3), 132, Some((192, 1, 1))),
            (nm, 64, (1000, 1000, 2, 3), 132, Some((36, 1, 1))),
            (nm, 64, (1, 1, 1, 1), 132, Some((1, 1, 1))),
            (k, 128, (4096, 4096, 16, 4), 0, Some((1, 1, 1))),
            (k, 128, (1 << 31, 1, 1, 128), 132, None),
            (k, 128, (usize::MAX, 1, 2, 2), 132, None),
        ] {
            assert_eq!(tma_forward_grid(kernel, d, dims, sms), want, "{dims:?}");
        }
        assert_eq!(PERSISTENT_MAX_KEYS, 4096);
        // the kernel documents the same: work tiles of BR rows, any grid up to their count
        let program = rtx_kernels::source("attention_tma").expect("attention_tma.cu is built in");
        assert!(program.source.contains("1 <= G <= n_work < 2^31"));
    }
}
