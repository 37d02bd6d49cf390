//! The [`Step`] op: validation, output layout and backend dispatch of [`super::sgd`] and
//! [`super::adamw`].

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Tensor,
    TensorSpec,
};

use super::cpu::{self, Controls, Hyper, Rule};
use crate::cpu_util::Float;
use crate::kernels::{count_donation, float_dispatch};

/// A fused optimizer step over a list of parameters, built by [`super::sgd`] or
/// [`super::adamw`] and refined by [`Step::clip_grad_norm`], [`Step::loss_scaling`] and
/// [`Step::with_copy`].
pub struct Step {
    pub(super) rule: Rule,
    pub(super) h: Hyper,
    pub(super) params: Vec<Tensor>,
    pub(super) grads: Vec<Tensor>,
    pub(super) m: Vec<Tensor>,
    pub(super) v: Vec<Tensor>,
    pub(super) norm: Option<Tensor>,
    pub(super) scaler: Option<Tensor>,
    pub(super) growth_interval: u32,
    pub(super) copy: Option<DType>,
    /// Where the copies go, donated ([`Step::copy_into`]); empty: fresh buffers.
    pub(super) copy_into: Vec<Tensor>,
    pub(super) step_count: Option<Tensor>,
}

/// Where a [`Step`]'s outputs are in its `Vec<Tensor>`: `tensors` parameters, then
/// `states` groups of `tensors` states each (SGD with momentum: the buffers; AdamW: `m`
/// then `v`), then `tensors` low-precision copies when `copies`, then the loss-scaling
/// state when `scaler`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLayout {
    /// Parameters in the step.
    pub tensors: usize,
    /// State tensors per parameter (0, 1 or 2).
    pub states: usize,
    /// Whether copies are written.
    pub copies: bool,
    /// Whether the loss-scaling state is an output.
    pub scaler: bool,
}

/// A step's outputs by role (from [`StepLayout::split`]).
#[derive(Debug)]
pub struct StepOutputs {
    /// The updated parameters.
    pub params: Vec<Tensor>,
    /// The updated states, one `Vec` per kind (SGD: `[momentum]`; AdamW: `[m, v]`).
    pub states: Vec<Vec<Tensor>>,
    /// The low-precision copies (empty without [`Step::with_copy`]).
    pub copies: Vec<Tensor>,
    /// The advanced loss-scaling state.
    pub scaler: Option<Tensor>,
}

impl StepLayout {
    /// How many outputs.
    pub fn len(&self) -> usize {
        self.tensors * (1 + self.states + self.copies as usize) + self.scaler as usize
    }
    /// Whether there are none (never, for a valid step).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Splits the output vector by role.
    pub fn split(&self, outs: Vec<Tensor>) -> StepOutputs {
        let mut it = outs.into_iter();
        let n = self.tensors;
        let params = it.by_ref().take(n).collect();
        let states = (0..self.states)
            .map(|_| it.by_ref().take(n).collect())
            .collect();
        let copies = if self.copies {
            it.by_ref().take(n).collect()
        } else {
            Vec::new()
        };
        StepOutputs {
            params,
            states,
            copies,
            scaler: it.next(),
        }
    }
}

