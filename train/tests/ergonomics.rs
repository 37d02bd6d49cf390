//! The short forms: `rt.run(op)` (the output handles at once), `t.to_vec()` without the
//! runtime, `t.values()` for printing values on request, and negative dims.

use rtx_runtime::{Error, Runtime};

#[test]
fn run_yields_the_outputs_and_chains() {
    let rt = Runtime::cpu(2);
    let x = rt
        .upload(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], [2, 3])
        .unwrap();
    let y = rt.run(rtx_ops::relu(&x)).unwrap();
    let z = rt.run(rtx_ops::add(&y, &x)).unwrap();
    assert_eq!(
        z.to_vec::<f32>().unwrap(),
        [2.0, -2.0, 6.0, -4.0, 10.0, -6.0]
    );
    // Multi-output ops yield their tuple.
    let g = rt.upload(&[1.0f32; 3], [3]).unwrap();
    let b = rt.upload(&[0.0f32; 3], [3]).unwrap();
    let (n, mean, rstd) = rt.run(rtx_ops::layer_norm(&x, &g, &b, 1e-5)).unwrap();
    assert_eq!(n.dims(), [2, 3]);
    assert_eq!(mean.to_vec::<f32>().unwrap(), [2.0 / 3.0, -5.0 / 3.0]);
    assert_eq!(rstd.dims(), [2]);
    // A rejected op is its typed error.
    let w = rt.upload(&[1.0f32; 4], [4]).unwrap();
    let e = rt.run(rtx_ops::add(&x, &w)).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
}

#[test]
fn to_vec_finds_the_runtime_and_checks_the_dtype() {
    let rt = Runtime::cpu(1);
    let x = rt.upload(&[7u32, 8, 9], [3]).unwrap();
    assert_eq!(x.to_vec::<u32>().unwrap(), [7, 8, 9]);
    assert_eq!(x.to_f64_vec().unwrap(), [7.0, 8.0, 9.0]);
    assert!(x.runtime().is_some());
    let e = x.to_vec::<f32>().unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e:?}");
    // Two runtimes: each tensor downloads through its own.
    let rt2 = Runtime::cpu(1);
    let y = rt2.upload(&[1.5f32], [1]).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.5]);
    // Once the runtime is gone, the tensor says so instead of hanging.
    drop(rt2);
    let e = y.to_vec::<f32>().unwrap_err();
    assert!(matches!(e, Error::InvalidOp { .. }), "{e:?}");
    assert!(y.runtime().is_none());
}

#[test]
fn values_print_on_request() {
    let rt = Runtime::cpu(1);
    let t = rt
        .upload(&[1.0f32, 2.5, -3.0, 4.0, 0.5, 6.0], [2, 3])
        .unwrap();
    assert_eq!(format!("{}", t.values()), "[[1, 2.5, -3], [4, 0.5, 6]]");
    let dbg = format!("{:?}", t.values());
    assert!(dbg.starts_with("Tensor(f32 [2, 3]"), "{dbg}");
    assert!(dbg.ends_with("[[1, 2.5, -3], [4, 0.5, 6]]"), "{dbg}");
    // Plain Debug shows no values (it never downloads).
    assert!(!format!("{t:?}").contains("2.5"));
    // Long dims are elided in the middle.
    let long: Vec<i32> = (0..20).collect();
    let l = rt.upload(&long, [20]).unwrap();
    assert_eq!(format!("{}", l.values()), "[0, 1, 2, ..., 17, 18, 19]");
    // bf16 prints its (rounded) values.
    let h = rt.run(rtx_ops::cast(&t, rtx_runtime::DType::BF16)).unwrap();
    assert_eq!(format!("{}", h.values()), "[[1, 2.5, -3], [4, 0.5, 6]]");
}

#[test]
fn negative_dims_count_from_the_end() {
    let rt = Runtime::cpu(1);
    let x = rt
        .upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])
        .unwrap();
    let last = rt.run(rtx_ops::sum_dim(&x, -1, false)).unwrap();
    assert_eq!(last.to_vec::<f32>().unwrap(), [6.0, 15.0]);
    let first = rt.run(rtx_ops::sum_dim(&x, -2, true)).unwrap();
    assert_eq!(first.dims(), [1, 3]);
    assert_eq!(first.to_vec::<f32>().unwrap(), [5.0, 7.0, 9.0]);
    let am = rt.run(rtx_ops::argmax_dim(&x, -1, false)).unwrap();
    assert_eq!(am.to_vec::<u32>().unwrap(), [2, 2]);
    // usize dims still work, and out-of-range ones are typed errors at submit.
    assert!(rt.run(rtx_ops::mean_dim(&x, 1usize, false)).is_ok());
    for bad in [-3isize, 2] {
        let e = rt.run(rtx_ops::max_dim(&x, bad, false)).unwrap_err();
        assert!(matches!(e, Error::InvalidDim { .. }), "{bad}: {e:?}");
        assert!(format!("{e}").contains(&format!("dim {bad}")), "{e}");
    }
    // Layout ops take negative dims too.
    let t = rt.run(rtx_ops::transpose(&x, -1, -2)).unwrap();
    assert_eq!(t.dims(), [3, 2]);
}
