//! CPU 2-D convolution: im2col + GEMM forward, GEMM + col2im for the data
//! gradient, im2col + GEMM for the filter gradient. Computed in f32 for every
//! storage type (inputs widened once, results rounded once).
//!
//! Layouts (row-major):
//! - [`Layout::Nchw`]: x `[n, c_in, h, w]`, weights `[c_out, c_in/groups, kh, kw]`,
//!   y `[n, c_out, oh, ow]`.
//! - [`Layout::Nhwc`]: x `[n, h, w, c_in]`, weights `[c_out, kh, kw, c_in/groups]`
//!   (cuDNN's NHWC filter format), y `[n, oh, ow, c_out]`.
//!
//! This is cross-correlation, as in every deep-learning framework. Output channel
//! `co` of group `g = co / (c_out/groups)` reads input channels
//! `g*(c_in/groups) .. (g+1)*(c_in/groups)`.
//!
//! Images are processed in parallel when there are at least as many as threads;
//! otherwise one image at a time with parallel im2col and GEMM.

mod im2col;
#[cfg(test)]
mod tests;

use rayon::prelude::*;

pub use super::{Conv2dParams, Layout};
use crate::cpu_util::{to_f32_cow, to_f32_vec, with_f32_out, Float};
use crate::gemm::cpu::{
    gemm_into, linear_epilogue, parallelism, Activation, MatMut, MatRef, GEMM_PAR_MIN,
};
use ::gemm::Parallelism;
use im2col::{col2im_nchw, col2im_nhwc, im2col_nchw, im2col_nhwc};

impl Conv2dParams {
    /// Output channels per group.
    fn cog(&self) -> usize {
        self.c_out / self.groups
    }

    fn debug_check(&self) {
        debug_assert!(self.groups > 0 && self.kh > 0 && self.kw > 0);
        debug_assert_eq!((self.c_in % self.groups, self.c_out % self.groups), (0, 0));
        debug_assert!(self.stride.0 > 0 && self.stride.1 > 0);
        debug_assert!(self.dilation.0 > 0 && self.dilation.1 > 0);
    }
}

/// How a whole-batch call spreads its work.
#[derive(Clone, Copy)]
struct Plan {
    /// One rayon task per image (then each image runs serially inside).
    per_image: bool,
    /// Parallelism inside one image (im2col, col2im, GEMM).
    inner: bool,
}

impl Plan {
    fn of(p: &Conv2dParams) -> Plan {
        let (oh, ow) = p.out_hw();
        let macs = p.n * p.c_out * oh * ow * p.k_len();
        let big = macs >= GEMM_PAR_MIN;
        let per_image = big && p.n >= rayon::current_num_threads();
        Plan {
            per_image,
            inner: big && !per_image,
        }
    }

    fn gemm_par(self, m: usize, n: usize, k: usize) -> Parallelism {
        if self.inner {
            parallelism(m, n, k)
        } else {
            Parallelism::None
        }
    }
}

/// Runs `f(image_a, image_b)` over matching per-image chunks of `a` and `b`.
fn for_images<A: Sync, B: Send>(
    plan: Plan,
    a: &[A],
    a_img: usize,
    b: &mut [B],
    b_img: usize,
    f: impl Fn(&[A], &mut [B]) + Sync,
) {
    if a_img == 0 || b_img == 0 {
        return;
    }
    if plan.per_image {
        b.par_chunks_mut(b_img)
            .zip(a.par_chunks(a_img))
            .for_each(|(b, a)| f(a, b));
    } else {
        b.chunks_mut(b_img)
            .zip(a.chunks(a_img))
            .for_each(|(b, a)| f(a, b));
    }
}

