//! A sticky CUDA error poisons that device's runtime: the faulting op, every pending op
//! and every later op fail with the error; nothing hangs; a new runtime in the same
//! process works if the context reset clears the error, else fails at once with
//! `DevicePoisoned` (the driver keeps a trap's error for the process's life); a new
//! process uses the device; the CPU backend goes on.
//! Runs only where a CUDA device is present (required under `RTX_REQUIRE_CUDA=1`).

mod common;

use std::time::{Duration, Instant};

use cudarc::driver::LaunchConfig;
use rtx::kernels::{Arch, KernelCache, Options};
use rtx::ops::elementwise as ew;
use rtx::{Backend, BackendCx, Error, ExecCx, Op, Plan, PlanCx, Result, Runtime, Tensor};

/// Launches `fault_trap` (kernels/cuda/testing/fault.cu, built in with the `test-util`
/// feature), which executes `__trap()`.
struct Fault(Tensor);

impl Op for Fault {
    type Output = Tensor;
    fn name(&self) -> &'static str {
        "fault"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.0]
    }
    fn plan(&self, _: &PlanCx) -> Result<Plan> {
        Ok(Plan::like(&self.0))
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let n = self.0.numel();
        let BackendCx::Cuda(scx) = cx.backend() else {
            return Err(Error::invalid("fault", "CUDA only"));
        };
        let f = scx.function("fault", "fault_trap", |(major, minor)| {
            KernelCache::global()
                .cubin(
                    "fault",
                    Arch {
                        major: major as u32,
                        minor: minor as u32,
                    },
                    &Options::default(),
                )
                .map_err(|e| Error::KernelCompile {
                    kernel: "fault".into(),
                    arch: format!("sm_{major}{minor}"),
                    status: None,
                    log: e.to_string(),
                })
        })?;
        let out = scx.alloc::<f32>(n)?;
        let mut b = scx.stream().launch_builder(&f);
        // SAFETY: `fault_trap` takes no arguments; it traps by design (that is the test).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(|e| Error::kernel_execution("fault", "cuLaunchKernel", e))?;
        cx.set_output(0, rtx::Buffer::from_cuda(out))
    }
}

#[test]
fn a_faulting_kernel_poisons_the_device_and_nothing_hangs() {
    if !common::cuda_present() {
        return;
    }
    let t0 = Instant::now();
    let rt = Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(2)
        .build()
        .unwrap();
    let x = rt.upload(&vec![1.0f32; 1 << 20], [1 << 20]).unwrap();
    let fine = rt.submit(ew::exp(&x)).unwrap().wait().unwrap();
    let fault = rt.submit(Fault(x.clone())).unwrap();
    // Queue more work behind and beside it, some depending on the faulting output.
    let bad_out = fault.outputs().unwrap().clone();
    let dependent: Vec<_> = (0..8)
        .map(|_| rt.submit(ew::add(&bad_out, &x)).unwrap())
        .collect();
    let independent: Vec<_> = (0..8)
        .map(|_| rt.submit(ew::add(&fine, &x)).unwrap())
        .collect();
    let e = fault.wait().unwrap_err();
    eprintln!("fault: {e}");
    for s in dependent {
        assert!(s.wait().is_err(), "an op after the fault must fail");
    }
    // Ops on the other stream either finished before the fault struck or fail; none hangs.
    for s in independent {
        let _ = s.wait();
    }
    // Later submissions fail with the poisoning error.
    let later = rt.submit(ew::exp(&x)).unwrap().wait().unwrap_err();
    assert!(
        matches!(later, Error::DevicePoisoned { .. }),
        "later op: {later}"
    );
    // Every handle into the old runtime's memory goes with it (each keeps its allocator,
    // and so the poisoned context, alive).
    drop((x, fine, bad_out));
    drop(rt);
    // A new runtime in this process: the driver keeps a sticky error in the context for
    // the rest of the process (NVIDIA: "to continue using CUDA, the process must be
    // terminated and relaunched"); rtx resets the primary context first, and where that
    // does not clear it, the build fails at once with the typed error: it never hangs.
    let t1 = Instant::now();
    match Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(2)
        .build()
    {
        Ok(fresh) => {
            exp_and_gemm(&fresh, "a new runtime in the faulted process");
            eprintln!(
                "fault: a new runtime in the same process works (the context reset cleared it)"
            );
        }
        Err(e) => {
            assert!(
                matches!(e, Error::DevicePoisoned { .. }),
                "a new runtime: {e}"
            );
            eprintln!("fault: a new runtime in the same process fails at once: {e}");
        }
    }
    assert!(t1.elapsed() < Duration::from_secs(30));
    // The device itself is fine: a new process uses it (this test binary again, running
    // only `a_fresh_process_uses_the_device`).
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_fresh_process_uses_the_device", "--nocapture"])
        .env("RTX_POISON_CHILD", "1")
        .output()
        .expect("spawn the test binary");
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the fresh process failed: {text}");
    assert!(
        text.contains("fresh process: exp and GEMM correct"),
        "{text}"
    );
    eprintln!("fault: a fresh process on the device computes exp and a GEMM correctly");
    // The CPU backend goes on.
    let cpu = Runtime::cpu(1);
    let a = cpu.upload(&[1.0f32], [1]).unwrap();
    let y = cpu.submit(ew::add(&a, &a)).unwrap().wait().unwrap();
    assert_eq!(cpu.to_vec::<f32>(&y).unwrap().wait().unwrap(), [2.0]);
    assert!(t0.elapsed() < Duration::from_secs(120));
}

/// Run by the faulting test in a child process (`RTX_POISON_CHILD=1`); does nothing else.
#[test]
fn a_fresh_process_uses_the_device() {
    if std::env::var("RTX_POISON_CHILD").is_err() || !common::cuda_present() {
        return;
    }
    let rt = Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(2)
        .build()
        .unwrap();
    exp_and_gemm(&rt, "a fresh process");
    eprintln!("fresh process: exp and GEMM correct");
}

/// `exp` of 4,096 values and a 64 x 48 x 40 GEMM on `rt`, checked against f64.
fn exp_and_gemm(rt: &Runtime, what: &str) {
    let v: Vec<f32> = (0..4096).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect();
    let x = rt.upload(&v, [4096]).unwrap();
    let y = rt
        .submit(ew::exp(&x))
        .unwrap()
        .wait()
        .unwrap_or_else(|e| panic!("{what}: exp: {e}"));
    let got = rt.to_vec::<f32>(&y).unwrap().wait().unwrap();
    for (g, x) in got.iter().zip(&v) {
        let want = (*x as f64).exp();
        assert!(
            ((*g as f64) - want).abs() <= 1e-5 * want,
            "{what}: exp({x}) = {g}"
        );
    }
    let (m, k, n) = (64usize, 48usize, 40usize);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
        .collect();
    let (ta, tb) = (
        rt.upload(&a, [m, k]).unwrap(),
        rt.upload(&b, [k, n]).unwrap(),
    );
    let c = rt
        .submit(rtx::ops::gemm::matmul(&ta, &tb))
        .unwrap()
        .wait()
        .unwrap_or_else(|e| panic!("{what}: GEMM: {e}"));
    let got = rt.to_vec::<f32>(&c).unwrap().wait().unwrap();
    let (mut err, mut norm) = (0f64, 0f64);
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum();
            err += (got[i * n + j] as f64 - want).powi(2);
            norm += want * want;
        }
    }
    assert!(
        (err / norm).sqrt() < 1e-2,
        "{what}: GEMM relative error {}",
        (err / norm).sqrt()
    );
}
