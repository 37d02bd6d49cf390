//! Launch conventions of the built-in kernels, for the code that launches them: block
//! size, grid sizes, workspace sizes, entry-point names and the by-value argument
//! structs. The kernels themselves are correct for any grid (grid-stride loops); these
//! grids are the ones they are tuned for. Signatures are in the [crate docs](crate).

/// Threads per block for every built-in kernel. Reductions and softmax require it
/// (their shared arrays are sized for it); element-wise kernels accept fewer.
pub const BLOCK: u32 = 256;

/// The largest grid for `reduce_all_*` / `argreduce_all_*`; a workspace of this many
/// partials fits every launch.
pub const REDUCE_ALL_MAX_GRID: u32 = 1024;

/// Most dimensions a [`StridedArgs`] holds.
pub const MAX_DIMS: usize = 8;

/// Most blocks of [`BLOCK`] threads resident on one SM (2048 threads per SM).
pub const MAX_BLOCKS_PER_SM: u32 = 8;

/// Element types of the built-in kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// `float`.
    F32,
    /// `__half`.
    F16,
    /// `__nv_bfloat16`.
    Bf16,
}

impl Dtype {
    /// The entry-point suffix: `f32`, `f16`, `bf16`.
    pub fn suffix(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// Elements per 16-byte vector.
    pub fn vector(self) -> usize {
        16 / self.size()
    }

    /// All of them.
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];
}

/// Unary ops of `elementwise.cu` (`ew_{op}_{dt}`).
pub const UNARY_OPS: [&str; 8] = ["neg", "exp", "log", "sin", "cos", "sqrt", "abs", "relu"];
/// Binary ops of `elementwise.cu` (`ew_`, `ewb_`, `ews_{op}_{dt}`).
pub const BINARY_OPS: [&str; 6] = ["add", "sub", "mul", "div", "max", "min"];
/// Reductions of `reduce.cu` (`reduce_all_`, `reduce_dim_{op}_{dt}`).
pub const REDUCE_OPS: [&str; 5] = ["sum", "mean", "prod", "max", "min"];
/// Index reductions of `reduce.cu` (`argreduce_all_`, `argreduce_dim_{op}_{dt}`).
pub const ARG_OPS: [&str; 2] = ["argmax", "argmin"];

/// Every documented entry point of a built-in program, or `None` for a program this
/// module does not describe.
pub fn entry_points(program: &str) -> Option<Vec<String>> {
    let per_dtype = |names: Vec<String>| -> Vec<String> {
        names
            .iter()
            .flat_map(|n| Dtype::ALL.map(|d| format!("{n}_{}", d.suffix())))
            .collect()
    };
    let with = |prefixes: &[&str], ops: &[&str]| -> Vec<String> {
        prefixes
            .iter()
            .flat_map(|p| ops.iter().map(move |op| format!("{p}_{op}")))
            .collect()
    };
    let names = match program {
        "elementwise" => {
            let mut all = with(&["ew"], &UNARY_OPS);
            all.extend(with(&["ew", "ewb", "ews"], &BINARY_OPS));
            let mut all = per_dtype(all);
            // Every op and dtype in one kernel (launch batching).
            all.push("ew_batch".to_owned());
            all
        }
        "reduce" => {
            let mut all = with(&["reduce_all", "reduce_dim"], &REDUCE_OPS);
            all.extend(with(&["argreduce_all", "argreduce_dim"], &ARG_OPS));
            per_dtype(all)
        }
        "softmax" => per_dtype(vec!["softmax".to_owned()]),
        "epilogue" => per_dtype(vec!["bias_act".to_owned()]),
        "fault" => vec!["fault_trap".to_owned()],
        _ => return None,
    };
    Some(names)
}

fn blocks(work: usize, per_block: usize, cap: u32) -> u32 {
    let needed = work.div_ceil(per_block.max(1)).max(1);
    u32::try_from(needed).unwrap_or(u32::MAX).min(cap.max(1))
}

