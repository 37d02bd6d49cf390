//! A runtime's settings: every knob, set on the builder, with its environment override.
//!
//! # The settings and their environment variables
//!
//! Each setting is a [`Builder`](crate::Builder) option first. Its environment variable,
//! when set, overrides the builder's value (so a run can be changed without
//! recompiling); [`Runtime::settings`](crate::Runtime::settings) reports what a runtime
//! runs with.
//!
//! | Setting (builder method) | Environment variable | Default | Effect |
//! |---|---|---|---|
//! | [`actor_spin`](crate::Builder::actor_spin) | `RTX_ACTOR_SPIN_US=<µs>` | 50 µs when the machine has a core for every CUDA actor plus four, else 0 | How long an idle CUDA stream actor polls its mailbox before it sleeps (a sleeping actor costs the next submit a wake-up). |
//! | [`stream_pools`](crate::Builder::stream_pools) | `RTX_STREAM_POOLS=0` turns off | on | Each CUDA stream actor allocates from a memory pool and block cache of its own; off, every stream uses the device's default pool and nothing is cached (a switch for diagnosis). |
//! | [`profile`](crate::Builder::profile) | `RTX_PROFILE=1` turns on | off | Times the phases of each op (submit, the CPU and CUDA actors, the CUDA watchers); read with [`Runtime::stats`](crate::Runtime::stats). |
//! | [`poison_outputs`](crate::Builder::poison_outputs) | `RTX_POISON_OUTPUTS=1` turns on | off | Ops fill every freshly allocated output with NaN (`0xFF` bytes on CUDA) before computing it, so a test catches any element an op forgets to write. Costs one memset per output. |
//! | [`trace`](crate::Builder::trace) | `RTX_TRACE=1` turns on | off | Records a timeline span per op (host clock on the CPU, a pair of CUDA timing events per op on the GPU); read with [`Runtime::take_trace`](crate::Runtime::take_trace). |
//! | [`attn_wgmma`](crate::Builder::attn_wgmma) | `RTX_ATTN_WGMMA=0` turns off | on | The attention ops use their Hopper (sm_90a) kernels on compute capability 9.0: warpgroup MMA (wgmma), a forward fed by bulk tensor copies (TMA) from a producer warpgroup (head dim 128, and head dim 64 for calls without a mask), and (with `attn_bwd_tma`, below) such a backward; off, the `mma.sync` kernels everywhere. |
//! | [`attn_bwd_tma`](crate::Builder::attn_bwd_tma) | `RTX_ATTN_BWD_TMA=0` turns off | on | On compute capability 9.0 with `attn_wgmma` on, `attention_backward` (head dims 64 and 128) runs its main kernel as `flash_bwd_tma_d{64,128}_*` (`kernels/cuda/attention_tma_bwd.cu`: a producer warpgroup loads Q and dO by bulk tensor copies, lse and dsum by plain loads, a step ahead, the consumer warpgroups hand stages over by mbarriers instead of a block barrier per step, and dK's GEMM runs while dQ is reduced); off, `flash_bwd_wgmma_d128_*` (D = 128) or the `mma.sync` kernel (D = 64). Why: measured on the H200 (`benches/RESULTS.md`, "Attention"), the backward alone ran 1.27× as fast as the wgmma kernel's at D = 128 and 1.8-2.0× the `mma.sync` kernel's at D = 64. For D = 128 its dK and dV come from the same GEMMs in the same order as the wgmma kernel's (bitwise equal); dQ, as there, adds the key blocks' f32 contributions in whatever order they land. A call whose tensor maps the driver refuses runs the kernel the setting off would run. |
//! | [`plan_cache`](crate::Builder::plan_cache) | `RTX_PLAN_CACHE=<entries>` | 256 | How many plans each stream's GEMM (cuBLASLt) and convolution (cuDNN algorithm) cache keeps; beyond it the least recently used plan is dropped (a new shape then pays its planning again). At least 1. |
//! | [`programmatic_launch`](crate::Builder::programmatic_launch) | `RTX_PROGRAMMATIC_LAUNCH=0` turns off | on | On compute capability 9.0 and newer, the element-wise kernels captured into a graph ([`Runtime::capture`](crate::Runtime::capture)) launch as programmatic dependents (`cuLaunchKernelEx` with `PROGRAMMATIC_STREAM_SERIALIZATION`): in the graph each may start while the kernel before it finishes, and waits on the device for it before touching memory (measured on the H200: a chain of 1000 tiny adds replays at 0.86 µs per op instead of 1.38). Eager launches stay plain. |
//! | [`gemm_tune`](crate::Builder::gemm_tune) | `RTX_GEMM_TUNE=1` turns on | off | Experimental. On CUDA, the first GEMM of each problem (shapes, dtype, epilogue, alignment) times up to 8 of cuBLASLt's candidate algorithms on its own buffers and keeps the fastest for the whole process (the op blocks its actor once per problem). Measured on the H200 it chose slower algorithms than the heuristic's first (small problems time the host's enqueue rate, large ones drift with the clock), hence off. Off, cuBLASLt's heuristic first runs: the same algorithm in every process, so results repeat bit for bit from run to run. Either way a problem runs the same algorithm on every stream. |
//! | [`gemm_sm_share`](crate::Builder::gemm_sm_share) | `RTX_GEMM_SM_SHARE=<n>` | 0: the compute streams per device | On CUDA, small GEMMs (at most 2^27 multiply-adds, e.g. 512³) are planned for 1/n of the device's multiprocessors (cuBLASLt's `SM_COUNT_TARGET`, at least 8), so that the small GEMMs of n streams run side by side instead of each filling the device in turn. Measured on the H200: the 8 chains of 256³ GEMMs on 8 streams as graphs in 1.60 ms instead of 4.28, the training sweep's graphs on 8 streams 11-14 % faster. 1: the whole device for every GEMM (cuBLASLt's default; a runtime with one stream per device always plans so). A small GEMM running alone in a runtime of several streams gets fewer multiprocessors than it could use. Larger GEMMs always plan for the whole device. Another share can mean another cuBLASLt algorithm, so runtimes with different stream counts may round small GEMMs differently; give them the same share for bitwise-equal results. |
//! | [`small_gemm`](crate::Builder::small_gemm) | `RTX_SMALL_GEMM=off\|eager\|always` (`0` off, `1` always) | [`eager`](SmallGemm::Eager) | On CUDA, small f16/bf16 `x·wᵀ` products (`linear`, `matmul` with `trans_b`; at most 2^27 multiply-adds, e.g. 512³; both inner dims multiples of 8, 16-byte aligned operands) run rtx's own tensor-core kernel (`kernels/cuda/small_gemm.cu`), launched straight through the driver, instead of `cublasLtMatmul`. Why: measured on the H200, a `cublasLtMatmul` call costs 8.7 µs of host time against 4.3 µs for a plain kernel launch, and from 8 threads at once 3.3 µs of wall time per call against 1.3 (`benches/gpu/lt_floor.cu`): eagerly, a small GEMM's cost is that host time. On the device cuBLASLt's kernels are faster (256³ in a graph: 2.8 µs against 3.7), so by default only eager products take rtx's kernel and captured ones keep cuBLASLt ([`SmallGemm`] has the choices). The kernel is the same on every stream and repeats bit for bit; with `eager` a captured small GEMM rounds differently from the same GEMM run eagerly (within the f16/bf16 rounding); `always` or `off` make the two bitwise equal. |
//! | [`launch_batching`](crate::Builder::launch_batching) | `RTX_LAUNCH_BATCHING=0` turns off | on | On CUDA, when a stream actor finds small element-wise ops (at most 4096 elements, same-shape operands) or small f16/bf16 products that take rtx's small-GEMM kernel (see `small_gemm` below) queued behind each other, it runs their kernels as one launch of a batch kernel (up to 16 ops of one kind, in order: the element-wise ones on one block with a barrier between them, the products as a cooperative launch whose blocks meet at a grid-wide barrier) instead of one `cuLaunchKernel` each; nothing waits to fill a batch (it is launched when the mailbox runs empty, before any other work of the stream, or when full). Results are bitwise those of the single launches. Why: one launch costs the H200 host's driver 3.6-4.3 µs; a chain of tiny ops was bound by it. Graph captures and ops timed on the device launch one by one. See `runtime/src/driver/batch.rs`. |
//! | [`embedding_one_launch`](crate::Builder::embedding_one_launch) | `RTX_EMB_ONE_LAUNCH=0` turns off | on | On CUDA, `embedding_backward` with at most 16384 ids runs as one launch (`emb_bwd_scan_*` in `kernels/cuda/embedding.cu`: every block reads all the ids and writes its own table rows once) instead of five (count, scan, scatter, order, then the table). Why: measured on the H200 at GPT-2 sizes (`benches/RESULTS.md`, "Training kernels"), 0.0616 ms against 0.0733 with uniform ids and 0.103 against 0.180 with Zipf-distributed ones, the five-launch backward's preparation launches taking 4-6 µs each before the table write. Both are deterministic; they may differ in the last bits of a row with more than 64 ids (summed in 32 segments instead of 8). |
//! | [`layer_norm_bulk`](crate::Builder::layer_norm_bulk) | `RTX_LN_BULK=1` turns on | off | Experimental. On CUDA devices of compute capability 9.0 and newer, `layer_norm` and `layer_norm_backward` on 16-byte aligned rows of the register path run on rings of bulk copies (`ln_fwd_bulk_*`, `ln_bwd_bulk_*` in `kernels/cuda/norm_bulk.cuh`: one thread per row group copies whole rows into shared memory up to 12 rows ahead, one block per SM) instead of `ln_fwd_*` and `ln_bwd_pipe_*` (or the three-kernel backward for rows under 8 KiB). Why: those reached 75 % (forward) and 70 % (forward + backward) of the H200's copy peak at bf16 8192 × 4096, with at most 64 KiB per SM in flight. Measured on the H200 (run 20b, `benches/RESULTS.md`) it is slower than the kernels it replaces (bf16 8192 × 4096: forward 0.078 ms against 0.040, forward + backward 0.176 against 0.111; at 8192 × 768 about 2-3× slower), so it stays off; its tests pass. The forward's mean and rstd may differ in the last bits (its variance is combined by Chan's formula), the backward's sums are ordered as `ln_bwd_pipe`'s for the same grid. |
//! | — (rtx-kernels) | `RTX_KERNEL_CACHE=<dir>` | the user's cache folder | Where rtx-kernels keeps compiled CUBINs (read by rtx-kernels, process-wide, not a runtime setting). |
//!
//! ```
//! use rtx::{Backend, Runtime};
//! let rt = Runtime::builder().backend(Backend::Cpu).poison_outputs(true).build().unwrap();
//! // The environment variable, when set, wins over the builder.
//! let env = std::env::var("RTX_POISON_OUTPUTS").ok();
//! assert_eq!(rt.settings().poison_outputs, env.map_or(true, |v| v == "1"));
//! // Counters are the runtime's own.
//! assert_eq!(rt.stats().block_cache.hits, 0);
//! ```
//!
//! Ops read the settings of the runtime they run in through
//! [`ExecCx::settings`](crate::ExecCx::settings) or
//! [`StreamCx::settings`](crate::cuda::StreamCx::settings).

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Duration;