impl Step {
    pub(super) fn new(
        rule: Rule,
        h: Hyper,
        params: Vec<Tensor>,
        grads: &[Tensor],
        m: Vec<Tensor>,
        v: Vec<Tensor>,
    ) -> Self {
        Step {
            rule,
            h,
            params,
            grads: grads.to_vec(),
            m,
            v,
            norm: None,
            scaler: None,
            growth_interval: 2000,
            copy: None,
            copy_into: Vec::new(),
            step_count: None,
        }
    }
    /// Clips the gradients by their global norm: `norm` is a one-element f32 tensor
    /// (from [`super::grad_norm`] of the same gradients, on the device); the update uses
    /// `g * min(1, max_norm / (norm + 1e-6))` (with loss scaling, of the unscaled norm),
    /// as `torch.nn.utils.clip_grad_norm_`.
    pub fn clip_grad_norm(mut self, norm: &Tensor, max_norm: f32) -> Self {
        self.norm = Some(norm.clone());
        self.h.max_norm = max_norm;
        self
    }
    /// Dynamic loss scaling with the state `state` (f32, shape `[4]`, see the module
    /// docs), donated; the scale doubles after `growth_interval` good steps.
    pub fn loss_scaling(mut self, state: Tensor, growth_interval: u32) -> Self {
        self.scaler = Some(state);
        self.growth_interval = growth_interval;
        self
    }
    /// AdamW's step number (for the bias corrections) read on the device from `t`, a
    /// one-element f32 tensor holding `1, 2, ...` (an exact integer up to 2^24; the
    /// step's own `t` is then unused), instead of the host scalar given to
    /// [`super::adamw`]. So a step captured into a graph stays correct on every launch
    /// when the counter is a graph state advanced by an op of the graph
    /// (`rtx_runtime::Capture::state`). SGD reads no step number and ignores it.
    pub fn step_count(mut self, t: &Tensor) -> Self {
        self.step_count = Some(t.clone());
        self
    }
    /// Also writes each updated parameter rounded to `dtype` (f16 or bf16).
    pub fn with_copy(mut self, dtype: DType) -> Self {
        self.copy = Some(dtype);
        self.h.copy_kind = super::copy_kind(Some(dtype));
        self
    }
    /// Writes the copies of [`Step::with_copy`] into `dsts` (one per parameter, of its
    /// shape and the copy's dtype; their contents are not read), each *donated*: where
    /// the handle given is the last one to its memory (a parameter's previous
    /// low-precision value, say), the copy is written there instead of into a fresh
    /// buffer. In a captured training step whose low-precision parameters are graph
    /// states, this is what lets the step update them in place
    /// (`rtx_runtime::Graph::in_place_states`). Get them back from a rejected step with
    /// [`Step::take_copy_dsts`].
    pub fn copy_into(mut self, dsts: Vec<Tensor>) -> Self {
        self.copy_into = dsts;
        self
    }
    /// The tensors given to [`Step::copy_into`] (for instance from a rejected
    /// submission), leaving none.
    pub fn take_copy_dsts(&mut self) -> Vec<Tensor> {
        std::mem::take(&mut self.copy_into)
    }
    /// Where the outputs are.
    pub fn layout(&self) -> StepLayout {
        StepLayout {
            tensors: self.params.len(),
            states: self.states(),
            copies: self.copy.is_some(),
            scaler: self.scaler.is_some(),
        }
    }
    /// Gives the tensors back (for instance from a rejected submission): parameters,
    /// gradients, first states, second states.
    pub fn into_tensors(self) -> (Vec<Tensor>, Vec<Tensor>, Vec<Tensor>, Vec<Tensor>) {
        (self.params, self.grads, self.m, self.v)
    }
    /// The loss-scaling state, if any (for instance from a rejected submission).
    pub fn scaler(&self) -> Option<&Tensor> {
        self.scaler.as_ref()
    }
    fn states(&self) -> usize {
        match self.rule {
            Rule::AdamW => 2,
            Rule::Sgd if self.h.momentum != 0.0 => 1,
            Rule::Sgd => 0,
        }
    }
    fn check_hyper(&self) -> Result<()> {
        let name = self.name();
        let h = &self.h;
        let bad = |what: String| Err(Error::invalid(name, what));
        if !(h.lr.is_finite() && h.lr >= 0.0) {
            return bad(format!("learning rate {} must be finite and >= 0", h.lr));
        }
        if !(h.wd.is_finite() && h.wd >= 0.0) {
            return bad(format!("weight decay {} must be finite and >= 0", h.wd));
        }
        match self.rule {
            Rule::AdamW => {
                for b in [h.beta1, h.beta2] {
                    if !(0.0..1.0).contains(&b) {
                        return bad(format!("beta {b} must be in [0, 1)"));
                    }
                }
                if !(h.eps.is_finite() && h.eps > 0.0) {
                    return bad(format!("eps {} must be finite and > 0", h.eps));
                }
                if !(1.0..=16_777_216.0).contains(&h.t) {
                    return bad(format!("step {} must be in 1..=2^24", h.t));
                }
            }
            Rule::Sgd => {
                if !(h.momentum.is_finite() && h.momentum >= 0.0) {
                    return bad(format!("momentum {} must be finite and >= 0", h.momentum));
                }
                if h.nesterov != 0 && h.momentum == 0.0 {
                    return bad("Nesterov momentum needs momentum > 0".into());
                }
            }
        }
        if self.norm.is_some() && !(h.max_norm.is_finite() && h.max_norm > 0.0) {
            return bad(format!("max_norm {} must be finite and > 0", h.max_norm));
        }
        if self.scaler.is_some() && self.growth_interval == 0 {
            return bad("growth_interval must be >= 1".into());
        }
        Ok(())
    }
}