/// Blocks that run at once on a device: `sm_count` times the kernel's blocks per SM at
/// [`BLOCK`] threads (from `cuOccupancyMaxActiveBlocksPerMultiprocessor(f, 256, 0)`,
/// cudarc's `CudaFunction::occupancy_max_active_blocks_per_multiprocessor`). The grid
/// functions below cap their grid at this: one full wave, no tail of idle SMs.
pub fn resident_blocks(sm_count: u32, blocks_per_sm: u32) -> u32 {
    sm_count.saturating_mul(blocks_per_sm.clamp(1, MAX_BLOCKS_PER_SM))
}

/// Most blocks of an element-wise grid (the grid's x limit).
pub const ELEMENTWISE_MAX_GRID: u32 = (1 << 31) - 1;

/// Grid for `ew_*`, `ewb_*`, `ews_*` (and the other element-wise kernels: activation,
/// convert, compare) over `n` outputs: a block for every [`BLOCK`] 16-byte vectors, so
/// that each thread takes one vector and the grid-stride loop runs once (at most
/// [`ELEMENTWISE_MAX_GRID`]). Measured on the H200 (kernels/checks/train_kernels_check.py):
/// add and exp at 2^26 and 2^28 elements ran at 4.15-4.39 TB/s with this grid, against
/// 3.56-4.10 TB/s with the grid capped at one resident wave (1056 blocks): the hardware
/// block scheduler keeps more loads in flight than a persistent loop does.
pub fn elementwise_grid(n: usize, dtype: Dtype) -> u32 {
    blocks(n, BLOCK as usize * dtype.vector(), ELEMENTWISE_MAX_GRID)
}

/// Grid for `reduce_all_*` / `argreduce_all_*`: enough blocks for 4 vectors per thread,
/// at most `resident` and [`REDUCE_ALL_MAX_GRID`]. The workspace needs one partial per
/// block.
pub fn reduce_all_grid(n: usize, dtype: Dtype, resident: u32) -> u32 {
    blocks(
        n,
        BLOCK as usize * dtype.vector() * 4,
        resident.min(REDUCE_ALL_MAX_GRID),
    )
}

/// Grid for `reduce_dim_*` / `argreduce_dim_*` on `[outer, r, inner]`: the kernel's
/// work units (rows per block or column tiles, as `reduce.cu` chooses them), at most
/// `resident`. Assumes `x` is 16-byte aligned (else the grid is merely less tuned).
pub fn reduce_dim_grid(outer: usize, r: usize, inner: usize, dtype: Dtype, resident: u32) -> u32 {
    if inner == 1 {
        let warp_per_row = outer >= 2048 || r <= 1024;
        let rows_per_block = if warp_per_row { BLOCK as usize / 32 } else { 1 };
        return blocks(outer, rows_per_block, resident);
    }
    let v = if inner.is_multiple_of(dtype.vector()) {
        dtype.vector()
    } else {
        1
    };
    let per_outer = inner / v;
    let items = outer.saturating_mul(per_outer);
    let tile = if items >= 65536 {
        BLOCK as usize
    } else {
        let segment = v * dtype.size();
        let (seg_max, seg_min) = ((128 / segment).max(1), (32 / segment).max(1));
        let mut tx = per_outer.next_power_of_two().min(seg_max);
        while tx > seg_min && items.div_ceil(tx) < 512 {
            tx /= 2;
        }
        tx
    };
    blocks(items, tile, resident)
}

/// Grid for `softmax_*` on `[rows, cols]`: a warp per row up to 1024 columns, else a
/// block per row; at most `resident`.
pub fn softmax_grid(rows: usize, cols: usize, resident: u32) -> u32 {
    let per_block = if cols <= 1024 { BLOCK as usize / 32 } else { 1 };
    blocks(rows, per_block, resident)
}