/// A runtime's settings. See the [module docs](self) for the table of settings, their
/// environment variables and defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// How long idle CUDA stream actors poll before sleeping; `None`: chosen by the core
    /// count (`RTX_ACTOR_SPIN_US`).
    pub actor_spin: Option<Duration>,
    /// Per-stream memory pools and block caches on CUDA (`RTX_STREAM_POOLS`).
    pub stream_pools: bool,
    /// Phase timing of the submits, actors and watchers (`RTX_PROFILE`).
    pub profile: bool,
    /// NaN-poisoned fresh outputs (`RTX_POISON_OUTPUTS`).
    pub poison_outputs: bool,
    /// The attention ops' Hopper kernels (`RTX_ATTN_WGMMA`).
    pub attn_wgmma: bool,
    /// The timeline recorder (`RTX_TRACE`).
    pub trace: bool,
    /// Entries per stream in each plan cache of the ops (GEMM, convolution), least
    /// recently used out (`RTX_PLAN_CACHE`; at least 1).
    pub plan_cache: usize,
    /// On CUDA, one op in this many per stream is timed on the device (a pair of
    /// timing events around its launches) and the placement policy is told that device
    /// time ([`Policy::observe_device`](crate::placement::Policy::observe_device));
    /// with the timeline recorder on, every op is. 0: no device timing
    /// (`RTX_DEVICE_TIMING`).
    pub device_timing: u32,
    /// The element-wise kernels captured into graphs launched as programmatic
    /// dependents on compute capability 9.0 and newer (`RTX_PROGRAMMATIC_LAUNCH`); see
    /// the module docs.
    pub programmatic_launch: bool,
    /// Small eager element-wise ops and small products queued behind each other
    /// launched as one batch on CUDA (`RTX_LAUNCH_BATCHING`); see the module docs.
    pub launch_batching: bool,
    /// Experimental: the GEMMs' cuBLASLt algorithm chosen by timing the heuristic's
    /// candidates, once per problem and process (`RTX_GEMM_TUNE`); see the module docs.
    pub gemm_tune: bool,
    /// Small GEMMs planned for 1/n of the device's multiprocessors (`RTX_GEMM_SM_SHARE`);
    /// 1: the whole device; 0 (the default): the compute streams per device (a built
    /// runtime reports the number it resolved to). See the module docs.
    pub gemm_sm_share: u32,
    /// Which small f16/bf16 products run rtx's own kernel instead of cuBLASLt
    /// (`RTX_SMALL_GEMM`); see the module docs.
    pub small_gemm: SmallGemm,
    /// `embedding_backward` on CUDA as one launch where it applies (default on;
    /// `RTX_EMB_ONE_LAUNCH=0` turns it off); see the module docs.
    pub embedding_one_launch: bool,
    /// Experimental: the layer-norm ops on rings of bulk copies on CUDA (compute
    /// capability 9.0 and newer) where they apply (`RTX_LN_BULK`); see the module docs.
    pub layer_norm_bulk: bool,
    /// The attention backward's main kernel for head dims 64 and 128 on compute capability
    /// 9.0 fed by a producer warpgroup's bulk tensor copies (default on;
    /// `RTX_ATTN_BWD_TMA=0` turns it off); see the module docs.
    pub attn_bwd_tma: bool,
}

