//! Graph states (`Capture::state` / `Capture::update` / `Graph::state`) and the
//! capture-safe training ops: an AdamW step captured with its parameters, moments and a
//! device step counter as states equals the eager steps over many launches (bit-equal:
//! the same kernels on the same data; the step number read on the device equals the
//! host's), the layer-norm backward and the gradient norm (per-call scratch from the
//! stream's persistent workspace) replay like eager, and misuse of states is a typed
//! error.

mod common;

use common::{check, f64s, rand_vec, rng};
use rtx_ops as ops;
use rtx_ops::optim::{adamw, AdamW};
use rtx_runtime::{BackendKind, DType, Error, Runtime, Tensor};

const N: usize = 300;

fn down(rt: &Runtime, t: &Tensor) -> Vec<f32> {
    rt.to_vec::<f32>(t).unwrap().wait().unwrap()
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `cuda` on the CUDA backend, else 0: how many states a capture updates in place
/// (`Graph::in_place_states`; the CPU backend's launches never copy a state).
fn in_place(rt: &Runtime, cuda: usize) -> usize {
    if rt.backend() == BackendKind::Cuda {
        cuda
    } else {
        0
    }
}

/// The initial values of a captured AdamW step's states: a random parameter `p0`
/// (uploaded as `p`), zero moments, the step counter at 0, and a zero gradient as the
/// bound input's example.
struct Inits {
    p0: Vec<f32>,
    p: Tensor,
    m: Tensor,
    v: Tensor,
    t: Tensor,
    g0: Tensor,
}

impl Inits {
    fn new(rt: &Runtime, g: &mut rand::rngs::StdRng) -> Self {
        let p0: Vec<f32> = rand_vec(g, N, -1.0, 1.0);
        let zeros = vec![0f32; N];
        Inits {
            p: rt.upload(&p0, [N]).unwrap(),
            m: rt.upload(&zeros, [N]).unwrap(),
            v: rt.upload(&zeros, [N]).unwrap(),
            t: rt.upload(&[0.0f32], [1]).unwrap(),
            g0: rt.upload(&zeros, [N]).unwrap(),
            p0,
        }
    }
}

fn cfg() -> AdamW {
    AdamW {
        lr: 0.01,
        weight_decay: 0.1,
        ..AdamW::default()
    }
}

backend_test!(
    adamw_reads_its_step_from_the_device_like_the_host_scalar,
    |rt, label| {
        let (seed, mut g) = rng();
        let p0: Vec<f32> = rand_vec(&mut g, N, -1.0, 1.0);
        let (mut pa, mut pb) = (rt.upload(&p0, [N]).unwrap(), rt.upload(&p0, [N]).unwrap());
        let zeros = vec![0f32; N];
        let (mut ma, mut va) = (
            rt.upload(&zeros, [N]).unwrap(),
            rt.upload(&zeros, [N]).unwrap(),
        );
        let (mut mb, mut vb) = (
            rt.upload(&zeros, [N]).unwrap(),
            rt.upload(&zeros, [N]).unwrap(),
        );
        for t in 1..=5u64 {
            let gr = rt
                .upload(&rand_vec::<f32>(&mut g, N, -1.0, 1.0), [N])
                .unwrap();
            let a = rt
                .submit(adamw(
                    cfg(),
                    t,
                    vec![pa],
                    std::slice::from_ref(&gr),
                    vec![ma],
                    vec![va],
                ))
                .unwrap()
                .wait()
                .unwrap();
            let tt = rt.upload(&[t as f32], [1]).unwrap();
            // A wrong host step: the device's must win.
            let step = adamw(cfg(), 1000, vec![pb], &[gr], vec![mb], vec![vb]).step_count(&tt);
            let b = rt.submit(step).unwrap().wait().unwrap();
            assert!(
                bits_eq(&down(rt, &a[0]), &down(rt, &b[0])),
                "{label}: step {t} differs (seed {seed})"
            );
            [pa, ma, va] = [a[0].clone(), a[1].clone(), a[2].clone()];
            [pb, mb, vb] = [b[0].clone(), b[1].clone(), b[2].clone()];
        }
        // A bad step tensor is refused at submit.
        let two = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
        let gr = rt.upload(&zeros, [N]).unwrap();
        let step = adamw(cfg(), 1, vec![pb], &[gr], vec![mb], vec![vb]).step_count(&two);
        let Err(e) = rt.submit(step) else {
            panic!("{label}: a two-element step count is accepted");
        };
        assert!(
            matches!(e.error, Error::InvalidOp { .. }),
            "{label}: {}",
            e.error
        );
    }
);

backend_test!(
    a_captured_adamw_step_with_states_equals_eager_steps,
    |rt, label| {
        let (seed, mut g) = rng();
        let Inits {
            p0,
            p: p_init,
            m: m_init,
            v: v_init,
            t: t_init,
            g0,
        } = Inits::new(rt, &mut g);
        let mut graph = rt
            .capture(|c| {
                let gr = c.input(&g0)?;
                let p = c.state(&p_init)?;
                let m = c.state(&m_init)?;
                let v = c.state(&v_init)?;
                let t = c.state(&t_init)?;
                let t1 = c.submit(ops::add_scalar(&t, 1.0))?;
                let step = adamw(
                    cfg(),
                    1,
                    vec![p.clone()],
                    &[gr],
                    vec![m.clone()],
                    vec![v.clone()],
                )
                .step_count(&t1);
                let out = c.submit(step).map_err(|e| e.error)?;
                c.update(&p, &out[0])?;
                c.update(&m, &out[1])?;
                c.update(&v, &out[2])?;
                c.update(&t, &t1)?;
                c.output(&out[0])?;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{label}: capture failed: {e}"));
        assert_eq!(graph.states().len(), 4);
        // p, m and v are donated to the step, which writes them in place; the counter's
        // update (`add_scalar`, not in place) is copied.
        assert_eq!(graph.in_place_states(), in_place(rt, 3), "{label}");
        // The capture's warm-up changed no state.
        assert!(bits_eq(&down(rt, &graph.state(0).unwrap()), &p0), "{label}");
        let mut p = rt.upload(&p0, [N]).unwrap();
        let (mut m, mut v) = (m_init.clone(), v_init.clone());
        let mut p_ref = f64s(&p0);
        for t in 1..=12u64 {
            let gh: Vec<f32> = rand_vec(&mut g, N, -1.0, 1.0);
            let gr = rt.upload(&gh, [N]).unwrap();
            let got = graph.launch(&[&gr]).unwrap().to_vec::<f32>(0).unwrap();
            let out = rt
                .submit(adamw(cfg(), t, vec![p], &[gr], vec![m], vec![v]))
                .unwrap()
                .wait()
                .unwrap();
            [p, m, v] = [out[0].clone(), out[1].clone(), out[2].clone()];
            let want = down(rt, &p);
            assert!(
                bits_eq(&got, &want),
                "{label}: launch {t} differs from eager (seed {seed})"
            );
            p_ref = want.iter().map(|&x| x as f64).collect();
        }
        // The states hold the last launch's values; the initial tensors were never written.
        let p_state = down(rt, &graph.state(0).unwrap());
        check::<f32>(&f64s(&p_state), &p_ref, label, seed);
        assert_eq!(down(rt, &graph.state(3).unwrap()), [12.0], "{label}");
        assert_eq!(down(rt, &t_init), [0.0], "{label}");
        assert!(bits_eq(&down(rt, &p_init), &p0), "{label}");
    }
);

backend_test!(
    a_state_read_after_its_update_keeps_its_old_value,
    |rt, label| {
        // The step donates p, but an op after it reads p: p must not be written in place
        // (that reader sees the launch's old value), m and v are (the counter's
        // `add_scalar` does not donate: copied).
        let (seed, mut g) = rng();
        let Inits {
            p0,
            p: p_init,
            m: m_init,
            v: v_init,
            t: t_init,
            g0,
        } = Inits::new(rt, &mut g);
        let mut graph = rt
            .capture(|c| {
                let gr = c.input(&g0)?;
                let p = c.state(&p_init)?;
                let m = c.state(&m_init)?;
                let v = c.state(&v_init)?;
                let t = c.state(&t_init)?;
                let s0 = c.streams()[0];
                let t1 = c.submit_on(s0, ops::add_scalar(&t, 1.0))?;
                let step = adamw(
                    cfg(),
                    1,
                    vec![p.clone()],
                    &[gr],
                    vec![m.clone()],
                    vec![v.clone()],
                )
                .step_count(&t1);
                let out = c.submit_on(s0, step).map_err(|e| e.error)?;
                let old = c.submit_on(s0, ops::mul_scalar(&p, 1.0))?;
                c.update(&p, &out[0])?;
                c.update(&m, &out[1])?;
                c.update(&v, &out[2])?;
                c.update(&t, &t1)?;
                c.output(&old)?;
                c.output(&out[0])?;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{label}: capture failed: {e}"));
        assert_eq!(graph.in_place_states(), in_place(rt, 2), "{label}");
        let mut p = rt.upload(&p0, [N]).unwrap();
        let (mut m, mut v) = (m_init.clone(), v_init.clone());
        let mut prev = p0.clone();
        for t in 1..=8u64 {
            let gr = rt
                .upload(&rand_vec::<f32>(&mut g, N, -1.0, 1.0), [N])
                .unwrap();
            let mut l = graph.launch(&[&gr]).unwrap();
            let (old, new) = (l.to_vec::<f32>(0).unwrap(), l.to_vec::<f32>(1).unwrap());
            drop(l);
            assert!(
                bits_eq(&old, &prev),
                "{label}: launch {t}: a reader after the step saw the new value (seed {seed})"
            );
            let out = rt
                .submit(adamw(cfg(), t, vec![p], &[gr], vec![m], vec![v]))
                .unwrap()
                .wait()
                .unwrap();
            [p, m, v] = [out[0].clone(), out[1].clone(), out[2].clone()];
            assert!(
                bits_eq(&new, &down(rt, &p)),
                "{label}: launch {t} differs from eager (seed {seed})"
            );
            prev = new;
        }
    }
);

backend_test!(
    a_mixed_precision_step_updates_every_state_in_place,
    |rt, label| {
        // The sweep's captured step in small: a bf16 parameter read before the step, its
        // f32 master, AdamW's moments and a device step counter, all states; the step
        // writes the bf16 copy into the parameter's buffer (`copy_into`) and the counter
        // is advanced in place: no state is copied at a launch's end on CUDA.
        let (seed, mut g) = rng();
        let p0: Vec<f32> = rand_vec(&mut g, N, -1.0, 1.0);
        let zeros = vec![0f32; N];
        let master_init = rt.upload(&p0, [N]).unwrap();
        let w_init = rt.run(ops::cast(&master_init, DType::BF16)).unwrap();
        let m_init = rt.upload(&zeros, [N]).unwrap();
        let v_init = rt.upload(&zeros, [N]).unwrap();
        let t_init = rt.upload(&[0.0f32], [1]).unwrap();
        let g0 = rt.upload(&zeros, [N]).unwrap();
        let mut graph = rt
            .capture(|c| {
                let gr = c.input(&g0)?;
                let w = c.state(&w_init)?;
                let master = c.state(&master_init)?;
                let m = c.state(&m_init)?;
                let v = c.state(&v_init)?;
                let t = c.state(&t_init)?;
                // Every reader of the states on one stream.
                let s0 = c.streams()[0];
                let fwd = c.submit_on(s0, ops::cast(&w, DType::F32))?;
                let t1 = c.submit_on(s0, ops::add_scalar_(t.clone(), 1.0))?;
                let step = adamw(
                    cfg(),
                    1,
                    vec![master.clone()],
                    &[gr],
                    vec![m.clone()],
                    vec![v.clone()],
                )
                .step_count(&t1)
                .with_copy(DType::BF16)
                .copy_into(vec![w.clone()]);
                let out = c.submit_on(s0, step).map_err(|e| e.error)?;
                c.update(&master, &out[0])?;
                c.update(&m, &out[1])?;
                c.update(&v, &out[2])?;
                c.update(&w, &out[3])?;
                c.update(&t, &t1)?;
                c.output(&fwd)?;
                c.output(&out[3])?;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{label}: capture failed: {e}"));
        assert_eq!(graph.in_place_states(), in_place(rt, 5), "{label}");
        let mut master = rt.upload(&p0, [N]).unwrap();
        let (mut m, mut v) = (m_init.clone(), v_init.clone());
        let mut w: Vec<rtx_runtime::bf16> = rt.to_vec(&w_init).unwrap().wait().unwrap();
        for t in 1..=8u64 {
            let gr = rt
                .upload(&rand_vec::<f32>(&mut g, N, -1.0, 1.0), [N])
                .unwrap();
            let mut l = graph.launch(&[&gr]).unwrap();
            let fwd = l.to_vec::<f32>(0).unwrap();
            let w_got = l.to_vec::<rtx_runtime::bf16>(1).unwrap();
            drop(l);
            let want_fwd: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
            assert!(
                bits_eq(&fwd, &want_fwd),
                "{label}: launch {t} read another parameter than the last launch's (seed {seed})"
            );
            let step =
                adamw(cfg(), t, vec![master], &[gr], vec![m], vec![v]).with_copy(DType::BF16);
            let out = rt.submit(step).unwrap().wait().unwrap();
            [master, m, v] = [out[0].clone(), out[1].clone(), out[2].clone()];
            w = rt.to_vec(&out[3]).unwrap().wait().unwrap();
            assert_eq!(
                w_got, w,
                "{label}: launch {t} differs from eager (seed {seed})"
            );
        }
        assert_eq!(down(rt, &graph.state(4).unwrap()), [8.0], "{label}");
    }
);

backend_test!(
    layer_norm_backward_and_grad_norm_replay_like_eager,
    |rt, label| {
        let (seed, mut g) = rng();
        let (rows, d) = (64, 96);
        let x0 = rt
            .upload(&rand_vec::<f32>(&mut g, rows * d, -1.0, 1.0), [rows, d])
            .unwrap();
        let gamma = rt
            .upload(&rand_vec::<f32>(&mut g, d, 0.5, 1.5), [d])
            .unwrap();
        let beta = rt
            .upload(&rand_vec::<f32>(&mut g, d, -0.5, 0.5), [d])
            .unwrap();
        let eager = |x: &Tensor, dy: &Tensor| -> Vec<Vec<f32>> {
            let f = rt.run(ops::layer_norm(x, &gamma, &beta, 1e-5)).unwrap();
            let b = rt
                .run(ops::layer_norm_backward(dy, x, &f.1, &f.2, &gamma))
                .unwrap();
            let n = rt.run(ops::grad_norm(&[b.1.clone(), b.2.clone()])).unwrap();
            vec![down(rt, &b.0), down(rt, &b.1), down(rt, &n)]
        };
        let mut graph = rt
            .capture(|c| {
                let x = c.input(&x0)?;
                let dy = c.input(&x0)?;
                let f = c.submit(ops::layer_norm(&x, &gamma, &beta, 1e-5))?;
                let b = c.submit(ops::layer_norm_backward(&dy, &x, &f.1, &f.2, &gamma))?;
                let n = c.submit(ops::grad_norm(&[b.1.clone(), b.2.clone()]))?;
                c.output(&b.0)?;
                c.output(&b.1)?;
                c.output(&n)?;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{label}: capture failed: {e}"));
        for launch in 0..6 {
            let x = rt
                .upload(&rand_vec::<f32>(&mut g, rows * d, -1.0, 1.0), [rows, d])
                .unwrap();
            let dy = rt
                .upload(&rand_vec::<f32>(&mut g, rows * d, -1.0, 1.0), [rows, d])
                .unwrap();
            let mut l = graph.launch(&[&x, &dy]).unwrap();
            let got: Vec<Vec<f32>> = (0..3).map(|i| l.to_vec::<f32>(i).unwrap()).collect();
            drop(l);
            let want = eager(&x, &dy);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    bits_eq(a, b),
                    "{label}: launch {launch}, output {i} differs from eager (seed {seed})"
                );
            }
        }
    }
);

backend_test!(misused_states_are_typed_errors, |rt, label| {
    let a = rt.upload(&[1.0f32, 2.0], [2]).unwrap();
    let three = rt.upload(&[1.0f32, 2.0, 3.0], [3]).unwrap();
    let invalid = |r: rtx_runtime::Result<rtx_runtime::Graph>, what: &str| match r {
        Err(Error::InvalidOp { .. }) => {}
        Err(e) => panic!("{label}: {what}: wrong error {e}"),
        Ok(_) => panic!("{label}: {what}: accepted"),
    };
    // A state no op reads or updates.
    invalid(
        rt.capture(|c| {
            c.state(&a)?;
            let y = c.submit(ops::add_scalar(&a, 1.0))?;
            c.output(&y)?;
            Ok(())
        }),
        "an unused state",
    );
    // An update of another shape, of a non-state, from a non-op tensor, twice.
    invalid(
        rt.capture(|c| {
            let s = c.state(&a)?;
            c.submit(ops::add_scalar(&s, 1.0))?;
            let z = c.submit(ops::add_scalar(&three, 1.0))?;
            c.update(&s, &z)
        }),
        "an update of another shape",
    );
    invalid(
        rt.capture(|c| {
            let s = c.state(&a)?;
            let y = c.submit(ops::add_scalar(&s, 1.0))?;
            c.update(&y, &y)
        }),
        "an update of a non-state",
    );
    invalid(
        rt.capture(|c| {
            let s = c.state(&a)?;
            c.submit(ops::add_scalar(&s, 1.0))?;
            c.update(&s, &a)
        }),
        "an update from an eager tensor",
    );
    invalid(
        rt.capture(|c| {
            let s = c.state(&a)?;
            let y = c.submit(ops::add_scalar(&s, 1.0))?;
            c.update(&s, &y)?;
            c.update(&s, &y)
        }),
        "a second update",
    );
    // A state read on two streams.
    let streams = rt.compute_streams(rt.device());
    if streams.len() > 1 {
        invalid(
            rt.capture(|c| {
                let s = c.state(&a)?;
                c.submit_on(streams[0], ops::add_scalar(&s, 1.0))?;
                c.submit_on(streams[1], ops::add_scalar(&s, 2.0))?;
                Ok(())
            }),
            "a state read on two streams",
        );
    }
    // The runtime is still usable.
    assert_eq!(
        down(rt, &rt.run(ops::add_scalar(&a, 1.0)).unwrap()),
        [2.0, 3.0]
    );
});
