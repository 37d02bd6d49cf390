//! CUDA launches of `kernels/cuda/optim.cu`.
//!
//! A step enqueues, on its stream: with loss scaling, `scaler_begin` (copy the state,
//! clear the overflow flag) and one `nonfinite_*` per gradient; then the step itself,
//! `adamw_mt_*` / `sgd_mt_*` launches over up to 48 tensors each (the tensors grouped by
//! gradient dtype; the kernels read the norm and the scaling state from device memory);
//! then `scaler_end`. (The one-tensor kernels `adamw_*` / `sgd_*` stay in optim.cu with
//! the same arithmetic.) Pointers are passed as raw addresses so that
//! an absent operand is a null pointer; every buffer they point to outlives the op's
//! kernels (inputs are held by the op, outputs are returned, and the scratch of
//! `grad_norm` is the stream's persistent one, `StreamCx::scratch`).

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{bf16, f16, Buffer, DType, Element, Error, Result};

use super::cpu::{Hyper, Rule};
use super::step::{Args, Operand, Operands};
use crate::kernels::{
    self, alloc_out, config, device_addr, float_dispatch, grid, launch_error, Input, BLOCK,
};

const MODULE: &str = "optim";

/// Most blocks of one tensor's `sumsq_*` launch.
const SUMSQ_MAX_BLOCKS: usize = 256;

// SAFETY: `Hyper` is `repr(C)` with eight f32 then two i32 fields, the layout of
// `struct Hyper` in optim.cu (40 bytes, 4-aligned), plain numbers valid for any bits.
unsafe impl DeviceRepr for Hyper {}

/// The output buffer of an updatable operand and the address to read it from (the
/// output's own address when donated).
fn operand<T: Element>(
    scx: &StreamCx,
    name: &str,
    n: usize,
    op: Operand<'_>,
) -> Result<(CudaSlice<T>, u64)> {
    let (y, input) = kernels::output_and_input::<T>(scx, name, n, op.0, op.1)?;
    let addr = match input {
        Input::Slice(s) => device_addr(s, scx),
        Input::Alias(a) => a,
    };
    Ok((y, addr))
}

fn f32_addr(scx: &StreamCx, b: &Buffer) -> Result<u64> {
    Ok(device_addr(b.cuda::<f32>()?, scx))
}