/// Where rtx's own small-GEMM kernel replaces cuBLASLt on CUDA
/// ([`Settings::small_gemm`]; the [module docs](self) say which products qualify).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SmallGemm {
    /// cuBLASLt runs every GEMM (`RTX_SMALL_GEMM=off` or `0`).
    Off,
    /// Products run eagerly take rtx's kernel (its launch costs the host less); captured
    /// ones ([`Runtime::capture`](crate::Runtime::capture)) keep cuBLASLt, whose kernels
    /// are faster on the device (`RTX_SMALL_GEMM=eager`).
    #[default]
    Eager,
    /// Eager and captured products take rtx's kernel, so that a graph's small GEMMs are
    /// bitwise equal to the same GEMMs run eagerly (`RTX_SMALL_GEMM=always` or `1`).
    Always,
}

impl SmallGemm {
    /// The value an `RTX_SMALL_GEMM` string names, if any.
    fn parse(v: &str) -> Option<Self> {
        match v.trim().to_ascii_lowercase().as_str() {
            "0" | "off" => Some(Self::Off),
            "eager" => Some(Self::Eager),
            "1" | "always" => Some(Self::Always),
            _ => None,
        }
    }

    /// Whether a qualifying product takes rtx's kernel; `capturing`: it is being
    /// recorded into a graph.
    pub fn applies(self, capturing: bool) -> bool {
        match self {
            Self::Off => false,
            Self::Eager => !capturing,
            Self::Always => true,
        }
    }
}

