//! Attention: the forward and backward ops against an f64 reference computed here
//! (naive `softmax(scale·q·kᵀ + mask)·v` and the textbook gradients), on fresh random
//! inputs, for every flag combination (dtype × D × causal × mask × lengths, GQA), with
//! outputs poisoned (NaN) so an unwritten element fails; fully masked rows; other head
//! dims; bad inputs (typed errors at submit, the op given back).
//!
//! The CPU backend runs the full flag grid on short lengths and a subsample on long
//! ones (the f64 reference is O(Lq·Lk·D)); CUDA runs the full grid, up to 4097 × 4097.

mod cases;
#[path = "../common/mod.rs"]
mod common;
mod tma;

use cases::*;
use common::{for_each_backend, upload};
use rtx_ops::attention::attention;
use rtx_runtime::{bf16, f16, DType, Error};

// ---- parity ----------------------------------------------------------------------------

#[test]
fn parity_short() {
    for_each_backend(|rt, label| {
        for dims in [(1, 2, 2, 1, 1), (1, 2, 2, 17, 17)] {
            run_all(rt, label, &grid(dtypes(rt), dims));
        }
    });
}

#[test]
fn parity_grouped_heads() {
    for_each_backend(|rt, label| {
        // GQA with two batches, and MQA (one kv head), at lengths off the tile sizes.
        for dims in [(2, 4, 2, 77, 200), (1, 4, 1, 33, 65)] {
            let cases = first_whole(label, is_cuda(rt), grid(dtypes(rt), dims));
            run_all(rt, label, &cases);
        }
    });
}

#[test]
fn parity_decode_and_cross() {
    for_each_backend(|rt, label| {
        for dims in [(1, 2, 2, 1, 1000), (1, 2, 2, 17, 1000), (1, 2, 2, 1000, 17)] {
            let cases = first_whole(label, is_cuda(rt), grid(dtypes(rt), dims));
            run_all(rt, label, &cases);
        }
    });
}

#[test]
fn parity_long() {
    for_each_backend(|rt, label| {
        let cases = first_whole(label, false, grid(dtypes(rt), (1, 2, 2, 1000, 1000)));
        run_all(rt, label, &cases);
    });
}

/// The longest sequences, on CUDA only (the f64 reference is O(L²·D)).
#[test]
fn parity_4097_cuda() {
    for_each_backend(|rt, label| {
        if !is_cuda(rt) {
            eprintln!("{label}: 4097 x 4097 runs on CUDA only");
            return;
        }
        let cases = first_whole(label, false, grid(dtypes(rt), (1, 2, 2, 4097, 4097)));
        // `RTX_TEST_SHARD=i/n`: the sanitizer runs split this test into processes.
        run_all(rt, label, &common::shard(&cases));
    });
}

/// Masks broadcast over only the batch or only the heads.
#[test]
fn parity_partial_mask_broadcast() {
    for_each_backend(|rt, label| {
        let mut cases = Vec::new();
        for &dtype in dtypes(rt) {
            for (mask, causal) in [(Mask::PerBatch, false), (Mask::PerHead, true)] {
                cases.push(Case {
                    dtype,
                    b: 2,
                    h: 3,
                    h_kv: 1,
                    lq: 33,
                    lk: 70,
                    d: 64,
                    causal,
                    mask,
                    scale: None,
                });
            }
        }
        run_all(rt, label, &cases);
    });
}

/// Rows whose every key is masked: o = 0, lse = -inf, zero dq, and the other rows
/// unaffected.
#[test]
fn fully_masked_rows() {
    for_each_backend(|rt, label| {
        for &dtype in dtypes(rt) {
            for mask in [Mask::Plane, Mask::Full] {
                let c = Case {
                    dtype,
                    b: 1,
                    h: 2,
                    h_kv: 1,
                    lq: 17,
                    lk: 40,
                    d: 64,
                    causal: false,
                    mask,
                    scale: None,
                };
                match dtype {
                    DType::F32 => fully_masked_t::<f32>(rt, label, &c),
                    DType::F16 => fully_masked_t::<f16>(rt, label, &c),
                    _ => fully_masked_t::<bf16>(rt, label, &c),
                }
            }
        }
    });
}

/// The CPU backend takes any head dim; CUDA rejects those it has no kernel for.
#[test]
fn other_head_dims() {
    for_each_backend(|rt, label| {
        for d in [8, 80] {
            let mut c = Case {
                dtype: DType::F16,
                b: 1,
                h: 2,
                h_kv: 1,
                lq: 9,
                lk: 30,
                d,
                causal: true,
                mask: Mask::Plane,
                scale: None,
            };
            if !is_cuda(rt) {
                for dtype in dtypes(rt) {
                    c.dtype = *dtype;
                    run_case(rt, label, &c);
                }
                continue;
            }
            let q = upload(rt, &vec![f16::ONE; 2 * 9 * d], &[1, 2, 9, d]);
            let kv = upload(rt, &vec![f16::ONE; 30 * d], &[1, 1, 30, d]);
            let e = rt.submit(attention(&q, &kv, &kv)).expect_err("rejected");
            assert!(
                matches!(e.error, Error::InvalidDim { .. }),
                "{label}: {}",
                e.error
            );
            assert!(e.into_op().into_inputs().0.same_storage(&q));
        }
    });
}
