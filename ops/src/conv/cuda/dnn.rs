//! cuDNN at the `sys` level: an owned handle, the descriptors of one convolution, the
//! algorithm search (benchmarking `cudnnFind*AlgorithmEx`, heuristic `*_v7` as the
//! fallback) and the three launches. Every status code becomes an
//! [`Error::Cudnn`](rtx_runtime::Error::Cudnn).
//!
//! cudarc's safe cuDNN API keeps its raw handle and descriptors private and offers only
//! the heuristic, so the benchmarking search cannot be layered on it; this module owns
//! its handle and descriptors instead. All of them are `!Send` (raw pointers): they are
//! created, used and dropped on one stream actor.

use std::ffi::c_void;

use cudarc::cudnn::sys;
use cudarc::driver::CudaStream;
use rtx_runtime::{DType, Result};

pub(crate) use super::perf::Filter;
use super::perf::{pick, zeroed, DATA_ALGOS, FILTER_ALGOS, FWD_ALGOS};
use crate::conv::{Conv2dParams, Layout};
use crate::gemm::device::cudnn_error;

use sys::cudnnConvolutionBwdDataAlgo_t as DataAlgo;
use sys::cudnnConvolutionBwdFilterAlgo_t as FilterAlgo;
use sys::cudnnConvolutionFwdAlgo_t as FwdAlgo;
use sys::cudnnMathType_t as Math;

/// A status as a `Result`.
pub(crate) fn check(call: &str, s: sys::cudnnStatus_t) -> Result<()> {
    match s {
        sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS => Ok(()),
        other => Err(cudnn_error(call, other)),
    }
}

/// Which computation of the convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dir {
    /// y = conv(x, w).
    Forward,
    /// dx from dy and w.
    BackwardData,
    /// dw from x and dy.
    BackwardFilter,
}

/// A chosen algorithm of one direction.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Algo {
    Fwd(FwdAlgo),
    Data(DataAlgo),
    Filter(FilterAlgo),
}

/// The result of the search: algorithm, its workspace and math type.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Choice {
    pub algo: Algo,
    pub workspace: usize,
    pub math: Math,
}

/// Device addresses of one call: x (dx for backward data), w (dw for backward
/// filter), y (dy for both backward directions).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Io {
    pub x: u64,
    pub w: u64,
    pub y: u64,
}

/// An owned cuDNN handle bound to one stream.
pub(crate) struct Handle(sys::cudnnHandle_t);

impl Handle {
    /// Creates a handle on this thread (the device context must be current) and binds
    /// it to `stream`.
    pub fn new(stream: &CudaStream) -> Result<Self> {
        let mut h: sys::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer for the new handle.
        check("cudnnCreate", unsafe { sys::cudnnCreate(&mut h) })?;
        let h = Handle(h);
        // SAFETY: `h.0` is live; the stream outlives the handle (the stream actor owns
        // both and drops the handle with its state, before the stream).
        check("cudnnSetStream", unsafe {
            sys::cudnnSetStream(h.0, stream.cu_stream() as _)
        })?;
        Ok(h)
    }