/// `y = act(conv(x, w) + bias)`; `bias` has `c_out` elements.
pub fn conv2d_forward<T: Float>(
    p: &Conv2dParams,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    act: Activation,
    y: &mut [T],
) {
    p.debug_check();
    debug_assert_eq!(
        (x.len(), w.len(), y.len()),
        (p.x_len(), p.w_len(), p.y_len())
    );
    debug_assert!(bias.iter().all(|b| b.len() == p.c_out));
    let plan = Plan::of(p);
    let wf = to_f32_cow(w);
    let bias = bias.map(to_f32_vec);
    let (oh, ow) = p.out_hw();
    let (x_img, y_img) = (p.c_in * p.h * p.w, p.c_out * oh * ow);
    for_images(plan, x, x_img, y, y_img, |xi, yi| {
        with_f32_out(yi, |yf| {
            forward_image(p, plan, xi, &wf, yf);
            epilogue(p, yf, bias.as_deref(), act);
        })
    });
}

fn forward_image<T: Float>(p: &Conv2dParams, plan: Plan, x: &[T], w: &[f32], y: &mut [f32]) {
    let (oh, ow) = p.out_hw();
    let (pp, k, cog) = (oh * ow, p.k_len(), p.cog());
    let mut col = vec![0f32; k * pp];
    let par = plan.gemm_par(cog, pp, k);
    for g in 0..p.groups {
        let wg = MatRef::new(w, g * cog * k, k, 1);
        match p.layout {
            Layout::Nchw => {
                im2col_nchw(p, x, g, &mut col, plan.inner);
                let c = MatMut::new(y, g * cog * pp, pp, 1);
                gemm_into((cog, pp, k), c, wg, MatRef::new(&col, 0, pp, 1), false, par);
            }
            Layout::Nhwc => {
                im2col_nhwc(p, x, g, &mut col, plan.inner);
                let c = MatMut::new(y, g * cog, p.c_out, 1);
                let wgt = MatRef::new(w, g * cog * k, 1, k);
                gemm_into((pp, cog, k), c, MatRef::new(&col, 0, k, 1), wgt, false, par);
            }
        }
    }
}

/// Per-channel bias and activation on one image's f32 output.
fn epilogue(p: &Conv2dParams, y: &mut [f32], bias: Option<&[f32]>, act: Activation) {
    match p.layout {
        Layout::Nhwc => linear_epilogue(y, bias, p.c_out, act),
        Layout::Nchw => {
            if bias.is_none() && act == Activation::None {
                return;
            }
            let pp = y.len() / p.c_out;
            for (co, plane) in y.chunks_mut(pp).enumerate() {
                let b = bias.map_or(0.0, |b| b[co]);
                plane.iter_mut().for_each(|v| *v = act.apply(*v + b));
            }
        }
    }
}

/// The data gradient: `dx = conv_transpose(dy, w)`, i.e. the adjoint of the
/// forward convolution (without bias and activation) applied to `dy`.
pub fn conv2d_backward_data<T: Float>(p: &Conv2dParams, dy: &[T], w: &[T], dx: &mut [T]) {
    p.debug_check();
    debug_assert_eq!(
        (dy.len(), w.len(), dx.len()),
        (p.y_len(), p.w_len(), p.x_len())
    );
    if p.y_len() == 0 {
        dx.fill(T::from_f32(0.0));
        return;
    }
    let plan = Plan::of(p);
    let wf = to_f32_cow(w);
    let (oh, ow) = p.out_hw();
    let (x_img, y_img) = (p.c_in * p.h * p.w, p.c_out * oh * ow);
    for_images(plan, dy, y_img, dx, x_img, |dyi, dxi| {
        let dyf = to_f32_cow(dyi);
        with_f32_out(dxi, |dxf| backward_data_image(p, plan, &dyf, &wf, dxf));
    });
}

