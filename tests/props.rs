//! Property tests over op construction and submission on the CPU backend: random shapes,
//! dtypes, dims, broadcast pairs, matrix-product geometries, convolution parameters (with
//! values that overflow size arithmetic), attention geometries, reshapes, donated and
//! shared inputs and tensors of another runtime. Every case either matches an f64
//! reference computed here or is rejected at submit with a typed error that gives the
//! inputs back — never a panic, never a hang (each case runs on a watched thread).

use std::sync::mpsc;
use std::time::Duration;

use proptest::prelude::*;
use rtx::ops::conv::{conv2d, Conv2dOpts};
use rtx::ops::{self, attention, elementwise as ew, gemm::matmul, reduce};
use rtx::{bf16, f16, DType, Error, Runtime, Tensor};

/// Runs `f` on its own thread: a panic fails the case with its message, and so does a
/// case still running after 60 s (a hang).
fn guarded<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => {
            let _ = h.join();
            r
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("the case panicked: {msg}")
            }
            Ok(()) => panic!("the case ended without a result"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the case hung (60 s)"),
    }
}

/// Whether `e` is one of the validation errors a bad submission may get.
fn is_validation(e: &Error) -> bool {
    matches!(
        e,
        Error::ShapeMismatch { .. }
            | Error::DTypeMismatch { .. }
            | Error::DeviceMismatch { .. }
            | Error::InvalidDim { .. }
            | Error::InvalidOp { .. }
    )
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    // A small LCG: reproducible per case, never all zeros.
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn upload(rt: &Runtime, dims: &[usize], dt: DType, seed: u64) -> (Tensor, Vec<f64>) {
    let n: usize = dims.iter().product();
    let v = values(n, seed);
    match dt {
        DType::F32 => (
            rt.upload(&v, dims.to_vec()).unwrap(),
            v.iter().map(|x| *x as f64).collect(),
        ),
        DType::F16 => {
            let h: Vec<f16> = v.iter().map(|x| f16::from_f32(*x)).collect();
            let r = h.iter().map(|x| x.to_f64()).collect();
            (rt.upload(&h, dims.to_vec()).unwrap(), r)
        }
        _ => {
            let h: Vec<bf16> = v.iter().map(|x| bf16::from_f32(*x)).collect();
            let r = h.iter().map(|x| x.to_f64()).collect();
            (rt.upload(&h, dims.to_vec()).unwrap(), r)
        }
    }
}

fn download(rt: &Runtime, t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F32 => rt
            .to_vec::<f32>(t)
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .map(|x| *x as f64)
            .collect(),
        DType::F16 => rt
            .to_vec::<f16>(t)
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .map(|x| x.to_f64())
            .collect(),
        DType::BF16 => rt
            .to_vec::<bf16>(t)
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .map(|x| x.to_f64())
            .collect(),
        other => panic!("unexpected dtype {other}"),
    }
}