/// The default of [`Settings::plan_cache`].
pub const DEFAULT_PLAN_CACHE: usize = 256;
/// The default of [`Settings::device_timing`]: one op in 32 per stream (two events
/// each; amortized well under 0.1 µs per op).
pub const DEFAULT_DEVICE_TIMING: u32 = 32;

impl Default for Settings {
    /// The built-in defaults, without the environment.
    fn default() -> Self {
        Settings {
            actor_spin: None,
            stream_pools: true,
            profile: false,
            poison_outputs: false,
            attn_wgmma: true,
            trace: false,
            plan_cache: DEFAULT_PLAN_CACHE,
            device_timing: DEFAULT_DEVICE_TIMING,
            programmatic_launch: true,
            launch_batching: true,
            gemm_tune: false,
            gemm_sm_share: 0,
            small_gemm: SmallGemm::Eager,
            embedding_one_launch: true,
            layer_norm_bulk: false,
            attn_bwd_tma: true,
        }
    }
}

impl Settings {
    /// These settings with every environment variable that is set applied over them.
    pub fn with_env(self) -> Self {
        self.with_vars(|name| std::env::var(name).ok())
    }

    /// [`Settings::with_env`] with the variables read through `var`.
    fn with_vars(mut self, var: impl Fn(&str) -> Option<String>) -> Self {
        if let Some(us) = var("RTX_ACTOR_SPIN_US").and_then(|v| v.parse::<u64>().ok()) {
            self.actor_spin = Some(Duration::from_micros(us));
        }
        if let Some(v) = var("RTX_STREAM_POOLS") {
            self.stream_pools = v != "0";
        }
        if let Some(v) = var("RTX_PROFILE") {
            self.profile = v == "1";
        }
        if let Some(v) = var("RTX_POISON_OUTPUTS") {
            self.poison_outputs = v == "1";
        }
        if let Some(v) = var("RTX_ATTN_WGMMA") {
            self.attn_wgmma = v != "0";
        }
        if let Some(v) = var("RTX_TRACE") {
            self.trace = v == "1";
        }
        if let Some(n) = var("RTX_PLAN_CACHE").and_then(|v| v.parse::<usize>().ok()) {
            self.plan_cache = n.max(1);
        }
        if let Some(n) = var("RTX_DEVICE_TIMING").and_then(|v| v.parse::<u32>().ok()) {
            self.device_timing = n;
        }
        if let Some(v) = var("RTX_PROGRAMMATIC_LAUNCH") {
            self.programmatic_launch = v != "0";
        }
        if let Some(v) = var("RTX_LAUNCH_BATCHING") {
            self.launch_batching = v != "0";
        }
        if let Some(v) = var("RTX_GEMM_TUNE") {
            self.gemm_tune = v == "1";
        }
        if let Some(n) = var("RTX_GEMM_SM_SHARE").and_then(|v| v.parse::<u32>().ok()) {
            self.gemm_sm_share = n;
        }
        if let Some(v) = var("RTX_SMALL_GEMM").and_then(|v| SmallGemm::parse(&v)) {
            self.small_gemm = v;
        }
        if let Some(v) = var("RTX_EMB_ONE_LAUNCH") {
            self.embedding_one_launch = v != "0";
        }
        if let Some(v) = var("RTX_LN_BULK") {
            self.layer_norm_bulk = v == "1";
        }
        if let Some(v) = var("RTX_ATTN_BWD_TMA") {
            self.attn_bwd_tma = v != "0";
        }
        self
    }