impl Op for Step {
    type Output = Vec<Tensor>;
    fn name(&self) -> &'static str {
        match self.rule {
            Rule::AdamW => "adamw",
            Rule::Sgd => "sgd",
        }
    }
    fn inputs(&self) -> Vec<&Tensor> {
        let mut v: Vec<&Tensor> = self.params.iter().collect();
        v.extend(&self.grads);
        v.extend(&self.m);
        v.extend(&self.v);
        v.extend(self.norm.as_ref());
        v.extend(self.scaler.as_ref());
        v.extend(self.step_count.as_ref());
        v.extend(&self.copy_into);
        v
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let name = self.name();
        self.check_hyper()?;
        let n = self.params.len();
        if n == 0 {
            return Err(Error::invalid(name, "no parameters"));
        }
        let states = self.states();
        let lists = [
            ("gradients", self.grads.len(), n),
            (
                "first states",
                self.m.len(),
                if states >= 1 { n } else { 0 },
            ),
            (
                "second states",
                self.v.len(),
                if states == 2 { n } else { 0 },
            ),
        ];
        for (what, got, want) in lists {
            if got != want {
                return Err(Error::invalid(
                    name,
                    format!("{got} {what} for {n} parameters (want {want})"),
                ));
            }
        }
        let pd = self.params[0].dtype();
        if !pd.is_float() {
            return Err(Error::dtype(name, DType::F32, pd));
        }
        let mut outputs = Vec::with_capacity(self.layout().len());
        let mut elems = 0usize;
        for (i, p) in self.params.iter().enumerate() {
            if p.dtype() != pd {
                return Err(Error::dtype(name, pd, p.dtype()));
            }
            let g = &self.grads[i];
            if g.shape() != p.shape() {
                let what = format!("gradient {i} vs parameter {i}");
                return Err(Error::shape(name, g.shape(), p.shape(), what));
            }
            if !g.dtype().is_float() {
                return Err(Error::dtype(name, DType::F32, g.dtype()));
            }
            for s in [self.m.get(i), self.v.get(i)].into_iter().flatten() {
                if s.shape() != p.shape() {
                    let what = format!("state of parameter {i}");
                    return Err(Error::shape(name, s.shape(), p.shape(), what));
                }
                if s.dtype() != pd {
                    return Err(Error::dtype(name, pd, s.dtype()));
                }
            }
            elems = elems
                .checked_add(p.numel())
                .ok_or_else(|| Error::invalid(name, "parameter sizes overflow usize"))?;
            outputs.push(TensorSpec::new(p.shape().clone(), pd));
        }
        for _ in 0..states {
            for p in &self.params {
                outputs.push(TensorSpec::new(p.shape().clone(), pd));
            }
        }
        if let Some(c) = self.copy {
            if !matches!(c, DType::F16 | DType::BF16) {
                return Err(Error::dtype(name, DType::BF16, c));
            }
            for p in &self.params {
                outputs.push(TensorSpec::new(p.shape().clone(), c));
            }
        }
        if !self.copy_into.is_empty() {
            let Some(c) = self.copy else {
                return Err(Error::invalid(
                    name,
                    "copy destinations given without with_copy",
                ));
            };
            if self.copy_into.len() != n {
                return Err(Error::invalid(
                    name,
                    format!(
                        "{} copy destinations for {n} parameters",
                        self.copy_into.len()
                    ),
                ));
            }
            for (i, (d, p)) in self.copy_into.iter().zip(&self.params).enumerate() {
                if d.shape() != p.shape() {
                    let what = format!("copy destination {i} vs parameter {i}");
                    return Err(Error::shape(name, d.shape(), p.shape(), what));
                }
                if d.dtype() != c {
                    return Err(Error::dtype(name, c, d.dtype()));
                }
            }
        }
        for (what, t, len) in [
            ("norm", &self.norm, 1),
            ("loss-scaling state", &self.scaler, 4),
            ("step count", &self.step_count, 1),
        ] {
            if let Some(t) = t {
                if t.dtype() != DType::F32 {
                    return Err(Error::dtype(name, DType::F32, t.dtype()));
                }
                if t.numel() != len {
                    return Err(Error::invalid(
                        name,
                        format!("the {what} must have {len} element(s), got {}", t.shape()),
                    ));
                }
            }
        }
        if let Some(s) = &self.scaler {
            outputs.push(TensorSpec::new(s.shape().clone(), DType::F32));
        }
        let per = (2 + 2 * states) * pd.size() + 4;
        Ok(Plan {
            outputs,
            cost: Cost {
                flops: 12.0 * elems as f64,
                bytes: (elems as f64) * per as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let name = self.name();
        // Donate everything first: an input reference would keep the memory shared.
        let donate = |cx: &mut ExecCx<'_>, ts: &mut Vec<Tensor>| -> Vec<Option<Buffer>> {
            ts.iter_mut()
                .map(|t| {
                    let d = cx.donate(t);
                    count_donation(&d);
                    d
                })
                .collect()
        };
        let dp = donate(cx, &mut self.params);
        let dm = donate(cx, &mut self.m);
        let dv = donate(cx, &mut self.v);
        let ds = match self.scaler.as_mut() {
            Some(s) => {
                let d = cx.donate(s);
                count_donation(&d);
                d
            }
            None => None,
        };
        let dc = donate(cx, &mut self.copy_into);
        let read = |cx: &ExecCx<'_>, ts: &[Tensor], d: &[Option<Buffer>]| -> Result<Vec<_>> {
            ts.iter()
                .zip(d)
                .map(|(t, d)| match d {
                    Some(_) => Ok(None),
                    None => cx.input(t).map(Some),
                })
                .collect()
        };
        let ip = read(cx, &self.params, &dp)?;
        let im = read(cx, &self.m, &dm)?;
        let iv = read(cx, &self.v, &dv)?;
        let is = match (&self.scaler, &ds) {
            (Some(s), None) => Some(cx.input(s)?),
            _ => None,
        };
        let grads = self
            .grads
            .iter()
            .map(|g| cx.input(g))
            .collect::<Result<Vec<_>>>()?;
        let norm = self.norm.as_ref().map(|t| cx.input(t)).transpose()?;
        let tstep = self.step_count.as_ref().map(|t| cx.input(t)).transpose()?;
        let operands = Operands {
            tstep: tstep.as_deref(),
            params: zip(dp, ip),
            m: zip(dm, im),
            v: zip(dv, iv),
            grads: grads.iter().map(|g| &**g).collect(),
            norm: norm.as_deref(),
            scaler: self.scaler.is_some().then_some((ds, is.as_deref())),
            copies: dc,
        };
        let (pd, gd) = (
            self.params[0].dtype(),
            self.grads.iter().map(|g| g.dtype()).collect(),
        );
        let args = Args {
            name,
            rule: self.rule,
            h: self.h,
            growth: self.growth_interval as f32,
            copy: self.copy,
            numels: self.params.iter().map(|p| p.numel()).collect(),
            pd,
            gd,
        };
        let outs = match cx.backend() {
            BackendCx::Cpu => run_cpu(&args, operands),
            BackendCx::Cuda(scx) => super::cuda::step(scx, &args, operands),
        }?;
        for (i, b) in outs.into_iter().enumerate() {
            cx.set_output(i, b)?;
        }
        Ok(())
    }
}

