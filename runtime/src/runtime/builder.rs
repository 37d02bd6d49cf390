//! Building a runtime: the backend choice, the [`Builder`] and its settings, and the
//! assembly of a [`Runtime`] from what the backend's `start` returned.

use std::sync::Arc as StdArc;
use std::time::Duration;

use super::{Inner, Runtime};
use crate::actor::{StartCx, Started};
use crate::error::{Error, Result};
use crate::placement::{Affinity, Policy};
use crate::settings::Settings;
use crate::stats::Counters;
use crate::sync::{Arc, AtomicBool, Mutex};

/// Which backend to run on.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Backend {
    /// CUDA when a driver and a device are present, the CPU otherwise.
    #[default]
    Auto,
    /// The CPU backend (rayon).
    Cpu,
    /// The CPU backend presenting `n` host devices (`Device::Cpu(0)` to `Cpu(n - 1)`,
    /// at least 1), each with its own compute streams and a communication stream, and
    /// an in-process collective: multi-device code (placement per device,
    /// [`Runtime::copy_to`](crate::Runtime::copy_to), collectives, data parallel across
    /// devices) runs and is tested without GPUs. The devices share the host's cores and
    /// memory.
    CpuDevices(usize),
    /// CUDA on these device ordinals (empty: all devices).
    Cuda(Vec<usize>),
}

/// The backend a runtime actually runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// CPU.
    Cpu,
    /// CUDA.
    Cuda,
}

/// The backend side of a runtime: what its backend's `start` returned besides the
/// streams. One enum, so the backend kind and its state cannot disagree.
pub(crate) enum BackendState {
    /// The CPU backend (no state of its own).
    Cpu,
    /// The CUDA backend: its devices and copy streams.
    Cuda(crate::cuda::Devices),
}

impl BackendState {
    pub(super) fn kind(&self) -> BackendKind {
        match self {
            BackendState::Cpu => BackendKind::Cpu,
            BackendState::Cuda(_) => BackendKind::Cuda,
        }
    }
}

/// Builds a [`Runtime`]. See [`Runtime::builder`]. The options besides the backend,
/// streams, mailbox and policy are the runtime's [`Settings`]; each has an environment
/// variable that overrides it (the table is in [`settings`](crate::settings)).
pub struct Builder {
    backend: Backend,
    streams: usize,
    mailbox: usize,
    policy: Option<Arc<dyn Policy>>,
    settings: Settings,
    /// `None`: a communication stream per device when there are several CUDA devices.
    comm_streams: Option<bool>,
}

impl Runtime {
    /// A builder; `Runtime::builder().build()` picks the best backend present.
    pub fn builder() -> Builder {
        Builder {
            backend: Backend::Auto,
            streams: 0,
            mailbox: 1024,
            policy: None,
            settings: Settings::default(),
            comm_streams: None,
        }
    }
}