/// ‖a − b‖ / ‖b‖ (or ‖a − b‖ when b is zero).
fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// ‖a − b‖ / ‖scale‖: the error relative to the magnitudes a sum is made of (for sums that
/// may cancel); ‖a − b‖ when the scale is zero.
fn rel_err_scaled(a: &[f64], b: &[f64], scale: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = scale.iter().map(|y| y * y).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn tol(dt: DType) -> f64 {
    match dt {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    }
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

/// NumPy broadcasting of two shapes, or `None`.
fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

fn index_of(shape: &[usize], out: &[usize], flat: usize) -> usize {
    // Position in `shape` (broadcast into `out`) of output element `flat`.
    let mut rem = flat;
    let mut idx = 0;
    let mut stride = 1;
    let off = out.len() - shape.len();
    for i in (0..out.len()).rev() {
        let coord = rem % out[i];
        rem /= out[i];
        if i >= off {
            let d = shape[i - off];
            if d != 1 {
                idx += coord * stride;
            }
            stride *= d;
        }
    }
    idx
}

fn shape(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..5, 0..=max_rank)
}

/// A shape and a second shape derived from it: equal, broadcastable (some dims set to 1
/// or dropped), or arbitrary.
fn shape_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (shape(4), prop::collection::vec(0u8..4, 4), 0u8..3, shape(4)).prop_map(
        |(a, tweaks, kind, other)| match kind {
            0 => (a.clone(), a),
            1 => {
                let mut b: Vec<usize> = a
                    .iter()
                    .zip(&tweaks)
                    .map(|(d, t)| if *t == 0 { 1 } else { *d })
                    .collect();
                let drop = (tweaks[0] as usize).min(b.len());
                b.drain(..drop);
                (a, b)
            }
            _ => (a, other),
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn binary_ops_broadcast_or_reject((sa, sb) in shape_pair(), da in dtype(), db in dtype(), which in 0u8..4, seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(2);
            let (a, ra) = upload(&rt, &sa, da, seed);
            let (b, rb) = upload(&rt, &sb, db, seed ^ 1);
            let op = match which {
                0 => ew::add(&a, &b),
                1 => ew::sub(&a, &b),
                2 => ew::mul(&a, &b),
                _ => ew::maximum(&a, &b),
            };
            let want_shape = broadcast(&sa, &sb);
            match rt.submit(op) {
                Ok(sub) => {
                    let y = sub.wait().expect("an accepted op completes");
                    let out = want_shape.expect("accepted only if the shapes broadcast");
                    assert_eq!(da, db, "accepted only if the dtypes agree");
                    assert_eq!(y.dims(), &out[..]);
                    let n: usize = out.iter().product();
                    let want: Vec<f64> = (0..n).map(|i| {
                        let (x, z) = (ra[index_of(&sa, &out, i)], rb[index_of(&sb, &out, i)]);
                        match which { 0 => x + z, 1 => x - z, 2 => x * z, _ => x.max(z) }
                    }).collect();
                    let got = download(&rt, &y);
                    assert!(rel_err(&got, &want) <= tol(da), "{sa:?} {sb:?} {da}");
                }
                Err(e) => {
                    assert!(is_validation(&e.error), "{e}");
                    assert!(want_shape.is_none() || da != db, "rejected a valid op: {}", e.error);
                    let (a2, b2) = e.into_op().into_inputs();
                    assert!(a2.same_storage(&a) && b2.same_storage(&b), "inputs given back");
                }
            }
        });
    }

    #[test]
    fn reductions_over_random_dims(s in shape(4), dim in 0usize..6, keep in any::<bool>(), dt in dtype(), seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let (x, rx) = upload(&rt, &s, dt, seed);
            match rt.submit(reduce::sum_dim(&x, dim, keep)) {
                Ok(sub) => {
                    assert!(dim < s.len());
                    let y = sub.wait().unwrap();
                    let outer: usize = s[..dim].iter().product();
                    let inner: usize = s[dim + 1..].iter().product();
                    let mut want = vec![0.0; outer * inner];
                    for o in 0..outer {
                        for k in 0..s[dim] {
                            for i in 0..inner {
                                want[o * inner + i] += rx[(o * s[dim] + k) * inner + i];
                            }
                        }
                    }
                    let mut dims = s.clone();
                    if keep { dims[dim] = 1 } else { dims.remove(dim); }
                    assert_eq!(y.dims(), &dims[..]);
                    let got = download(&rt, &y);
                    let scale = (s[dim] as f64).sqrt();
                    assert!(rel_err(&got, &want) <= tol(dt) * scale.max(1.0) * 4.0, "{s:?} dim {dim}");
                }
                Err(e) => {
                    assert!(matches!(e.error, Error::InvalidDim { .. }), "{e}");
                    assert!(dim >= s.len(), "rejected a valid dim: {}", e.error);
                    assert!(e.into_op().into_input().same_storage(&x));
                }
            }
        });
    }

    #[test]
    fn matmul_geometries(m in 1usize..7, k in 1usize..7, n in 1usize..7, k2 in 1usize..7, batch in 0usize..3, ta in any::<bool>(), tb in any::<bool>(), seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(2);
            let mut sa: Vec<usize> = if batch > 0 { vec![batch] } else { vec![] };
            sa.extend(if ta { [k, m] } else { [m, k] });
            let sb: Vec<usize> = if tb { vec![n, k2] } else { vec![k2, n] };
            let (a, ra) = upload(&rt, &sa, DType::F32, seed);
            let (b, rb) = upload(&rt, &sb, DType::F32, seed ^ 7);
            let mut op = matmul(&a, &b);
            if ta { op = op.trans_a(); }
            if tb { op = op.trans_b(); }
            match rt.submit(op) {
                Ok(sub) => {
                    assert_eq!(k, k2, "accepted only if the inner dims agree");
                    let y = sub.wait().unwrap();
                    let bt = batch.max(1);
                    let mut want = vec![0.0; bt * m * n];
                    let mut mag = vec![0.0; bt * m * n];
                    for p in 0..bt {
                        for i in 0..m {
                            for j in 0..n {
                                let (mut acc, mut abs) = (0.0, 0.0);
                                for l in 0..k {
                                    let av = if ta { ra[p * m * k + l * m + i] } else { ra[p * m * k + i * k + l] };
                                    let bv = if tb { rb[j * k + l] } else { rb[l * n + j] };
                                    acc += av * bv;
                                    abs += (av * bv).abs();
                                }
                                want[(p * m + i) * n + j] = acc;
                                mag[(p * m + i) * n + j] = abs;
                            }
                        }
                    }
                    // relative to |A|·|B|: a 1 x 1 result of k terms of both signs may cancel
                    // to near zero, where f32 rounding is large against the result itself
                    assert!(rel_err_scaled(&download(&rt, &y), &want, &mag) <= 1e-5);
                }
                Err(e) => {
                    assert!(matches!(e.error, Error::ShapeMismatch { .. }), "{e}");
                    assert_ne!(k, k2, "rejected a valid product: {}", e.error);
                    let (a2, b2) = e.into_op().into_inputs();
                    assert!(a2.same_storage(&a) && b2.same_storage(&b));
                }
            }
        });
    }

    #[test]
    fn reshape_never_wraps(dims in prop::collection::vec(prop_oneof![1usize..6, Just(usize::MAX / 2 + 1), Just(1usize << 62), Just(0usize)], 0..4)) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let x = rt.upload(&values(4, 3), [4]).unwrap();
            let exact = dims.iter().try_fold(1usize, |acc, d| acc.checked_mul(*d));
            match x.reshape(dims.clone()) {
                Ok(y) => {
                    assert_eq!(exact, Some(4), "{dims:?} accepted");
                    assert_eq!(y.numel(), 4);
                }
                Err(e) => {
                    assert!(is_validation(&e), "{e}");
                    assert_ne!(exact, Some(4), "{dims:?} rejected: {e}");
                }
            }
        });
    }

    #[test]
    fn conv_params_reject_or_compute(
        n in 1usize..3, c in 1usize..4, hw in 1usize..7, co in 1usize..4, kk in 1usize..4,
        stride in prop_oneof![1usize..3, Just(usize::MAX), Just(1usize << 40)],
        pad in prop_oneof![0usize..2, Just(usize::MAX / 2), Just(1usize << 62)],
        dil in prop_oneof![1usize..3, Just(usize::MAX / 3)],
        groups in prop_oneof![Just(1usize), 1usize..4, Just(0usize)],
        seed in any::<u64>(),
    ) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let cg = c.div_ceil(groups.max(1));
            let (x, rx) = upload(&rt, &[n, c, hw, hw], DType::F32, seed);
            let (w, rw) = upload(&rt, &[co, cg, kk, kk], DType::F32, seed ^ 3);
            let opts = Conv2dOpts::default().stride(stride).pad(pad).dilation(dil).groups(groups);
            match rt.submit(conv2d(&x, &w, opts)) {
                Ok(sub) => {
                    let y = sub.wait().unwrap();
                    // Only small, valid geometries can be accepted; check them against a
                    // direct convolution.
                    let g = groups;
                    assert!(g >= 1 && c % g == 0 && co % g == 0 && cg * g == c);
                    let span = dil * (kk - 1) + 1;
                    let oh = (hw + 2 * pad - span) / stride + 1;
                    assert_eq!(y.dims(), &[n, co, oh, oh]);
                    let mut want = vec![0.0; n * co * oh * oh];
                    let cog = co / g;
                    for b in 0..n { for o in 0..co { for i in 0..oh { for j in 0..oh {
                        let gi = o / cog;
                        let mut acc = 0.0;
                        for ci in 0..cg { for p in 0..kk { for q in 0..kk {
                            let yy = (i * stride + p * dil) as isize - pad as isize;
                            let xx = (j * stride + q * dil) as isize - pad as isize;
                            if yy < 0 || xx < 0 || yy >= hw as isize || xx >= hw as isize { continue; }
                            let cin = gi * cg + ci;
                            acc += rx[((b * c + cin) * hw + yy as usize) * hw + xx as usize]
                                * rw[((o * cg + ci) * kk + p) * kk + q];
                        }}}
                        want[((b * co + o) * oh + i) * oh + j] = acc;
                    }}}}
                    assert!(rel_err(&download(&rt, &y), &want) <= 1e-5);
                }
                Err(e) => {
                    assert!(is_validation(&e.error), "{e}");
                    let (x2, w2, _) = e.into_op().into_inputs();
                    assert!(x2.same_storage(&x) && w2.same_storage(&w));
                }
            }
        });
    }

    #[test]
    fn attention_geometries(b in 1usize..3, h in 1usize..3, l in 1usize..6, s in 1usize..6, d in prop_oneof![Just(4usize), Just(8), 1usize..9], vmis in 0u8..6, hk in 1usize..3, causal in any::<bool>(), seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let (q, rq) = upload(&rt, &[b, h, l, d], DType::F32, seed);
            let (k, rk) = upload(&rt, &[b, hk, s, d], DType::F32, seed ^ 5);
            // Now and then v's length differs from k's (must be rejected).
            let sv = if vmis == 0 { s + 1 } else { s };
            let dv = d;
            let (v, rv) = upload(&rt, &[b, hk, sv, dv], DType::F32, seed ^ 9);
            match rt.submit(attention(&q, &k, &v).causal(causal)) {
                Ok(sub) => {
                    let (o, _lse) = sub.wait().unwrap();
                    assert!(h % hk == 0, "heads must group");
                    assert_eq!(sv, s, "k and v must agree");
                    let scale = 1.0 / (d as f64).sqrt();
                    let mut want = vec![0.0; b * h * l * dv];
                    for bi in 0..b { for hi in 0..h {
                        let kh = hi / (h / hk);
                        for i in 0..l {
                            // Causal is top-left (as the op documents): query i sees key
                            // j iff j <= i, so every row sees key 0.
                            let last = if causal { i.min(s - 1) } else { s - 1 };
                            let sc: Vec<f64> = (0..=last).map(|j| (0..d).map(|t| rq[((bi * h + hi) * l + i) * d + t] * rk[((bi * hk + kh) * s + j) * d + t]).sum::<f64>() * scale).collect();
                            let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                            let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                            let z: f64 = e.iter().sum();
                            for t in 0..dv {
                                want[((bi * h + hi) * l + i) * dv + t] = (0..=last).map(|j| e[j] / z * rv[((bi * hk + kh) * s + j) * dv + t]).sum();
                            }
                        }
                    }}
                    assert!(rel_err(&download(&rt, &o), &want) <= 1e-4, "b{b} h{h} hk{hk} l{l} s{s} d{d} causal {causal}");
                }
                Err(e) => {
                    assert!(is_validation(&e.error), "{e}");
                    let (q2, k2, v2, _) = e.into_op().into_inputs();
                    assert!(q2.same_storage(&q) && k2.same_storage(&k) && v2.same_storage(&v));
                }
            }
        });
    }
}

