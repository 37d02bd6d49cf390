//! `linear_train` (forward saving the pre-activation) and `linear_backward`:
//!
//! - the forward's `y` equals `linear`'s and its saved pre-activation is `x·wᵀ + b`
//!   (f64 reference), on every backend;
//! - the gradients against central finite differences in f64 of the loss
//!   `L = Σ g ⊙ y` (g fixed and random), for each activation, with and without bias,
//!   and through two chained layers (`input_activation`), on the CPU backend;
//! - every backend (CUDA when present, with 1 and 4 streams) against an f64 reference of
//!   the gradient formulas, odd sizes and sizes that take cuBLASLt's fused epilogues,
//!   outputs poisoned;
//! - bad input: typed errors at submit, the op given back.
//!
//! Tolerances: f64 finite differences (h = 1e-4 on values of order 1: truncation about
//! 1e-8) against the op in f32: 1e-4 for f32, 2e-2 for f16/bf16 (the gradient's
//! inputs are rounded to 8 or 11 bits, and its outputs too). Parity with the f64
//! formulas by the norm relative to the magnitudes (`rel_err_scaled`): f32 2e-5 (up to
//! K = 256, growing as sqrt(K/256)), f16/bf16 1e-2 — dz is rounded to the storage type
//! before the CUDA GEMMs, one more rounding than the CPU reference.

mod common;
mod linear_ref;

use common::*;
use linear_ref::*;
use rtx_ops::gemm::{
    activation_grad, linear, linear_backward, linear_fused_fallbacks, linear_train, Activation,
    LinearGrads,
};
use rtx_runtime::{bf16, f16, BackendKind, DType, Element, Error, Runtime, Tensor};

fn submit<O: rtx_runtime::Op>(rt: &Runtime, op: O) -> O::Output {
    match rt.submit(op) {
        Ok(s) => s.wait().expect("op failed"),
        Err(e) => panic!("submit rejected: {}", e.error),
    }
}

fn tol_parity(dt: DType, k: usize) -> f64 {
    match dt {
        DType::F32 => 2e-5 * (k as f64 / 256.0).sqrt().max(1.0),
        _ => 1e-2,
    }
}

fn tol_fd(dt: DType) -> f64 {
    match dt {
        DType::F32 => 1e-4,
        _ => 2e-2,
    }
}

fn assert_close(what: &str, got: &[f64], want: &[f64], scale: &[f64], tol: f64, seed: u64) {
    let e = rel_err_scaled(got, want, scale);
    assert!(
        e <= tol,
        "{what}: relative error {e:e} > {tol:e} (seed {seed})"
    );
}

// ---- forward ---------------------------------------------------------------------------

