//! 2-D convolution (NCHW and NHWC; stride, padding, dilation, groups): forward (with
//! optional bias + activation) and backward (data, filter).
//!
//! - `op.rs`: the [`Conv2d`], [`Conv2dBackwardData`] and [`Conv2dBackwardFilter`] ops;
//! - `shape.rs`: [`Conv2dOpts`] and the shape rules checked at submit;
//! - `cpu.rs` (+ `cpu/`): the CPU kernels (im2col + GEMM);
//! - `cuda.rs`: per-stream cuDNN state, the algorithm cache and the workspace;
//! - `dnn.rs`: cuDNN handles, descriptors, algorithm search and launches (`sys` level);
//! - `graph.rs`: cuDNN's graph (backend) API: engine plans for one convolution;
//! - `perf.rs`: reading cuDNN's search results (which algorithm, which math type).
pub mod cpu;
mod cuda;
mod dnn;
mod graph;
mod op;
mod perf;
mod shape;

pub use cpu::{Conv2dParams, Layout};
pub use cuda::{conv_algo_cache_stats, conv_engine_stats, conv_search_fallbacks, SEARCH_CAP};
pub use op::{
    conv2d, conv2d_backward_data, conv2d_backward_filter, Conv2d, Conv2dBackwardData,
    Conv2dBackwardFilter,
};
pub use shape::{w_shape, x_shape, y_shape, Conv2dOpts};