/// The by-value argument of `ews_{op}_{dt}`, laid out as the C struct
/// `struct StridedArgs { int ndim; long long shape[8]; long long sa[8]; long long sb[8]; }`.
///
/// Dims are row-major (0 outermost); strides are in elements, 0 where an operand is
/// broadcast. The output is contiguous.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StridedArgs {
    /// Number of dims in use, 1 to 8.
    pub ndim: i32,
    /// Output shape.
    pub shape: [i64; MAX_DIMS],
    /// Strides of `a`.
    pub sa: [i64; MAX_DIMS],
    /// Strides of `b`.
    pub sb: [i64; MAX_DIMS],
}

const _: () = assert!(
    std::mem::size_of::<StridedArgs>() == 200,
    "must match the C layout"
);
const _: () = assert!(std::mem::align_of::<StridedArgs>() == 8);

// SAFETY: StridedArgs is `repr(C)` plain data (integers only, no pointers), 200 bytes,
// 8-aligned (4 bytes of padding after `ndim`, as C puts them), laid out exactly as the
// C struct the `ews_*` kernels take by value, so its bytes are a valid kernel argument
// for any value.
unsafe impl cudarc::driver::DeviceRepr for StridedArgs {}

impl StridedArgs {
    /// Arguments for output `shape` with operand strides `sa`, `sb` (one per dim), after
    /// dropping size-1 dims and merging dims that are contiguous in both operands.
    /// `None` if the lengths differ or more than 8 dims remain.
    ///
    /// # Examples
    ///
    /// ```
    /// use rtx::kernels::launch::StridedArgs;
    /// // [4, 1, 3, 5] + a bias of [3, 1] broadcast over dims 0 and 3:
    /// let args = StridedArgs::new(&[4, 1, 3, 5], &[15, 15, 5, 1], &[0, 0, 1, 0]).unwrap();
    /// assert_eq!(args.ndim, 3);
    /// assert_eq!(&args.shape[..3], &[4, 3, 5]);
    /// ```
    pub fn new(shape: &[usize], sa: &[isize], sb: &[isize]) -> Option<Self> {
        if sa.len() != shape.len() || sb.len() != shape.len() {
            return None;
        }
        let mut dims: Vec<(i64, i64, i64)> = Vec::with_capacity(shape.len());
        for ((&n, &a), &b) in shape.iter().zip(sa).zip(sb) {
            let (n, a, b) = (i64::try_from(n).ok()?, a as i64, b as i64);
            if n == 1 {
                continue;
            }
            match dims.last_mut() {
                Some(outer) if outer.1 == a * n && outer.2 == b * n => *outer = (outer.0 * n, a, b),
                _ => dims.push((n, a, b)),
            }
        }
        if dims.is_empty() {
            dims.push((1, 0, 0));
        }
        if dims.len() > MAX_DIMS {
            return None;
        }
        let mut args = StridedArgs {
            ndim: dims.len() as i32,
            shape: [1; 8],
            sa: [0; 8],
            sb: [0; 8],
        };
        for (d, (n, a, b)) in dims.into_iter().enumerate() {
            (args.shape[d], args.sa[d], args.sb[d]) = (n, a, b);
        }
        Some(args)
    }
}