/// A donated buffer or the input to read.
pub(super) type Operand<'a> = (Option<Buffer>, Option<&'a Buffer>);

fn zip(d: Vec<Option<Buffer>>, i: Vec<Option<rtx_runtime::BufferRef>>) -> Vec<OperandOwned> {
    d.into_iter()
        .zip(i)
        .map(|(d, i)| OperandOwned(d, i))
        .collect()
}

/// A donated buffer, or a reference to the input (held while the op runs).
pub(super) struct OperandOwned(
    pub(super) Option<Buffer>,
    pub(super) Option<rtx_runtime::BufferRef>,
);

impl OperandOwned {
    pub(super) fn parts(&mut self) -> Operand<'_> {
        (self.0.take(), self.1.as_deref())
    }
}

/// Everything a backend needs.
pub(super) struct Operands<'a> {
    pub(super) params: Vec<OperandOwned>,
    pub(super) m: Vec<OperandOwned>,
    pub(super) v: Vec<OperandOwned>,
    pub(super) grads: Vec<&'a Buffer>,
    pub(super) norm: Option<&'a Buffer>,
    pub(super) scaler: Option<(Option<Buffer>, Option<&'a Buffer>)>,
    /// AdamW's step number on the device ([`Step::step_count`]).
    pub(super) tstep: Option<&'a Buffer>,
    /// The copies' donated buffers ([`Step::copy_into`]): one per parameter, or none.
    pub(super) copies: Vec<Option<Buffer>>,
}

/// The step's scalars.
pub(super) struct Args {
    pub(super) name: &'static str,
    pub(super) rule: Rule,
    pub(super) h: Hyper,
    pub(super) growth: f32,
    pub(super) copy: Option<DType>,
    pub(super) numels: Vec<usize>,
    pub(super) pd: DType,
    pub(super) gd: Vec<DType>,
}

/// The new value of an updatable tensor on the CPU: the donated buffer, or a copy of
/// the input.
fn owned<T: Element>(op: Operand<'_>) -> Result<Buffer> {
    match op {
        (Some(b), _) => Ok(b),
        (None, Some(x)) => Ok(Buffer::from_vec(x.cpu::<T>()?.to_vec())),
        (None, None) => Err(Error::invalid(
            "optim",
            "operand neither donated nor readable",
        )),
    }
}

