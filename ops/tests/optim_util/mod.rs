//! Helpers shared by the optimizer tests (`optim.rs`, `optim_copies.rs`).
#![allow(dead_code)]

use rtx_ops::optim::{AdamW, Step, StepOutputs};
use rtx_runtime::{Element, Error, Runtime, Tensor};

use super::common::upload;

/// Submits a step and waits for its outputs, split by role.
pub fn submit(rt: &Runtime, op: Step) -> StepOutputs {
    let layout = op.layout();
    match rt.submit(op) {
        Ok(s) => layout.split(s.wait().expect("step failed")),
        Err(e) => panic!("submit rejected: {}", e.error),
    }
}

/// A zero tensor of `T`.
pub fn zeros<T: Element>(rt: &Runtime, shape: &[usize]) -> Tensor {
    upload(rt, &vec![T::from_f64(0.0); shape.iter().product()], shape)
}

/// The AdamW settings of the tests.
pub fn cfg_adamw() -> AdamW {
    AdamW {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    }
}

/// Submits `op`, which must be refused at submit with the error of `kind` (`"shape"`,
/// `"dtype"`, else invalid), and returns the op given back.
pub fn rejected_as(rt: &Runtime, op: Step, kind: &str, what: &str) -> Step {
    let e = rt.submit(op).unwrap_err();
    let ok = match kind {
        "shape" => matches!(e.error, Error::ShapeMismatch { .. }),
        "dtype" => matches!(e.error, Error::DTypeMismatch { .. }),
        _ => matches!(e.error, Error::InvalidOp { .. }),
    };
    assert!(ok, "{what}: want {kind}, got {}", e.error);
    e.into_op()
}
