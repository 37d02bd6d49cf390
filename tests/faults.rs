//! Fault injection under load, on the CPU backend and on CUDA when a device is present:
//!
//! - an op that fails in `run` (an error, or a panic) in the middle of a chain: its
//!   dependents fail with [`Error::Upstream`] naming the failed op and carrying its
//!   cause; the independent work in flight beside it completes with the right values;
//!   the runtime goes on;
//! - outputs beyond the memory present: [`Error::OutOfMemory`] with the requested and
//!   available bytes (at submit, with the op given back, or from the op), interleaved
//!   with ordinary work that completes; the runtime goes on.
//!
//! `RTX_FAULTS=N` sets the rounds of the first test (default 400). The sticky device
//! fault is `tests/poison.rs` (a process of its own: it poisons the device).

mod common;

use rtx::ops::{self, elementwise as ew};
use rtx::{Backend, Error, ExecCx, Op, Plan, PlanCx, Result, Runtime, Tensor};

/// Fails in `run`: with an error naming `tag`, or by panicking with it.
struct Fault {
    x: Tensor,
    tag: String,
    panic: bool,
}

impl Op for Fault {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "injected_fault"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.x))
    }
    fn run(&mut self, _: &mut ExecCx<'_>) -> Result<()> {
        if self.panic {
            panic!("{}", self.tag)
        }
        Err(Error::invalid("injected_fault", self.tag.clone()))
    }
}

fn backends() -> Vec<(&'static str, Backend)> {
    let mut v = vec![("cpu", Backend::Cpu)];
    if common::cuda_present() {
        v.push(("cuda", Backend::Cuda(vec![0])));
    }
    v
}

/// The error at the bottom of a chain of [`Error::Upstream`]s, and the chain's length.
fn root(e: &Error) -> (&Error, usize) {
    match e {
        Error::Upstream { cause, .. } => {
            let (r, n) = root(cause);
            (r, n + 1)
        }
        other => (other, 0),
    }
}

fn rounds() -> usize {
    std::env::var("RTX_FAULTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400)
}

/// One round in flight: the fault, its dependents, the independent ops and what they
/// should hold.
struct Round {
    tag: String,
    panic: bool,
    first: rtx::Submission<Tensor>,
    fault: rtx::Submission<Tensor>,
    dependents: Vec<rtx::Submission<Tensor>>,
    independent: rtx::Submission<Tensor>,
    x: Vec<f32>,
}

/// Keeps the injected panics (by design, hundreds) out of the test's output; every
/// other panic is reported as usual.
fn quiet_injected_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        if !msg.starts_with("fault #") {
            default(info)
        }
    }));
}

