//! rtx: an actor-based, multi-stream execution runtime for CUDA GPUs, with a CPU backend.
//!
//! Each CUDA stream is an actor — a thread that owns the stream and its library handles
//! and takes op messages. Events carry dependencies between streams; a scheduler places
//! each op; buffer ownership travels with the messages. The same program runs on the CPU
//! backend (rayon) where no GPU is present.
//!
//! ```
//! use rtx::{ops, Runtime, Backend, block_on};
//! let rt = Runtime::builder().backend(Backend::Cpu).streams(2).build().unwrap();
//! let a = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
//! let b = rt.upload(&[10.0f32, 20.0, 30.0], [3]).unwrap();
//! let c = rt.submit(ops::add(&a, &b)).unwrap();           // output handle available at once
//! let d = rt.submit(ops::relu(c.outputs().unwrap())).unwrap();
//! let v: Vec<f32> = block_on(rt.to_vec(&block_on(d).unwrap()).unwrap()).unwrap();
//! assert_eq!(v, [11.0, 22.0, 33.0]);
//! ```
//!
//! # What is here
//!
//! - The runtime (this crate's root): [`Runtime`] and its [`Builder`], [`Tensor`],
//!   [`Submission`], [`Op`] for writing ops, [`Error`]; the CUDA backend's pieces under
//!   [`cuda`].
//! - [`ops`]: the op library, one module per family, each with a CPU and a CUDA
//!   implementation:
//!
//!   | family | ops |
//!   |---|---|
//!   | [`ops::elementwise`] | unary [`neg`](ops::neg), [`exp`](ops::exp), [`log`](ops::log), [`sin`](ops::sin), [`cos`](ops::cos), [`sqrt`](ops::sqrt), [`abs`](ops::abs), [`relu`](ops::relu); binary with broadcasting [`add`](ops::add), [`sub`](ops::sub), [`mul`](ops::mul), [`div`](ops::div), [`maximum`](ops::maximum), [`minimum`](ops::minimum); each with an in-place `*_` form ([`add_`](ops::add_), ...) |
//!   | [`ops::reduce`] | [`sum`](ops::sum), [`mean`](ops::mean), [`prod`](ops::prod), [`max`](ops::max), [`min`](ops::min), [`argmax`](ops::argmax), [`argmin`](ops::argmin): over all elements or one dim (`*_dim`) |
//!   | [`ops::softmax`](mod@ops::softmax) | [`softmax`](fn@ops::softmax) over the last dim |
//!   | [`ops::gemm`] | [`matmul`](ops::matmul) (batched, transposed, broadcast batch dims), [`linear`](ops::linear) (+ bias + [`Activation`](ops::Activation)) |
//!   | [`ops::conv`] | [`conv2d`](ops::conv2d) (NCHW or NHWC; stride, padding, dilation, groups; bias + activation), [`conv2d_backward_data`](ops::conv2d_backward_data), [`conv2d_backward_filter`](ops::conv2d_backward_filter) |
//!   | [`ops::attention`](mod@ops::attention) | [`attention`](fn@ops::attention) (scaled dot-product; causal, masks, grouped KV heads), [`attention_backward`](ops::attention_backward) |
//!
//! - [`scheduler`]: placement policies ([`EarliestFinish`](scheduler::EarliestFinish),
//!   [`LeastLoaded`](scheduler::LeastLoaded), [`RoundRobin`](scheduler::RoundRobin))
//!   and the [`CostModel`](scheduler::CostModel) they use.
//! - [`kernels`]: the CUDA C kernels, their NVRTC build and on-disk CUBIN cache, and
//!   their launch conventions ([`kernels::launch`]).
//!
//! # Dtypes
//!
//! Tensors hold [`DType::F32`], [`DType::F16`], [`DType::BF16`], [`DType::I32`] or
//! [`DType::U32`]. The ops compute on the three float types (accumulating in f32;
//! [`f16`](struct@f16) and [`bf16`] are the `half` crate's types, re-exported); `argmax`/`argmin`
//! return `u32` indices. On CUDA, attention takes f16 or bf16 with a head dim of 64 or
//! 128 (the CPU backend also takes f32 and any head dim). A dtype an op does not take
//! is an error at submit ([`Error::DTypeMismatch`]).
//!
//! # Seeing what ran
//!
//! Every op runs inside a `tracing` span named `op` (fields: `kind`, `stream`,
//! `queue_wait_us`, `run_us`) at debug level. Install any `tracing` subscriber to see
//! them, e.g. with `tracing-subscriber`:
//! `tracing_subscriber::fmt().with_max_level(tracing::Level::DEBUG).init()`.
//!
//! Ownership rules are enforced by the types. An op that writes in place takes its input
//! by value, so the caller's handle is gone:
//!
//! ```compile_fail,E0382
//! use rtx::{ops, Runtime};
//! let rt = Runtime::cpu(1);
//! let x = rt.upload(&[1.0f32, -2.0], [2]).unwrap();
//! let y = rt.submit(ops::relu_(x)).unwrap();   // x is donated (moved)
//! let again = ops::relu(&x);                   // error: use of moved value `x`
//! ```
//!
//! A tensor's memory cannot be reached, let alone written, from outside an op:
//!
//! ```compile_fail,E0599
//! use rtx::Runtime;
//! let rt = Runtime::cpu(1);
//! let x = rt.upload(&[1.0f32], [1]).unwrap();
//! let buf: &mut rtx::Buffer = x.buffer_mut();  // error: no such method
//! ```
//!
//! Inside an op, inputs are read-only: only outputs (fresh memory) and donated inputs
//! (the last handle, taken by value) can be written:
//!
//! ```compile_fail,E0596
//! fn write_input(cx: &mut rtx::ExecCx<'_>, t: &rtx::Tensor) -> rtx::Result<()> {
//!     let buf = cx.input(t)?;
//!     buf.cpu_mut::<f32>()?[0] = 1.0; // error: `BufferRef` only derefs to `&Buffer`
//!     Ok(())
//! }
//! ```
//!
//! An op's execution context (the only place memory is handed out) cannot be built by
//! users:
//!
//! ```compile_fail,E0451
//! let cx = rtx::ExecCx { name: "x" };          // error: private fields
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[doc(inline)]
pub use rtx_kernels as kernels;
#[doc(inline)]
pub use rtx_ops as ops;
pub use rtx_runtime::*;
#[doc(inline)]
pub use rtx_scheduler as scheduler;
pub mod timeline;
#[doc(inline)]
pub use rtx_train as train;