impl Builder {
    /// Which backend (default [`Backend::Auto`]).
    pub fn backend(mut self, b: Backend) -> Self {
        self.backend = b;
        self
    }
    /// Compute streams per device (default 4 on CUDA, 2 on the CPU; at least 1).
    pub fn streams(mut self, n: usize) -> Self {
        self.streams = n.max(1);
        self
    }
    /// Mailbox capacity per stream (default 1024; at least 1). A full mailbox makes
    /// `submit` block and `submit_async` wait.
    pub fn mailbox(mut self, n: usize) -> Self {
        self.mailbox = n.max(1);
        self
    }
    /// On CUDA, whether each device gets a communication stream of its own: an actor
    /// that runs only the collectives (NCCL), so they overlap the compute streams'
    /// work, ordered with it by events. Default: on when the runtime has several CUDA
    /// devices, off with one (the collectives of a one-rank group then run on the first
    /// compute stream). [`Backend::CpuDevices`] always has one per device; the single
    /// CPU device never.
    pub fn comm_streams(mut self, on: bool) -> Self {
        self.comm_streams = Some(on);
        self
    }
    /// The placement policy (default [`Affinity`]; see `rtx-scheduler` for others).
    pub fn policy(mut self, p: impl Policy) -> Self {
        self.policy = Some(policy_arc(p));
        self
    }
    /// All settings at once (default [`Settings::default`]); the environment still
    /// overrides them.
    pub fn settings(mut self, s: Settings) -> Self {
        self.settings = s;
        self
    }
    /// How long idle CUDA stream actors poll their mailbox before sleeping (default:
    /// 50 µs when the machine has a core for every actor plus four, else 0).
    /// `RTX_ACTOR_SPIN_US` overrides it.
    pub fn actor_spin(mut self, d: Duration) -> Self {
        self.settings.actor_spin = Some(d);
        self
    }
    /// Per-stream memory pools and block caches on CUDA (default on; off, every stream
    /// allocates from the device's default pool, uncached). `RTX_STREAM_POOLS=0`
    /// overrides it.
    pub fn stream_pools(mut self, on: bool) -> Self {
        self.settings.stream_pools = on;
        self
    }
    /// Times the phases of every op on the CUDA actors, for [`Runtime::stats`] (default
    /// off). `RTX_PROFILE` overrides it (`1`: on).
    pub fn profile(mut self, on: bool) -> Self {
        self.settings.profile = on;
        self
    }
    /// Ops fill each fresh output with NaN (`0xFF` bytes on CUDA) before computing it, so
    /// that a test catches unwritten elements (default off). `RTX_POISON_OUTPUTS`
    /// overrides it (`1`: on).
    pub fn poison_outputs(mut self, on: bool) -> Self {
        self.settings.poison_outputs = on;
        self
    }
    /// The attention ops' Hopper (wgmma) kernels on compute capability 9.0 (default
    /// on). `RTX_ATTN_WGMMA=0` overrides it.
    pub fn attn_wgmma(mut self, on: bool) -> Self {
        self.settings.attn_wgmma = on;
        self
    }
    /// Records a timeline of every op (stream, name, output shapes, start and duration;
    /// host clock on the CPU, CUDA timing events on the GPU), for
    /// [`Runtime::take_trace`] (default off; off, each op pays one flag load).
    /// `RTX_TRACE` overrides it (`1`: on).
    pub fn trace(mut self, on: bool) -> Self {
        self.settings.trace = on;
        self
    }
    /// How many plans each stream's GEMM and convolution plan cache keeps (default
    /// [`DEFAULT_PLAN_CACHE`](crate::settings::DEFAULT_PLAN_CACHE), at least 1); the least
    /// recently used plan goes first. `RTX_PLAN_CACHE=<entries>` overrides it.
    pub fn plan_cache(mut self, entries: usize) -> Self {
        self.settings.plan_cache = entries.max(1);
        self
    }
    /// On CUDA, time one op in `every` per stream on the device for the placement
    /// policy ([`Policy::observe_device`](crate::placement::Policy::observe_device);
    /// default [`DEFAULT_DEVICE_TIMING`](crate::settings::DEFAULT_DEVICE_TIMING), 0: off).
    /// `RTX_DEVICE_TIMING=<every>` overrides it.
    pub fn device_timing(mut self, every: u32) -> Self {
        self.settings.device_timing = every;
        self
    }
    /// On compute capability 9.0 and newer, launch the element-wise kernels captured
    /// into graphs as programmatic dependents, so that in the graph each may start while
    /// the kernel before it finishes (default on; see the [settings table](crate::settings)).
    /// `RTX_PROGRAMMATIC_LAUNCH=0` turns it off.
    pub fn programmatic_launch(mut self, on: bool) -> Self {
        self.settings.programmatic_launch = on;
        self
    }
    /// On CUDA, run the kernels of small element-wise ops (and of small products on
    /// rtx's small-GEMM kernel) queued behind each other on a stream as one batched launch (default on; see the [settings table](crate::settings)).
    /// `RTX_LAUNCH_BATCHING=0` turns it off.
    pub fn launch_batching(mut self, on: bool) -> Self {
        self.settings.launch_batching = on;
        self
    }
    /// On CUDA, run `embedding_backward` with at most 16384 ids as one launch instead of
    /// five (default on: 1.2-1.7× as fast on the H200; see the [settings
    /// table](crate::settings)). `RTX_EMB_ONE_LAUNCH=0` turns it off.
    pub fn embedding_one_launch(mut self, on: bool) -> Self {
        self.settings.embedding_one_launch = on;
        self
    }
    /// Experimental: on CUDA devices of compute capability 9.0 and newer, run the
    /// layer-norm ops on rings of bulk copies where they apply (default off: slower than
    /// the default kernels on the H200; see the [settings table](crate::settings)). `RTX_LN_BULK=1`
    /// turns it on.
    pub fn layer_norm_bulk(mut self, on: bool) -> Self {
        self.settings.layer_norm_bulk = on;
        self
    }
    /// On compute capability 9.0, run the attention backward's main kernel (head dims 64
    /// and 128) with a producer warpgroup's bulk tensor copies and mbarrier-handed stages
    /// (default on: 1.27-2.0× as fast as the kernels it replaces on the H200; see the
    /// [settings table](crate::settings)). `RTX_ATTN_BWD_TMA=0` turns it off.
    pub fn attn_bwd_tma(mut self, on: bool) -> Self {
        self.settings.attn_bwd_tma = on;
        self
    }
    /// Experimental: choose each GEMM problem's cuBLASLt algorithm by timing the
    /// heuristic's candidates once per process (default off: the heuristic's first, the
    /// same in every run; see the [settings table](crate::settings), which says why).
    /// `RTX_GEMM_TUNE=1` turns it on.
    pub fn gemm_tune(mut self, on: bool) -> Self {
        self.settings.gemm_tune = on;
        self
    }
    /// Plan small GEMMs for 1/`n` of the device's multiprocessors, so that `n` streams'
    /// small GEMMs can run side by side (default 0: the number of compute streams per
    /// device; 1: the whole device; see the [settings table](crate::settings)).
    /// `RTX_GEMM_SM_SHARE=<n>` overrides it. Two runtimes with different shares may
    /// round small GEMMs differently (another cuBLASLt algorithm): give them the same
    /// share where their results must be bitwise equal.
    pub fn gemm_sm_share(mut self, n: u32) -> Self {
        self.settings.gemm_sm_share = n;
        self
    }
    /// On CUDA, which small f16/bf16 products run rtx's own tensor-core kernel,
    /// launched straight through the driver, instead of cuBLASLt (default
    /// [`SmallGemm::Eager`](crate::SmallGemm::Eager): those run eagerly; see the [settings table](crate::settings)
    /// for which products qualify and why). `RTX_SMALL_GEMM=off|eager|always`.
    pub fn small_gemm(mut self, mode: crate::SmallGemm) -> Self {
        self.settings.small_gemm = mode;
        self
    }
    /// Starts the actors.
    pub fn build(self) -> Result<Runtime> {
        let policy = self.policy.clone().unwrap_or_else(|| policy_arc(Affinity));
        let settings = self.settings.with_env();
        let counters = StdArc::new(Counters::new(settings.profile).with_trace(settings.trace));
        // Compute streams per device: 2 on the CPU, 4 on CUDA unless set.
        let (cpu_streams, cuda_streams) = (self.streams_or(2), self.streams_or(4));
        let cx = |streams: usize| StartCx {
            streams,
            mailbox: self.mailbox,
            policy: policy.clone(),
            settings: settings.resolved(streams),
            counters: counters.clone(),
        };
        let want_cuda = match &self.backend {
            Backend::Cpu | Backend::CpuDevices(_) => None,
            Backend::Auto => crate::cuda::probe()
                .ok()
                .filter(|n| *n > 0)
                .map(|n| (0..n).collect::<Vec<_>>()),
            Backend::Cuda(ords) => {
                let n = crate::cuda::probe().map_err(Error::DeviceNotFound)?;
                if n == 0 {
                    return Err(Error::DeviceNotFound("no CUDA device".into()));
                }
                let ords = if ords.is_empty() {
                    (0..n).collect()
                } else {
                    ords.clone()
                };
                if let Some(bad) = ords.iter().find(|o| **o >= n) {
                    return Err(Error::DeviceNotFound(format!(
                        "cuda:{bad} (found {n} devices)"
                    )));
                }
                Some(ords)
            }
        };
        let cpu = || {
            let started = match self.backend {
                Backend::CpuDevices(n) => crate::cpu::start(&cx(cpu_streams), n.max(1), true),
                _ => crate::cpu::start(&cx(cpu_streams), 1, false),
            };
            assemble(started, BackendState::Cpu)
        };
        let cuda = |ords: &[usize]| {
            let comm = self.comm_streams.unwrap_or(ords.len() > 1);
            crate::cuda::start(&cx(cuda_streams), ords, comm)
                .map(|s| assemble_with(s, BackendState::Cuda))
        };
        let rt = match want_cuda {
            // `Auto` falls back to the CPU when CUDA is there but cannot be started
            // (exclusive-process mode, a broken driver...), and says why.
            Some(ords) if self.backend == Backend::Auto => cuda(&ords).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "CUDA found but not usable; using the CPU backend");
                cpu()
            }),
            Some(ords) => cuda(&ords)?,
            None => cpu(),
        };
        let streams = if matches!(rt.backend, BackendState::Cpu) {
            cpu_streams
        } else {
            cuda_streams
        };
        Ok(rt.with(policy, settings.resolved(streams), counters))
    }
    fn streams_or(&self, d: usize) -> usize {
        if self.streams == 0 {
            d
        } else {
            self.streams
        }
    }
}

