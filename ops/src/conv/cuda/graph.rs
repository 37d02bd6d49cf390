//! cuDNN's graph (backend) API for one convolution: the operation graph, the engine
//! configurations its heuristic proposes, finalized execution plans, and their launch.
//!
//! The legacy API (`dnn.rs`) reaches only part of cuDNN 9's engines; the fast Hopper
//! kernels for 3×3 and strided convolutions are offered through the graph API alone,
//! which is what PyTorch uses (through cudnn-frontend). [`candidates`] builds the graph
//! of one direction and returns the plans of the heuristic's engine configurations that
//! finalize and pass the numerics filter; the caller benchmarks them on the real
//! buffers, together with the legacy search's choice, and keeps the fastest.
//!
//! Every backend descriptor is owned ([`Desc`], destroyed on drop) and typed: an
//! attribute's element type comes from the Rust type of the values ([`AttrValue`]), so
//! a value can never be passed under the wrong type tag. Like everything cuDNN here,
//! the descriptors are `!Send` and live on one stream actor.

use std::ffi::c_void;

use cudarc::cudnn::sys;
use rtx_runtime::{DType, Result};

use super::dnn::{check, data_type, Dir, Filter, Handle, Io};
use crate::conv::{Conv2dParams, Layout};

use sys::cudnnBackendAttributeName_t as Attr;
use sys::cudnnBackendAttributeType_t as Ty;
use sys::cudnnBackendDescriptorType_t as Kind;

/// Unique ids of the three tensors in a variant pack.
const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_Y: i64 = 3;

/// The heuristic's engine configurations considered per graph at most (mode A proposes
/// a few dozen for common convolutions, most of them knob variants of one engine).
const MAX_CONFIGS: usize = 64;

/// Variant packs kept per plan: the block caches make a stream's buffers recur, so the
/// same (x, w, y, workspace) addresses come back and their pack is reused.
const PACKS_KEPT: usize = 8;

/// A Rust type that is the element type of a backend attribute.
///
/// # Safety
/// `TYPE` must be the backend attribute type whose elements have exactly the layout of
/// `Self` (cuDNN reads and writes `Self` values through untyped pointers).
unsafe trait AttrValue: Copy {
    const TYPE: Ty;
}
// SAFETY: each pairing below is the one cuDNN documents for the attribute type:
// int64_t, float, void*, the enums (C enums, `repr(u32)` here) and the opaque handles.
unsafe impl AttrValue for i64 {
    const TYPE: Ty = Ty::CUDNN_TYPE_INT64;
}
// SAFETY: as above.
unsafe impl AttrValue for f32 {
    const TYPE: Ty = Ty::CUDNN_TYPE_FLOAT;
}
// SAFETY: as above (`DevPtr` is a transparent `void*`).
unsafe impl AttrValue for DevPtr {
    const TYPE: Ty = Ty::CUDNN_TYPE_VOID_PTR;
}
// SAFETY: as above (`Note` is a transparent C enum value).
unsafe impl AttrValue for Note<NUMERICAL> {
    const TYPE: Ty = Ty::CUDNN_TYPE_NUMERICAL_NOTE;
}
// SAFETY: as above.
unsafe impl AttrValue for Note<BEHAVIOR> {
    const TYPE: Ty = Ty::CUDNN_TYPE_BEHAVIOR_NOTE;
}
// SAFETY: as above.
unsafe impl AttrValue for sys::cudnnDataType_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_DATA_TYPE;
}
// SAFETY: as above.
unsafe impl AttrValue for sys::cudnnConvolutionMode_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_CONVOLUTION_MODE;
}
// SAFETY: as above.
unsafe impl AttrValue for sys::cudnnBackendHeurMode_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_HEUR_MODE;
}
// SAFETY: as above.
unsafe impl AttrValue for sys::cudnnHandle_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_HANDLE;
}
// SAFETY: as above.
unsafe impl AttrValue for sys::cudnnBackendDescriptor_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR;
}

/// A device address as a `void*` attribute value (descriptors are `void*` too, so
/// addresses get their own type).
#[derive(Clone, Copy)]
#[repr(transparent)]
struct DevPtr(*mut c_void);

