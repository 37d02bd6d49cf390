//! Attention ops reject bad input at submit time with typed errors and give the op back,
//! on every backend (the parity tests are in `attention.rs`).

mod common;

use common::{for_each_backend, upload};
use rtx_ops::attention::{attention, attention_backward};
use rtx_runtime::{bf16, f16, BackendKind, Element, Error, Runtime, Tensor};

fn is_cuda(rt: &Runtime) -> bool {
    rt.backend() == BackendKind::Cuda
}

// ---- bad input -------------------------------------------------------------------------

/// Asserts `op` is rejected at submit with an error `ok` accepts, and that the op comes
/// back holding the q it was given.
fn rejected_fwd(
    rt: &Runtime,
    label: &str,
    what: &str,
    op: rtx_ops::attention::Attention,
    q: &Tensor,
    ok: fn(&Error) -> bool,
) {
    let e = rt
        .submit(op)
        .err()
        .unwrap_or_else(|| panic!("{label}: {what} was accepted"));
    assert!(ok(&e.error), "{label}: {what}: unexpected {}", e.error);
    let (gq, ..) = e.into_op().into_inputs();
    assert!(gq.same_storage(q), "{label}: {what}: op not given back");
}

fn rejected_bwd(
    rt: &Runtime,
    label: &str,
    what: &str,
    op: rtx_ops::attention::AttentionBackward,
    q: &Tensor,
    ok: fn(&Error) -> bool,
) {
    let e = rt
        .submit(op)
        .err()
        .unwrap_or_else(|| panic!("{label}: {what} was accepted"));
    assert!(ok(&e.error), "{label}: {what}: unexpected {}", e.error);
    assert!(
        e.into_op().into_inputs().q.same_storage(q),
        "{label}: {what}: op not given back"
    );
}

fn shape_err(e: &Error) -> bool {
    matches!(e, Error::ShapeMismatch { .. })
}
fn dtype_err(e: &Error) -> bool {
    matches!(e, Error::DTypeMismatch { .. })
}
fn dim_err(e: &Error) -> bool {
    matches!(e, Error::InvalidDim { .. })
}
fn invalid_err(e: &Error) -> bool {
    matches!(e, Error::InvalidOp { .. })
}

fn ones<T: Element>(rt: &Runtime, dims: &[usize]) -> Tensor {
    upload(rt, &vec![T::from_f64(1.0); dims.iter().product()], dims)
}

