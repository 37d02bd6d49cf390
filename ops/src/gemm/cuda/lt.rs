//! cuBLASLt at the `result`/`sys` level: owned handles and descriptors, and a
//! [`LtPlan`] — the matmul descriptor, the three matrix layouts and the heuristic's
//! candidate algorithms, one of them chosen (`tune.rs`) — built once per problem and
//! replayed by [`LtPlan::launch`].
//!
//! cudarc's safe `CudaBlasLT::matmul` rebuilds every descriptor and reruns the
//! heuristic on each call, and keeps its workspace private; this module exists so the
//! per-stream plan cache (`cuda.rs`) can skip both on the hot path.
//!
//! # Row-major through a column-major library
//!
//! rtx tensors are row-major; cuBLASLt is column-major. A row-major `C = A·B` (`m × n`)
//! is the column-major `Cᵀ = Bᵀ·Aᵀ` (`n × m`) over the *same* memory, so every plan
//! passes our `B` as cuBLASLt's `A`, our `A` as its `B`, and swaps `m` and `n`. A
//! stored transpose flips the corresponding op (`N` ↔ `T`). The linear epilogue's bias
//! runs along cuBLASLt's rows (`n` of them), which are our columns: exactly `x·wᵀ + b`.

use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use rtx_runtime::{DType, Result};

use super::device::cublas_error;
use super::tune::CANDIDATES;
use crate::gemm::Activation;

use sys::cublasLtMatmulDescAttributes_t as DescAttr;
use sys::cublasLtMatmulPreferenceAttributes_t as PrefAttr;
use sys::cublasLtMatrixLayoutAttribute_t as LayoutAttr;

/// Everything that selects a plan. Two calls with equal keys can share descriptors,
/// layouts and algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a_bs: usize,
    pub b_bs: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    /// Whether a bias vector is added (linear epilogue).
    pub bias: bool,
    /// The fused activation (linear epilogue).
    pub act: Activation,
    /// f32 only: TF32 tensor cores allowed.
    pub tf32: bool,
    /// Alignment in bytes of our A, our B, the output and the bias pointers.
    pub align: [u32; 4],
    /// A training epilogue (aux input/output or bias gradient) replacing the one that
    /// `bias` and `act` select; see [`Fusion`].
    pub fused: Option<Fusion>,
    /// The multiprocessors cuBLASLt plans for (`SM_COUNT_TARGET`); 0: the whole device
    /// (see `Settings::gemm_sm_share`).
    pub sm_target: u32,
}

/// Which training epilogue a plan uses (`backward.rs` decides where each applies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum FusedKind {
    /// `GELU_AUX` / `GELU_AUX_BIAS` (with `bias`): `D = gelu(A·B + bias)` and the aux
    /// matrix `A·B + bias` (the pre-activation) in D's dtype and layout.
    GeluAux,
    /// `DGELU`: `D = (A·B) ⊙ gelu'(aux)`, the aux matrix in D's dtype and layout.
    DGelu,
    /// `BGRADB`: `D = A·B` and, through the bias pointer, the bias gradient: the sums
    /// of cuBLASLt's `op(B)` over `k`, one per column of D — with our operands swapped
    /// (see the module docs), the sums over `k` of our `op(A)`, one per row of our
    /// output.
    BgradB,
}

/// A training epilogue and what its aux matrix needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Fusion {
    /// The epilogue.
    pub kind: FusedKind,
    /// The aux matrix's leading dimension in elements (cuBLASLt requires a multiple of
    /// 8 for GELU aux); 0 for `BgradB`.
    pub aux_ld: usize,
    /// The alignment in bytes of the aux pointer (256 when there is none).
    pub aux_align: u32,
}

/// An owned cuBLASLt handle (destroyed on drop).
pub(crate) struct LtHandle(sys::cublasLtHandle_t);

