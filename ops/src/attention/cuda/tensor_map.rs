//! Tensor maps (`cuTensorMapEncodeTiled`) of the attention tensors, as the TMA kernels
//! (`attention_tma.cu`, `attention_tma_bwd.cu`) read them through bulk tensor copies.

use cudarc::driver::sys;
use rtx_kernels::launch::TensorMap;
use rtx_runtime::DType;

/// The tensor map of a contiguous `[heads, l, d]` tensor of 16-bit elements at `ptr`,
/// as the TMA kernels read it: 3-D (d, l, heads), box (64, `rows`, 1), 128-byte swizzle
/// (the shared-memory panels of `attention_wgmma.cu`), rows past `l` read as zeros.
/// Errors when the driver refuses it (e.g. `ptr` not 16-byte aligned).
pub(super) fn tensor_map(
    ptr: u64,
    dtype: DType,
    d: usize,
    l: usize,
    heads: usize,
    rows: u32,
) -> std::result::Result<TensorMap, String> {
    use sys::CUtensorMapDataType as Dt;
    let dt = match dtype {
        DType::F16 => Dt::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => Dt::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        other => return Err(format!("no tensor map for {other:?}")),
    };
    encode(ptr, dt, 2, d, l, heads, [64, rows])
}

/// The tensor map of the TMA backward's f32 workspace `dq_accum` (`[heads, l, d]` at
/// `ptr`), as `attention_tma_bwd.cu` adds dQ to it by bulk tensor reductions: 3-D
/// (d, l, heads), box (32, 16, 1) (a consumer warp's 16 rows by 128 bytes), 128-byte
/// swizzle. Errors when the driver refuses it.
pub(super) fn dq_accum_map(
    ptr: u64,
    d: usize,
    l: usize,
    heads: usize,
) -> std::result::Result<TensorMap, String> {
    let dt = sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    encode(ptr, dt, 4, d, l, heads, [32, 16])
}

/// `cuTensorMapEncodeTiled` of a contiguous `[heads, l, d]` tensor of `elem`-byte elements:
/// 3-D (d, l, heads), box (`bx[0]`, `bx[1]`, 1), 128-byte swizzle, 128-byte L2 promotion,
/// out-of-bounds elements read as zeros (and not written).
fn encode(
    ptr: u64,
    dt: sys::CUtensorMapDataType,
    elem: usize,
    d: usize,
    l: usize,
    heads: usize,
    bx: [u32; 2],
) -> std::result::Result<TensorMap, String> {
    use sys::{
        CUtensorMapFloatOOBfill as Oob, CUtensorMapInterleave as Il, CUtensorMapL2promotion as L2,
        CUtensorMapSwizzle as Sw,
    };
    let row = d.checked_mul(elem).ok_or("row bytes overflow")?;
    let plane = row.checked_mul(l).ok_or("plane bytes overflow")?;
    let dims: [u64; 3] = [d as u64, l as u64, heads as u64];
    let strides: [u64; 2] = [row as u64, plane as u64];
    let boxes: [u32; 3] = [bx[0], bx[1], 1];
    let steps: [u32; 3] = [1, 1, 1];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::uninit();
    // SAFETY: every pointer argument points at a live array of the length the call reads
    // for rank 3 (3 dims, 2 strides, 3 box sizes, 3 element strides) and `map` at room for
    // one CUtensorMap, which the call writes whole when it succeeds (checked below). The
    // global address is only recorded in the map, not dereferenced.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dt,
            3,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            Il::CU_TENSOR_MAP_INTERLEAVE_NONE,
            Sw::CU_TENSOR_MAP_SWIZZLE_128B,
            L2::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            Oob::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuTensorMapEncodeTiled: {r:?}"));
    }
    // SAFETY: the call succeeded, so it wrote the whole map.
    let map = unsafe { map.assume_init() };
    Ok(TensorMap(map.opaque))
}