fn backward_data_image(p: &Conv2dParams, plan: Plan, dy: &[f32], w: &[f32], dx: &mut [f32]) {
    let (oh, ow) = p.out_hw();
    let (pp, k, cog) = (oh * ow, p.k_len(), p.cog());
    let mut col = vec![0f32; k * pp];
    let par = plan.gemm_par(k, pp, cog);
    if p.layout == Layout::Nhwc {
        dx.fill(0.0);
    }
    for g in 0..p.groups {
        match p.layout {
            Layout::Nchw => {
                // dcol [K, P] = W_gᵀ · dY_g
                let wgt = MatRef::new(w, g * cog * k, 1, k);
                let dyg = MatRef::new(dy, g * cog * pp, pp, 1);
                gemm_into(
                    (k, pp, cog),
                    MatMut::new(&mut col, 0, pp, 1),
                    wgt,
                    dyg,
                    false,
                    par,
                );
                col2im_nchw(p, &col, g, dx, plan.inner);
            }
            Layout::Nhwc => {
                // dcol [P, K] = dY_g · W_g
                let dyg = MatRef::new(dy, g * cog, p.c_out, 1);
                let wg = MatRef::new(w, g * cog * k, k, 1);
                gemm_into(
                    (pp, k, cog),
                    MatMut::new(&mut col, 0, k, 1),
                    dyg,
                    wg,
                    false,
                    par,
                );
                col2im_nhwc(p, &col, g, dx, plan.inner);
            }
        }
    }
}

/// The filter gradient: `dw[co, ..] = Σ_images Σ_pixels dy · x-patch`.
pub fn conv2d_backward_filter<T: Float>(p: &Conv2dParams, x: &[T], dy: &[T], dw: &mut [T]) {
    p.debug_check();
    debug_assert_eq!(
        (x.len(), dy.len(), dw.len()),
        (p.x_len(), p.y_len(), p.w_len())
    );
    let plan = Plan::of(p);
    let (oh, ow) = p.out_hw();
    let (x_img, y_img) = (p.c_in * p.h * p.w, p.c_out * oh * ow);
    with_f32_out(dw, |dwf| {
        dwf.fill(0.0);
        if y_img == 0 || p.n == 0 {
            return;
        }
        let images = |range: std::ops::Range<usize>, acc: &mut [f32]| {
            for i in range {
                let xi = &x[i * x_img..][..x_img];
                let dyf = to_f32_cow(&dy[i * y_img..][..y_img]);
                filter_image(p, plan, xi, &dyf, acc);
            }
        };
        if !plan.per_image {
            images(0..p.n, dwf);
            return;
        }
        // Fixed contiguous image ranges, partial sums added in order: the result
        // does not depend on scheduling.
        let parts = rayon::current_num_threads().min(p.n);
        let per = p.n.div_ceil(parts);
        let partials: Vec<Vec<f32>> = (0..parts)
            .into_par_iter()
            .map(|t| {
                let mut acc = vec![0f32; dwf.len()];
                images(t * per..((t + 1) * per).min(p.n), &mut acc);
                acc
            })
            .collect();
        for part in partials {
            dwf.iter_mut().zip(&part).for_each(|(d, v)| *d += v);
        }
    });
}

/// Adds one image's filter gradient onto `dw` (f32, `[c_out, K]` in the filter's
/// own tap order).
fn filter_image<T: Float>(p: &Conv2dParams, plan: Plan, x: &[T], dy: &[f32], dw: &mut [f32]) {
    let (oh, ow) = p.out_hw();
    let (pp, k, cog) = (oh * ow, p.k_len(), p.cog());
    let mut col = vec![0f32; k * pp];
    let par = plan.gemm_par(cog, k, pp);
    for g in 0..p.groups {
        let dwg = MatMut::new(dw, g * cog * k, k, 1);
        match p.layout {
            Layout::Nchw => {
                // dW_g [cog, K] += dY_g [cog, P] · colᵀ
                im2col_nchw(p, x, g, &mut col, plan.inner);
                let dyg = MatRef::new(dy, g * cog * pp, pp, 1);
                gemm_into(
                    (cog, k, pp),
                    dwg,
                    dyg,
                    MatRef::new(&col, 0, 1, pp),
                    true,
                    par,
                );
            }
            Layout::Nhwc => {
                // dW_g [cog, K] += dY_gᵀ · col [P, K]
                im2col_nhwc(p, x, g, &mut col, plan.inner);
                let dygt = MatRef::new(dy, g * cog, 1, p.c_out);
                gemm_into(
                    (cog, k, pp),
                    dwg,
                    dygt,
                    MatRef::new(&col, 0, k, 1),
                    true,
                    par,
                );
            }
        }
    }
}
