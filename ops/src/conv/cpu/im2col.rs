//! im2col (gather input patches into a matrix) and col2im (its adjoint: add a
//! patch matrix back onto the input), for one image and one group, in f32.
//!
//! Matrix layouts, with `P = oh * ow` output pixels and `K = cg * kh * kw`:
//! - NCHW: `col` is `[K, P]`, rows ordered `(c, ky, kx)` like the filter's
//!   `[cg, kh, kw]`; then `Y_g = W_g · col`.
//! - NHWC: `col` is `[P, K]`, columns ordered `(ky, kx, c)` like the filter's
//!   `[kh, kw, cg]`; then `Y_g = col · W_gᵀ`.

use rayon::prelude::*;

use super::Conv2dParams;
use crate::cpu_util::Float;

/// Outputs `o` in `0..n_out` with `0 <= o * stride + offset < n_in`, as a range
/// `lo..hi` (empty when none).
#[inline]
pub(super) fn valid_range(
    n_out: usize,
    stride: usize,
    offset: isize,
    n_in: usize,
) -> (usize, usize) {
    let s = stride as isize;
    let lo = if offset >= 0 {
        0
    } else {
        (-offset + s - 1) / s
    };
    let room = n_in as isize - offset;
    let hi = if room <= 0 { 0 } else { (room + s - 1) / s };
    let hi = (hi as usize).min(n_out);
    ((lo as usize).min(hi), hi)
}

/// `ky * dilation - pad` for one kernel tap along one axis.
#[inline]
fn tap_offset(k: usize, dil: usize, pad: usize) -> isize {
    (k * dil) as isize - pad as isize
}

/// Fills `col` (`[K, P]`) from image `x` (`[c_in, h, w]`) for group `g`.
pub(super) fn im2col_nchw<T: Float>(
    p: &Conv2dParams,
    x: &[T],
    g: usize,
    col: &mut [f32],
    par: bool,
) {
    let (oh, ow) = p.out_hw();
    let (cg, hw) = (p.c_in / p.groups, p.h * p.w);
    let row = |(r, dst): (usize, &mut [f32])| {
        let (c, ky, kx) = (r / (p.kh * p.kw), (r / p.kw) % p.kh, r % p.kw);
        let plane = &x[(g * cg + c) * hw..][..hw];
        let offy = tap_offset(ky, p.dilation.0, p.pad.0);
        let offx = tap_offset(kx, p.dilation.1, p.pad.1);
        let (ylo, yhi) = valid_range(oh, p.stride.0, offy, p.h);
        let (xlo, xhi) = valid_range(ow, p.stride.1, offx, p.w);
        for (oy, d) in dst.chunks_mut(ow).enumerate() {
            if oy < ylo || oy >= yhi {
                d.fill(0.0);
                continue;
            }
            let iy = (oy * p.stride.0) as isize + offy;
            let src = &plane[iy as usize * p.w..][..p.w];
            d[..xlo].fill(0.0);
            d[xhi..].fill(0.0);
            for (ox, v) in d[xlo..xhi].iter_mut().enumerate() {
                let ix = ((ox + xlo) * p.stride.1) as isize + offx;
                *v = src[ix as usize].to_f32();
            }
        }
    };
    let pp = oh * ow;
    if par {
        col.par_chunks_mut(pp).enumerate().for_each(row);
    } else {
        col.chunks_mut(pp).enumerate().for_each(row);
    }
}

/// Fills `col` (`[P, K]`) from image `x` (`[h, w, c_in]`) for group `g`.
pub(super) fn im2col_nhwc<T: Float>(
    p: &Conv2dParams,
    x: &[T],
    g: usize,
    col: &mut [f32],
    par: bool,
) {
    let (_, ow) = p.out_hw();
    let cg = p.c_in / p.groups;
    let k = cg * p.kh * p.kw;
    let pixel = |(pi, dst): (usize, &mut [f32])| {
        let (oy, ox) = (pi / ow, pi % ow);
        for ky in 0..p.kh {
            let iy = (oy * p.stride.0) as isize + tap_offset(ky, p.dilation.0, p.pad.0);
            for kx in 0..p.kw {
                let ix = (ox * p.stride.1) as isize + tap_offset(kx, p.dilation.1, p.pad.1);
                let d = &mut dst[(ky * p.kw + kx) * cg..][..cg];
                if iy < 0 || iy >= p.h as isize || ix < 0 || ix >= p.w as isize {
                    d.fill(0.0);
                    continue;
                }
                let src = &x[(iy as usize * p.w + ix as usize) * p.c_in + g * cg..][..cg];
                d.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
            }
        }
    };
    if par {
        col.par_chunks_mut(k).enumerate().for_each(pixel);
    } else {
        col.chunks_mut(k).enumerate().for_each(pixel);
    }
}