/// Enqueues the step; returns the outputs in [`super::StepLayout`] order.
pub(super) fn step(scx: &mut StreamCx, a: &Args, mut o: Operands<'_>) -> Result<Vec<Buffer>> {
    let name = a.name;
    let cfg1 = config(1, 0);
    // Loss scaling: this step's state and overflow flag.
    let scaler = match o.scaler.take() {
        Some(op) => {
            let (s, s_in) = operand::<f32>(scx, name, 4, op)?;
            let s_addr = device_addr(&s, scx);
            let f = kernels::function(scx, MODULE, 0x500, DType::F32, || "scaler_begin".into())?;
            let mut lb = scx.stream().launch_builder(&f);
            lb.arg(&s_in).arg(&s_addr);
            // SAFETY: scaler_begin(const float* in, float* out): both hold the 4-element
            // state (or are the same buffer); one thread copies and clears out[3].
            unsafe { lb.launch(cfg1) }.map_err(|e| launch_error(name, e))?;
            let flag = s_addr + 12;
            for (g, (&gd, &n)) in o.grads.iter().zip(a.gd.iter().zip(&a.numels)) {
                float_dispatch!(gd, name, |G| {
                    let f = kernels::function(scx, MODULE, 0x200, G::DTYPE, || {
                        format!("nonfinite_{}", G::DTYPE.name())
                    })?;
                    let gs = g.cuda::<G>()?;
                    let cfg = config(grid(scx, n.div_ceil(BLOCK as usize)), 0);
                    let mut lb = scx.stream().launch_builder(&f);
                    lb.arg(gs).arg(&n).arg(&flag);
                    // SAFETY: nonfinite_{dt}(const T* g, size_t n, float* flag): `gs`
                    // holds n elements of T; `flag` is element 3 of the state above.
                    unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))
                })?;
            }
            Some((s, s_addr))
        }
        None => None,
    };
    let scaler_addr = scaler.as_ref().map_or(0u64, |s| s.1);
    let norm_addr = match o.norm {
        Some(b) => f32_addr(scx, b)?,
        None => 0,
    };
    let n = a.numels.len();
    let (mut ps, mut ms, mut vs, mut cs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let p = o.params[i].parts();
        let m = o.m.get_mut(i).map(|m| m.parts());
        let v = o.v.get_mut(i).map(|v| v.parts());
        let g = o.grads[i];
        let dst = o.copies.get_mut(i).and_then(Option::take);
        let ((p, m, v, c), e) =
            float_dispatch!(a.pd, name, |P| float_dispatch!(a.gd[i], name, |G| {
                prepare_step::<P, G>(scx, a, i, p, g, m, v, dst)
            }))?;
        entries.push(e);
        ps.push(p);
        ms.extend(m);
        vs.extend(v);
        cs.extend(c);
    }
    let ptrs = Ptrs {
        norm: norm_addr,
        scaler: scaler_addr,
        tstep: match o.tstep {
            Some(b) => f32_addr(scx, b)?,
            None => 0,
        },
    };
    // The tensors of one gradient dtype, RTX_MT_MAX per launch.
    let mut gds: Vec<DType> = a.gd.clone();
    gds.sort_by_key(|d| *d as u16);
    gds.dedup();
    for gd in gds {
        let group: Vec<MtTensor> = (0..n)
            .filter(|&i| a.gd[i] == gd)
            .map(|i| entries[i])
            .collect();
        for chunk in group.chunks(MT_MAX) {
            float_dispatch!(a.pd, name, |P| float_dispatch!(gd, name, |G| {
                launch_multi::<P, G>(scx, a, chunk, ptrs)
            }))?;
        }
    }
    let mut out = ps;
    out.extend(ms);
    out.extend(vs);
    out.extend(cs);
    if let Some((s, s_addr)) = scaler {
        let f = kernels::function(scx, MODULE, 0x600, DType::F32, || "scaler_end".into())?;
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&s_addr).arg(&a.growth);
        // SAFETY: scaler_end(float* s, float growth_interval): `s` is the 4-element state
        // written by scaler_begin above; it runs after every step kernel (stream order).
        unsafe { lb.launch(cfg1) }.map_err(|e| launch_error(name, e))?;
        out.push(Buffer::from_cuda(s));
    }
    Ok(out)
}

#[derive(Clone, Copy)]
struct Ptrs {
    norm: u64,
    scaler: u64,
    tstep: u64,
}

type Stepped = (Buffer, Option<Buffer>, Option<Buffer>, Option<Buffer>);

/// Tensors per multi-tensor launch (`RTX_MT_MAX` in optim.cu): GPT-2 small's 148 tensors
/// in 4 launches (the table is 3848 bytes, under the 4 KiB of kernel parameters every
/// driver takes). On the H200 (kernels/checks/train_kernels_check.py) 4 launches of 48
/// ran 0.884 ms against 0.904 for 7 of 24.
const MT_MAX: usize = 48;
/// Elements per tile of a multi-tensor launch (`RTX_MT_TILE` in optim.cu).
const MT_TILE: usize = 4096;

/// One tensor of a multi-tensor launch: `struct MtTensor` in optim.cu (addresses; 0 for
/// an absent operand).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MtTensor {
    p_in: u64,
    p_out: u64,
    g: u64,
    m_in: u64,
    m_out: u64,
    v_in: u64,
    v_out: u64,
    copy: u64,
    n: u64,
}

/// `struct MtTable` in optim.cu: up to [`MT_MAX`] tensors and their cumulative tiles.
#[repr(C)]
#[derive(Clone, Copy)]
struct MtTable {
    t: [MtTensor; MT_MAX],
    tile_end: [u64; MT_MAX],
    count: i32,
    pad: i32,
}

