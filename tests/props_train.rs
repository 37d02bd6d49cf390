//! Property tests of the training op families on the CPU backend (`tests/props.rs` has
//! the element-wise, reduction, GEMM, convolution and attention ones): activations and
//! softmax over random shapes and dtypes, `narrow` and `transpose` with random (also
//! negative, out-of-range and overflowing) arguments, comparisons and `where_` over
//! operand pairs of any shapes and dtypes, cross-entropy with out-of-range labels, layer norm with mismatched
//! parameters and bad `eps`, embeddings with out-of-range ids, AdamW with mismatched
//! lists, random init with bad parameters. Each case matches an f64 reference computed
//! here, or fails with a typed error — at submit with the inputs given back, or (for the
//! data-dependent errors the CPU finds while running: a bad label or id) from the op —
//! never a panic, never a hang. Each test prints how many cases it ran and how many were
//! accepted; `RTX_PROP_CASES=N` sets the cases per test (default 128).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use proptest::prelude::*;
use rtx::ops::{self, optim::AdamW};
use rtx::{bf16, f16, DType, Error, Runtime, Tensor};

/// Cases per test: `RTX_PROP_CASES` or 128.
fn cases() -> u32 {
    std::env::var("RTX_PROP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(128)
}

/// Counts a test's cases; prints the tally at the last.
struct Tally {
    name: &'static str,
    cases: AtomicUsize,
    accepted: AtomicUsize,
}

impl Tally {
    const fn new(name: &'static str) -> Self {
        Tally {
            name,
            cases: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
        }
    }
    fn count(&self, accepted: bool) {
        self.accepted
            .fetch_add(accepted as usize, Ordering::Relaxed);
        let n = self.cases.fetch_add(1, Ordering::Relaxed) + 1;
        if n == cases() as usize {
            eprintln!(
                "props {}: {n} cases, {} accepted and checked against f64, {} rejected typed",
                self.name,
                self.accepted.load(Ordering::Relaxed),
                n - self.accepted.load(Ordering::Relaxed)
            );
        }
    }
}

/// Runs `f` on its own thread: a panic fails the case, and so does a hang (60 s).
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
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let p = h.join().unwrap_err();
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("the case panicked: {msg}")
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the case hung (60 s)"),
    }
}

