//! Out-of-device-memory is a typed error with the requested and available bytes, the
//! runtime goes on afterwards. Runs only where a CUDA device is present (required under
//! `RTX_REQUIRE_CUDA=1`).

use rtx::ops::elementwise as ew;
mod common;

use common::AllocF32;
use rtx::{Backend, Error, Runtime};

#[test]
fn out_of_memory_is_typed_and_recoverable() {
    if !common::cuda_present() {
        return;
    }
    let rt = Runtime::builder()
        .backend(Backend::Cuda(vec![]))
        .streams(1)
        .build()
        .unwrap();
    let n = 1usize << 42; // 16 TiB of f32
    match rt.submit(AllocF32(n)).unwrap().wait() {
        Err(Error::OutOfMemory {
            requested,
            available,
            ..
        }) => {
            assert_eq!(requested, n * 4);
            assert!(available < requested, "available {available} bytes");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // The stream and the device still work.
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let y = rt.submit(ew::add(&a, &a)).unwrap().wait().unwrap();
    assert_eq!(rt.to_vec::<f32>(&y).unwrap().wait().unwrap(), [2.0, 4.0]);
}