fn forward_case<T: Element>(rt: &Runtime, label: &str, lead: &[usize], inp: usize, out: usize) {
    let (seed, mut r) = rng();
    let rows: usize = lead.iter().product();
    let mut xs = lead.to_vec();
    xs.push(inp);
    let x: Vec<T> = rand_vec(&mut r, rows * inp, -1.0, 1.0);
    let w: Vec<T> = rand_vec(&mut r, out * inp, -1.0, 1.0);
    let b: Vec<T> = rand_vec(&mut r, out, -1.0, 1.0);
    let (xt, wt, bt) = (
        upload(rt, &x, &xs),
        upload(rt, &w, &[out, inp]),
        upload(rt, &b, &[out]),
    );
    let (xf, wf, bf) = (f64s(&x), f64s(&w), f64s(&b));
    let tol = tol_parity(T::DTYPE, inp);
    for act in ACTS {
        for with_bias in [false, true] {
            let what = format!(
                "{label} {} {lead:?}x{inp}->{out} {act:?} bias={with_bias}",
                T::DTYPE
            );
            let bias = with_bias.then_some(&bt);
            let s = submit(rt, linear_train(&xt, &wt, bias, act));
            let mut ys = lead.to_vec();
            ys.push(out);
            assert_eq!(s.y.dims(), &ys[..], "{what}");
            assert_eq!(s.pre.is_some(), act != Activation::None, "{what}");
            let want_pre = pre64(&xf, &wf, with_bias.then_some(&bf[..]), rows, inp, out);
            let mut scale = pre64(&abs_all(&xf), &abs_all(&wf), None, rows, inp, out);
            if with_bias {
                scale
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, s)| *s += bf[i % out].abs());
            }
            if let Some(pre) = &s.pre {
                assert_eq!(pre.dims(), &ys[..], "{what}");
                assert_close(
                    &format!("{what} pre"),
                    &download::<T>(rt, pre),
                    &want_pre,
                    &scale,
                    tol,
                    seed,
                );
            }
            let want_y: Vec<f64> = want_pre.iter().map(|&v| act64(act, v)).collect();
            let y = download::<T>(rt, &s.y);
            assert_close(&format!("{what} y"), &y, &want_y, &scale, tol, seed);
            // The same as the inference op (one extra rounding of pre at most).
            let plain = submit(rt, linear(&xt, &wt, bias, act));
            assert_close(
                &format!("{what} y vs linear"),
                &y,
                &download::<T>(rt, &plain),
                &scale,
                tol,
                seed,
            );
            // And through the builder form.
            let s2 = submit(rt, linear(&xt, &wt, bias, act).save_pre_activation());
            assert_close(
                &format!("{what} save_pre_activation"),
                &download::<T>(rt, &s2.y),
                &y,
                &scale,
                tol,
                seed,
            );
        }
    }
}

backend_test!(
    forward_saves_the_pre_activation_and_matches_linear,
    |rt, label| {
        // Widths that are multiples of 8 take GELU_AUX_BIAS on CUDA; the others the
        // unfused path. Each case has at least 33 outputs (see gemm.rs's note).
        let cases = [
            (&[2usize, 5][..], 33, 7),
            (&[129][..], 257, 24),
            (&[33][..], 8, 16),
            (&[3][..], 1, 13),
        ];
        for (lead, inp, out) in cases {
            forward_case::<f32>(rt, label, lead, inp, out);
            forward_case::<f16>(rt, label, lead, inp, out);
            forward_case::<bf16>(rt, label, lead, inp, out);
        }
    }
);

fn grads_cpu<T: Element>(
    rt: &Runtime,
    layers: &[Layer],
    x: &[f64],
    g: &[f64],
    rows: usize,
) -> Vec<LinearGrads> {
    let x_t = upload(rt, &to_t::<T>(x), &[rows, layers[0].inp]);
    let ws: Vec<Tensor> = layers
        .iter()
        .map(|l| upload(rt, &to_t::<T>(&l.w), &[l.out, l.inp]))
        .collect();
    let bs: Vec<Option<Tensor>> = layers
        .iter()
        .map(|l| l.b.as_ref().map(|b| upload(rt, &to_t::<T>(b), &[l.out])))
        .collect();
    // Forward, saving inputs and pre-activations.
    let mut inputs = vec![x_t];
    let mut pres = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let s = submit(rt, linear_train(&inputs[i], &ws[i], bs[i].as_ref(), l.act));
        pres.push(s.pre);
        inputs.push(s.y);
    }
    // Backward, chaining: each layer's dx is the gradient of the layer below's
    // pre-activation (input_activation), so that layer runs with Activation::None.
    let last = layers.len() - 1;
    let mut dy = upload(rt, &to_t::<T>(g), &[rows, layers[last].out]);
    let mut out = Vec::new();
    for i in (0..layers.len()).rev() {
        let act = if i == last {
            layers[i].act
        } else {
            Activation::None
        };
        let mut op = linear_backward(
            &dy,
            &inputs[i],
            &ws[i],
            pres[i].as_ref(),
            act,
            bs[i].is_some(),
        );
        if i > 0 {
            if let Some(pre_in) = &pres[i - 1] {
                op = op.input_activation(layers[i - 1].act, pre_in);
            }
        }
        let gr = submit(rt, op);
        dy = gr.dx.clone();
        out.push(gr);
    }
    out.reverse();
    out
}

