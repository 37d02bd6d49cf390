//! Convolution tests: forward and both gradients against a direct f64 loop nest,
//! and the adjoint identities `<conv(x,w), dy> == <x, bwd_data(dy,w)> == <w, bwd_filter(x,dy)>`.

use super::*;
use crate::cpu_util::testing::{f64s, poison, rand_vec, rel_err, rng, tol};
use half::{bf16, f16};

/// Calls `f(x_index, w_index, y_index)` for every multiply-add of the convolution.
fn for_each_tap(p: &Conv2dParams, mut f: impl FnMut(usize, usize, usize)) {
    let (oh, ow) = p.out_hw();
    let (cg, cog) = (p.c_in / p.groups, p.c_out / p.groups);
    for n in 0..p.n {
        for co in 0..p.c_out {
            let g = co / cog;
            for oy in 0..oh {
                for ox in 0..ow {
                    for c in 0..cg {
                        for ky in 0..p.kh {
                            for kx in 0..p.kw {
                                let iy = (oy * p.stride.0 + ky * p.dilation.0) as isize
                                    - p.pad.0 as isize;
                                let ix = (ox * p.stride.1 + kx * p.dilation.1) as isize
                                    - p.pad.1 as isize;
                                if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
                                    continue;
                                }
                                let (iy, ix, ci) = (iy as usize, ix as usize, g * cg + c);
                                let (xi, wi, yi) = match p.layout {
                                    Layout::Nchw => (
                                        ((n * p.c_in + ci) * p.h + iy) * p.w + ix,
                                        ((co * cg + c) * p.kh + ky) * p.kw + kx,
                                        ((n * p.c_out + co) * oh + oy) * ow + ox,
                                    ),
                                    Layout::Nhwc => (
                                        ((n * p.h + iy) * p.w + ix) * p.c_in + ci,
                                        ((co * p.kh + ky) * p.kw + kx) * cg + c,
                                        ((n * oh + oy) * ow + ox) * p.c_out + co,
                                    ),
                                };
                                f(xi, wi, yi);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn ref_act(act: Activation, v: f64) -> f64 {
    match act {
        Activation::None => v,
        Activation::Relu => v.max(0.0),
        Activation::Gelu => {
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh();
            0.5 * v * (1.0 + t)
        }
    }
}

fn ref_forward(
    p: &Conv2dParams,
    x: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    act: Activation,
) -> Vec<f64> {
    let mut y = vec![0f64; p.y_len()];
    for_each_tap(p, |xi, wi, yi| y[yi] += x[xi] * w[wi]);
    let (oh, ow) = p.out_hw();
    for (i, v) in y.iter_mut().enumerate() {
        let co = match p.layout {
            Layout::Nchw => (i / (oh * ow)) % p.c_out,
            Layout::Nhwc => i % p.c_out,
        };
        *v = ref_act(act, *v + bias.map_or(0.0, |b| b[co]));
    }
    y
}

#[allow(clippy::too_many_arguments)]
fn geom(
    n: usize,
    c_in: usize,
    hw: (usize, usize),
    c_out: usize,
    k: (usize, usize),
    stride: (usize, usize),
    pad: (usize, usize),
    dilation: (usize, usize),
    groups: usize,
) -> Conv2dParams {
    Conv2dParams {
        n,
        c_in,
        h: hw.0,
        w: hw.1,
        c_out,
        kh: k.0,
        kw: k.1,
        stride,
        pad,
        dilation,
        groups,
        layout: Layout::Nchw,
    }
}

fn cases() -> Vec<Conv2dParams> {
    vec![
        geom(1, 1, (1, 1), 1, (1, 1), (1, 1), (0, 0), (1, 1), 1),
        geom(2, 3, (7, 5), 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
        geom(3, 4, (9, 11), 6, (3, 2), (2, 1), (1, 0), (1, 2), 2),
        geom(2, 6, (10, 10), 6, (3, 3), (1, 2), (2, 2), (2, 2), 6), // depthwise
        geom(1, 8, (13, 7), 4, (5, 3), (3, 2), (2, 1), (1, 1), 4),
        geom(4, 16, (16, 16), 32, (1, 1), (1, 1), (0, 0), (1, 1), 1), // pointwise
        geom(1, 3, (4, 4), 2, (3, 3), (1, 1), (3, 3), (1, 1), 1),     // padding > kernel reach
        geom(5, 32, (20, 18), 48, (3, 3), (1, 1), (1, 1), (1, 1), 2), // one task per image
        geom(1, 16, (40, 30), 32, (3, 3), (2, 1), (1, 1), (1, 2), 2), // parallel inside one image
    ]
}

fn layouts() -> Vec<Conv2dParams> {
    let mut v = Vec::new();
    for p in cases() {
        v.push(p);
        v.push(Conv2dParams {
            layout: Layout::Nhwc,
            ..p
        });
    }
    v
}

fn check_forward<T: Float>(p: &Conv2dParams) {
    let (seed, mut r) = rng();
    let x: Vec<T> = rand_vec(&mut r, p.x_len());
    let w: Vec<T> = rand_vec(&mut r, p.w_len());
    let b: Vec<T> = rand_vec(&mut r, p.c_out);
    for (bias, act) in [
        (false, Activation::None),
        (true, Activation::Relu),
        (true, Activation::Gelu),
    ] {
        let bias = bias.then_some(&b[..]);
        let mut y = poison::<T>(p.y_len());
        conv2d_forward(p, &x, &w, bias, act, &mut y);
        let bf = bias.map(f64s);
        let want = ref_forward(p, &f64s(&x), &f64s(&w), bf.as_deref(), act);
        let e = rel_err(&y, &want);
        assert!(
            e < tol::<T>(),
            "forward {p:?} {act:?} {:?} err {e} seed {seed}",
            T::KIND
        );
    }
}

fn check_backward<T: Float>(p: &Conv2dParams) {
    let (seed, mut r) = rng();
    let x: Vec<T> = rand_vec(&mut r, p.x_len());
    let w: Vec<T> = rand_vec(&mut r, p.w_len());
    let dy: Vec<T> = rand_vec(&mut r, p.y_len());
    let (xf, wf, dyf) = (f64s(&x), f64s(&w), f64s(&dy));
    let (mut dx_ref, mut dw_ref) = (vec![0f64; p.x_len()], vec![0f64; p.w_len()]);
    for_each_tap(p, |xi, wi, yi| {
        dx_ref[xi] += dyf[yi] * wf[wi];
        dw_ref[wi] += xf[xi] * dyf[yi];
    });
    let mut dx = poison::<T>(p.x_len());
    conv2d_backward_data(p, &dy, &w, &mut dx);
    let e = rel_err(&dx, &dx_ref);
    assert!(
        e < tol::<T>(),
        "backward data {p:?} {:?} err {e} seed {seed}",
        T::KIND
    );
    let mut dw = poison::<T>(p.w_len());
    conv2d_backward_filter(p, &x, &dy, &mut dw);
    let e = rel_err(&dw, &dw_ref);
    assert!(
        e < tol::<T>(),
        "backward filter {p:?} {:?} err {e} seed {seed}",
        T::KIND
    );
}

#[test]
fn forward_f32() {
    layouts().iter().for_each(check_forward::<f32>);
}
#[test]
fn forward_f16() {
    layouts().iter().for_each(check_forward::<f16>);
}
#[test]
fn forward_bf16() {
    layouts().iter().for_each(check_forward::<bf16>);
}
#[test]
fn backward_f32() {
    layouts().iter().for_each(check_backward::<f32>);
}
#[test]
fn backward_f16() {
    layouts().iter().for_each(check_backward::<f16>);
}
#[test]
fn backward_bf16() {
    layouts().iter().for_each(check_backward::<bf16>);
}

/// `<conv(x,w), dy> == <x, bwd_data(dy,w)> == <w, bwd_filter(x,dy)>` with the
/// kernels' own outputs only (no reference loop).
#[test]
fn adjoint_identities() {
    for p in layouts() {
        let (seed, mut r) = rng();
        let x: Vec<f32> = rand_vec(&mut r, p.x_len());
        let w: Vec<f32> = rand_vec(&mut r, p.w_len());
        let dy: Vec<f32> = rand_vec(&mut r, p.y_len());
        let (mut y, mut dx, mut dw) = (poison(p.y_len()), poison(p.x_len()), poison(p.w_len()));
        conv2d_forward(&p, &x, &w, None, Activation::None, &mut y);
        conv2d_backward_data(&p, &dy, &w, &mut dx);
        conv2d_backward_filter(&p, &x, &dy, &mut dw);
        let dot = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>()
        };
        let norms = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum::<f64>()
        };
        let (l, scale) = (dot(&y, &dy), norms(&y, &dy).max(1e-30));
        let (d, f) = (dot(&x, &dx), dot(&w, &dw));
        assert!(
            ((l - d) / scale).abs() < 1e-5,
            "{p:?} <y,dy>={l} <x,dx>={d} seed {seed}"
        );
        assert!(
            ((l - f) / scale).abs() < 1e-5,
            "{p:?} <y,dy>={l} <w,dw>={f} seed {seed}"
        );
    }
}

#[test]
fn output_size() {
    let p = geom(1, 1, (10, 7), 1, (3, 3), (2, 3), (1, 0), (2, 1), 1);
    assert_eq!(p.out_hw(), (4, 2));
    let tiny = geom(1, 1, (2, 2), 1, (3, 3), (1, 1), (0, 0), (1, 1), 1);
    assert_eq!(tiny.out_hw(), (0, 0));
    let mut dx = poison::<f32>(4);
    conv2d_backward_data(&tiny, &[], &[1.0; 9], &mut dx);
    assert_eq!(dx, vec![0.0; 4]);
}