/// The by-value argument of every attention kernel (`attention.cu`,
/// `attention_wgmma.cu`, `attention_wgmma_bwd.cu`), field for field the C struct
/// `FlashParams` of `attention_common.cuh`: twelve device pointers, three `long long`
/// mask strides, five `int` sizes, a `float` scale, the `int` causal flag and an `int`
/// of padding; 152 bytes, 8-aligned, no implicit padding on either side. Unused
/// pointers are 0 (NULL). Shapes: q, o, dout, dq `[B, H, Lq, D]`; k, v, dk, dv
/// `[B, Hkv, Lk, D]`; lse, dsum `[B, H, Lq]` (f32); dq_accum `[B, H, Lq, D]` (f32).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlashParams {
    /// Queries.
    pub q: u64,
    /// Keys.
    pub k: u64,
    /// Values.
    pub v: u64,
    /// The additive mask (NULL: none), laid out by the `mask_stride_*` fields.
    pub mask: u64,
    /// The output (forward) or the forward's output (backward).
    pub o: u64,
    /// Log-sum-exp per query row (forward output, backward input).
    pub lse: u64,
    /// The output's gradient (backward).
    pub dout: u64,
    /// Backward workspace: `rowsum(dO * O)`.
    pub dsum: u64,
    /// Backward workspace: the unscaled dQ in f32.
    pub dq_accum: u64,
    /// The queries' gradient (backward).
    pub dq: u64,
    /// The keys' gradient (backward).
    pub dk: u64,
    /// The values' gradient (backward).
    pub dv: u64,
    /// Mask element stride between batches (0: broadcast).
    pub mask_stride_b: i64,
    /// Mask element stride between heads (0: broadcast).
    pub mask_stride_h: i64,
    /// Mask element stride between query rows (keys are contiguous).
    pub mask_stride_q: i64,
    /// Batch size.
    pub b: i32,
    /// Query heads.
    pub h: i32,
    /// Key/value heads; `h % h_kv == 0`.
    pub h_kv: i32,
    /// Query length, at least 1.
    pub lq: i32,
    /// Key length, at least 1.
    pub lk: i32,
    /// Softmax scale, > 0.
    pub scale: f32,
    /// 1: top-left causal (query `i` sees key `j` iff `j <= i`); 0: none.
    pub causal: i32,
    /// Unused; keeps the size at 152 bytes.
    pub pad_: i32,
}

const _: () = assert!(std::mem::size_of::<FlashParams>() == 152);
const _: () = assert!(std::mem::align_of::<FlashParams>() == 8);

// SAFETY: `FlashParams` is `repr(C)` with the field types, order and therefore layout
// of the C struct the kernels take by value (152 bytes, 8-aligned; the size is checked
// above, each offset by `tests::flash_params_offsets_match_the_c_header`):
// `CUdeviceptr` (u64) for each `void*`, i64 for `long long`, i32 for `int`, f32 for
// `float`. It is plain old data, valid for any bit pattern.
unsafe impl cudarc::driver::DeviceRepr for FlashParams {}

/// A CUDA tensor map (`CUtensorMap`: 128 opaque bytes, 64-byte aligned), the descriptor
/// of a global tensor that bulk tensor copies (TMA) read; made on the host by
/// `cuTensorMapEncodeTiled`.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorMap(pub [u64; 16]);

/// The argument of the TMA forwards `flash_fwd_tma_d128_*` and `flash_fwd_tma_nm_d{64,128}_*`
/// (`attention_tma.cu`, struct `FlashTmaParams`): the [`FlashParams`] of the call, the
/// work-tile counters and the tensor maps of q, k and v, each 3-D (D, L, B·heads) with
/// the 128-byte swizzle (box (64, 128, 1); q's (64, 64, 1) at D = 64). 576 bytes,
/// 64-aligned: `p` at 0, `sched` at 152, `q` at 192, `k` at 320, `v` at 448.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlashTmaParams {
    /// Sizes, flags and pointers (the kernel reads o, lse, mask and its strides here).
    pub p: FlashParams,
    /// Device address of two `u32` counters, 0 at launch (the kernel leaves them at 0),
    /// by which the blocks of a grid smaller than the work tiles claim the tiles past
    /// their first; or 0: block x takes tiles x, x + grid, ... (`attention_tma.cu`, "Work
    /// tiles").
    pub sched: u64,
    /// Queries, (D, Lq, B·H).
    pub q: TensorMap,
    /// Keys, (D, Lk, B·Hkv).
    pub k: TensorMap,
    /// Values, (D, Lk, B·Hkv).
    pub v: TensorMap,
}

const _: () = assert!(std::mem::size_of::<TensorMap>() == 128);
const _: () = assert!(std::mem::size_of::<FlashTmaParams>() == 576);
const _: () = assert!(std::mem::align_of::<FlashTmaParams>() == 64);
const _: () = assert!(std::mem::offset_of!(FlashTmaParams, sched) == 152);
const _: () = assert!(std::mem::offset_of!(FlashTmaParams, q) == 192);
const _: () = assert!(std::mem::offset_of!(FlashTmaParams, k) == 320);
const _: () = assert!(std::mem::offset_of!(FlashTmaParams, v) == 448);