fn fd_case<T: Element>(acts: &[Activation], bias: bool, rows: usize, widths: &[usize]) {
    let rt = Runtime::cpu(2);
    let (seed, mut r) = rng();
    let (mut layers, mut x, g) = loop {
        let layers: Vec<Layer> = acts
            .iter()
            .zip(widths.windows(2))
            .map(|(&act, io)| Layer {
                w: f64s(&rand_t::<T>(&mut r, io[0] * io[1])),
                b: bias.then(|| f64s(&rand_t::<T>(&mut r, io[1]))),
                act,
                inp: io[0],
                out: io[1],
            })
            .collect();
        let x = f64s(&rand_t::<T>(&mut r, rows * widths[0]));
        let g = f64s(&rand_t::<T>(&mut r, rows * widths[widths.len() - 1]));
        if kinks_clear(&layers, &x, rows) {
            break (layers, x, g);
        }
    };
    let grads = grads_cpu::<T>(&rt, &layers, &x, &g, rows);
    let tol = tol_fd(T::DTYPE);
    let what = format!(
        "{} acts {acts:?} bias={bias} rows {rows} widths {widths:?}",
        T::DTYPE
    );
    let want_dx = fd(&mut layers, &mut x, &g, rows, (0, 0));
    check_fd(
        &format!("{what} dx"),
        &download::<T>(&rt, &grads[0].dx),
        &want_dx,
        tol,
        seed,
    );
    for (l, gl) in grads.iter().enumerate() {
        let want = fd(&mut layers, &mut x, &g, rows, (1, l));
        check_fd(
            &format!("{what} layer {l} dw"),
            &download::<T>(&rt, &gl.dw),
            &want,
            tol,
            seed,
        );
        assert_eq!(gl.db.is_some(), bias, "{what}");
        if let Some(db) = &gl.db {
            let want = fd(&mut layers, &mut x, &g, rows, (2, l));
            check_fd(
                &format!("{what} layer {l} db"),
                &download::<T>(&rt, db),
                &want,
                tol,
                seed,
            );
        }
    }
}

fn check_fd(what: &str, got: &[f64], want: &[f64], tol: f64, seed: u64) {
    let e = rel_err(got, want);
    assert!(
        e <= tol,
        "{what}: relative error {e:e} against finite differences > {tol:e} (seed {seed})"
    );
}

#[test]
fn one_layer_gradients_match_finite_differences() {
    rtx_ops::set_poison_outputs(true);
    for act in ACTS {
        for bias in [false, true] {
            fd_case::<f32>(&[act], bias, 7, &[5, 9]);
            fd_case::<f32>(&[act], bias, 1, &[3, 1]);
            fd_case::<bf16>(&[act], bias, 6, &[11, 4]);
            fd_case::<f16>(&[act], bias, 6, &[11, 4]);
        }
    }
}

#[test]
fn chained_layers_gradients_match_finite_differences() {
    rtx_ops::set_poison_outputs(true);
    for a1 in ACTS {
        for a2 in ACTS {
            for bias in [false, true] {
                fd_case::<f32>(&[a1, a2], bias, 5, &[4, 7, 3]);
            }
        }
    }
    fd_case::<f32>(
        &[Activation::Gelu, Activation::Relu, Activation::None],
        true,
        3,
        &[6, 8, 5, 2],
    );
}

// ---- every backend against the f64 formulas --------------------------------------------