#[test]
fn a_failing_op_mid_chain_fails_its_dependents_and_nothing_else() {
    quiet_injected_panics();
    for (label, backend) in backends() {
        let rt = Runtime::builder()
            .backend(backend)
            .streams(8)
            .mailbox(2)
            .build()
            .unwrap();
        let n = 256;
        let (mut faults, mut dependents, mut independent) = (0usize, 0usize, 0usize);
        let (mut panics, mut errors) = (0usize, 0usize);
        let t0 = std::time::Instant::now();
        let mut in_flight: std::collections::VecDeque<Round> = Default::default();
        let total = rounds();
        for r in 0..=total {
            if r < total {
                let x: Vec<f32> = (0..n).map(|i| ((i * 7 + r) % 13) as f32 - 6.0).collect();
                let xt = rt.upload(&x, [n]).unwrap();
                let first = rt.submit(ops::add_scalar(&xt, 1.0)).unwrap();
                let y1 = first.outputs().unwrap().clone();
                let (tag, panic) = (format!("fault #{r} of {label}"), r % 2 == 1);
                let fault = rt
                    .submit(Fault {
                        x: y1.clone(),
                        tag: tag.clone(),
                        panic,
                    })
                    .unwrap();
                let bad = fault.outputs().unwrap().clone();
                // Dependents at distance 1, 2 and 3, one also reading a good value.
                let d1 = rt.submit(ops::mul_scalar(&bad, 2.0)).unwrap();
                let d2 = rt.submit(ew::add(d1.outputs().unwrap(), &y1)).unwrap();
                let d3 = rt.submit(ops::tanh(d2.outputs().unwrap())).unwrap();
                let independent = rt.submit(ew::mul(&y1, &xt)).unwrap();
                in_flight.push_back(Round {
                    tag,
                    panic,
                    first,
                    fault,
                    dependents: vec![d1, d2, d3],
                    independent,
                    x,
                });
            }
            // Keep 16 rounds in flight; settle the oldest.
            if in_flight.len() > 16 || (r == total && !in_flight.is_empty()) {
                while let Some(round) = in_flight.pop_front() {
                    let e = round.fault.wait().unwrap_err();
                    match (&e, round.panic) {
                        (Error::OpPanicked { op, message }, true) => {
                            assert_eq!(op, "injected_fault");
                            assert!(message.contains(&round.tag), "{e}");
                            panics += 1;
                        }
                        (Error::InvalidOp { .. }, false) => {
                            assert!(e.to_string().contains(&round.tag), "{e}");
                            errors += 1;
                        }
                        _ => panic!("{label}: the fault failed with {e:?}"),
                    }
                    faults += 1;
                    for (depth, d) in round.dependents.into_iter().enumerate() {
                        let e = d.wait().unwrap_err();
                        let (cause, chain) = root(&e);
                        assert!(
                            matches!(e, Error::Upstream { .. }) && chain == depth + 1,
                            "{label}: dependent {depth} failed with {e:?}"
                        );
                        assert!(
                            cause.to_string().contains(&round.tag),
                            "{label}: the cause is named: {e}"
                        );
                        dependents += 1;
                    }
                    let y1: Vec<f32> = round.x.iter().map(|v| v + 1.0).collect();
                    let want: Vec<f32> = y1.iter().zip(&round.x).map(|(a, b)| a * b).collect();
                    let y = round.first.wait().unwrap();
                    assert_eq!(rt.to_vec::<f32>(&y).unwrap().wait().unwrap(), y1);
                    let z = round.independent.wait().unwrap();
                    assert_eq!(rt.to_vec::<f32>(&z).unwrap().wait().unwrap(), want);
                    independent += 2;
                    if r < total {
                        break;
                    }
                }
            }
        }
        // The runtime goes on: every stream still computes.
        let a = rt.upload(&[1.5f32, -2.0], [2]).unwrap();
        for s in rt.compute_streams(rt.device()) {
            let y = rt.submit_on(s, ew::add(&a, &a)).unwrap().wait().unwrap();
            assert_eq!(rt.to_vec::<f32>(&y).unwrap().wait().unwrap(), [3.0, -4.0]);
        }
        eprintln!(
            "faults {label}: {faults} faults injected mid-chain ({errors} errors, {panics} \
             panics) on 8 streams, mailbox 2, 16 rounds in flight: {dependents} dependents \
             failed with the cause, {independent} independent ops completed and checked, \
             runtime usable after; {:.2} s",
            t0.elapsed().as_secs_f64()
        );
        assert_eq!(faults, total);
    }
}

#[test]
fn outputs_beyond_memory_are_out_of_memory_and_the_runtime_goes_on() {
    for (label, backend) in backends() {
        let rt = Runtime::builder()
            .backend(backend)
            .streams(4)
            .mailbox(2)
            .build()
            .unwrap();
        let m = 1usize << 20;
        // [2^20, 1] + [1, 2^20] broadcasts to 2^40 f32: 4 TiB.
        let a = rt.upload(&vec![1.0f32; m], [m, 1]).unwrap();
        let b = rt.upload(&vec![2.0f32; m], [1, m]).unwrap();
        let small = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
        let (mut at_submit, mut at_run, mut ok) = (0usize, 0usize, 0usize);
        let mut good = Vec::new();
        for i in 0..40 {
            good.push(rt.submit(ops::mul_scalar(&small, i as f32)).unwrap());
            let e = match rt.submit(ew::add(&a, &b)) {
                Err(refused) => {
                    let e = refused.error.clone();
                    // The op comes back whole.
                    let op = refused.into_op();
                    assert_eq!(op.into_inputs().0.dims(), [m, 1]);
                    at_submit += 1;
                    e
                }
                Ok(s) => {
                    at_run += 1;
                    s.wait().unwrap_err()
                }
            };
            match e {
                Error::OutOfMemory {
                    requested,
                    available,
                    ..
                } => {
                    assert_eq!(requested, 4usize << 40, "{label}");
                    assert!(available < requested, "{label}: available {available}");
                }
                other => panic!("{label}: expected OutOfMemory, got {other:?}"),
            }
        }
        for (i, s) in good.into_iter().enumerate() {
            let y = s.wait().unwrap();
            let want: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|v| v * i as f32).collect();
            assert_eq!(rt.to_vec::<f32>(&y).unwrap().wait().unwrap(), want);
            ok += 1;
        }
        eprintln!(
            "faults {label}: 40 outputs of 4 TiB: {at_submit} OutOfMemory at submit, {at_run} \
             from the op; {ok} ops beside them completed and checked"
        );
    }
}