fn validation(e: &Error) -> bool {
    matches!(
        e,
        Error::ShapeMismatch { .. }
            | Error::DTypeMismatch { .. }
            | Error::InvalidDim { .. }
            | Error::InvalidOp { .. }
    )
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// Uploads `n` values of `dt` for `dims`; returns the tensor and the values it holds.
fn upload(rt: &Runtime, dims: &[usize], dt: DType, seed: u64) -> (Tensor, Vec<f64>) {
    let v = values(dims.iter().product(), seed);
    match dt {
        DType::F16 => {
            let h: Vec<f16> = v.iter().map(|x| f16::from_f32(*x)).collect();
            let r = h.iter().map(|x| x.to_f64()).collect();
            (rt.upload(&h, dims.to_vec()).unwrap(), r)
        }
        DType::BF16 => {
            let h: Vec<bf16> = v.iter().map(|x| bf16::from_f32(*x)).collect();
            let r = h.iter().map(|x| x.to_f64()).collect();
            (rt.upload(&h, dims.to_vec()).unwrap(), r)
        }
        _ => (
            rt.upload(&v, dims.to_vec()).unwrap(),
            v.iter().map(|x| *x as f64).collect(),
        ),
    }
}

fn download(rt: &Runtime, t: &Tensor) -> Vec<f64> {
    let f = rt.submit(ops::cast(t, DType::F32)).unwrap().wait().unwrap();
    let v = rt.to_vec::<f32>(&f).unwrap().wait().unwrap();
    v.iter().map(|x| *x as f64).collect()
}

fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn tol(dt: DType) -> f64 {
    match dt {
        DType::F32 => 1e-5,
        DType::F16 => 3e-3,
        _ => 2e-2,
    }
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

fn shape(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..6, 0..=max_rank)
}

static ACT: Tally = Tally::new("activations_and_softmax");
static LAYOUT: Tally = Tally::new("narrow_and_transpose");
static CMP: Tally = Tally::new("compare_and_where");
static CE: Tally = Tally::new("cross_entropy");
static LN: Tally = Tally::new("layer_norm");
static EMB: Tally = Tally::new("embedding");
static ADAM: Tally = Tally::new("adamw");
static RAND: Tally = Tally::new("random_init");

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn activations_and_softmax(s in shape(3), dt in dtype(), which in 0u8..5, seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let (x, rx) = upload(&rt, &s, dt, seed);
            let op = match which {
                0 => ops::tanh(&x),
                1 => ops::sigmoid(&x),
                2 => ops::gelu(&x),
                3 => ops::silu(&x),
                _ => {
                    match rt.submit(ops::softmax(&x)) {
                        Ok(sub) => {
                            let y = sub.wait().unwrap();
                            let d = *s.last().expect("softmax of a scalar accepted");
                            let mut want = rx.clone();
                            for row in want.chunks_mut(d) {
                                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                                let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
                                row.iter_mut().for_each(|v| *v = (*v - m).exp() / z);
                            }
                            assert!(rel_err(&download(&rt, &y), &want) <= tol(dt), "{s:?} {dt}");
                            ACT.count(true);
                        }
                        Err(e) => {
                            assert!(validation(&e.error) && s.is_empty(), "{}", e.error);
                            assert!(e.into_op().into_input().same_storage(&x));
                            ACT.count(false);
                        }
                    }
                    return;
                }
            };
            let y = rt.submit(op).expect("an activation of any float shape").wait().unwrap();
            let want: Vec<f64> = rx.iter().map(|&v| match which {
                0 => v.tanh(),
                1 => 1.0 / (1.0 + (-v).exp()),
                2 => 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh()),
                _ => v / (1.0 + (-v).exp()),
            }).collect();
            assert_eq!(y.dims(), &s[..]);
            assert!(rel_err(&download(&rt, &y), &want) <= tol(dt) * 2.0, "{s:?} {dt} {which}");
            ACT.count(true);
        });
    }

    #[test]
    fn narrow_and_transpose(s in shape(4), d0 in -5isize..5, d1 in -5isize..5,
                            start in prop_oneof![0usize..6, Just(usize::MAX), Just(usize::MAX / 2 + 1)],
                            len in prop_oneof![0usize..6, Just(usize::MAX)], which in any::<bool>(), seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let (x, rx) = upload(&rt, &s, DType::F32, seed);
            let r = s.len() as isize;
            let norm = |d: isize| if d < 0 { d + r } else { d };
            let op = if which { ops::transpose(&x, d0, d1) } else { ops::narrow(&x, d0, start, len) };
            match rt.submit(op) {
                Ok(sub) => {
                    let y = sub.wait().unwrap();
                    let got = download(&rt, &y);
                    let (a, strides) = (norm(d0) as usize, strides(&s));
                    let mut out = s.clone();
                    let want: Vec<f64> = if which {
                        let b = norm(d1) as usize;
                        out.swap(a, b);
                        (0..rx.len()).map(|i| {
                            let mut idx = unflat(i, &out);
                            idx.swap(a, b);
                            rx[flat(&idx, &strides)]
                        }).collect()
                    } else {
                        assert!(len > 0 && start.checked_add(len).is_some_and(|e| e <= s[a]));
                        out[a] = len;
                        (0..out.iter().product()).map(|i| {
                            let mut idx = unflat(i, &out);
                            idx[a] += start;
                            rx[flat(&idx, &strides)]
                        }).collect()
                    };
                    assert_eq!(y.dims(), &out[..]);
                    assert_eq!(got, want, "{s:?} {d0} {d1} {start} {len} {which}");
                    LAYOUT.count(true);
                }
                Err(e) => {
                    assert!(validation(&e.error), "{}", e.error);
                    let dims_ok = |d: isize| (-r..r).contains(&d);
                    if which {
                        assert!(!dims_ok(d0) || !dims_ok(d1), "rejected a valid transpose: {}", e.error);
                    } else {
                        assert!(!dims_ok(d0) || len == 0 || start.checked_add(len).is_none_or(|end| end > s[norm(d0) as usize]),
                            "rejected a valid narrow: {}", e.error);
                    }
                    assert!(e.into_op().into_inputs()[0].same_storage(&x));
                    LAYOUT.count(false);
                }
            }
        });
    }

    #[test]
    fn compare_and_where(sa in shape(3), other in shape(3), same in any::<bool>(),
                         dt in dtype(), db in dtype(), which in 0u8..3, seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            // b: a's shape (comparisons take operands of one shape) or any other shape,
            // in a dtype that may differ.
            let sb = if same { sa.clone() } else { other };
            let (a, ra) = upload(&rt, &sa, dt, seed);
            let (b, rb) = upload(&rt, &sb, db, seed ^ 3);
            let op = match which { 0 => ops::gt(&a, &b), 1 => ops::lt(&a, &b), _ => ops::eq(&a, &b) };
            match rt.submit(op) {
                Ok(sub) => {
                    assert!(dt == db && sa == sb, "accepted only when the dtypes and shapes agree");
                    let m = sub.wait().unwrap();
                    assert_eq!(m.dims(), &sa[..]);
                    let bi = |i: usize| i;
                    let want: Vec<u32> = (0..ra.len()).map(|i| {
                        let (x, y) = (ra[i], rb[bi(i)]);
                        (match which { 0 => x > y, 1 => x < y, _ => x == y }) as u32
                    }).collect();
                    assert_eq!(rt.to_vec::<u32>(&m).unwrap().wait().unwrap(), want);
                    let w = rt.submit(ops::where_(&m, &a, &b)).unwrap().wait().unwrap();
                    let wv: Vec<f64> = (0..ra.len()).map(|i| if want[i] == 1 { ra[i] } else { rb[bi(i)] }).collect();
                    assert_eq!(download(&rt, &w), wv);
                    CMP.count(true);
                }
                Err(e) => {
                    assert!(validation(&e.error) && (dt != db || sa != sb), "rejected a valid compare: {}", e.error);
                    let (a2, b2) = e.into_op().into_inputs();
                    assert!(a2.same_storage(&a) && b2.same_storage(&b));
                    CMP.count(false);
                }
            }
        });
    }

    #[test]
    fn cross_entropy(n in 1usize..6, c in 1usize..9, bad in 0u8..4, dt in dtype(), seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let (x, rx) = upload(&rt, &[n, c], dt, seed);
            // bad: 0 valid labels, 1 one label out of range, 2 labels of n+1 rows, 3 f32 labels.
            let labels: Vec<u32> = (0..n).map(|i| ((i * 7 + seed as usize) % c) as u32).collect();
            let lt = match bad {
                1 => { let mut l = labels.clone(); l[0] = c as u32 + (seed % 5) as u32; rt.upload(&l, [n]).unwrap() }
                2 => rt.upload(&vec![0u32; n + 1], [n + 1]).unwrap(),
                3 => rt.upload(&vec![0f32; n], [n]).unwrap(),
                _ => rt.upload(&labels, [n]).unwrap(),
            };
            match rt.submit(ops::cross_entropy(&x, &lt)) {
                Ok(sub) => match sub.wait() {
                    Ok(out) => {
                        assert_eq!(bad, 0, "bad labels ran to a result");
                        let loss = rt.to_vec::<f32>(&out.loss).unwrap().wait().unwrap()[0] as f64;
                        let mut want = 0.0;
                        for (r, row) in rx.chunks(c).enumerate() {
                            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                            want += lse - row[labels[r] as usize];
                        }
                        want /= n as f64;
                        assert!((loss - want).abs() <= 1e-4 * want.abs().max(1.0), "{loss} vs {want}");
                        CE.count(true);
                    }
                    Err(e) => {
                        assert!(bad == 1 && matches!(e, Error::InvalidOp { .. }), "{e}");
                        CE.count(false);
                    }
                },
                Err(e) => {
                    assert!(validation(&e.error) && bad >= 2, "rejected a valid cross_entropy: {}", e.error);
                    let (x2, l2) = e.into_op().into_inputs();
                    assert!(x2.same_storage(&x) && l2.same_storage(&lt));
                    CE.count(false);
                }
            }
        });
    }

    #[test]
    fn layer_norm(s in shape(3), gd in 0usize..7, eps in prop_oneof![Just(1e-5f32), Just(-1.0), Just(f32::NAN), Just(0.0)], dt in dtype(), seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let (x, rx) = upload(&rt, &s, dt, seed);
            let (g, rg) = upload(&rt, &[gd.max(1)], dt, seed ^ 5);
            let (b, rb) = upload(&rt, &[gd.max(1)], dt, seed ^ 9);
            match rt.submit(ops::layer_norm(&x, &g, &b, eps)) {
                Ok(sub) => {
                    let d = *s.last().unwrap();
                    assert!(gd.max(1) == d && eps >= 0.0 && eps.is_finite());
                    let (y, _, _) = sub.wait().unwrap();
                    let mut want = Vec::new();
                    for row in rx.chunks(d) {
                        let mean = row.iter().sum::<f64>() / d as f64;
                        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
                        let rstd = 1.0 / (var + eps as f64).sqrt();
                        want.extend(row.iter().enumerate().map(|(i, v)| if rstd.is_finite() { (v - mean) * rstd * rg[i] + rb[i] } else { 0.0 }));
                    }
                    let got = download(&rt, &y);
                    // d = 1 with eps 0: 0/0; the op's rows are then not finite.
                    if want.iter().all(|v| v.is_finite()) && d > 1 {
                        assert!(rel_err(&got, &want) <= tol(dt) * 4.0, "{s:?} {dt}");
                    }
                    LN.count(true);
                }
                Err(e) => {
                    assert!(validation(&e.error), "{}", e.error);
                    assert!(s.is_empty() || s.last() != Some(&gd.max(1)) || !(eps >= 0.0 && eps.is_finite()),
                        "rejected a valid layer_norm: {}", e.error);
                    let (x2, g2, b2) = e.into_op().into_inputs();
                    assert!(x2.same_storage(&x) && g2.same_storage(&g) && b2.same_storage(&b));
                    LN.count(false);
                }
            }
        });
    }

    #[test]
    fn embedding(v in 1usize..6, d in 1usize..5, ids in prop::collection::vec(0u32..8, 1..6), i32_ids in any::<bool>(), rank in 1usize..4, seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let dims: Vec<usize> = match rank { 1 => vec![v, d], 2 => vec![v * d], _ => vec![1, v, d] };
            let (table, rt_) = upload(&rt, &dims, DType::F32, seed);
            let it = if i32_ids {
                rt.upload(&ids.iter().map(|&i| i as i32).collect::<Vec<_>>(), [ids.len()]).unwrap()
            } else {
                rt.upload(&ids, [ids.len()]).unwrap()
            };
            match rt.submit(ops::embedding(&table, &it)) {
                Ok(sub) => match sub.wait() {
                    Ok((y, _)) => {
                        assert!(rank == 1 && ids.iter().all(|&i| (i as usize) < v));
                        let want: Vec<f64> = ids.iter().flat_map(|&i| rt_[i as usize * d..][..d].to_vec()).collect();
                        assert_eq!(download(&rt, &y), want);
                        EMB.count(true);
                    }
                    Err(e) => {
                        assert!(matches!(e, Error::InvalidOp { .. }) && ids.iter().any(|&i| i as usize >= v), "{e}");
                        EMB.count(false);
                    }
                },
                Err(e) => {
                    assert!(validation(&e.error), "{}", e.error);
                    assert!(rank != 1, "rejected a valid embedding: {}", e.error);
                    let (t2, i2) = e.into_op().into_inputs();
                    assert!(t2.same_storage(&table) && i2.same_storage(&it));
                    EMB.count(false);
                }
            }
        });
    }

    #[test]
    fn adamw(sizes in prop::collection::vec(1usize..5, 1..4), fault in 0u8..6, t in 1u64..4, seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let up = |n: usize, s: u64| upload(&rt, &[n], DType::F32, s);
            let (ps, rp): (Vec<_>, Vec<_>) = sizes.iter().enumerate().map(|(i, &n)| up(n, seed ^ i as u64)).unzip();
            let (mut gs, rg): (Vec<_>, Vec<_>) = sizes.iter().enumerate().map(|(i, &n)| up(n, seed ^ (100 + i as u64))).unzip();
            let zeros = |rt: &Runtime| -> Vec<Tensor> { sizes.iter().map(|&n| rt.upload(&vec![0f32; n], [n]).unwrap()).collect() };
            let (mut ms, vs) = (zeros(&rt), zeros(&rt));
            let mut cfg = AdamW { lr: 0.01, ..AdamW::default() };
            let mut step = t;
            // fault: 0 none, 1 a gradient missing, 2 a moment of another size, 3 t = 0,
            // 4 a negative lr, 5 beta1 = 1.
            match fault {
                1 => { gs.pop(); }
                2 => ms[0] = rt.upload(&vec![0f32; sizes[0] + 1], [sizes[0] + 1]).unwrap(),
                3 => step = 0,
                4 => cfg.lr = -1.0,
                5 => cfg.beta1 = 1.0,
                _ => {}
            }
            let keep: Vec<Tensor> = ps.clone();
            match rt.submit(ops::adamw(cfg, step, ps, &gs, ms, vs)) {
                Ok(sub) => {
                    assert_eq!(fault, 0, "a bad step was accepted");
                    let out = sub.wait().unwrap();
                    let (b1, b2) = (cfg.beta1 as f64, cfg.beta2 as f64);
                    for (k, p) in rp.iter().enumerate() {
                        let want: Vec<f64> = p.iter().zip(&rg[k]).map(|(&p, &g)| {
                            let p = p * (1.0 - cfg.lr as f64 * cfg.weight_decay as f64);
                            let (m, v) = ((1.0 - b1) * g, (1.0 - b2) * g * g);
                            let mh = m / (1.0 - b1.powi(t as i32));
                            let vh = v / (1.0 - b2.powi(t as i32));
                            p - cfg.lr as f64 * mh / (vh.sqrt() + cfg.eps as f64)
                        }).collect();
                        assert!(rel_err(&download(&rt, &out[k]), &want) <= 1e-5, "param {k}");
                    }
                    ADAM.count(true);
                }
                Err(e) => {
                    assert!(validation(&e.error) && fault != 0, "rejected a valid step: {}", e.error);
                    let (p2, _, _, _) = e.into_op().into_tensors();
                    assert!(p2.iter().zip(&keep).all(|(a, b)| a.same_storage(b)), "parameters given back");
                    ADAM.count(false);
                }
            }
        });
    }

    #[test]
    fn random_init(s in shape(3), lo in prop_oneof![-2.0f32..2.0, Just(f32::NAN), Just(f32::INFINITY)], span in -1.0f32..3.0, int in any::<bool>(), seed in any::<u64>()) {
        guarded(move || {
            let rt = Runtime::cpu(1);
            let dt = if int { DType::U32 } else { DType::F32 };
            let hi = lo + span;
            match rt.submit(ops::uniform(s.clone(), dt, lo, hi, seed, 0)) {
                Ok(sub) => {
                    assert!(!int && lo.is_finite() && hi.is_finite() && lo <= hi);
                    let y = sub.wait().unwrap();
                    let v = rt.to_vec::<f32>(&y).unwrap().wait().unwrap();
                    assert_eq!(v.len(), s.iter().product::<usize>());
                    assert!(v.iter().all(|x| (lo..=hi).contains(x)), "{lo}..{hi}");
                    // The same seed gives the same numbers.
                    let again = rt.submit(ops::uniform(s.clone(), dt, lo, hi, seed, 0)).unwrap().wait().unwrap();
                    assert_eq!(rt.to_vec::<f32>(&again).unwrap().wait().unwrap(), v);
                    RAND.count(true);
                }
                Err(e) => {
                    assert!(validation(&e.error), "{}", e.error);
                    assert!(int || !lo.is_finite() || !hi.is_finite() || lo > hi, "rejected a valid uniform: {}", e.error);
                    RAND.count(false);
                }
            }
        });
    }
}

fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

fn unflat(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        idx[k] = i % dims[k];
        i /= dims[k];
    }
    idx
}

fn flat(idx: &[usize], strides: &[usize]) -> usize {
    idx.iter().zip(strides).map(|(i, s)| i * s).sum()
}