impl LtHandle {
    /// A new handle; the CUDA context must be current on this thread.
    pub fn new() -> Result<Self> {
        lt::create_handle()
            .map(LtHandle)
            .map_err(|e| cublas_error("cublasLtCreate", e.0))
    }
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `cublasLtCreate` and is destroyed only here.
        // Work enqueued with it is stream-ordered and does not reference the handle.
        // A failure cannot be reported from `drop` and leaks at most the handle.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

/// An owned matmul descriptor.
struct Desc(sys::cublasLtMatmulDesc_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulDescCreate`, destroyed only here.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

impl Desc {
    /// Sets a descriptor attribute to the bytes of `value`.
    fn set<V>(&self, attr: DescAttr, value: &V) -> Result<()> {
        // SAFETY: `self.0` is a live descriptor; `value` points to `size_of::<V>()`
        // readable bytes, which cuBLASLt copies before returning. Callers pass the
        // attribute's documented type (i32 ops, u32 epilogue, u64 pointer).
        unsafe {
            lt::set_matmul_desc_attribute(
                self.0,
                attr,
                value as *const V as *const c_void,
                size_of::<V>(),
            )
        }
        .map_err(|e| cublas_error("cublasLtMatmulDescSetAttribute", e.0))
    }
}

/// An owned matrix layout.
struct Layout(sys::cublasLtMatrixLayout_t);

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatrixLayoutCreate`, destroyed only here.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

impl Layout {
    /// A column-major `rows × cols` layout with leading dimension `rows`, repeated
    /// `batch` times `stride` elements apart (stride 0 broadcasts).
    fn new(
        dt: sys::cudaDataType,
        rows: usize,
        cols: usize,
        batch: usize,
        stride: usize,
    ) -> Result<Self> {
        let l = lt::create_matrix_layout(dt, rows as u64, cols as u64, rows as i64)
            .map(Layout)
            .map_err(|e| cublas_error("cublasLtMatrixLayoutCreate", e.0))?;
        if batch > 1 {
            l.set(
                LayoutAttr::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                &(batch as i32),
            )?;
            l.set(
                LayoutAttr::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &(stride as i64),
            )?;
        }
        Ok(l)
    }

    fn set<V>(&self, attr: LayoutAttr, value: &V) -> Result<()> {
        // SAFETY: `self.0` is a live layout; `value` points to `size_of::<V>()` readable
        // bytes of the attribute's documented type (i32 count, i64 offset), copied
        // before the call returns.
        unsafe {
            lt::set_matrix_layout_attribute(
                self.0,
                attr,
                value as *const V as *const c_void,
                size_of::<V>(),
            )
        }
        .map_err(|e| cublas_error("cublasLtMatrixLayoutSetAttribute", e.0))
    }
}

/// An owned heuristic preference.
struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulPreferenceCreate`, destroyed only here.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

impl Pref {
    fn set<V>(&self, attr: PrefAttr, value: &V) -> Result<()> {
        // SAFETY: `self.0` is a live preference; `value` points to `size_of::<V>()`
        // readable bytes of the attribute's documented type (u64 bytes, u32 alignment).
        unsafe {
            lt::set_matmul_pref_attribute(
                self.0,
                attr,
                value as *const V as *const c_void,
                size_of::<V>(),
            )
        }
        .map_err(|e| cublas_error("cublasLtMatmulPreferenceSetAttribute", e.0))
    }
}

/// The cuBLASLt data type of a storage dtype (the caller validated it is a float).
fn data_type(dt: DType) -> sys::cudaDataType {
    match dt {
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        _ => sys::cudaDataType::CUDA_R_32F,
    }
}

/// The epilogue for (bias?, activation), or the training epilogue when there is one.
fn epilogue(bias: bool, act: Activation, fused: Option<Fusion>) -> sys::cublasLtEpilogue_t {
    use sys::cublasLtEpilogue_t as E;
    if let Some(f) = fused {
        return match (f.kind, bias) {
            (FusedKind::GeluAux, false) => E::CUBLASLT_EPILOGUE_GELU_AUX,
            (FusedKind::GeluAux, true) => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            (FusedKind::DGelu, _) => E::CUBLASLT_EPILOGUE_DGELU,
            (FusedKind::BgradB, _) => E::CUBLASLT_EPILOGUE_BGRADB,
        };
    }
    match (bias, act) {
        (false, Activation::None) => E::CUBLASLT_EPILOGUE_DEFAULT,
        (false, Activation::Relu) => E::CUBLASLT_EPILOGUE_RELU,
        (false, Activation::Gelu) => E::CUBLASLT_EPILOGUE_GELU,
        (true, Activation::None) => E::CUBLASLT_EPILOGUE_BIAS,
        (true, Activation::Relu) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
        (true, Activation::Gelu) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
    }
}

/// A ready-to-launch cuBLASLt matmul: descriptors, layouts and the chosen algorithm.
/// It lives on one stream actor (the descriptors are host objects of that actor).
pub(crate) struct LtPlan {
    desc: Desc,
    /// cuBLASLt's A: our B.
    a: Layout,
    /// cuBLASLt's B: our A.
    b: Layout,
    /// C and D: the output.
    d: Layout,
    /// The heuristic's candidates, best predicted first (each within the workspace);
    /// never empty.
    algos: Vec<sys::cublasLtMatmulAlgo_t>,
    /// The one [`LtPlan::launch`] uses (`tune.rs` may choose another than the first).
    chosen: usize,
}

/// The device addresses of one call.
pub(crate) struct Ptrs {
    /// Our A (`[.., m, k]` or transposed).
    pub a: u64,
    /// Our B.
    pub b: u64,
    /// The output.
    pub d: u64,
    /// The bias vector, if the epilogue adds one.
    pub bias: Option<u64>,
    /// The workspace and its size in bytes.
    pub workspace: (u64, usize),
}

impl LtPlan {
    /// Builds the descriptors for `key` and asks the heuristic for its best algorithms
    /// (up to [`CANDIDATES`], the first chosen). `Ok(None)` when cuBLASLt has no
    /// algorithm for this problem (the caller falls back to cuBLAS); `bias` is the bias
    /// address the heuristic sees (alignment). Errors only when a descriptor cannot be
    /// built.
    pub fn new(
        handle: &LtHandle,
        key: &PlanKey,
        bias: Option<u64>,
        workspace: usize,
    ) -> Result<Option<Self>> {
        Self::with_aux(handle, key, bias, None, workspace)
    }

    /// [`LtPlan::new`] for a plan with a training epilogue (`key.fused`): `bias` is then
    /// the bias-gradient output for `BgradB`, and `aux` the aux matrix's address (for
    /// its alignment) for `GeluAux` / `DGelu`.
    pub fn with_aux(
        handle: &LtHandle,
        key: &PlanKey,
        bias: Option<u64>,
        aux: Option<u64>,
        workspace: usize,
    ) -> Result<Option<Self>> {
        use sys::cublasComputeType_t as C;
        let compute = match (key.dtype, key.tf32) {
            (DType::F32, true) => C::CUBLAS_COMPUTE_32F_FAST_TF32,
            _ => C::CUBLAS_COMPUTE_32F,
        };
        let desc = lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F)
            .map(Desc)
            .map_err(|e| cublas_error("cublasLtMatmulDescCreate", e.0))?;
        // cublasOperation_t: 0 = N, 1 = T.
        desc.set(DescAttr::CUBLASLT_MATMUL_DESC_TRANSA, &(key.trans_b as i32))?;
        desc.set(DescAttr::CUBLASLT_MATMUL_DESC_TRANSB, &(key.trans_a as i32))?;
        desc.set(
            DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epilogue(key.bias, key.act, key.fused),
        )?;
        if let Some(ptr) = bias {
            desc.set(DescAttr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr)?;
        }
        if key.sm_target > 0 {
            desc.set(
                DescAttr::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                &(key.sm_target.min(i32::MAX as u32) as i32),
            )?;
        }
        if let (Some(f), Some(ptr)) = (key.fused, aux) {
            // The aux dtype is left at its default (D's dtype: cuBLASLt takes another
            // only for narrow-precision kernels); the pointer is set now because the
            // heuristic reads its alignment, and again at every launch.
            desc.set(DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ptr)?;
            desc.set(
                DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                &(f.aux_ld as i64),
            )?;
        }
        let dt = data_type(key.dtype);
        let (m, n, k) = (key.m, key.n, key.k);
        // Column-major shapes as stored: our B is n×k (k×n when transposed), our A is
        // k×m (m×k when transposed), the output n×m.
        let (ar, ac) = if key.trans_b { (k, n) } else { (n, k) };
        let (br, bc) = if key.trans_a { (m, k) } else { (k, m) };
        let a = Layout::new(dt, ar, ac, key.batch, key.b_bs)?;
        let b = Layout::new(dt, br, bc, key.batch, key.a_bs)?;
        let d = Layout::new(dt, n, m, key.batch, m * n)?;
        let pref = lt::create_matmul_pref()
            .map(Pref)
            .map_err(|e| cublas_error("cublasLtMatmulPreferenceCreate", e.0))?;
        pref.set(
            PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &(workspace as u64),
        )?;
        let [al_a, al_b, al_d, _] = key.align;
        pref.set(PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b)?;
        pref.set(PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a)?;
        pref.set(PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d)?;
        pref.set(PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d)?;
        // SAFETY: an all-zero heuristic result is a valid value of the plain-data
        // struct (status 0 is SUCCESS); only the `count` results cuBLASLt reports are read.
        let mut results: [sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] =
            unsafe { std::mem::zeroed() };
        let mut count = 0i32;
        // SAFETY: every descriptor, layout and the preference is live (owned above);
        // `results` has room for the `CANDIDATES` requested and `count` is writable.
        let status = unsafe {
            sys::cublasLtMatmulAlgoGetHeuristic(
                handle.0,
                desc.0,
                a.0,
                b.0,
                d.0,
                d.0,
                pref.0,
                CANDIDATES as i32,
                results.as_mut_ptr(),
                &mut count,
            )
        };
        use sys::cublasStatus_t as S;
        // Any heuristic failure (NOT_SUPPORTED, or INVALID_VALUE for a combination this
        // cuBLASLt does not take) means "no algorithm": the caller falls back to cuBLAS
        // and counts it (`gemm_lt_fallbacks`).
        if status != S::CUBLAS_STATUS_SUCCESS {
            return Ok(None);
        }
        let reported = usize::try_from(count).unwrap_or(0).min(CANDIDATES);
        let usable: Vec<&sys::cublasLtMatmulHeuristicResult_t> = results[..reported]
            .iter()
            .filter(|r| r.state == S::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= workspace)
            .collect();
        let Some(first) = usable.first() else {
            return Ok(None);
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            let cfg = |attr| algo_config(&first.algo, attr);
            use sys::cublasLtMatmulAlgoConfigAttributes_t as C;
            tracing::debug!(
                dtype = ?key.dtype, m = key.m, n = key.n, k = key.k, batch = key.batch,
                act = ?key.act, bias = key.bias,
                algo = cfg(C::CUBLASLT_ALGO_CONFIG_ID),
                tile = cfg(C::CUBLASLT_ALGO_CONFIG_TILE_ID),
                stages = cfg(C::CUBLASLT_ALGO_CONFIG_STAGES_ID),
                splitk = cfg(C::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                swizzle = cfg(C::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                cluster = cfg(C::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                waves = first.wavesCount,
                workspace = first.workspaceSize,
                candidates = usable.len(),
                "cuBLASLt plan"
            );
        }
        let algos = usable.iter().map(|r| r.algo).collect();
        Ok(Some(LtPlan {
            desc,
            a,
            b,
            d,
            algos,
            chosen: 0,
        }))
    }

    /// How many candidate algorithms the heuristic offered (at least 1).
    pub fn candidates(&self) -> usize {
        self.algos.len()
    }

    /// Makes candidate `i` (clamped to the last) the one [`LtPlan::launch`] uses.
    pub fn choose(&mut self, i: usize) {
        self.chosen = i.min(self.algos.len() - 1);
    }

    /// Enqueues `D = A·B (+ bias, activation)` on `stream`.
    ///
    /// # Safety
    /// The addresses in `p` must be live device allocations on the plan's device, large
    /// enough for the plan's shapes (our A, our B, the output, the bias with `n`
    /// elements when the plan adds one, and the workspace), of the plan's dtype, and
    /// stay alive until the enqueued work completes; the output must not overlap the
    /// inputs; `handle` must be the handle the plan was built with.
    pub unsafe fn launch(
        &self,
        handle: &LtHandle,
        p: &Ptrs,
        stream: sys::cudaStream_t,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller (same contract, no aux matrix).
        unsafe { self.launch_aux(handle, p, None, stream) }
    }

    /// [`LtPlan::launch`] for a plan with a training epilogue: `aux` is the aux matrix
    /// (written by `GeluAux`, read by `DGelu`), `p.bias` the bias-gradient output of
    /// `BgradB`.
    ///
    /// # Safety
    /// As [`LtPlan::launch`]; besides, `aux` (when given) must be a live allocation of
    /// the plan's dtype holding the plan's output shape with its leading dimension, not
    /// overlapping the output, and for `BgradB` `p.bias` must hold one element per row
    /// of our output (written, so it must overlap no input).
    pub unsafe fn launch_aux(
        &self,
        handle: &LtHandle,
        p: &Ptrs,
        aux: Option<u64>,
        stream: sys::cudaStream_t,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller (same contract); `chosen` is in range.
        unsafe { self.launch_candidate(self.chosen, handle, p, aux, stream) }
    }

    /// [`LtPlan::launch_aux`] with candidate `i` (clamped to the last) instead of the
    /// chosen one: for timing the candidates (`tune.rs`).
    ///
    /// # Safety
    /// As [`LtPlan::launch_aux`].
    pub unsafe fn launch_candidate(
        &self,
        i: usize,
        handle: &LtHandle,
        p: &Ptrs,
        aux: Option<u64>,
        stream: sys::cudaStream_t,
    ) -> Result<()> {
        let algo = &self.algos[i.min(self.algos.len() - 1)];
        if let Some(aux) = aux {
            self.desc
                .set(DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux)?;
        }
        if let Some(bias) = p.bias {
            self.desc
                .set(DescAttr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
        }
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: the caller guarantees the addresses (see `# Safety`); descriptors,
        // layouts and `algo` (one of the heuristic's results for them, each within the
        // workspace) are live and were validated together by the heuristic;
        // alpha and beta are host f32 scalars matching the f32 scale type and the
        // default host pointer mode. With beta = 0, C (= D) is not read.
        unsafe {
            lt::matmul(
                handle.0,
                self.desc.0,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                p.b as *const c_void,
                self.a.0,
                p.a as *const c_void,
                self.b.0,
                p.d as *const c_void,
                self.d.0,
                p.d as *mut c_void,
                self.d.0,
                algo,
                p.workspace.0 as *mut c_void,
                p.workspace.1,
                stream,
            )
        }
        .map_err(|e| cublas_error("cublasLtMatmul", e.0))
    }
}

/// One integer attribute of an algorithm's configuration (for the plan's debug event);
/// -1 when cuBLASLt does not report it.
fn algo_config(
    algo: &sys::cublasLtMatmulAlgo_t,
    attr: sys::cublasLtMatmulAlgoConfigAttributes_t,
) -> i64 {
    use sys::cublasLtMatmulAlgoConfigAttributes_t as C;
    // cuBLASLt takes only the attribute's own size: 16-bit shape ids, else 32 bits.
    let size = match attr {
        C::CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID | C::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID => 2,
        _ => 4,
    };
    let mut v: u32 = 0;
    let mut written = 0usize;
    // SAFETY: `algo` is a live algorithm value; `v` has room for the `size` (2 or 4)
    // bytes passed, and cuBLASLt writes at most that many, little-endian, into the
    // zeroed buffer.
    let st = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            attr,
            (&mut v as *mut u32).cast(),
            size,
            &mut written,
        )
    };
    if st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        // The algorithm id is signed; the others are unsigned.
        if attr == C::CUBLASLT_ALGO_CONFIG_ID {
            i64::from(v as i32)
        } else {
            i64::from(v)
        }
    } else {
        -1
    }
}