    /// The settings of the runtime whose stream actor runs on this thread (what its ops
    /// see through `ExecCx::settings`); on any other thread, the defaults with the
    /// environment applied. For op helpers that have no context at hand.
    pub fn current() -> Settings {
        CURRENT.with(Cell::get).unwrap_or_else(|| {
            static ENV: OnceLock<Settings> = OnceLock::new();
            *ENV.get_or_init(|| Settings::default().with_env())
        })
    }

    /// These settings for a runtime of `streams` compute streams per device: a
    /// [`gemm_sm_share`](Settings::gemm_sm_share) of 0 becomes `streams`.
    pub(crate) fn resolved(mut self, streams: usize) -> Self {
        if self.gemm_sm_share == 0 {
            self.gemm_sm_share = u32::try_from(streams.max(1)).unwrap_or(u32::MAX);
        }
        self
    }

    /// Makes `self` this thread's [`Settings::current`] (a stream actor, at its start).
    pub(crate) fn enter(self) {
        CURRENT.with(|c| c.set(Some(self)));
    }
}

thread_local! {
    static CURRENT: Cell<Option<Settings>> = const { Cell::new(None) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_gemm_sm_share_resolves_to_the_stream_count() {
        let auto = Settings {
            gemm_sm_share: 0,
            ..Settings::default()
        };
        assert_eq!(auto.resolved(6).gemm_sm_share, 6);
        assert_eq!(auto.resolved(0).gemm_sm_share, 1);
        assert_eq!(Settings::default().resolved(6).gemm_sm_share, 6);
        let one = Settings {
            gemm_sm_share: 1,
            ..Settings::default()
        };
        assert_eq!(one.resolved(6).gemm_sm_share, 1);
    }

    #[test]
    fn environment_variables_override_the_builder_values() {
        let base = Settings {
            poison_outputs: true,
            ..Settings::default()
        };
        let none = base.with_vars(|_| None);
        assert_eq!(none, base, "nothing set: the builder's values stay");
        let env = |name: &str| {
            match name {
                "RTX_ACTOR_SPIN_US" => Some("7"),
                "RTX_STREAM_POOLS" => Some("0"),
                "RTX_PROFILE" => Some("1"),
                "RTX_POISON_OUTPUTS" => Some("0"),
                "RTX_ATTN_WGMMA" => Some("0"),
                "RTX_PLAN_CACHE" => Some("3"),
                "RTX_DEVICE_TIMING" => Some("0"),
                "RTX_PROGRAMMATIC_LAUNCH" => Some("0"),
                "RTX_LAUNCH_BATCHING" => Some("0"),
                "RTX_GEMM_TUNE" => Some("1"),
                "RTX_GEMM_SM_SHARE" => Some("4"),
                "RTX_SMALL_GEMM" => Some("always"),
                "RTX_EMB_ONE_LAUNCH" => Some("0"),
                "RTX_LN_BULK" => Some("1"),
                "RTX_ATTN_BWD_TMA" => Some("0"),
                _ => None,
            }
            .map(String::from)
        };
        let s = base.with_vars(env);
        assert_eq!(s.actor_spin, Some(Duration::from_micros(7)));
        assert!(!s.stream_pools && s.profile && !s.poison_outputs && !s.attn_wgmma);
        assert_eq!(s.plan_cache, 3);
        assert_eq!(s.device_timing, 0);
        assert!(!s.programmatic_launch && base.programmatic_launch);
        assert!(!s.launch_batching && base.launch_batching);
        assert!(s.gemm_tune && !base.gemm_tune);
        assert!(!s.embedding_one_launch && base.embedding_one_launch);
        assert!(s.layer_norm_bulk && !base.layer_norm_bulk);
        assert!(!s.attn_bwd_tma && base.attn_bwd_tma);
        assert_eq!((s.gemm_sm_share, base.gemm_sm_share), (4, 0));
        assert_eq!(
            (s.small_gemm, base.small_gemm),
            (SmallGemm::Always, SmallGemm::Eager)
        );
        for (v, want) in [
            ("0", SmallGemm::Off),
            ("OFF", SmallGemm::Off),
            ("eager", SmallGemm::Eager),
            ("1", SmallGemm::Always),
            ("2", SmallGemm::Eager),
        ] {
            let got = base.with_vars(|n| (n == "RTX_SMALL_GEMM").then(|| v.to_string()));
            assert_eq!(got.small_gemm, want, "RTX_SMALL_GEMM={v}");
        }
        assert!(!SmallGemm::Off.applies(false) && !SmallGemm::Off.applies(true));
        assert!(SmallGemm::Eager.applies(false) && !SmallGemm::Eager.applies(true));
        assert!(SmallGemm::Always.applies(false) && SmallGemm::Always.applies(true));
        let zero = base.with_vars(|n| (n == "RTX_PLAN_CACHE").then(|| "0".to_string()));
        assert_eq!(zero.plan_cache, 1, "a plan cache keeps at least one entry");
    }

    #[test]
    fn an_actor_thread_sees_its_runtime_settings() {
        let s = Settings {
            poison_outputs: true,
            profile: true,
            ..Settings::default()
        };
        std::thread::spawn(move || {
            s.enter();
            assert_eq!(Settings::current(), s);
        })
        .join()
        .expect("thread");
    }
}