/// A started backend, before the runtime-wide parts are added.
struct Assembled {
    started: Started<()>,
    backend: BackendState,
}

fn assemble(started: Started<()>, backend: BackendState) -> Assembled {
    Assembled { started, backend }
}

/// Splits a backend's [`Started`] into its streams and its state (wrapped by `wrap`).
fn assemble_with<S>(s: Started<S>, wrap: impl FnOnce(S) -> BackendState) -> Assembled {
    let backend = wrap(s.state);
    Assembled {
        started: Started {
            devices: s.devices,
            streams: s.streams,
            threads: s.threads,
            state: (),
        },
        backend,
    }
}

impl Assembled {
    fn with(
        self,
        policy: Arc<dyn Policy>,
        settings: Settings,
        counters: StdArc<Counters>,
    ) -> Runtime {
        let rt = Runtime {
            pin: None,
            recording: None,
            inner: Arc::new(Inner {
                id: next_runtime_id(),
                backend: self.backend,
                devices: self.started.devices,
                streams: self.started.streams,
                policy,
                settings,
                counters,
                closed: AtomicBool::new(false),
                gate: crate::gate::Gate::default(),
                threads: Mutex::new(self.started.threads),
                collectives: Default::default(),
            }),
        };
        super::ergonomic::register(&rt);
        rt
    }
}

/// A shared policy. loom's `Arc` cannot unsize to `dyn Policy`, so under loom the trait
/// object is built as a std `Arc` and converted.
pub(super) fn policy_arc(p: impl Policy) -> Arc<dyn Policy> {
    #[cfg(not(loom))]
    {
        Arc::new(p)
    }
    #[cfg(loom)]
    {
        Arc::from_std(std::sync::Arc::new(p) as std::sync::Arc<dyn Policy>)
    }
}

/// A process-wide unique runtime id.
fn next_runtime_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