// SAFETY: `MtTable` is `repr(C)`: 48 `MtTensor` (nine u64 each), 48 u64 and two i32, the
// layout of `struct MtTable` in optim.cu (3848 bytes, 8-aligned), plain integers valid
// for any bits.
unsafe impl DeviceRepr for MtTable {}

/// Allocates tensor `i`'s outputs (the copy into `dst` when donated) and returns them
/// with the addresses its step reads and writes (launched later, with other tensors, by
/// [`launch_multi`]).
#[allow(clippy::too_many_arguments)]
fn prepare_step<P: Element, G: Element>(
    scx: &mut StreamCx,
    a: &Args,
    i: usize,
    p: Operand<'_>,
    g: &Buffer,
    m: Option<Operand<'_>>,
    v: Option<Operand<'_>>,
    dst: Option<Buffer>,
) -> Result<(Stepped, MtTensor)> {
    let (name, n) = (a.name, a.numels[i]);
    let (p_out, p_in) = operand::<P>(scx, name, n, p)?;
    let m = m.map(|m| operand::<P>(scx, name, n, m)).transpose()?;
    let v = v.map(|v| operand::<P>(scx, name, n, v)).transpose()?;
    let copy = match (a.copy, dst) {
        // The plan checked its dtype and shape.
        (Some(DType::F16 | DType::BF16), Some(d)) if d.len() == n => Some(d),
        (Some(DType::F16 | DType::BF16), Some(_)) => {
            return Err(Error::invalid(name, "a copy destination of another length"))
        }
        (Some(DType::F16), None) => Some(Buffer::from_cuda(alloc_out::<f16>(scx, n)?)),
        (Some(DType::BF16), None) => Some(Buffer::from_cuda(alloc_out::<bf16>(scx, n)?)),
        (Some(other), _) => return Err(Error::dtype(name, DType::BF16, other)),
        (None, _) => None,
    };
    let copy_addr = match (&copy, a.copy) {
        (Some(b), Some(DType::F16)) => device_addr(b.cuda::<f16>()?, scx),
        (Some(b), _) => device_addr(b.cuda::<bf16>()?, scx),
        (None, _) => 0,
    };
    let addrs = |s: &Option<(CudaSlice<P>, u64)>| match s {
        Some((out, inp)) => (*inp, device_addr(out, scx)),
        None => (0, 0),
    };
    let (m_in, m_out) = addrs(&m);
    let (v_in, v_out) = addrs(&v);
    let entry = MtTensor {
        p_in,
        p_out: device_addr(&p_out, scx),
        g: device_addr(g.cuda::<G>()?, scx),
        m_in,
        m_out,
        v_in,
        v_out,
        copy: copy_addr,
        n: n as u64,
    };
    let stepped = (
        Buffer::from_cuda(p_out),
        m.map(|(s, _)| Buffer::from_cuda(s)),
        v.map(|(s, _)| Buffer::from_cuda(s)),
        copy,
    );
    Ok((stepped, entry))
}

