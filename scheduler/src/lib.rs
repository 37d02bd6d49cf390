//! rtx-scheduler: placement policies and the cost model behind them.
//!
//! At every [`Runtime::submit`](rtx_runtime::Runtime::submit) the runtime asks its
//! [`Policy`] which compute stream of the op's device should run the op, passing the
//! op's name and [`Cost`](rtx_runtime::Cost), the streams producing its inputs, and each
//! candidate's queued work ([`StreamLoad`]). After each op the stream's actor reports the
//! measured run time through [`Policy::observe`]. This crate holds the policies:
//!
//! | policy | chooses | file |
//! |---|---|---|
//! | [`EarliestFinish`] (recommended) | the stream where the op is estimated to finish first: its calibrated queued work + the op's predicted time + a penalty per input produced on another stream (StarPU's *dmda* idea) | `earliest_finish.rs` |
//! | [`LeastLoaded`] | the stream with the fewest queued ops | `least_loaded.rs` |
//! | [`RoundRobin`] | the next stream in turn | `round_robin.rs` |
//!
//! and the [`CostModel`] (`cost.rs`) that [`EarliestFinish`] uses to predict an op's time
//! from its name and cost, calibrated from the observed run times. The runtime's own
//! default, [`Affinity`], runs an op on its first input's stream.
//!
//! A policy is installed with the builder:
//!
//! ```
//! use rtx::{Backend, Runtime};
//! use rtx::scheduler::EarliestFinish;
//!
//! let rt = Runtime::builder()
//!     .backend(Backend::Cpu)
//!     .streams(4)
//!     .policy(EarliestFinish::default())
//!     .build()?;
//! assert_eq!(rt.info().policy, "earliest-finish");
//! # Ok::<(), rtx::Error>(())
//! ```
//!
//! # Pinning
//!
//! An op can bypass the policy and be pinned to a stream with
//! [`Runtime::submit_on`](rtx_runtime::Runtime::submit_on) (or `submit_async_on`), e.g.
//! to keep latency-critical work on a stream of its own. Pinned ops are not placed, so
//! [`EarliestFinish`] does not count them in its queue estimates (the runtime's
//! [`StreamLoad::queued_ops`] still does); their measured times still calibrate the
//! [`CostModel`].
//!
//! ```
//! # use rtx::{Backend, Runtime};
//! # let rt = Runtime::builder().backend(Backend::Cpu).streams(2).build()?;
//! let streams = rt.compute_streams(rt.device());
//! let pinned_to = streams[1];
//! // rt.submit_on(pinned_to, op)? runs `op` on `pinned_to` whatever the policy says.
//! # let _ = pinned_to;
//! # Ok::<(), rtx::Error>(())
//! ```
//!
//! # Writing a policy
//!
//! `place` runs on the submitting thread for every op, so it must be cheap and must not
//! block for long; `observe` runs on a stream actor (or the CUDA watcher) after the op.
//! Both are called concurrently from many threads.
#![warn(missing_docs)]

mod cost;
mod earliest_finish;
mod least_loaded;
mod round_robin;

pub use cost::{Calibration, CostModel, Defaults};
pub use earliest_finish::EarliestFinish;
pub use least_loaded::LeastLoaded;
pub use round_robin::RoundRobin;

pub use rtx_runtime::placement::{Affinity, OpInfo, Policy, StreamLoad};
