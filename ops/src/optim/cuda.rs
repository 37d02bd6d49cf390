//! CUDA launches of `kernels/cuda/optim.cu`.
//!
//! A step enqueues, on its stream: with loss scaling, `scaler_begin` (copy the state,
//! clear the overflow flag) and one `nonfinite_*` per gradient; then one `adamw_*` /
//! `sgd_*` launch per parameter tensor (the kernels read the norm and the scaling state
//! from device memory); then `scaler_end`. Pointers are passed as raw addresses so that
//! an absent operand is a null pointer; every buffer they point to outlives the op's
//! kernels (inputs are held by the op, outputs are returned, and the one scratch
//! buffer of `grad_norm` is freed stream-ordered after them).

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
    for i in 0..n {
        let p = o.params[i].parts();
        let m = o.m.get_mut(i).map(|m| m.parts());
        let v = o.v.get_mut(i).map(|v| v.parts());
        let g = o.grads[i];
        let ptrs = Ptrs {
            norm: norm_addr,
            scaler: scaler_addr,
        };
        let (p, m, v, c) = float_dispatch!(a.pd, name, |P| float_dispatch!(a.gd[i], name, |G| {
            launch_step::<P, G>(scx, a, i, p, g, m, v, ptrs)
        }))?;
        ps.push(p);
        ms.extend(m);
        vs.extend(v);
        cs.extend(c);
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
}

type Stepped = (Buffer, Option<Buffer>, Option<Buffer>, Option<Buffer>);

#[allow(clippy::too_many_arguments)]
fn launch_step<P: Element, G: Element>(
    scx: &mut StreamCx,
    a: &Args,
    i: usize,
    p: Operand<'_>,
    g: &Buffer,
    m: Option<Operand<'_>>,
    v: Option<Operand<'_>>,
    ptrs: Ptrs,
) -> Result<Stepped> {
    let (name, n) = (a.name, a.numels[i]);
    let (rule, code) = match a.rule {
        Rule::AdamW => ("adamw", 0u16),
        Rule::Sgd => ("sgd", 1),
    };
    let gd = G::DTYPE;
    let f = kernels::function(scx, MODULE, code << 8 | gd as u16, P::DTYPE, || {
        format!("{rule}_{}_{}", P::DTYPE.name(), gd.name())
    })?;
    let (p_out, p_in) = operand::<P>(scx, name, n, p)?;
    let m = m.map(|m| operand::<P>(scx, name, n, m)).transpose()?;
    let v = v.map(|v| operand::<P>(scx, name, n, v)).transpose()?;
    let copy = match a.copy {
        Some(DType::F16) => Some(Buffer::from_cuda(alloc_out::<f16>(scx, n)?)),
        Some(DType::BF16) => Some(Buffer::from_cuda(alloc_out::<bf16>(scx, n)?)),
        Some(other) => return Err(Error::dtype(name, DType::BF16, other)),
        None => None,
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
    let p_out_addr = device_addr(&p_out, scx);
    let (m_in, m_out) = addrs(&m);
    let (v_in, v_out) = addrs(&v);
    let gs = g.cuda::<G>()?;
    let cfg = config(grid(scx, n.div_ceil(BLOCK as usize)), 0);
    {
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&p_in).arg(&p_out_addr).arg(gs);
        lb.arg(&m_in)
            .arg(&m_out)
            .arg(&v_in)
            .arg(&v_out)
            .arg(&copy_addr);
        lb.arg(&n).arg(&a.h).arg(&ptrs.norm).arg(&ptrs.scaler);
        // SAFETY: `{rule}_{p}_{g}(const P* p_in, P* p_out, const G* g, const P* m_in, P*
        // m_out, const P* v_in, P* v_out, void* copy, size_t n, Hyper h, const float*
        // norm, const float* scaler)` with P, G the dtypes of the buffers; every non-null
        // pointer addresses n elements (the state f32[4] and norm f32[1] for the last
        // two), *_in is a distinct input or the output itself (donated, which the kernel
        // allows); m is null only for SGD without momentum, v null for SGD; copy is
        // null exactly when h.copy_kind == 0, else n elements of f16 (1) or bf16 (2).
        unsafe { lb.launch(cfg) }.map_err(|e| launch_error(name, e))?;
    }
    Ok((
        Buffer::from_cuda(p_out),
        m.map(|(s, _)| Buffer::from_cuda(s)),
        v.map(|(s, _)| Buffer::from_cuda(s)),
        copy,
    ))
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
    let partials = scx.alloc::<f32>(total)?;
    let base = device_addr(&partials, scx);
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
            // elements of T; `dst` has room for the grid's `nb` partials (inside
            // `partials`, which holds the sum of all grids).
            unsafe { lb.launch(config(nb as u32, 0)) }.map_err(|e| launch_error(name, e))
        })?;
        at += nb;
    }
    let mut y = alloc_out::<f32>(scx, 1)?;
    let f = kernels::function(scx, MODULE, 0x400, DType::F32, || "sumsq_finish".into())?;
    {
        let mut lb = scx.stream().launch_builder(&f);
        lb.arg(&partials).arg(&total).arg(&mut y);
        // SAFETY: sumsq_finish(const float* partials, size_t count, float* out): all
        // `total` partials were written by the launches above (stream order); `y` holds 1.
        unsafe { lb.launch(config(1, 0)) }.map_err(|e| launch_error(name, e))?;
    }
    Ok(Buffer::from_cuda(y))
}
