//! The in-place bias + activation kernel (`kernels/cuda/epilogue.cu`), compiled by NVRTC
//! through `rtx-kernels`' CUBIN cache and loaded once per stream.
//!
//! Used where a library cannot fuse the epilogue: `linear` on the cuBLAS fallback path,
//! and `conv2d` with a bias or an activation (see `conv/cuda/mod.rs` for why cuDNN's own
//! fused call is not used).

use cudarc::driver::{CudaSlice, PushKernelArg};
use rtx_runtime::cuda::StreamCx;
use rtx_runtime::{DType, Element, Error, Result};

use super::device::dptr;
use crate::gemm::Activation;
use crate::kernels::{self, config, grid, launch_error, BLOCK};

/// The kernel program, `kernels/cuda/epilogue.cu`.
const MODULE: &str = "epilogue";

/// `y[i] = act(y[i] + bias[(i / inner) % channels])` over all of `y`, enqueued on
/// `scx`'s stream. `bias` (if any) has `channels` elements.
pub(crate) fn bias_act<T: Element>(
    scx: &mut StreamCx,
    y: &mut CudaSlice<T>,
    bias: Option<&CudaSlice<T>>,
    channels: usize,
    inner: usize,
    act: Activation,
) -> Result<()> {
    if bias.is_none() && act == Activation::None {
        return Ok(());
    }
    debug_assert!(bias.iter().all(|b| b.len() >= channels));
    let name = match T::DTYPE {
        DType::F32 => "bias_act_f32",
        DType::F16 => "bias_act_f16",
        DType::BF16 => "bias_act_bf16",
        other => return Err(Error::dtype("bias_act", DType::F32, other)),
    };
    let f = kernels::function(scx, MODULE, 0, T::DTYPE, || name.to_owned())?;
    let stream = scx.stream().clone();
    let n = y.len() as u64;
    let cfg = config(grid(scx, y.len().div_ceil(BLOCK as usize)), 0);
    let (bias_ptr, _gb) = match bias {
        Some(b) => {
            let (p, g) = dptr(b, &stream);
            (p, Some(g))
        }
        None => (0u64, None),
    };
    let (channels, inner) = (channels.max(1) as u64, inner.max(1) as u64);
    let act_code: i32 = match act {
        Activation::None => 0,
        Activation::Relu => 1,
        Activation::Gelu => 2,
    };
    let mut b = stream.launch_builder(&f);
    b.arg(y);
    b.arg(&bias_ptr);
    b.arg(&n);
    b.arg(&channels);
    b.arg(&inner);
    b.arg(&act_code);
    // SAFETY: the arguments match the kernel's signature (T*, const T*, three u64, int)
    // for the `T` the kernel name was chosen for; `y` holds `n` elements and the
    // kernel touches only `y[0..n)`; `bias` is null or holds `channels` elements, and
    // `(i / inner) % channels < channels`. Both buffers outlive the launch (the op
    // owns `y` and keeps its inputs alive until completion).
    unsafe { b.launch(cfg) }.map_err(|e| launch_error("bias_act", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtx_kernels::{Arch, Options};

    /// The kernel compiles to CUBIN for Hopper, without spills (skipped without NVRTC:
    /// `.ci/nvrtc-setup` installs it).
    #[test]
    fn bias_act_compiles_for_sm90() {
        if !rtx_kernels::nvrtc_present() {
            eprintln!("nvrtc: skipped (not installed)");
            return;
        }
        let source = rtx_kernels::source(MODULE).expect("epilogue.cu is built in");
        let c = rtx_kernels::compile(
            source,
            Arch::SM_90,
            &Options {
                verbose: true,
                ..Options::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let res = c.resources();
        if res.is_empty() && std::env::var_os("RTX_UNDER_SANITIZER").is_some() {
            // Under compute-sanitizer's racecheck and synccheck NVRTC compiles but its
            // log has no resource lines; the compile itself is what is checked there.
            eprintln!("nvrtc: compiled; no resource report under the sanitizer");
            return;
        }
        for k in ["bias_act_f32", "bias_act_f16", "bias_act_bf16"] {
            let r = res
                .iter()
                .find(|r| r.name == k)
                .unwrap_or_else(|| panic!("{k} missing: {res:?}"));
            assert_eq!(r.spill_stores, 0, "{r:?}");
        }
    }
}