// SAFETY: `FlashTmaParams` is `repr(C, align(64))` with the layout of the C struct the
// TMA forward takes by value (576 bytes, 64-aligned, the offsets checked above; the C
// side asserts the same size and alignment): a `FlashParams` (see its impl), a device
// address and three 128-byte tensor maps, plain bytes. It is plain old data, valid for any
// bit pattern.
unsafe impl cudarc::driver::DeviceRepr for FlashTmaParams {}

/// The argument of `flash_bwd_tma_d{64,128}_{f16,bf16}` (`attention_tma_bwd.cu`, struct
/// `FlashTmaBwdParams`): the [`FlashParams`] of the backward call and the tensor maps of
/// q and dO (3-D (D, Lq, B·H), box (64, 128, 1) for D = 64 and (64, 64, 1) for D = 128:
/// the kernel's query rows per step) and of k and v (3-D (D, Lk, B·Hkv), box
/// (64, 128, 1)), all with the 128-byte swizzle, and of the f32 workspace `dq_accum` that the
/// kernel adds dQ to (3-D (D, Lq, B·H), box (32, 16, 1), the 128-byte swizzle). 832 bytes,
/// 64-aligned: `p` at 0, `q` at 192, `k` at 320, `v` at 448, `dout` at 576, `dq` at 704.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlashTmaBwdParams {
    /// Sizes, flags and pointers (the kernel reads lse, dsum, the mask, dq_accum, dk and
    /// dv through them).
    pub p: FlashParams,
    /// Queries, (D, Lq, B·H), boxes of the kernel's query rows per step (128 at D = 64, 64
    /// at D = 128).
    pub q: TensorMap,
    /// Keys, (D, Lk, B·Hkv), 128-row boxes.
    pub k: TensorMap,
    /// Values, (D, Lk, B·Hkv), 128-row boxes.
    pub v: TensorMap,
    /// The output's gradient dO, (D, Lq, B·H), boxes as `q`'s.
    pub dout: TensorMap,
    /// `p.dq_accum` (f32), (D, Lq, B·H), boxes of 32 columns and 16 rows.
    pub dq: TensorMap,
}

const _: () = assert!(std::mem::size_of::<FlashTmaBwdParams>() == 832);
const _: () = assert!(std::mem::align_of::<FlashTmaBwdParams>() == 64);
const _: () = assert!(std::mem::offset_of!(FlashTmaBwdParams, q) == 192);
const _: () = assert!(std::mem::offset_of!(FlashTmaBwdParams, k) == 320);
const _: () = assert!(std::mem::offset_of!(FlashTmaBwdParams, v) == 448);
const _: () = assert!(std::mem::offset_of!(FlashTmaBwdParams, dout) == 576);
const _: () = assert!(std::mem::offset_of!(FlashTmaBwdParams, dq) == 704);

// SAFETY: `FlashTmaBwdParams` is `repr(C, align(64))` with the layout of the C struct the
// TMA backward takes by value (832 bytes, 64-aligned, the offsets checked above; the C
// side asserts the same size and alignment): a `FlashParams` and five 128-byte tensor
// maps, plain bytes. It is plain old data, valid for any bit pattern.
unsafe impl cudarc::driver::DeviceRepr for FlashTmaBwdParams {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_contiguous_dims_and_drops_ones() {
        let args = StridedArgs::new(&[2, 3, 4], &[12, 4, 1], &[12, 4, 1]).unwrap();
        assert_eq!((args.ndim, args.shape[0], args.sa[0]), (1, 24, 1));
        let bcast = StridedArgs::new(&[2, 3, 4], &[12, 4, 1], &[0, 1, 0]).unwrap();
        assert_eq!(
            (bcast.ndim, &bcast.shape[..3], &bcast.sb[..3]),
            (3, &[2, 3, 4][..], &[0, 1, 0][..])
        );
        let sb: Vec<isize> = (0..9).map(|d| 1 << (8 - d)).collect();
        let merged = StridedArgs::new(&[2; 9], &[0; 9], &sb).unwrap();
        assert_eq!((merged.ndim, merged.shape[0], merged.sb[0]), (1, 512, 1));
        assert!(
            StridedArgs::new(&[2; 9], &[0; 9], &[1; 9]).is_none(),
            "9 unmergeable dims"
        );
        assert!(StridedArgs::new(&[2, 3], &[1], &[1, 1]).is_none());
    }

