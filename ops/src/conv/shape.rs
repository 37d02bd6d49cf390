//! Convolution options and the shape rules, checked at submit time.

use rtx_runtime::{Error, Result, Shape};

use super::{Conv2dParams, Layout};

/// The options of a 2-D convolution: everything but the sizes, which come from the
/// tensors. Defaults: stride 1, no padding, dilation 1, one group, NCHW.
///
/// # Examples
///
/// ```
/// use rtx::ops::conv::{Conv2dOpts, Layout};
/// use rtx::Shape;
///
/// let opts = Conv2dOpts::default().stride(2).pad(1).layout(Layout::Nhwc);
/// // x [n, h, w, c_in], w [c_out, kh, kw, c_in/groups]
/// let p = opts.params(&Shape::new(vec![2, 9, 9, 4]), &Shape::new(vec![8, 3, 3, 4]))?;
/// assert_eq!(p.out_hw(), (5, 5));
/// # Ok::<(), rtx::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dOpts {
    /// (vertical, horizontal) stride.
    pub stride: (usize, usize),
    /// (top/bottom, left/right) zero padding.
    pub pad: (usize, usize),
    /// (vertical, horizontal) dilation.
    pub dilation: (usize, usize),
    /// Channel groups (`c_in` for depthwise).
    pub groups: usize,
    /// Activation and filter layout.
    pub layout: Layout,
}

impl Default for Conv2dOpts {
    fn default() -> Self {
        Conv2dOpts {
            stride: (1, 1),
            pad: (0, 0),
            dilation: (1, 1),
            groups: 1,
            layout: Layout::Nchw,
        }
    }
}

impl Conv2dOpts {
    /// The same stride along both axes.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = (s, s);
        self
    }
    /// The same padding along both axes.
    pub fn pad(mut self, p: usize) -> Self {
        self.pad = (p, p);
        self
    }
    /// The same dilation along both axes.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d);
        self
    }
    /// Channel groups.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
    /// The layout.
    pub fn layout(mut self, l: Layout) -> Self {
        self.layout = l;
        self
    }

    /// The full geometry of a convolution of input `x` with filter `w` (shapes in this
    /// layout), validated: typed errors for a rank other than 4, channels not divisible
    /// by `groups`, a filter whose channels do not match the input's, a zero stride or
    /// dilation, or an empty output.
    pub fn params(&self, x: &Shape, w: &Shape) -> Result<Conv2dParams> {
        const OP: &str = "conv2d";
        if x.rank() != 4 || w.rank() != 4 {
            let detail = format!("x and w must both be 4-D ({:?})", self.layout);
            return Err(Error::shape(OP, x, w, detail));
        }
        let (xd, wd) = (x.dims(), w.dims());
        let (n, c_in, h, wi, c_out, cig, kh, kw) = match self.layout {
            Layout::Nchw => (xd[0], xd[1], xd[2], xd[3], wd[0], wd[1], wd[2], wd[3]),
            Layout::Nhwc => (xd[0], xd[3], xd[1], xd[2], wd[0], wd[3], wd[1], wd[2]),
        };
        let g = self.groups;
        if g == 0 {
            return Err(Error::invalid_dim(OP, "groups must be at least 1"));
        }
        if c_in % g != 0 || c_out % g != 0 {
            let detail = format!("c_in {c_in} and c_out {c_out} must be multiples of groups {g}");
            return Err(Error::shape(OP, x, w, detail));
        }
        if cig != c_in / g {
            let detail = format!(
                "w has {cig} input channels per group, x has c_in / groups = {c_in} / {g} = {}",
                c_in / g
            );
            return Err(Error::shape(OP, x, w, detail));
        }
        let p = Conv2dParams {
            n,
            c_in,
            h,
            w: wi,
            c_out,
            kh,
            kw,
            stride: self.stride,
            pad: self.pad,
            dilation: self.dilation,
            groups: g,
            layout: self.layout,
        };
        check_params(OP, &p)?;
        Ok(p)
    }
}

impl From<&Conv2dParams> for Conv2dOpts {
    fn from(p: &Conv2dParams) -> Self {
        Conv2dOpts {
            stride: p.stride,
            pad: p.pad,
            dilation: p.dilation,
            groups: p.groups,
            layout: p.layout,
        }
    }
}

