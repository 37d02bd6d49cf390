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

pub use rtx_kernels as kernels;
pub use rtx_ops as ops;
pub use rtx_runtime::*;
pub use rtx_scheduler as scheduler;
pub mod timeline;
