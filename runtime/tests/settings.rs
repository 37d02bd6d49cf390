//! Settings are builder options (environment variables override them), visible to ops
//! through their context; counters are per runtime (`rt.stats()`).

use rtx_runtime::*;

/// Whether the environment overrides `var` (then the builder's value is not expected).
fn env_set(var: &str) -> bool {
    std::env::var_os(var).is_some()
}

/// An op that reports the settings it sees, through its context and on its thread.
struct SeeSettings;

impl Op for SeeSettings {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "see_settings"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan {
            outputs: vec![TensorSpec::new([2], DType::U32)],
            cost: Cost::default(),
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let through_cx = cx.settings().poison_outputs as u32;
        let on_thread = Settings::current().poison_outputs as u32;
        cx.set_output(0, Buffer::from_vec(vec![through_cx, on_thread]))
    }
}

#[test]
fn builder_options_become_the_runtime_settings() {
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .poison_outputs(true)
        .stream_pools(false)
        .attn_wgmma(false)
        .profile(true)
        .actor_spin(std::time::Duration::from_micros(3))
        .plan_cache(5)
        .build()
        .unwrap();
    let s = rt.settings();
    if !env_set("RTX_PLAN_CACHE") {
        assert_eq!(s.plan_cache, 5);
    }
    if !env_set("RTX_POISON_OUTPUTS") {
        assert!(s.poison_outputs);
    }
    if !env_set("RTX_STREAM_POOLS") {
        assert!(!s.stream_pools);
    }
    if !env_set("RTX_ATTN_WGMMA") {
        assert!(!s.attn_wgmma);
    }
    if !env_set("RTX_PROFILE") {
        assert!(s.profile);
    }
    if !env_set("RTX_ACTOR_SPIN_US") {
        assert_eq!(s.actor_spin, Some(std::time::Duration::from_micros(3)));
    }
    let defaults = Runtime::cpu(1);
    if !env_set("RTX_POISON_OUTPUTS") {
        assert!(!defaults.settings().poison_outputs);
    }
}

#[test]
fn ops_see_the_settings_of_their_own_runtime() {
    if env_set("RTX_POISON_OUTPUTS") {
        return; // the environment decides for both runtimes
    }
    let on = Runtime::builder()
        .backend(Backend::Cpu)
        .poison_outputs(true)
        .build()
        .unwrap();
    let off = Runtime::cpu(1);
    let seen = |rt: &Runtime| -> Vec<u32> {
        let t = rt.submit(SeeSettings).unwrap().wait().unwrap();
        rt.to_vec::<u32>(&t).unwrap().wait().unwrap()
    };
    assert_eq!(
        seen(&on),
        [1, 1],
        "through ExecCx::settings and Settings::current"
    );
    assert_eq!(
        seen(&off),
        [0, 0],
        "another runtime's setting does not leak"
    );
}

#[test]
fn stats_are_per_runtime_and_reset() {
    let rt = Runtime::cpu(1);
    let s = rt.stats();
    // The CPU backend has no device caches: nothing is counted.
    assert_eq!(s.block_cache, CacheStats::default());
    assert_eq!(s.pinned_cache, CacheStats::default());
    rt.reset_stats();
    assert_eq!(rt.stats(), Stats::default());
}