fn run_cpu(a: &Args, mut o: Operands<'_>) -> Result<Vec<Buffer>> {
    let name = a.name;
    // The step number read from the device tensor, as the kernel does.
    let mut h = a.h;
    if let Some(t) = o.tstep {
        h.t = t.cpu::<f32>()?[0];
    }
    // The loss-scaling state, with this step's overflow flag.
    let mut scaler = match o.scaler.take() {
        Some(s) => {
            let mut b = owned::<f32>(s)?;
            let st = b.cpu_mut::<f32>()?;
            st[3] = 0.0;
            for (g, &gd) in o.grads.iter().zip(&a.gd) {
                if float_dispatch!(gd, name, |G| Ok(cpu::nonfinite(g.cpu::<G>()?)))? {
                    st[3] = 1.0;
                }
            }
            Some(b)
        }
        None => None,
    };
    let controls = Controls {
        scaler: match &scaler {
            Some(b) => Some(
                b.cpu::<f32>()?
                    .try_into()
                    .map_err(|_| Error::invalid(name, "state"))?,
            ),
            None => None,
        },
        norm: o.norm.map(|b| b.cpu::<f32>().map(|v| v[0])).transpose()?,
    };
    let n = a.numels.len();
    let (mut ps, mut ms, mut vs, mut copies) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let g = o.grads[i];
        let pb = o.params[i].parts();
        let mb = o.m.get_mut(i).map(|m| m.parts());
        let vb = o.v.get_mut(i).map(|v| v.parts());
        let cb = o.copies.get_mut(i).and_then(Option::take);
        let (p, m, v, c) = float_dispatch!(a.pd, name, |P| float_dispatch!(a.gd[i], name, |G| {
            step_one::<P, G>(a, &h, &controls, pb, g, mb, vb, cb)
        }))?;
        ps.push(p);
        ms.extend(m);
        vs.extend(v);
        copies.extend(c);
    }
    if let Some(b) = scaler.as_mut() {
        let st: &mut [f32; 4] = b
            .cpu_mut::<f32>()?
            .try_into()
            .map_err(|_| Error::invalid(name, "state"))?;
        cpu::scaler_end(st, a.growth);
    }
    let mut out = ps;
    out.extend(ms);
    out.extend(vs);
    out.extend(copies);
    out.extend(scaler);
    Ok(out)
}

type Stepped = (Buffer, Option<Buffer>, Option<Buffer>, Option<Buffer>);

#[allow(clippy::too_many_arguments)]
fn step_one<P: Float + Element, G: Float + Element>(
    a: &Args,
    h: &Hyper,
    c: &Controls,
    p: Operand<'_>,
    g: &Buffer,
    m: Option<Operand<'_>>,
    v: Option<Operand<'_>>,
    dst: Option<Buffer>,
) -> Result<Stepped> {
    let mut p = owned::<P>(p)?;
    let mut m = m.map(owned::<P>).transpose()?;
    let mut v = v.map(owned::<P>).transpose()?;
    let len = p.len();
    let mut copy = a.copy.map(|_| vec![0f32; len]);
    cpu::step::<P, G>(
        a.rule,
        h,
        c,
        p.cpu_mut::<P>()?,
        g.cpu::<G>()?,
        m.as_mut().map(|b| b.cpu_mut::<P>()).transpose()?,
        v.as_mut().map(|b| b.cpu_mut::<P>()).transpose()?,
        copy.as_deref_mut(),
    );
    let copy = match (a.copy, copy, dst) {
        (Some(DType::F16), Some(c), Some(mut d)) => {
            let out = d.cpu_mut::<rtx_runtime::f16>()?;
            for (o, &x) in out.iter_mut().zip(&c) {
                *o = rtx_runtime::f16::from_f32(x);
            }
            Some(d)
        }
        (Some(_), Some(c), Some(mut d)) => {
            let out = d.cpu_mut::<rtx_runtime::bf16>()?;
            for (o, &x) in out.iter_mut().zip(&c) {
                *o = rtx_runtime::bf16::from_f32(x);
            }
            Some(d)
        }
        (Some(DType::F16), Some(c), None) => Some(Buffer::from_vec(
            c.iter().map(|&x| rtx_runtime::f16::from_f32(x)).collect(),
        )),
        (Some(_), Some(c), None) => Some(Buffer::from_vec(
            c.iter().map(|&x| rtx_runtime::bf16::from_f32(x)).collect(),
        )),
        _ => None,
    };
    Ok((p, m, v, copy))
}