    #[test]
    fn grids_are_bounded() {
        assert_eq!(elementwise_grid(1 << 26, Dtype::F32), 65536);
        assert_eq!(elementwise_grid(10, Dtype::F16), 1);
        assert_eq!(
            elementwise_grid(usize::MAX, Dtype::F16),
            ELEMENTWISE_MAX_GRID
        );
        assert_eq!(
            reduce_all_grid(1 << 30, Dtype::F32, 10_000),
            REDUCE_ALL_MAX_GRID
        );
        // 8192 x 8192 f32 over dim 0: 2048 column vectors, 4 per tile -> 512 tiles.
        assert_eq!(reduce_dim_grid(1, 8192, 8192, Dtype::F32, 10_000), 512);
        // ... over dim 1: a warp per row, 8 rows per block.
        assert_eq!(reduce_dim_grid(8192, 8192, 1, Dtype::F32, 10_000), 1024);
        assert_eq!(reduce_dim_grid(8192, 8192, 1, Dtype::F32, 660), 660);
        // Unaligned width 3 with many items: a thread per item.
        assert_eq!(
            reduce_dim_grid(100_000, 7, 3, Dtype::F32, 10_000),
            300_000usize.div_ceil(256) as u32
        );
        assert_eq!(softmax_grid(4096, 8192, resident_blocks(132, 4)), 528);
    }

    #[test]
    fn names_follow_the_scheme() {
        let ew = entry_points("elementwise").unwrap();
        assert_eq!(ew.len(), (8 + 6 * 3) * 3 + 1);
        assert!(ew.contains(&"ewb_max_bf16".to_owned()));
        assert!(ew.contains(&"ew_batch".to_owned()));
        let red = entry_points("reduce").unwrap();
        assert!(red.contains(&"argreduce_dim_argmin_f16".to_owned()));
        assert!(entry_points("attention").is_none());
    }

    #[test]
    fn strided_args_match_the_c_layout() {
        use std::mem::{align_of, offset_of, size_of};
        // struct StridedArgs { int ndim; long long shape[8]; long long sa[8]; long long sb[8]; }
        assert_eq!(size_of::<StridedArgs>(), 8 + 3 * 8 * 8);
        assert_eq!(align_of::<StridedArgs>(), 8);
        assert_eq!(
            (
                offset_of!(StridedArgs, shape),
                offset_of!(StridedArgs, sa),
                offset_of!(StridedArgs, sb)
            ),
            (8, 72, 136)
        );
        let cu = crate::source("elementwise").expect("elementwise.cu is built in");
        let decl = "struct StridedArgs {\n    int ndim;\n    long long shape[8];\n    \
                    long long sa[8];\n    long long sb[8];\n};";
        assert!(cu.source.contains(decl), "elementwise.cu declares {decl}");
    }

    /// The `ATTN_CHECK_OFFSET(field, offset)` lines of `attention_common.cuh`.
    fn header_offsets() -> Vec<(String, usize)> {
        let header = crate::headers()
            .iter()
            .find(|h| h.name == "attention_common.cuh")
            .expect("attention_common.cuh is built in");
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
    fn flash_params_offsets_match_the_c_header() {
        use std::mem::offset_of;
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
        // The offsets documented in the struct's comment in attention_common.cuh.
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
        assert_eq!(std::mem::align_of::<FlashParams>(), 8);
    }
}
