//! Reading cuDNN's algorithm-search results: the three perf-result structs behind one
//! trait, the choice rule, and the lists of algorithms per direction.

use cudarc::cudnn::sys;

use super::dnn::{Algo, Choice};

use sys::cudnnConvolutionBwdDataAlgo_t as DataAlgo;
use sys::cudnnConvolutionBwdFilterAlgo_t as FilterAlgo;
use sys::cudnnConvolutionFwdAlgo_t as FwdAlgo;
use sys::cudnnMathType_t as Math;

/// What the search may return.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Filter {
    /// f32 without TF32: force FMA math (no tensor-op TF32), as PyTorch does.
    pub exact_f32: bool,
    /// Backward data with a stride above 1: skip the FFT algorithms (PyTorch's
    /// blocklist for strided dgrad).
    pub no_fft: bool,
}

/// The first (fastest) successful result that fits `cap` bytes and passes `f`.
pub(super) fn pick<P: Perf>(results: &[P], cap: usize, f: Filter) -> Option<Choice> {
    results
        .iter()
        .filter(|r| r.status() == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && r.memory() <= cap)
        .filter(|r| !(f.no_fft && r.is_fft()))
        .map(|r| Choice {
            algo: r.algo(),
            workspace: r.memory(),
            math: if f.exact_f32 {
                Math::CUDNN_FMA_MATH
            } else {
                r.math()
            },
        })
        .next()
}

/// An all-zero array of perf results, to be filled by cuDNN.
pub(super) fn zeroed<P: Perf, const N: usize>() -> [P; N] {
    // SAFETY: `Perf` is implemented only for cuDNN's three perf-result structs: plain
    // C data (integers, floats, `repr(u32)` enums) in which every enum field has a
    // variant 0, so the all-zero bit pattern is a valid value.
    unsafe { std::mem::zeroed() }
}

/// The fields the search reads from cuDNN's three perf-result structs.
pub(super) trait Perf {
    fn status(&self) -> sys::cudnnStatus_t;
    fn memory(&self) -> usize;
    fn math(&self) -> Math;
    fn algo(&self) -> Algo;
    fn is_fft(&self) -> bool;
}

macro_rules! perf {
    ($t:ty, $variant:ident, $($fft:ident),*) => {
        impl Perf for $t {
            fn status(&self) -> sys::cudnnStatus_t { self.status }
            fn memory(&self) -> usize { self.memory }
            fn math(&self) -> Math { self.mathType }
            fn algo(&self) -> Algo { Algo::$variant(self.algo) }
            fn is_fft(&self) -> bool { false $(|| self.algo as u32 == $fft as u32)* }
        }
    };
}
const DATA_FFT: DataAlgo = DataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT;
const DATA_FFT_TILING: DataAlgo = DataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING;
perf!(sys::cudnnConvolutionFwdAlgoPerf_t, Fwd,);
perf!(
    sys::cudnnConvolutionBwdDataAlgoPerf_t,
    Data,
    DATA_FFT,
    DATA_FFT_TILING
);
perf!(sys::cudnnConvolutionBwdFilterAlgoPerf_t, Filter,);

pub(super) const FWD_ALGOS: [FwdAlgo; 8] = [
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
];
pub(super) const DATA_ALGOS: [DataAlgo; 6] = [
    DataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
    DataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
    DataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
    DataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
    DataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
    DataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
];
pub(super) const FILTER_ALGOS: [FilterAlgo; 7] = [
    FilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
    FilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
    FilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
    FilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
    FilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
    FilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
    FilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
];
