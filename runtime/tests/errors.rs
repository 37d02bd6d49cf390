//! Device errors keep the failed call and its status code, so callers can match on them;
//! storage and buffer failures have variants of their own instead of a made-up op name.

use cudarc::driver::{sys::CUresult, DriverError};
use rtx_runtime::*;

#[test]
fn a_driver_failure_keeps_its_call_and_code() {
    let e = Error::cuda(
        "cuMemAllocAsync",
        DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
    );
    match &e {
        Error::Cuda {
            call,
            code: CudaCode::CUDA_ERROR_ILLEGAL_ADDRESS,
            message,
        } => {
            assert_eq!(call, "cuMemAllocAsync");
            assert!(message.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{message}");
        }
        other => panic!("expected Error::Cuda, got {other:?}"),
    }
    assert_eq!(e.cuda_code(), Some(CudaCode::CUDA_ERROR_ILLEGAL_ADDRESS));
    // Behind an upstream failure the code is still reachable.
    let up = Error::Upstream {
        op: "add".into(),
        cause: Box::new(e),
    };
    assert_eq!(up.cuda_code(), Some(CudaCode::CUDA_ERROR_ILLEGAL_ADDRESS));
}

#[test]
fn launch_and_synchronization_failures_keep_the_driver_code() {
    let e = Error::kernel_execution(
        "softmax",
        "cuLaunchKernel",
        DriverError(CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
    );
    assert!(matches!(
        &e,
        Error::KernelExecution { op, call, code: CudaCode::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, .. }
            if op == "softmax" && call == "cuLaunchKernel"
    ));
    let s = Error::synchronization(DriverError(CUresult::CUDA_ERROR_LAUNCH_FAILED));
    assert!(matches!(
        s,
        Error::Synchronization {
            code: Some(CudaCode::CUDA_ERROR_LAUNCH_FAILED),
            ..
        }
    ));
    assert_eq!(Error::invalid("x", "y").cuda_code(), None);
}

#[test]
fn cublas_and_cublaslt_statuses_share_one_code_space() {
    let blas = Error::cublas(
        "cublasGemmStridedBatchedEx",
        cudarc::cublas::result::CublasError(
            cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
        ),
    );
    let lt = Error::cublas(
        "cublasLtMatmul",
        cudarc::cublaslt::sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
    );
    for (e, want) in [
        (&blas, "cublasGemmStridedBatchedEx"),
        (&lt, "cublasLtMatmul"),
    ] {
        match e {
            Error::Cublas {
                call,
                status: CublasStatus::NOT_SUPPORTED,
                message,
            } => {
                assert_eq!(call, want);
                assert!(message.contains("NOT_SUPPORTED"), "{message}");
            }
            other => panic!("expected Error::Cublas, got {other:?}"),
        }
    }
}

#[test]
fn a_cudnn_failure_keeps_its_status() {
    let e = Error::cudnn(
        "cudnnConvolutionForward",
        CudnnStatus::CUDNN_STATUS_BAD_PARAM,
        "CUDNN_STATUS_BAD_PARAM: bad parameter",
    );
    assert!(matches!(
        e,
        Error::Cudnn {
            status: CudnnStatus::CUDNN_STATUS_BAD_PARAM,
            ref call,
            ..
        } if call == "cudnnConvolutionForward"
    ));
}

#[test]
fn a_wrong_buffer_access_is_a_buffer_access_error_not_an_op_error() {
    let mut b = Buffer::from_vec(vec![1.0f32, 2.0]);
    match b.cpu::<i32>() {
        Err(Error::BufferAccess { wanted, held }) => {
            assert_eq!(wanted, "host i32");
            assert_eq!(held, "host f32");
        }
        other => panic!("expected BufferAccess, got {other:?}"),
    }
    assert!(matches!(
        b.cuda::<f32>(),
        Err(Error::BufferAccess { ref wanted, .. }) if wanted == "device f32"
    ));
    assert!(matches!(
        b.cpu_mut::<u32>(),
        Err(Error::BufferAccess { ref wanted, ref held }) if wanted == "host u32" && held == "host f32"
    ));
    assert!(matches!(
        b.cuda_mut::<f32>(),
        Err(Error::BufferAccess { ref wanted, ref held }) if wanted == "device f32" && held == "host f32"
    ));
    b.cpu_mut::<f32>().unwrap()[1] = 3.0;
    assert_eq!(b.cpu::<f32>().unwrap(), [1.0, 3.0]);
}
