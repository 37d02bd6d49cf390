//! Convolution on every backend: forward (with bias and each activation), backward
//! data and backward filter against a direct f64 reference, in NCHW and NHWC, with
//! stride, padding, dilation and groups; the algorithm cache; bad input.
//!
//! Tolerances: f32 1e-5, f16 and bf16 1e-2 (relative error by the norm, against f64
//! computed from the rounded inputs; the GEMM depth here is at most 200).

mod common;

use common::*;
use rtx_ops::conv::{
    conv2d, conv2d_backward_data, conv2d_backward_filter, conv_algo_cache_stats,
    conv_search_fallbacks, w_shape, x_shape, y_shape, Conv2dOpts, Conv2dParams, Layout,
};
use rtx_ops::gemm::Activation;
use rtx_runtime::{bf16, f16, BackendKind, Element, Error, Runtime, Tensor};

/// (n, c_in, h, w, c_out, kh, kw, stride, pad, dilation, groups)
type Geo = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    (usize, usize),
    (usize, usize),
    (usize, usize),
    usize,
);

const GEOMETRIES: [Geo; 7] = [
    (2, 3, 8, 8, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1), // plain 3x3, "same" padding
    (1, 4, 9, 7, 6, 3, 3, (2, 2), (1, 1), (1, 1), 2), // stride 2, groups 2, odd sizes
    (2, 4, 10, 10, 4, 3, 3, (1, 1), (2, 2), (2, 2), 1), // dilation 2
    (2, 6, 7, 9, 6, 3, 3, (1, 1), (1, 1), (1, 1), 6), // depthwise
    (1, 5, 6, 6, 7, 1, 1, (1, 1), (0, 0), (1, 1), 1), // 1x1
    (2, 4, 11, 8, 8, 3, 1, (2, 1), (1, 0), (1, 1), 4), // non-square kernel, mixed stride
    (1, 8, 16, 16, 16, 5, 5, (1, 1), (2, 2), (1, 1), 1), // deeper (K = 200)
];

fn params(g: Geo, layout: Layout) -> Conv2dParams {
    let (n, c_in, h, w, c_out, kh, kw, stride, pad, dilation, groups) = g;
    Conv2dParams {
        n,
        c_in,
        h,
        w,
        c_out,
        kh,
        kw,
        stride,
        pad,
        dilation,
        groups,
        layout,
    }
}