    /// The raw handle, for calls made while `self` is borrowed.
    pub fn raw(&self) -> sys::cudnnHandle_t {
        self.0
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreate`, destroyed only here; no error can be
        // reported from drop (at worst the handle leaks).
        let _ = unsafe { sys::cudnnDestroy(self.0) };
    }
}

macro_rules! owned_desc {
    ($name:ident, $raw:ty, $create:ident, $destroy:ident) => {
        struct $name($raw);
        impl $name {
            fn new() -> Result<Self> {
                let mut d: $raw = std::ptr::null_mut();
                // SAFETY: `d` is a valid out-pointer for the new descriptor.
                check(stringify!($create), unsafe { sys::$create(&mut d) })?;
                Ok($name(d))
            }
        }
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created by the matching create call, destroyed only here.
                let _ = unsafe { sys::$destroy(self.0) };
            }
        }
    };
}
owned_desc!(
    TensorDesc,
    sys::cudnnTensorDescriptor_t,
    cudnnCreateTensorDescriptor,
    cudnnDestroyTensorDescriptor
);
owned_desc!(
    FilterDesc,
    sys::cudnnFilterDescriptor_t,
    cudnnCreateFilterDescriptor,
    cudnnDestroyFilterDescriptor
);
owned_desc!(
    ConvDesc,
    sys::cudnnConvolutionDescriptor_t,
    cudnnCreateConvolutionDescriptor,
    cudnnDestroyConvolutionDescriptor
);

/// The descriptors of one convolution geometry and dtype.
pub(crate) struct ConvDescs {
    x: TensorDesc,
    w: FilterDesc,
    y: TensorDesc,
    conv: ConvDesc,
}

pub(crate) fn data_type(dt: DType) -> sys::cudnnDataType_t {
    match dt {
        DType::F16 => sys::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::BF16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        _ => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
    }
}

impl ConvDescs {
    /// Descriptors for `p` with storage `dtype`, f32 compute (cross-correlation), and
    /// the initial math type `math`. Sizes were validated below 2^31 at submit.
    pub fn new(p: &Conv2dParams, dtype: DType, math: Math) -> Result<Self> {
        let fmt = match p.layout {
            Layout::Nchw => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            Layout::Nhwc => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
        };
        let dt = data_type(dtype);
        let i = |v: usize| v as i32;
        let (oh, ow) = p.out_hw();
        let d = ConvDescs {
            x: TensorDesc::new()?,
            w: FilterDesc::new()?,
            y: TensorDesc::new()?,
            conv: ConvDesc::new()?,
        };
        // SAFETY: the descriptor is live (created above); the call reads only scalars.
        check("cudnnSetTensor4dDescriptor", unsafe {
            sys::cudnnSetTensor4dDescriptor(d.x.0, fmt, dt, i(p.n), i(p.c_in), i(p.h), i(p.w))
        })?;
        // SAFETY: as above.
        check("cudnnSetTensor4dDescriptor", unsafe {
            sys::cudnnSetTensor4dDescriptor(d.y.0, fmt, dt, i(p.n), i(p.c_out), i(oh), i(ow))
        })?;
        let cig = p.c_in / p.groups;
        // SAFETY: as above.
        check("cudnnSetFilter4dDescriptor", unsafe {
            sys::cudnnSetFilter4dDescriptor(d.w.0, dt, fmt, i(p.c_out), i(cig), i(p.kh), i(p.kw))
        })?;
        // SAFETY: as above.
        check("cudnnSetConvolution2dDescriptor", unsafe {
            sys::cudnnSetConvolution2dDescriptor(
                d.conv.0,
                i(p.pad.0),
                i(p.pad.1),
                i(p.stride.0),
                i(p.stride.1),
                i(p.dilation.0),
                i(p.dilation.1),
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )
        })?;
        // SAFETY: the convolution descriptor is live.
        check("cudnnSetConvolutionGroupCount", unsafe {
            sys::cudnnSetConvolutionGroupCount(d.conv.0, i(p.groups))
        })?;
        d.set_math(math)?;
        Ok(d)
    }

    /// Sets the convolution's math type (FMA only, or tensor ops allowed).
    pub fn set_math(&self, math: Math) -> Result<()> {
        // SAFETY: the convolution descriptor is live.
        check("cudnnSetConvolutionMathType", unsafe {
            sys::cudnnSetConvolutionMathType(self.conv.0, math)
        })
    }

    /// The largest workspace any algorithm of `dir` asks for, at most `cap` bytes
    /// (algorithms whose size query fails, or that need more, are left out).
    pub fn max_workspace(&self, h: &Handle, dir: Dir, cap: usize) -> usize {
        let mut best = 0usize;
        let mut consider = |s: sys::cudnnStatus_t, bytes: usize| {
            if s == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && bytes <= cap {
                best = best.max(bytes);
            }
        };
        match dir {
            Dir::Forward => {
                for a in FWD_ALGOS {
                    let mut bytes = 0usize;
                    // SAFETY: handle and descriptors are live; `bytes` is a valid out-pointer.
                    let s = unsafe {
                        sys::cudnnGetConvolutionForwardWorkspaceSize(
                            h.0,
                            self.x.0,
                            self.w.0,
                            self.conv.0,
                            self.y.0,
                            a,
                            &mut bytes,
                        )
                    };
                    consider(s, bytes);
                }
            }
            Dir::BackwardData => {
                for a in DATA_ALGOS {
                    let mut bytes = 0usize;
                    // SAFETY: handle and descriptors are live; `bytes` is a valid out-pointer.
                    let s = unsafe {
                        sys::cudnnGetConvolutionBackwardDataWorkspaceSize(
                            h.0,
                            self.w.0,
                            self.y.0,
                            self.conv.0,
                            self.x.0,
                            a,
                            &mut bytes,
                        )
                    };
                    consider(s, bytes);
                }
            }
            Dir::BackwardFilter => {
                for a in FILTER_ALGOS {
                    let mut bytes = 0usize;
                    // SAFETY: handle and descriptors are live; `bytes` is a valid out-pointer.
                    let s = unsafe {
                        sys::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                            h.0,
                            self.x.0,
                            self.y.0,
                            self.conv.0,
                            self.w.0,
                            a,
                            &mut bytes,
                        )
                    };
                    consider(s, bytes);
                }
            }
        }
        best
    }

    /// Benchmarks every algorithm of `dir` on the real buffers (like PyTorch's
    /// `cudnn.benchmark`) and returns the fastest usable one. It writes the output
    /// buffer of `io` (several times) and blocks the calling thread until done.
    ///
    /// # Safety
    /// `io` must address live buffers of this geometry and dtype on the handle's
    /// device (inputs initialized by stream order), the output not overlapping the
    /// inputs; `ws` must address `ws.1` bytes of device memory (or be `(0, 0)`).
    pub unsafe fn find(
        &self,
        h: &Handle,
        dir: Dir,
        io: Io,
        ws: (u64, usize),
        f: Filter,
    ) -> Result<Option<Choice>> {
        let (wsp, wsn) = (ws.0 as *mut c_void, ws.1);
        let mut n = 0i32;
        match dir {
            Dir::Forward => {
                let mut r: [sys::cudnnConvolutionFwdAlgoPerf_t; FWD_ALGOS.len()] = zeroed();
                // SAFETY: the caller guarantees `io` and `ws`; handle and descriptors are
                // live; `r` has room for `r.len()` results and only the first `n`
                // (written by cuDNN) are read.
                check("cudnnFindConvolutionForwardAlgorithmEx", unsafe {
                    sys::cudnnFindConvolutionForwardAlgorithmEx(
                        h.0,
                        self.x.0,
                        io.x as *const c_void,
                        self.w.0,
                        io.w as *const c_void,
                        self.conv.0,
                        self.y.0,
                        io.y as *mut c_void,
                        r.len() as i32,
                        &mut n,
                        r.as_mut_ptr(),
                        wsp,
                        wsn,
                    )
                })?;
                Ok(pick(&r[..n.max(0) as usize], wsn, f))
            }
            Dir::BackwardData => {
                let mut r: [sys::cudnnConvolutionBwdDataAlgoPerf_t; DATA_ALGOS.len()] = zeroed();
                // SAFETY: the caller guarantees `io` and `ws`; handle and descriptors are
                // live; `r` has room for `r.len()` results and only the first `n`
                // (written by cuDNN) are read.
                check("cudnnFindConvolutionBackwardDataAlgorithmEx", unsafe {
                    sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                        h.0,
                        self.w.0,
                        io.w as *const c_void,
                        self.y.0,
                        io.y as *const c_void,
                        self.conv.0,
                        self.x.0,
                        io.x as *mut c_void,
                        r.len() as i32,
                        &mut n,
                        r.as_mut_ptr(),
                        wsp,
                        wsn,
                    )
                })?;
                Ok(pick(&r[..n.max(0) as usize], wsn, f))
            }
            Dir::BackwardFilter => {
                let mut r: [sys::cudnnConvolutionBwdFilterAlgoPerf_t; FILTER_ALGOS.len()] =
                    zeroed();
                // SAFETY: the caller guarantees `io` and `ws`; handle and descriptors are
                // live; `r` has room for `r.len()` results and only the first `n`
                // (written by cuDNN) are read.
                check("cudnnFindConvolutionBackwardFilterAlgorithmEx", unsafe {
                    sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        h.0,
                        self.x.0,
                        io.x as *const c_void,
                        self.y.0,
                        io.y as *const c_void,
                        self.conv.0,
                        self.w.0,
                        io.w as *mut c_void,
                        r.len() as i32,
                        &mut n,
                        r.as_mut_ptr(),
                        wsp,
                        wsn,
                    )
                })?;
                Ok(pick(&r[..n.max(0) as usize], wsn, f))
            }
        }
    }

    /// cuDNN's heuristic choice (no benchmarking): the fallback when `find` fails.
    pub fn heuristic(&self, h: &Handle, dir: Dir, cap: usize, f: Filter) -> Result<Option<Choice>> {
        let mut n = 0i32;
        match dir {
            Dir::Forward => {
                let mut r: [sys::cudnnConvolutionFwdAlgoPerf_t; FWD_ALGOS.len()] = zeroed();
                // SAFETY: handle and descriptors are live; `r` has room for `r.len()`
                // results and only the first `n` (written by cuDNN) are read.
                check("cudnnGetConvolutionForwardAlgorithm_v7", unsafe {
                    sys::cudnnGetConvolutionForwardAlgorithm_v7(
                        h.0,
                        self.x.0,
                        self.w.0,
                        self.conv.0,
                        self.y.0,
                        r.len() as i32,
                        &mut n,
                        r.as_mut_ptr(),
                    )
                })?;
                Ok(pick(&r[..n.max(0) as usize], cap, f))
            }
            Dir::BackwardData => {
                let mut r: [sys::cudnnConvolutionBwdDataAlgoPerf_t; DATA_ALGOS.len()] = zeroed();
                // SAFETY: handle and descriptors are live; `r` has room for `r.len()`
                // results and only the first `n` (written by cuDNN) are read.
                check("cudnnGetConvolutionBackwardDataAlgorithm_v7", unsafe {
                    sys::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                        h.0,
                        self.w.0,
                        self.y.0,
                        self.conv.0,
                        self.x.0,
                        r.len() as i32,
                        &mut n,
                        r.as_mut_ptr(),
                    )
                })?;
                Ok(pick(&r[..n.max(0) as usize], cap, f))
            }
            Dir::BackwardFilter => {
                let mut r: [sys::cudnnConvolutionBwdFilterAlgoPerf_t; FILTER_ALGOS.len()] =
                    zeroed();
                // SAFETY: handle and descriptors are live; `r` has room for `r.len()`
                // results and only the first `n` (written by cuDNN) are read.
                check("cudnnGetConvolutionBackwardFilterAlgorithm_v7", unsafe {
                    sys::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                        h.0,
                        self.x.0,
                        self.y.0,
                        self.conv.0,
                        self.w.0,
                        r.len() as i32,
                        &mut n,
                        r.as_mut_ptr(),
                    )
                })?;
                Ok(pick(&r[..n.max(0) as usize], cap, f))
            }
        }
    }

    /// Enqueues the chosen algorithm: `y = conv(x, w)`, `dx = conv_transpose(dy, w)` or
    /// `dw = Σ dy ⊗ x`, with alpha 1 and beta 0 (the output is overwritten, not read).
    ///
    /// # Safety
    /// As [`ConvDescs::find`]; `ws.1` must be at least `c.workspace`, and the buffers
    /// must stay alive until the enqueued work completes.
    pub unsafe fn launch(&self, h: &Handle, c: &Choice, io: Io, ws: (u64, usize)) -> Result<()> {
        let (alpha, beta) = (1f32, 0f32);
        let (a, b) = (
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
        );
        let (wsp, wsn) = (ws.0 as *mut c_void, ws.1);
        let (x, w, y) = (
            io.x as *mut c_void,
            io.w as *mut c_void,
            io.y as *mut c_void,
        );
        // The caller guarantees the buffers and workspace; the descriptors are live and
        // describe them; alpha/beta are host f32 scalars, the scaling type of an
        // f32-compute convolution for every storage type.
        let s = match c.algo {
            // SAFETY: see above.
            Algo::Fwd(al) => unsafe {
                sys::cudnnConvolutionForward(
                    h.0,
                    a,
                    self.x.0,
                    x,
                    self.w.0,
                    w,
                    self.conv.0,
                    al,
                    wsp,
                    wsn,
                    b,
                    self.y.0,
                    y,
                )
            },
            // SAFETY: see above.
            Algo::Data(al) => unsafe {
                sys::cudnnConvolutionBackwardData(
                    h.0,
                    a,
                    self.w.0,
                    w,
                    self.y.0,
                    y,
                    self.conv.0,
                    al,
                    wsp,
                    wsn,
                    b,
                    self.x.0,
                    x,
                )
            },
            // SAFETY: see above.
            Algo::Filter(al) => unsafe {
                sys::cudnnConvolutionBackwardFilter(
                    h.0,
                    a,
                    self.x.0,
                    x,
                    self.y.0,
                    y,
                    self.conv.0,
                    al,
                    wsp,
                    wsn,
                    b,
                    self.w.0,
                    w,
                )
            },
        };
        check("cudnnConvolution (launch)", s)
    }
}