const NUMERICAL: u8 = 0;
const BEHAVIOR: u8 = 1;

/// A numerical or behavior note as the raw C enum value: cuDNN may report notes newer
/// than the bindings' enums know, which must not become invalid Rust enum values.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
struct Note<const KIND: u8>(u32);

/// An owned backend descriptor.
pub(crate) struct Desc(sys::cudnnBackendDescriptor_t);

impl Desc {
    fn new(kind: Kind) -> Result<Self> {
        let mut d: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `d` is a valid out-pointer for the new descriptor.
        check("cudnnBackendCreateDescriptor", unsafe {
            sys::cudnnBackendCreateDescriptor(kind, &mut d)
        })?;
        Ok(Desc(d))
    }

    /// Sets attribute `name` to `vals` (element type from `V`).
    fn set<V: AttrValue>(&self, name: Attr, vals: &[V]) -> Result<()> {
        // SAFETY: the descriptor is live; `vals` holds `vals.len()` elements of the
        // type `V::TYPE` names (the `AttrValue` contract); cuDNN copies them.
        check("cudnnBackendSetAttribute", unsafe {
            sys::cudnnBackendSetAttribute(
                self.0,
                name,
                V::TYPE,
                vals.len() as i64,
                vals.as_ptr() as *const c_void,
            )
        })
    }