#[test]
fn tensors_of_another_runtime_are_rejected_and_given_back() {
    guarded(|| {
        let rt1 = Runtime::cpu(1);
        let rt2 = Runtime::cpu(1);
        let a = rt1.upload(&values(6, 1), [2, 3]).unwrap();
        let b = rt2.upload(&values(6, 2), [2, 3]).unwrap();
        let Err(e) = rt1.submit(ops::add(&a, &b)) else {
            panic!("a foreign tensor was accepted")
        };
        assert!(matches!(e.error, Error::InvalidOp { .. }), "{}", e.error);
        let (a2, b2) = e.into_op().into_inputs();
        assert!(a2.same_storage(&a) && b2.same_storage(&b));
    });
}

#[test]
fn donated_inputs_that_are_shared_leave_the_other_handle_untouched() {
    guarded(|| {
        let rt = Runtime::cpu(2);
        let v = values(64, 11);
        let a = rt.upload(&v, [64]).unwrap();
        let keep = a.clone(); // a second handle: the donation must not write in place
        let b = rt.upload(&values(64, 12), [64]).unwrap();
        let y = rt.submit(ops::add_(a, &b)).unwrap().wait().unwrap();
        assert!(!y.same_storage(&keep));
        assert_eq!(rt.to_vec::<f32>(&keep).unwrap().wait().unwrap(), v);
        let bv = rt.to_vec::<f32>(&b).unwrap().wait().unwrap();
        let want: Vec<f32> = v.iter().zip(&bv).map(|(x, z)| x + z).collect();
        assert_eq!(rt.to_vec::<f32>(&y).unwrap().wait().unwrap(), want);
    });
}

