//! A sticky CUDA error poisons that device's runtime: the faulting op, every pending op
//! and every later op fail with the error; nothing hangs; a new runtime on the device
//! works once the poisoned one is dropped; the CPU backend goes on.
//! Runs only where a CUDA device is present (required under `RTX_REQUIRE_CUDA=1`).

mod common;

use std::time::{Duration, Instant};

use cudarc::driver::LaunchConfig;
use rtx::kernels::{Arch, KernelCache, Options};
use rtx::ops::elementwise as ew;
use rtx::{
    Backend, BackendCx, Cost, Error, ExecCx, Op, Plan, PlanCx, Result, Runtime, Tensor, TensorSpec,
};

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
        Ok(Plan {
            outputs: vec![TensorSpec::new(self.0.shape().clone(), self.0.dtype())],
            cost: Cost::default(),
        })
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
    // A new runtime on the same device works: the poisoned context went with the old
    // runtime (issue 14: "a new runtime on that device works afterwards").
    let fresh = Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(2)
        .build()
        .unwrap();
    let v: Vec<f32> = (0..4096).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect();
    let x = fresh.upload(&v, [4096]).unwrap();
    let y = fresh
        .submit(ew::exp(&x))
        .unwrap()
        .wait()
        .unwrap_or_else(|e| panic!("a new runtime after the fault: {e}"));
    let got = fresh.to_vec::<f32>(&y).unwrap().wait().unwrap();
    for (g, x) in got.iter().zip(&v) {
        let want = (*x as f64).exp();
        assert!(((*g as f64) - want).abs() <= 1e-5 * want, "exp({x}) = {g}");
    }
    // cuBLAS in the new runtime too (the CUDA libraries keep state of their own in the
    // context that was reset).
    let (m, k, n) = (64usize, 48usize, 40usize);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
        .collect();
    let (ta, tb) = (
        fresh.upload(&a, [m, k]).unwrap(),
        fresh.upload(&b, [k, n]).unwrap(),
    );
    let c = fresh
        .submit(rtx::ops::gemm::matmul(&ta, &tb))
        .unwrap()
        .wait()
        .unwrap_or_else(|e| panic!("a GEMM in the new runtime after the fault: {e}"));
    let got = fresh.to_vec::<f32>(&c).unwrap().wait().unwrap();
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
        "GEMM relative error {}",
        (err / norm).sqrt()
    );
    eprintln!(
        "fault: a new runtime on the device after the fault computes exp and a GEMM correctly"
    );
    drop(fresh);
    // The CPU backend goes on.
    let cpu = Runtime::cpu(1);
    let a = cpu.upload(&[1.0f32], [1]).unwrap();
    let y = cpu.submit(ew::add(&a, &a)).unwrap().wait().unwrap();
    assert_eq!(cpu.to_vec::<f32>(&y).unwrap().wait().unwrap(), [2.0]);
    assert!(t0.elapsed() < Duration::from_secs(120));
}