/// The shape of x (and dx) in `p`'s layout.
pub fn x_shape(p: &Conv2dParams) -> Shape {
    match p.layout {
        Layout::Nchw => Shape::new(vec![p.n, p.c_in, p.h, p.w]),
        Layout::Nhwc => Shape::new(vec![p.n, p.h, p.w, p.c_in]),
    }
}

/// The shape of the filter (and dw) in `p`'s layout.
pub fn w_shape(p: &Conv2dParams) -> Shape {
    let cig = p.c_in / p.groups.max(1);
    match p.layout {
        Layout::Nchw => Shape::new(vec![p.c_out, cig, p.kh, p.kw]),
        Layout::Nhwc => Shape::new(vec![p.c_out, p.kh, p.kw, cig]),
    }
}

/// The shape of y (and dy) in `p`'s layout.
pub fn y_shape(p: &Conv2dParams) -> Shape {
    let (oh, ow) = p.out_hw();
    match p.layout {
        Layout::Nchw => Shape::new(vec![p.n, p.c_out, oh, ow]),
        Layout::Nhwc => Shape::new(vec![p.n, oh, ow, p.c_out]),
    }
}

/// Validates a full geometry: positive sizes, groups dividing both channel counts, a
/// non-empty output, and element counts within cuDNN's 32-bit limits.
pub(crate) fn check_params(op: &str, p: &Conv2dParams) -> Result<()> {
    let (xs, ws) = (x_shape(p), w_shape(p));
    let sizes = [p.n, p.c_in, p.h, p.w, p.c_out, p.kh, p.kw, p.groups];
    if sizes.contains(&0) {
        return Err(Error::invalid_dim(op, format!("zero size in {p:?}")));
    }
    if !p.c_in.is_multiple_of(p.groups) || !p.c_out.is_multiple_of(p.groups) {
        let detail = format!(
            "c_in {} and c_out {} must be multiples of groups {}",
            p.c_in, p.c_out, p.groups
        );
        return Err(Error::shape(op, &xs, &ws, detail));
    }
    if [p.stride.0, p.stride.1, p.dilation.0, p.dilation.1].contains(&0) {
        return Err(Error::invalid_dim(
            op,
            "stride and dilation must be at least 1",
        ));
    }
    // Params are public fields: bound every size before any arithmetic on them, so
    // that no sum or product below can overflow (cuDNN takes 32-bit values anyway).
    let limit = i32::MAX as usize;
    let geometry = [
        p.h,
        p.w,
        p.kh,
        p.kw,
        p.stride.0,
        p.stride.1,
        p.pad.0,
        p.pad.1,
        p.dilation.0,
        p.dilation.1,
        p.n,
        p.c_in,
        p.c_out,
    ];
    if geometry.iter().any(|&v| v > limit) {
        return Err(Error::invalid_dim(
            op,
            format!("sizes, strides, padding and dilation must be below 2^31: {p:?}"),
        ));
    }
    let (oh, ow) = p.out_hw();
    if oh == 0 || ow == 0 {
        let detail = format!(
            "empty output: the dilated kernel ({}x{}) does not fit the padded input ({}x{})",
            p.dilation.0 * (p.kh - 1) + 1,
            p.dilation.1 * (p.kw - 1) + 1,
            p.h + 2 * p.pad.0,
            p.w + 2 * p.pad.1
        );
        return Err(Error::shape(op, &xs, &ws, detail));
    }
    let len = |dims: [usize; 4]| dims.iter().try_fold(1usize, |a, d| a.checked_mul(*d));
    let lens = [
        len([p.n, p.c_in, p.h, p.w]),
        len([p.c_out, p.c_in / p.groups, p.kh, p.kw]),
        len([p.n, p.c_out, oh, ow]),
    ];
    if lens.iter().any(|l| l.is_none_or(|l| l > limit)) {
        return Err(Error::invalid_dim(
            op,
            format!("tensors above 2^31 elements: {p:?}"),
        ));
    }
    Ok(())
}

/// Checks that `got` is the shape `p` implies for the operand `what`.
pub(crate) fn expect_shape(op: &str, what: &str, got: &Shape, want: &Shape) -> Result<()> {
    if got == want {
        return Ok(());
    }
    Err(Error::shape(
        op,
        got,
        want,
        format!("{what} must have the shape the params imply"),
    ))
}