/// Calls `f(x_index, w_index, y_index)` for every (output, tap) pair that reads an
/// input element (padding taps are skipped): the definition of the convolution.
fn visit(p: &Conv2dParams, mut f: impl FnMut(usize, usize, usize)) {
    let (oh, ow) = p.out_hw();
    let (cig, cog) = (p.c_in / p.groups, p.c_out / p.groups);
    let xi = |n: usize, c: usize, y: usize, x: usize| match p.layout {
        Layout::Nchw => ((n * p.c_in + c) * p.h + y) * p.w + x,
        Layout::Nhwc => ((n * p.h + y) * p.w + x) * p.c_in + c,
    };
    let wi = |co: usize, ci: usize, ky: usize, kx: usize| match p.layout {
        Layout::Nchw => ((co * cig + ci) * p.kh + ky) * p.kw + kx,
        Layout::Nhwc => ((co * p.kh + ky) * p.kw + kx) * cig + ci,
    };
    let yi = |n: usize, c: usize, y: usize, x: usize| match p.layout {
        Layout::Nchw => ((n * p.c_out + c) * oh + y) * ow + x,
        Layout::Nhwc => ((n * oh + y) * ow + x) * p.c_out + c,
    };
    for n in 0..p.n {
        for co in 0..p.c_out {
            let g = co / cog;
            for oy in 0..oh {
                for ox in 0..ow {
                    for ci in 0..cig {
                        for ky in 0..p.kh {
                            let iy =
                                (oy * p.stride.0 + ky * p.dilation.0) as isize - p.pad.0 as isize;
                            if iy < 0 || iy >= p.h as isize {
                                continue;
                            }
                            for kx in 0..p.kw {
                                let ix = (ox * p.stride.1 + kx * p.dilation.1) as isize
                                    - p.pad.1 as isize;
                                if ix < 0 || ix >= p.w as isize {
                                    continue;
                                }
                                f(
                                    xi(n, g * cig + ci, iy as usize, ix as usize),
                                    wi(co, ci, ky, kx),
                                    yi(n, co, oy, ox),
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

fn act_ref(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::Gelu => {
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh();
            0.5 * x * (1.0 + t)
        }
    }
}

/// The channel of output element `i`.
fn channel(p: &Conv2dParams, i: usize) -> usize {
    let (oh, ow) = p.out_hw();
    match p.layout {
        Layout::Nchw => (i / (oh * ow)) % p.c_out,
        Layout::Nhwc => i % p.c_out,
    }
}

fn run(rt: &Runtime, op: impl rtx_runtime::Op<Output = Tensor>) -> Tensor {
    match rt.submit(op) {
        Ok(s) => s.wait().expect("op failed"),
        Err(e) => panic!("submit rejected: {}", e.error),
    }
}

fn up<T: Element>(rt: &Runtime, data: &[T], shape: rtx_runtime::Shape) -> Tensor {
    rt.upload(data, shape).expect("upload")
}

/// Forward with (bias, activation) combinations, backward data, backward filter.
fn all_directions<T: Element>(rt: &Runtime, label: &str, p: &Conv2dParams) {
    let (seed, mut r) = rng();
    let x: Vec<T> = rand_vec(&mut r, p.x_len(), -1.0, 1.0);
    let w: Vec<T> = rand_vec(&mut r, p.w_len(), -1.0, 1.0);
    let dy: Vec<T> = rand_vec(&mut r, p.y_len(), -1.0, 1.0);
    let bias: Vec<T> = rand_vec(&mut r, p.c_out, -1.0, 1.0);
    let (xf, wf, dyf, bf) = (f64s(&x), f64s(&w), f64s(&dy), f64s(&bias));
    let what = |dir: &str| format!("{label} {} {dir} {p:?} seed {seed}", T::DTYPE);

    let mut y_ref = vec![0f64; p.y_len()];
    visit(p, |xi, wi, yi| y_ref[yi] += xf[xi] * wf[wi]);
    let opts = Conv2dOpts::from(p);
    for (with_bias, act) in [
        (false, Activation::None),
        (true, Activation::None),
        (true, Activation::Relu),
        (false, Activation::Gelu),
    ] {
        let mut op = conv2d(&up(rt, &x, x_shape(p)), &up(rt, &w, w_shape(p)), opts).activation(act);
        if with_bias {
            op = op.bias(&up(rt, &bias, vec![p.c_out].into()));
        }
        let y = run(rt, op);
        assert_eq!(y.shape(), &y_shape(p), "{}", what("forward shape"));
        let want: Vec<f64> = (0..p.y_len())
            .map(|i| {
                act_ref(
                    act,
                    y_ref[i] + if with_bias { bf[channel(p, i)] } else { 0.0 },
                )
            })
            .collect();
        check::<T>(
            &download::<T>(rt, &y),
            &want,
            &what(&format!("forward bias={with_bias} {act:?}")),
            seed,
        );
    }

    let mut dx_ref = vec![0f64; p.x_len()];
    visit(p, |xi, wi, yi| dx_ref[xi] += dyf[yi] * wf[wi]);
    let dx = run(
        rt,
        conv2d_backward_data(&up(rt, &dy, y_shape(p)), &up(rt, &w, w_shape(p)), *p),
    );
    assert_eq!(dx.shape(), &x_shape(p));
    check::<T>(
        &download::<T>(rt, &dx),
        &dx_ref,
        &what("backward data"),
        seed,
    );

    let mut dw_ref = vec![0f64; p.w_len()];
    visit(p, |xi, wi, yi| dw_ref[wi] += dyf[yi] * xf[xi]);
    let dw = run(
        rt,
        conv2d_backward_filter(&up(rt, &x, x_shape(p)), &up(rt, &dy, y_shape(p)), *p),
    );
    assert_eq!(dw.shape(), &w_shape(p));
    check::<T>(
        &download::<T>(rt, &dw),
        &dw_ref,
        &what("backward filter"),
        seed,
    );
}

backend_test!(conv_nchw_all_directions_match_f64, |rt, label| {
    for g in common::shard(&GEOMETRIES) {
        let p = params(g, Layout::Nchw);
        all_directions::<f32>(rt, label, &p);
        all_directions::<f16>(rt, label, &p);
        all_directions::<bf16>(rt, label, &p);
    }
});

backend_test!(conv_nhwc_all_directions_match_f64, |rt, label| {
    for g in common::shard(&GEOMETRIES) {
        let p = params(g, Layout::Nhwc);
        all_directions::<f32>(rt, label, &p);
        all_directions::<f16>(rt, label, &p);
        all_directions::<bf16>(rt, label, &p);
    }
});

backend_test!(conv_params_from_opts_match_shapes, |rt, label| {
    let _ = rt;
    let opts = Conv2dOpts::default()
        .stride(2)
        .pad(1)
        .dilation(1)
        .groups(2)
        .layout(Layout::Nhwc);
    let p = opts
        .params(&vec![2, 9, 7, 4].into(), &vec![6, 3, 3, 2].into())
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_eq!(
        (p.n, p.c_in, p.h, p.w, p.c_out, p.kh, p.kw),
        (2, 4, 9, 7, 6, 3, 3)
    );
    assert_eq!(y_shape(&p).dims(), [2, 5, 4, 6]);
});

backend_test!(conv_algorithm_cache_hits_on_repeat, |rt, label| {
    if rt.backend() != BackendKind::Cuda {
        return;
    }
    let s0 = rt.compute_streams(rt.device())[0];
    let p = params(GEOMETRIES[0], Layout::Nchw);
    let x = up(rt, &vec![0.5f32; p.x_len()], x_shape(&p));
    let w = up(rt, &vec![0.25f32; p.w_len()], w_shape(&p));
    let once = || {
        let op = conv2d(&x, &w, Conv2dOpts::from(&p));
        rt.submit_on(s0, op)
            .map_err(|e| e.error)
            .unwrap()
            .wait()
            .unwrap()
    };
    once();
    let (hits, misses) = conv_algo_cache_stats();
    once();
    once();
    let (hits2, misses2) = conv_algo_cache_stats();
    // Other tests run concurrently, so only lower bounds hold.
    assert!(hits2 >= hits + 2, "{label}: hits {hits} -> {hits2}");
    assert!(misses2 >= misses, "{label}: misses {misses} -> {misses2}");
    eprintln!(
        "{label}: conv algorithm searches that fell back to the heuristic: {}",
        conv_search_fallbacks()
    );
});

backend_test!(
    conv_bad_input_is_rejected_with_typed_errors_and_given_back,
    |rt, label| {
        let t = |d: &[usize]| upload(rt, &vec![0.5f32; d.iter().product()], d);
        let is_shape = |e: &Error| matches!(e, Error::ShapeMismatch { .. });
        let nchw = Conv2dOpts::default();
        // channels not divisible by groups
        let (x, w) = (t(&[1, 6, 8, 8]), t(&[4, 3, 3, 3]));
        let e = rt.submit(conv2d(&x, &w, nchw.groups(4))).unwrap_err();
        assert!(is_shape(&e.error), "{label}: {}", e.error);
        let (gx, gw, gb) = e.into_op().into_inputs();
        assert!(gx.same_storage(&x) && gw.same_storage(&w) && gb.is_none());
        // filter channels do not match the input's
        let e = rt
            .submit(conv2d(&t(&[1, 6, 8, 8]), &t(&[4, 4, 3, 3]), nchw))
            .unwrap_err();
        assert!(is_shape(&e.error), "{label}: {}", e.error);
        assert!(e.error.to_string().contains("[1, 6, 8, 8]"), "{}", e.error);
        // output size <= 0
        let e = rt
            .submit(conv2d(&t(&[1, 2, 4, 4]), &t(&[2, 2, 5, 5]), nchw))
            .unwrap_err();
        assert!(is_shape(&e.error), "{label}: {}", e.error);
        let e = rt
            .submit(conv2d(
                &t(&[1, 2, 4, 4]),
                &t(&[2, 2, 3, 3]),
                nchw.dilation(2),
            ))
            .unwrap_err();
        assert!(is_shape(&e.error), "{label}: {}", e.error);
        // zero stride, rank
        let e = rt
            .submit(conv2d(&t(&[1, 2, 4, 4]), &t(&[2, 2, 3, 3]), nchw.stride(0)))
            .unwrap_err();
        assert!(
            matches!(e.error, Error::InvalidDim { .. }),
            "{label}: {}",
            e.error
        );
        let e = rt
            .submit(conv2d(&t(&[2, 4, 4]), &t(&[2, 2, 3, 3]), nchw))
            .unwrap_err();
        assert!(is_shape(&e.error), "{label}: {}", e.error);
        // dtype mismatch, and bias length
        let h = upload(rt, &[f16::ONE; 2 * 2 * 9], &[2, 2, 3, 3]);
        let e = rt.submit(conv2d(&t(&[1, 2, 4, 4]), &h, nchw)).unwrap_err();
        assert!(
            matches!(e.error, Error::DTypeMismatch { .. }),
            "{label}: {}",
            e.error
        );
        assert!(e.into_op().into_inputs().1.same_storage(&h));
        let e = rt
            .submit(conv2d(&t(&[1, 2, 4, 4]), &t(&[2, 2, 3, 3]), nchw).bias(&t(&[3])))
            .unwrap_err();
        assert!(is_shape(&e.error), "{label}: {}", e.error);
        // backward: operands that do not match the params
        let p = params(GEOMETRIES[1], Layout::Nchw);
        let dy = t(y_shape(&p).dims());
        let e = rt
            .submit(conv2d_backward_data(&dy, &t(&[6, 4, 3, 3]), p))
            .unwrap_err();
        assert!(is_shape(&e.error), "{label}: {}", e.error);
        assert!(e.into_op().into_inputs().0.same_storage(&dy));
        let e = rt
            .submit(conv2d_backward_filter(&t(&[1, 4, 9, 8]), &dy, p))
            .unwrap_err();
        assert!(is_shape(&e.error), "{label}: {}", e.error);
        let mut bad = p;
        bad.groups = 3;
        let e = rt
            .submit(conv2d_backward_filter(&t(x_shape(&p).dims()), &dy, bad))
            .unwrap_err();
        assert!(is_shape(&e.error), "{label}: {}", e.error);
    }
);