/// Writes group `g`'s channels of `dx` (`[c_in, h, w]`) as the sum of the
/// patches in `col` (`[K, P]`) that cover each input pixel. Each channel plane is
/// one task: its `kh * kw` rows of `col` land only on it.
pub(super) fn col2im_nchw(p: &Conv2dParams, col: &[f32], g: usize, dx: &mut [f32], par: bool) {
    let (oh, ow) = p.out_hw();
    let (cg, hw, pp) = (p.c_in / p.groups, p.h * p.w, oh * ow);
    let planes = &mut dx[g * cg * hw..][..cg * hw];
    let plane = |(c, d): (usize, &mut [f32])| {
        d.fill(0.0);
        for ky in 0..p.kh {
            let offy = tap_offset(ky, p.dilation.0, p.pad.0);
            let (ylo, yhi) = valid_range(oh, p.stride.0, offy, p.h);
            for kx in 0..p.kw {
                let offx = tap_offset(kx, p.dilation.1, p.pad.1);
                let (xlo, xhi) = valid_range(ow, p.stride.1, offx, p.w);
                let src = &col[((c * p.kh + ky) * p.kw + kx) * pp..][..pp];
                for oy in ylo..yhi {
                    let iy = ((oy * p.stride.0) as isize + offy) as usize;
                    let drow = &mut d[iy * p.w..][..p.w];
                    for ox in xlo..xhi {
                        let ix = ((ox * p.stride.1) as isize + offx) as usize;
                        drow[ix] += src[oy * ow + ox];
                    }
                }
            }
        }
    };
    if par {
        planes.par_chunks_mut(hw).enumerate().for_each(plane);
    } else {
        planes.chunks_mut(hw).enumerate().for_each(plane);
    }
}

/// Adds onto group `g`'s channels of `dx` (`[h, w, c_in]`, zeroed by the caller)
/// the patches in `col` (`[P, K]`), gathering per input row so rows are
/// independent tasks.
pub(super) fn col2im_nhwc(p: &Conv2dParams, col: &[f32], g: usize, dx: &mut [f32], par: bool) {
    let (oh, ow) = p.out_hw();
    let cg = p.c_in / p.groups;
    let k = cg * p.kh * p.kw;
    // The output index `o` whose tap at offset `off` lands on input `i`, if any.
    let source = |i: usize, off: isize, stride: usize, n_out: usize| -> Option<usize> {
        let num = i as isize - off;
        if num < 0 || num % stride as isize != 0 {
            return None;
        }
        let o = (num / stride as isize) as usize;
        (o < n_out).then_some(o)
    };
    let row = |(iy, drow): (usize, &mut [f32])| {
        for ky in 0..p.kh {
            let Some(oy) = source(iy, tap_offset(ky, p.dilation.0, p.pad.0), p.stride.0, oh) else {
                continue;
            };
            for kx in 0..p.kw {
                let offx = tap_offset(kx, p.dilation.1, p.pad.1);
                for ix in 0..p.w {
                    let Some(ox) = source(ix, offx, p.stride.1, ow) else {
                        continue;
                    };
                    let src = &col[(oy * ow + ox) * k + (ky * p.kw + kx) * cg..][..cg];
                    let d = &mut drow[ix * p.c_in + g * cg..][..cg];
                    d.iter_mut().zip(src).for_each(|(d, s)| *d += s);
                }
            }
        }
    };
    let row_len = p.w * p.c_in;
    if par {
        dx.par_chunks_mut(row_len).enumerate().for_each(row);
    } else {
        dx.chunks_mut(row_len).enumerate().for_each(row);
    }
}