fn backward_case<T: Element>(
    rt: &Runtime,
    label: &str,
    rows: usize,
    inp: usize,
    out: usize,
    chained: bool,
) {
    let (seed, mut r) = rng();
    let x: Vec<T> = rand_vec(&mut r, rows * inp, -1.0, 1.0);
    let w: Vec<T> = rand_vec(&mut r, out * inp, -1.0, 1.0);
    let b: Vec<T> = rand_vec(&mut r, out, -1.0, 1.0);
    let dy: Vec<T> = rand_vec(&mut r, rows * out, -1.0, 1.0);
    // A pre-activation of the input (for input_activation): x is act_in(pre_in).
    let pre_in: Vec<T> = rand_vec(&mut r, rows * inp, -2.0, 2.0);
    let (xt, wt, bt, dyt) = (
        upload(rt, &x, &[rows, inp]),
        upload(rt, &w, &[out, inp]),
        upload(rt, &b, &[out]),
        upload(rt, &dy, &[rows, out]),
    );
    let pre_in_t = upload(rt, &pre_in, &[rows, inp]);
    let (xf, wf, dyf, pinf) = (f64s(&x), f64s(&w), f64s(&dy), f64s(&pre_in));
    for act in ACTS {
        for act_in in if chained { &ACTS[1..] } else { &ACTS[..1] } {
            for has_bias in [false, true] {
                let what = format!(
                    "{label} {} rows {rows} in {inp} out {out} {act:?} input {act_in:?} bias={has_bias}",
                    T::DTYPE
                );
                let s = submit(rt, linear_train(&xt, &wt, has_bias.then_some(&bt), act));
                let mut op = linear_backward(&dyt, &xt, &wt, s.pre.as_ref(), act, has_bias);
                if chained {
                    op = op.input_activation(*act_in, &pre_in_t);
                }
                let g = submit(rt, op);
                // The reference from the pre-activation the op saved (same rounding).
                let pre = s.pre.as_ref().map(|p| download::<T>(rt, p));
                let dz: Vec<f64> = (0..rows * out)
                    .map(|i| dyf[i] * pre.as_ref().map_or(1.0, |p| dact64(act, p[i])))
                    .collect();
                // The scale of dz's rounding: |dy| times that of the derivative's
                // (`dact_mag64`; not |dz|, which vanishes where its terms cancel).
                let adz: Vec<f64> = (0..rows * out)
                    .map(|i| dyf[i].abs() * pre.as_ref().map_or(1.0, |p| dact_mag64(act, p[i])))
                    .collect();
                let mut dx = vec![0f64; rows * inp];
                let mut sdx = vec![0f64; rows * inp];
                for rr in 0..rows {
                    for i in 0..inp {
                        let (mut s1, mut s2) = (0.0, 0.0);
                        for o in 0..out {
                            s1 += dz[rr * out + o] * wf[o * inp + i];
                            s2 += adz[rr * out + o] * wf[o * inp + i].abs();
                        }
                        let d = if chained {
                            dact64(*act_in, pinf[rr * inp + i])
                        } else {
                            1.0
                        };
                        dx[rr * inp + i] = s1 * d;
                        sdx[rr * inp + i] = s2 * d.abs();
                    }
                }
                let mut dw = vec![0f64; out * inp];
                let mut sdw = vec![0f64; out * inp];
                for o in 0..out {
                    for i in 0..inp {
                        let (mut s1, mut s2) = (0.0, 0.0);
                        for rr in 0..rows {
                            s1 += dz[rr * out + o] * xf[rr * inp + i];
                            s2 += adz[rr * out + o] * xf[rr * inp + i].abs();
                        }
                        dw[o * inp + i] = s1;
                        sdw[o * inp + i] = s2;
                    }
                }
                let tol = tol_parity(T::DTYPE, rows.max(out));
                assert_eq!(g.dx.dims(), &[rows, inp], "{what}");
                assert_eq!(g.dw.dims(), &[out, inp], "{what}");
                assert_close(
                    &format!("{what} dx"),
                    &download::<T>(rt, &g.dx),
                    &dx,
                    &sdx,
                    tol,
                    seed,
                );
                assert_close(
                    &format!("{what} dw"),
                    &download::<T>(rt, &g.dw),
                    &dw,
                    &sdw,
                    tol,
                    seed,
                );
                assert_eq!(g.db.is_some(), has_bias, "{what}");
                if let Some(db) = &g.db {
                    let mut want = vec![0f64; out];
                    let mut scale = vec![0f64; out];
                    for rr in 0..rows {
                        for o in 0..out {
                            want[o] += dz[rr * out + o];
                            scale[o] += adz[rr * out + o];
                        }
                    }
                    assert_close(
                        &format!("{what} db"),
                        &download::<T>(rt, db),
                        &want,
                        &scale,
                        tol,
                        seed,
                    );
                }
            }
        }
    }
}