    /// Sets a descriptor-valued attribute.
    fn set_descs(&self, name: Attr, descs: &[&Desc]) -> Result<()> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = descs.iter().map(|d| d.0).collect();
        self.set(name, &raw)
    }

    /// Reads up to `out.len()` elements of attribute `name`; returns how many exist.
    fn get<V: AttrValue>(&self, name: Attr, out: &mut [V]) -> Result<usize> {
        let mut n = 0i64;
        // SAFETY: the descriptor is live; `out` has room for `out.len()` elements of
        // `V::TYPE` (the `AttrValue` contract); `n` is a valid out-pointer.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                self.0,
                name,
                V::TYPE,
                out.len() as i64,
                &mut n,
                out.as_mut_ptr() as *mut c_void,
            )
        })?;
        Ok(n.max(0) as usize)
    }

    /// Reads a descriptor-valued attribute into `into` (descriptors created by the
    /// caller with the kind cuDNN fills); returns how many were filled.
    fn get_descs(&self, name: Attr, into: &[Desc]) -> Result<usize> {
        let mut raw: Vec<sys::cudnnBackendDescriptor_t> = into.iter().map(|d| d.0).collect();
        let n = self.get(name, &mut raw)?;
        Ok(n.min(into.len()))
    }

    fn finalize(&self) -> Result<()> {
        // SAFETY: the descriptor is live; finalizing validates its attributes.
        check("cudnnBackendFinalize", unsafe {
            sys::cudnnBackendFinalize(self.0)
        })
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnBackendCreateDescriptor`, destroyed only here.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.0) };
    }
}

/// An execution plan of one engine configuration, ready to launch.
pub(crate) struct GraphPlan {
    // Field order is drop order: the plan before what it was built from (whether
    // cuDNN's plan refers to them after finalizing is not documented, so they live
    // as long as it does).
    plan: Desc,
    /// The variant packs of the last [`PACKS_KEPT`] (x, w, y, workspace) address tuples
    /// (first in, first out).
    packs: std::cell::RefCell<Vec<([u64; 4], Desc)>>,
    _config: [Desc; 2],
    _graph: std::rc::Rc<Vec<Desc>>,
    /// Workspace bytes the plan needs.
    pub workspace: usize,
    /// The engine's global index (for logs).
    pub engine: i64,
}

impl std::fmt::Debug for GraphPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphPlan")
            .field("engine", &self.engine)
            .field("workspace", &self.workspace)
            .finish()
    }
}

impl GraphPlan {
    /// Enqueues the plan on the handle's stream: `y = conv(x, w)`, `dx` or `dw`, with
    /// alpha 1 and beta 0.
    ///
    /// # Safety
    /// `io` must address live buffers of the plan's geometry and dtype on the handle's
    /// device, aligned as the plan was built for, the output not overlapping the inputs;
    /// `ws` must address at least `self.workspace` bytes (or be `(0, 0)` when that is
    /// 0); everything must stay alive until the enqueued work completes.
    pub unsafe fn launch(&self, h: &Handle, io: Io, ws: (u64, usize)) -> Result<()> {
        let key = [io.x, io.w, io.y, ws.0];
        let mut packs = self.packs.borrow_mut();
        let i = match packs.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                if packs.len() == PACKS_KEPT {
                    packs.remove(0);
                }
                packs.push((key, variant_pack(io, ws)?));
                packs.len() - 1
            }
        };
        // SAFETY: handle, plan and pack are live; the pack's pointers and workspace are
        // what the caller guarantees for this call (the pack was built for exactly these
        // addresses); the plan was finalized for this handle.
        check("cudnnBackendExecute", unsafe {
            sys::cudnnBackendExecute(h.raw(), self.plan.0, packs[i].1 .0)
        })
    }
}

/// The variant pack binding the three tensors and the workspace to addresses.
fn variant_pack(io: Io, ws: (u64, usize)) -> Result<Desc> {
    let pack = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    let ptrs = [io.x, io.w, io.y].map(|a| DevPtr(a as *mut c_void));
    pack.set(
        Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
        &[UID_X, UID_W, UID_Y],
    )?;
    pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, &ptrs)?;
    pack.set(
        Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
        &[DevPtr(ws.0 as *mut c_void)],
    )?;
    pack.finalize()?;
    Ok(pack)
}

/// A tensor descriptor: logical dims `[n, c, h, w]` with the strides of `layout`.
fn tensor(uid: i64, dt: DType, dims: [usize; 4], layout: Layout, align: i64) -> Result<Desc> {
    let [_, c, h, w] = dims.map(|v| v as i64);
    let strides = match layout {
        Layout::Nchw => [c * h * w, h * w, w, 1],
        Layout::Nhwc => [h * w * c, 1, w * c, c],
    };
    let d = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    d.set(Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, &[data_type(dt)])?;
    d.set(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims.map(|v| v as i64))?;
    d.set(Attr::CUDNN_ATTR_TENSOR_STRIDES, &strides)?;
    d.set(Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    d.set(Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[align])?;
    d.finalize()?;
    Ok(d)
}

/// Whether an engine with numerical `notes` is allowed under `f` (the legacy search's
/// rules, plus: never half-precision accumulation or down-converted inputs).
fn allows(f: Filter, notes: &[Note<NUMERICAL>]) -> bool {
    use sys::cudnnBackendNumericalNote_t as N;
    let forbidden = |n: &Note<NUMERICAL>| {
        let is = |v: N| n.0 == v as u32;
        // Half-precision accumulation, or inputs converted to a narrower type (f32 with
        // TF32 would overflow above 65504 in f16): below what the legacy path and every
        // op promise.
        is(N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
            || is(N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
            || (f.exact_f32 && is(N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
            || (f.no_fft && is(N::CUDNN_NUMERICAL_NOTE_FFT))
    };
    !notes.iter().any(forbidden)
}

/// The plans cuDNN's heuristic proposes for one convolution, in the heuristic's order,
/// keeping those that finalize, pass `filter` (see [`allows`]), need no runtime compilation and at most
/// `cap` bytes of workspace. `align` is the byte alignment every buffer of the calls
/// will have (a power of two, at most 16). An empty list means the graph API has
/// nothing here (the legacy path serves).
pub(crate) fn candidates(
    h: &Handle,
    p: &Conv2dParams,
    dir: Dir,
    dtype: DType,
    filter: Filter,
    align: i64,
    cap: usize,
) -> Result<Vec<GraphPlan>> {
    let (oh, ow) = p.out_hw();
    let x = tensor(UID_X, dtype, [p.n, p.c_in, p.h, p.w], p.layout, align)?;
    let w = tensor(
        UID_W,
        dtype,
        [p.c_out, p.c_in / p.groups, p.kh, p.kw],
        p.layout,
        align,
    )?;
    let y = tensor(UID_Y, dtype, [p.n, p.c_out, oh, ow], p.layout, align)?;

    let conv = Desc::new(Kind::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    let pair = |a: (usize, usize)| [a.0 as i64, a.1 as i64];
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        &[sys::cudnnDataType_t::CUDNN_DATA_FLOAT],
    )?;
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        &[sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
    )?;
    conv.set(Attr::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2i64])?;
    conv.set(Attr::CUDNN_ATTR_CONVOLUTION_DILATIONS, &pair(p.dilation))?;
    conv.set(Attr::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &pair(p.stride))?;
    conv.set(Attr::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &pair(p.pad))?;
    conv.set(Attr::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &pair(p.pad))?;
    conv.finalize()?;

    let (kind, ax, aw, ay, aconv, aalpha, abeta) = match dir {
        Dir::Forward => (
            Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
        ),
        Dir::BackwardData => (
            Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
        ),
        Dir::BackwardFilter => (
            Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
        ),
    };
    let op = Desc::new(kind)?;
    op.set_descs(ax, &[&x])?;
    op.set_descs(aw, &[&w])?;
    op.set_descs(ay, &[&y])?;
    op.set_descs(aconv, &[&conv])?;
    // Alpha and beta are float for a float-compute convolution.
    op.set(aalpha, &[1f32])?;
    op.set(abeta, &[0f32])?;
    op.finalize()?;

    let graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set(Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, &[h.raw()])?;
    graph.set_descs(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &[&op])?;
    graph.finalize()?;

    // The heuristic's proposals (mode A, else the fallback mode); if it proposes
    // nothing, every engine the graph has, in index order.
    let mut keep = vec![x, w, y, conv, op];
    let mut configs = Vec::new();
    for mode in [
        sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
        sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
    ] {
        match heuristic(&graph, mode) {
            Ok((heur, found)) => {
                tracing::debug!(?mode, proposed = found.len(), "cuDNN graph heuristic");
                keep.push(heur);
                if !found.is_empty() {
                    configs = found;
                    break;
                }
            }
            Err(e) => tracing::debug!(?mode, error = %e, "cuDNN graph heuristic failed"),
        }
    }
    if configs.is_empty() {
        let mut count = [0i64];
        graph.get(
            Attr::CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
            &mut count,
        )?;
        tracing::debug!(engines = count[0], "cuDNN graph: enumerating engines");
        for i in 0..count[0].clamp(0, MAX_CONFIGS as i64) {
            match engine_config(&graph, i) {
                Ok((engine, cfg)) => {
                    keep.push(engine);
                    configs.push(cfg);
                }
                Err(e) => tracing::debug!(engine = i, error = %e, "cuDNN engine unavailable"),
            }
        }
    }
    let filled = configs.len();
    keep.push(graph);

    let keep = std::rc::Rc::new(keep);
    let mut plans = Vec::new();
    for cfg in configs.into_iter().take(filled) {
        match plan_of(h, cfg, filter, cap, &keep) {
            Ok(Ok(plan)) => plans.push(plan),
            Ok(Err(why)) => tracing::debug!(why, "cuDNN engine configuration left out"),
            Err(e) => tracing::debug!(error = %e, "cuDNN engine configuration failed"),
        }
    }
    tracing::debug!(
        ?dir,
        ?dtype,
        candidates = filled,
        usable = plans.len(),
        "cuDNN graph plans"
    );
    Ok(plans)
}

/// The engine configurations cuDNN's heuristic proposes for `graph` in `mode` (at most
/// [`MAX_CONFIGS`]), with the heuristic descriptor they came from.
fn heuristic(graph: &Desc, mode: sys::cudnnBackendHeurMode_t) -> Result<(Desc, Vec<Desc>)> {
    let heur = Desc::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_descs(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?;
    heur.set(Attr::CUDNN_ATTR_ENGINEHEUR_MODE, &[mode])?;
    heur.finalize()?;
    let configs = (0..MAX_CONFIGS)
        .map(|_| Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>>>()?;
    let filled = heur.get_descs(Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS, &configs)?;
    let mut configs = configs;
    configs.truncate(filled);
    Ok((heur, configs))
}

/// Engine `index` of `graph` with its default knobs: (engine, configuration).
fn engine_config(graph: &Desc, index: i64) -> Result<(Desc, Desc)> {
    let engine = Desc::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    engine.set_descs(Attr::CUDNN_ATTR_ENGINE_OPERATION_GRAPH, &[graph])?;
    engine.set(Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX, &[index])?;
    engine.finalize()?;
    let cfg = Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)?;
    cfg.set_descs(Attr::CUDNN_ATTR_ENGINECFG_ENGINE, &[&engine])?;
    cfg.finalize()?;
    Ok((engine, cfg))
}

/// The execution plan of one engine configuration, or why it is left out (its
/// engine's notes, or more than `cap` bytes of workspace).
fn plan_of(
    h: &Handle,
    cfg: Desc,
    filter: Filter,
    cap: usize,
    graph: &std::rc::Rc<Vec<Desc>>,
) -> Result<std::result::Result<GraphPlan, &'static str>> {
    let engine = Desc::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    cfg.get_descs(
        Attr::CUDNN_ATTR_ENGINECFG_ENGINE,
        std::slice::from_ref(&engine),
    )?;
    let mut notes = [Note::<NUMERICAL>(u32::MAX); 16];
    let n = engine.get(Attr::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, &mut notes)?;
    if !allows(filter, &notes[..n.min(notes.len())]) {
        return Ok(Err("numerical notes"));
    }
    let mut behavior = [Note::<BEHAVIOR>(u32::MAX); 16];
    let n = engine.get(Attr::CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, &mut behavior)?;
    let rtc = Note(sys::cudnnBackendBehaviorNote_t::CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION as u32);
    // Runtime-compiled engines take seconds to finalize: not worth it per shape.
    if behavior[..n.min(behavior.len())].contains(&rtc) {
        return Ok(Err("runtime compilation"));
    }
    let mut index = [0i64];
    engine.get(Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX, &mut index)?;

    let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, &[h.raw()])?;
    plan.set_descs(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&cfg])?;
    plan.finalize()?;
    let mut ws = [0i64];
    plan.get(Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, &mut ws)?;
    let workspace = ws[0].max(0) as usize;
    if workspace > cap {
        return Ok(Err("workspace above the cap"));
    }
    Ok(Ok(GraphPlan {
        plan,
        packs: std::cell::RefCell::new(Vec::new()),
        _config: [cfg, engine],
        _graph: graph.clone(),
        workspace,
        engine: index[0],
    }))
}

/// The byte alignment (a power of two, at most 16) every address of `io` has.
pub(crate) fn alignment(io: Io) -> i64 {
    let a = io.x | io.w | io.y;
    if a == 0 {
        16
    } else {
        (1i64 << a.trailing_zeros().min(4)).min(16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::cudnnBackendNumericalNote_t as N;

    fn notes(ns: &[N]) -> Vec<Note<NUMERICAL>> {
        ns.iter().map(|&n| Note(n as u32)).collect()
    }

    #[test]
    fn numerics_filter_follows_the_legacy_rules() {
        let half = Filter {
            exact_f32: false,
            no_fft: false,
        };
        let exact = Filter {
            exact_f32: true,
            no_fft: true,
        };
        let tc = notes(&[N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE]);
        assert!(allows(half, &tc));
        assert!(!allows(exact, &tc), "exact f32: no tensor cores");
        assert!(allows(half, &notes(&[N::CUDNN_NUMERICAL_NOTE_FFT])));
        assert!(!allows(exact, &notes(&[N::CUDNN_NUMERICAL_NOTE_FFT])));
        for never in [
            N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
            N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
        ] {
            assert!(!allows(
                half,
                &notes(&[N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE, never])
            ));
        }
        assert!(allows(exact, &[]));
        assert!(
            allows(half, &[Note(u32::MAX)]),
            "unknown notes are not refused"
        );
    }
}