/// Enqueues one `{rule}_mt_{p}_{g}` launch over `tensors` (at most [`MT_MAX`], each with
/// gradients of type `G`).
fn launch_multi<P: Element, G: Element>(
    scx: &mut StreamCx,
    a: &Args,
    tensors: &[MtTensor],
    ptrs: Ptrs,
) -> Result<()> {
    let name = a.name;
    if tensors.is_empty() {
        return Ok(());
    }
    let (rule, code) = match a.rule {
        Rule::AdamW => ("adamw", 0x10u16),
        Rule::Sgd => ("sgd", 0x11),
    };
    let gd = G::DTYPE;
    let f = kernels::function(scx, MODULE, code << 8 | gd as u16, P::DTYPE, || {
        format!("{rule}_mt_{}_{}", P::DTYPE.name(), gd.name())
    })?;
    let mut tab = MtTable {
        t: [MtTensor::default(); MT_MAX],
        tile_end: [0; MT_MAX],
        count: tensors.len().min(MT_MAX) as i32,
        pad: 0,
    };
    let mut tiles = 0usize;
    for (k, e) in tensors.iter().take(MT_MAX).enumerate() {
        tab.t[k] = *e;
        tiles = tiles
            .checked_add((e.n as usize).div_ceil(MT_TILE))
            .ok_or_else(|| Error::invalid(name, "tile count overflows"))?;
        tab.tile_end[k] = tiles as u64;
    }
    // A block per tile (no cap at one resident wave): on the H200 this ran GPT-2 small's
    // 124M f32 parameters at 3.86 TB/s against 3.67 with the grid capped at 1056 blocks
    // (kernels/checks/train_kernels_check.py).
    let blocks = u32::try_from(tiles).unwrap_or(u32::MAX);
    let cfg = config(blocks.clamp(1, kernels::launch::ELEMENTWISE_MAX_GRID), 0);
    let mut lb = scx.stream().launch_builder(&f);
    lb.arg(&tab)
        .arg(&a.h)
        .arg(&ptrs.norm)
        .arg(&ptrs.scaler)
        .arg(&ptrs.tstep);
    // SAFETY: `{rule}_mt_{p}_{g}(MtTable tab, Hyper h, const float* norm, const float*
    // scaler, const float* tstep)` (tstep null, or the op's one-element f32 input) with P, G the dtypes of every tensor's buffers: each entry's non-null
    // pointers address n elements (prepared by `prepare_step`: *_in a distinct input or
    // the output itself, which the kernel allows; m null only for SGD without momentum, v
    // null for SGD; copy null exactly when h.copy_kind == 0, else n elements of f16 (1)
    // or bf16 (2)); the buffers outlive the launch (inputs held by the op, outputs
    // returned); tile_end holds the cumulative ceil(n / 4096); norm and scaler as for the
    // one-tensor kernel.
    unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    Ok(())
}

/// Enqueues the global norm of `parts` into a new f32 `[1]` tensor.
pub(super) fn grad_norm(scx: &mut StreamCx, parts: &[(&Buffer, DType)]) -> Result<Buffer> {
    let name = "grad_norm";
    let blocks: Vec<usize> = parts
        .iter()
        .map(|(b, _)| {
            grid(scx, b.len().div_ceil(BLOCK as usize)).min(SUMSQ_MAX_BLOCKS as u32) as usize
        })
        .collect();
    let total: usize = blocks.iter().sum();
    // The stream's persistent scratch, so that the norm can be captured into a graph.
    let base = scx.scratch::<f32>("grad_norm.partials", total)?;
    let mut at = 0usize;
    for ((b, d), &nb) in parts.iter().zip(&blocks) {
        let n = b.len();
        let dst = base + (at * 4) as u64;
        float_dispatch!(*d, name, |T| {
            let f = kernels::function(scx, MODULE, 0x300, T::DTYPE, || {
                format!("sumsq_{}", T::DTYPE.name())
            })?;
            let x = b.cuda::<T>()?;
            let mut lb = scx.stream().launch_builder(&f);
            lb.arg(x).arg(&n).arg(&dst);
            // SAFETY: sumsq_{dt}(const T* x, size_t n, float* partials): `x` holds n
            // elements of T; `dst` has room for the grid's `nb` partials (inside the
            // scratch at `base`, which holds at least the sum of all grids).
            unsafe { lb.launch(config(nb as u32, 0)) }.map_err(|e| launch_error(name, e))
        })?;
        at += nb;
    }
    let mut y = alloc_out::<f32>(scx, 1)?;
    let f = kernels::function(scx, MODULE, 0x400, DType::F32, || "sumsq_finish".into())?;
    {
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&base).arg(&total).arg(&mut y);
        // SAFETY: sumsq_finish(const float* partials, size_t count, float* out): all
        // `total` partials were written by the launches above (stream order); `y` holds 1.
        unsafe { lb.launch(config(1, 0)) }.map_err(|e| launch_error(name, e))?;
    }
    Ok(Buffer::from_cuda(y))
}