#[test]
fn bad_inputs() {
    for_each_backend(|rt, label| {
        let (b, h, lq, lk, d) = (2, 4, 5, 7, 64);
        let q = ones::<f16>(rt, &[b, h, lq, d]);
        let kv = ones::<f16>(rt, &[b, 2, lk, d]);
        let fwd = |q: &Tensor, k: &Tensor, v: &Tensor| attention(q, k, v);

        let q3 = ones::<f16>(rt, &[h, lq, d]);
        rejected_fwd(rt, label, "rank-3 q", fwd(&q3, &kv, &kv), &q3, dim_err);
        let k3 = ones::<f16>(rt, &[2, lk, d]);
        rejected_fwd(rt, label, "rank-3 k", fwd(&q, &k3, &k3), &q, dim_err);
        let v_long = ones::<f16>(rt, &[b, 2, lk + 1, d]);
        rejected_fwd(
            rt,
            label,
            "k/v shapes",
            fwd(&q, &kv, &v_long),
            &q,
            shape_err,
        );
        let kv_b = ones::<f16>(rt, &[b + 1, 2, lk, d]);
        rejected_fwd(rt, label, "batch", fwd(&q, &kv_b, &kv_b), &q, shape_err);
        let kv_d = ones::<f16>(rt, &[b, 2, lk, 128]);
        rejected_fwd(rt, label, "head dim", fwd(&q, &kv_d, &kv_d), &q, shape_err);
        let kv_h = ones::<f16>(rt, &[b, 3, lk, d]);
        rejected_fwd(rt, label, "H % Hkv", fwd(&q, &kv_h, &kv_h), &q, shape_err);
        let kv_bf = ones::<bf16>(rt, &[b, 2, lk, d]);
        rejected_fwd(
            rt,
            label,
            "k/v dtype",
            fwd(&q, &kv_bf, &kv_bf),
            &q,
            dtype_err,
        );
        let qi = upload(rt, &vec![1i32; b * h * lq * d], &[b, h, lq, d]);
        rejected_fwd(rt, label, "integer q", fwd(&qi, &kv, &kv), &qi, dtype_err);

        for dims in [
            vec![lq, lk + 1],
            vec![lk, lq],
            vec![h, lq, lk],
            vec![b, h + 1, lq, lk],
            vec![3, h, lq, lk],
        ] {
            let m = ones::<f16>(rt, &dims);
            let what = format!("mask {dims:?}");
            rejected_fwd(rt, label, &what, fwd(&q, &kv, &kv).mask(&m), &q, shape_err);
        }
        let m32 = ones::<f32>(rt, &[lq, lk]);
        rejected_fwd(
            rt,
            label,
            "mask dtype",
            fwd(&q, &kv, &kv).mask(&m32),
            &q,
            dtype_err,
        );
        for s in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            rejected_fwd(
                rt,
                label,
                &format!("scale {s}"),
                fwd(&q, &kv, &kv).scale(s),
                &q,
                invalid_err,
            );
        }

        let (q32, kv32) = (
            ones::<f32>(rt, &[b, h, lq, d]),
            ones::<f32>(rt, &[b, 2, lk, d]),
        );
        if is_cuda(rt) {
            rejected_fwd(
                rt,
                label,
                "f32 on CUDA",
                fwd(&q32, &kv32, &kv32),
                &q32,
                dtype_err,
            );
            let (o, lse) = (
                ones::<f32>(rt, &[b, h, lq, d]),
                ones::<f32>(rt, &[b, h, lq]),
            );
            let op = attention_backward(&q32, &kv32, &kv32, &o, &lse, &o);
            rejected_bwd(rt, label, "f32 backward on CUDA", op, &q32, dtype_err);
        } else {
            rt.submit(fwd(&q32, &kv32, &kv32))
                .expect("f32 on the CPU")
                .wait()
                .expect("f32 on the CPU");
            // An empty operand cannot even be made: zero-size tensors are rejected at
            // upload, with a typed error.
            let e = rt.upload::<f32>(&[], vec![b, h, 0, d]).unwrap_err();
            assert!(
                matches!(e, Error::InvalidOp { .. }),
                "{label}: empty q: {e}"
            );
        }

        // Backward: o, do_ and lse must fit q.
        let lse = ones::<f32>(rt, &[b, h, lq]);
        let bwd =
            |o: &Tensor, lse: &Tensor, do_: &Tensor| attention_backward(&q, &kv, &kv, o, lse, do_);
        let o_short = ones::<f16>(rt, &[b, h, lq - 1, d]);
        rejected_bwd(rt, label, "o shape", bwd(&o_short, &lse, &q), &q, shape_err);
        rejected_bwd(
            rt,
            label,
            "do shape",
            bwd(&q, &lse, &o_short),
            &q,
            shape_err,
        );
        let o_bf = ones::<bf16>(rt, &[b, h, lq, d]);
        rejected_bwd(rt, label, "o dtype", bwd(&o_bf, &lse, &q), &q, dtype_err);
        rejected_bwd(rt, label, "do dtype", bwd(&q, &lse, &o_bf), &q, dtype_err);
        let lse_h = ones::<f16>(rt, &[b, h, lq]);
        rejected_bwd(rt, label, "lse dtype", bwd(&q, &lse_h, &q), &q, dtype_err);
        let lse_d = ones::<f32>(rt, &[b, h, lq, 1]);
        rejected_bwd(rt, label, "lse shape", bwd(&q, &lse_d, &q), &q, shape_err);
        let m = ones::<f16>(rt, &[lq + 1, lk]);
        rejected_bwd(
            rt,
            label,
            "backward mask",
            bwd(&q, &lse, &q).mask(&m),
            &q,
            shape_err,
        );
        rejected_bwd(
            rt,
            label,
            "backward scale",
            bwd(&q, &lse, &q).scale(-2.0),
            &q,
            invalid_err,
        );
        let kv_h = ones::<f16>(rt, &[b, 3, lk, d]);
        let op = attention_backward(&q, &kv_h, &kv_h, &q, &lse, &q);
        rejected_bwd(rt, label, "backward H % Hkv", op, &q, shape_err);

        // The well-formed call is accepted, with either mask layout.
        let m = ones::<f16>(rt, &[lq, lk]);
        let (o, lse) = rt
            .submit(fwd(&q, &kv, &kv).mask(&m).causal(true))
            .expect("valid")
            .wait()
            .expect("runs");
        rt.submit(
            attention_backward(&q, &kv, &kv, &o, &lse, &q)
                .mask(&m)
                .causal(true),
        )
        .expect("valid")
        .wait()
        .expect("runs");
    });
}