/// A broadcast whose output is far beyond host memory (`[2^20, 1] + [1, 2^20]`: 2^40 f32,
/// 4 TiB) is refused at submit with `OutOfMemory` and the inputs back, instead of
/// aborting the process in the allocator. (The check reads the system's available
/// memory, which Linux reports in /proc/meminfo.)
#[cfg(target_os = "linux")]
#[test]
fn host_outputs_beyond_memory_are_out_of_memory_not_an_abort() {
    guarded(|| {
        let rt = Runtime::cpu(1);
        let n = 1usize << 20;
        let a = rt.upload(&values(n, 21), [n, 1]).unwrap();
        let b = rt.upload(&values(n, 22), [1, n]).unwrap();
        let Err(e) = rt.submit(ops::add(&a, &b)) else {
            panic!("a 4 TiB output was accepted")
        };
        match e.error {
            Error::OutOfMemory {
                requested,
                available,
                ..
            } => {
                assert_eq!(requested, 4 << 40);
                assert!(available < requested);
            }
            ref other => panic!("expected OutOfMemory, got {other}"),
        }
        let (a2, b2) = e.into_op().into_inputs();
        assert!(a2.same_storage(&a) && b2.same_storage(&b));
        // The runtime goes on.
        let y = rt.submit(ops::add(&a, &a)).unwrap().wait().unwrap();
        assert_eq!(y.dims(), &[n, 1]);
    });
}