backend_test!(backward_matches_the_f64_formulas, |rt, label| {
    // (rows, in, out): multiples of 8 take DGELU / GELU_AUX on CUDA, the others the
    // unfused kernels; BGRADB applies when out is a multiple of 8 (40, 8), the other
    // widths take the plain GEMM and bias_grad. 333 rows cross several bias_grad row
    // slices; 1 row and 1 output are the extremes; 512 x 128 -> 10 is the sweep's
    // output layer.
    let cases = [
        (7, 5, 9, false),
        (64, 48, 40, true),
        (333, 33, 17, true),
        (1, 24, 1, false),
        (129, 16, 8, true),
        (512, 128, 10, true),
    ];
    for (rows, inp, out, chained) in cases {
        backward_case::<f32>(rt, label, rows, inp, out, chained);
        backward_case::<f16>(rt, label, rows, inp, out, chained);
        backward_case::<bf16>(rt, label, rows, inp, out, chained);
    }
    if rt.backend() == BackendKind::Cuda {
        eprintln!(
            "{label}: linear training epilogues that fell back: {}",
            linear_fused_fallbacks()
        );
    }
});

#[test]
fn activation_grad_is_exported_and_matches_f64() {
    for i in -20..=20 {
        let z = i as f32 * 0.31 + 0.01;
        for act in ACTS {
            let got = activation_grad(act, z) as f64;
            let want = dact64(act, z as f64);
            assert!((got - want).abs() < 1e-6, "{act:?} at {z}: {got} vs {want}");
        }
    }
}

// ---- bad input ---------------------------------------------------------------------------

backend_test!(bad_input_is_rejected_with_typed_errors, |rt, label| {
    let t = |d: &[usize]| upload(rt, &vec![0.5f32; d.iter().product()], d);
    let (x, w, dy) = (t(&[4, 3]), t(&[5, 3]), t(&[4, 5]));
    // dy of the wrong shape.
    let bad_dy = t(&[4, 6]);
    let e = rt
        .submit(linear_backward(
            &bad_dy,
            &x,
            &w,
            None,
            Activation::None,
            true,
        ))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    assert!(e.into_op().into_inputs()[0].same_storage(&bad_dy));
    // An activation without its pre-activation.
    let e = rt
        .submit(linear_backward(&dy, &x, &w, None, Activation::Gelu, false))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidOp { .. }),
        "{label}: {}",
        e.error
    );
    assert!(e.error.to_string().contains("pre"), "{}", e.error);
    // pre of the wrong shape.
    let e = rt
        .submit(linear_backward(
            &dy,
            &x,
            &w,
            Some(&x),
            Activation::Relu,
            false,
        ))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    // pre_in of the wrong shape.
    let e = rt
        .submit(
            linear_backward(&dy, &x, &w, None, Activation::None, false)
                .input_activation(Activation::Relu, &dy),
        )
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    // in_features mismatch, and dtype mismatch.
    let e = rt
        .submit(linear_backward(
            &dy,
            &t(&[4, 2]),
            &w,
            None,
            Activation::None,
            false,
        ))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    let h = upload(rt, &[f16::ONE; 20], &[4, 5]);
    let e = rt
        .submit(linear_backward(&h, &x, &w, None, Activation::None, false))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::DTypeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    // The forward: bias length.
    let e = rt
        .submit(linear_train(&x, &w, Some(&t(&[4])), Activation::Gelu))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ShapeMismatch { .. }),
        "{label}: {}",
        e.error
    );
    assert!(e.into_op().into_inputs().0.same_storage(&x));
});
