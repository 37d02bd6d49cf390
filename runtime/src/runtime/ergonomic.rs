//! The short forms a user of candle or PyTorch expects:
//!
//! - [`Runtime::run`]: submit an op and get its output handles at once (no
//!   `submit(op)?.outputs().unwrap().clone()`);
//! - [`Tensor::to_vec`]: a blocking download without passing the runtime around (each
//!   tensor remembers its runtime's id; a registry of weak handles finds the runtime);
//! - [`Tensor::values`]: a `Display`/`Debug` view that downloads and prints the values,
//!   on request only (plain `{:?}` of a tensor never blocks and never copies).

use std::fmt;

use crate::buffer::Element;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::tensor::Tensor;

use super::Runtime;

#[cfg(not(loom))]
mod registry {
    use std::sync::{Mutex, Weak};

    use super::super::Inner;
    use super::Runtime;
    use crate::sync::Arc;

    /// Every live runtime by id, as weak handles (a tensor must not keep its runtime
    /// alive). Dead entries are dropped at each registration.
    static RUNTIMES: Mutex<Vec<(u64, Weak<Inner>)>> = Mutex::new(Vec::new());

    pub(in crate::runtime) fn register(rt: &Runtime) {
        let mut v = RUNTIMES.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|(_, w)| w.strong_count() > 0);
        v.push((rt.inner.id, Arc::downgrade(&rt.inner)));
    }

    pub(super) fn lookup(id: u64) -> Option<Runtime> {
        let v = RUNTIMES.lock().unwrap_or_else(|e| e.into_inner());
        v.iter()
            .find(|(i, _)| *i == id)
            .and_then(|(_, w)| w.upgrade())
            .map(|inner| Runtime {
                inner,
                pin: None,
                recording: None,
            })
    }
}

#[cfg(loom)]
mod registry {
    use super::Runtime;
    pub(in crate::runtime) fn register(_rt: &Runtime) {}
    pub(super) fn lookup(_id: u64) -> Option<Runtime> {
        None
    }
}

pub(super) use registry::register;

impl Runtime {
    /// Submits `op` and returns its output handles at once: the one-call form for
    /// chaining ops (`let y = rt.run(relu(&x))?;`).
    ///
    /// It does not wait: the op runs asynchronously and `y` can go straight into the
    /// next op, which waits for it on the device. A rejected submission (bad shapes,
    /// dtypes, a closed runtime) is its typed error here, with the op dropped (use
    /// [`Runtime::submit`] to get the op back); an error at run time reaches the ops that
    /// read these outputs and whoever downloads them (or `.wait()`s a submission).
    ///
    /// # Examples
    ///
    /// ```
    /// use rtx_runtime::Runtime;
    /// # use rtx_runtime::{Op, Plan, PlanCx, ExecCx, Buffer, Result, Tensor};
    /// # struct Double(Tensor);
    /// # impl Op for Double {
    /// #     type Output = Tensor;
    /// #     fn name(&self) -> &'static str { "double" }
    /// #     fn inputs(&self) -> Vec<&Tensor> { vec![&self.0] }
    /// #     fn plan(&self, _: &PlanCx) -> Result<Plan> {
    /// #         Ok(Plan::like(&self.0))
    /// #     }
    /// #     fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
    /// #         let v: Vec<f32> = cx.input(&self.0)?.cpu::<f32>()?.iter().map(|x| 2.0 * x).collect();
    /// #         cx.set_output(0, Buffer::from_vec(v))
    /// #     }
    /// # }
    /// let rt = Runtime::cpu(1);
    /// let x = rt.upload(&[1.0f32, 2.0], [2])?;
    /// let y = rt.run(Double(x))?; // a Tensor, at once
    /// let z = rt.run(Double(y))?;
    /// assert_eq!(z.to_vec::<f32>()?, [4.0, 8.0]);
    /// # Ok::<(), rtx_runtime::Error>(())
    /// ```
    pub fn run<O: Op>(&self, op: O) -> Result<O::Output> {
        let name = op.name();
        let sub = self.submit(op).map_err(|e| e.error)?;
        sub.into_outputs()
            .ok_or_else(|| Error::invalid(name, "the op has no output handles"))
    }
}

impl Tensor {
    /// The runtime this tensor belongs to, while it is alive (`None` once every handle
    /// to it has been dropped).
    pub fn runtime(&self) -> Option<Runtime> {
        registry::lookup(self.storage().runtime)
    }

    /// Copies the tensor to the host, blocking until its producer has finished: the
    /// short form of `rt.to_vec::<T>(&t)?.wait()` for a tensor whose runtime is still
    /// alive. `T` must be the tensor's element type ([`Error::DTypeMismatch`] otherwise).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.owner("to_vec")?.to_vec::<T>(self)?.wait()
    }

    /// The values as `f64` (any dtype), blocking as [`Tensor::to_vec`].
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let rt = self.owner("to_f64_vec")?;
        fn get<T: Element>(rt: &Runtime, t: &Tensor) -> Result<Vec<f64>> {
            Ok(rt
                .to_vec::<T>(t)?
                .wait()?
                .into_iter()
                .map(|v| v.to_f64())
                .collect())
        }
        match self.dtype() {
            DType::F32 => get::<f32>(&rt, self),
            DType::F16 => get::<half::f16>(&rt, self),
            DType::BF16 => get::<half::bf16>(&rt, self),
            DType::I32 => get::<i32>(&rt, self),
            DType::U32 => get::<u32>(&rt, self),
        }
    }

    /// A view that prints the values (downloading them, so it blocks until they are
    /// computed) after the usual description, PyTorch style, eliding the middle of long
    /// dims: `println!("{}", t.values())` or `{:?}`.
    ///
    /// ```
    /// let rt = rtx_runtime::Runtime::cpu(1);
    /// let t = rt.upload(&[1.0f32, 2.5, -3.0, 4.0], [2, 2])?;
    /// assert_eq!(format!("{}", t.values()), "[[1, 2.5], [-3, 4]]");
    /// # Ok::<(), rtx_runtime::Error>(())
    /// ```
    pub fn values(&self) -> Values<'_> {
        Values(self)
    }

    fn owner(&self, what: &str) -> Result<Runtime> {
        self.runtime().ok_or_else(|| {
            Error::invalid(
                what,
                format!("the runtime of {self:?} has shut down (or is not reachable)"),
            )
        })
    }
}

/// The values of a tensor for printing; see [`Tensor::values`]. `Display` prints the
/// nested values; `Debug` prints the tensor's description followed by them.
pub struct Values<'a>(&'a Tensor);

/// Dims longer than this print their first and last [`EDGE`] entries only.
const SUMMARIZE: usize = 8;
const EDGE: usize = 3;

impl Values<'_> {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match self.0.to_f64_vec() {
            Ok(v) => v,
            Err(e) => return write!(f, "<values unavailable: {e}>"),
        };
        write_nested(f, &v, self.0.dims())
    }
}

fn write_nested(f: &mut fmt::Formatter<'_>, v: &[f64], dims: &[usize]) -> fmt::Result {
    let Some((&n, rest)) = dims.split_first() else {
        return write!(f, "{}", v.first().copied().unwrap_or(f64::NAN));
    };
    let inner: usize = rest.iter().product();
    let shown: Vec<Option<usize>> = if n > SUMMARIZE {
        (0..EDGE)
            .map(Some)
            .chain(std::iter::once(None))
            .chain((n - EDGE..n).map(Some))
            .collect()
    } else {
        (0..n).map(Some).collect()
    };
    write!(f, "[")?;
    for (k, i) in shown.iter().enumerate() {
        if k > 0 {
            write!(f, ", ")?;
        }
        match i {
            None => write!(f, "...")?,
            Some(i) if rest.is_empty() => write!(f, "{}", v[*i])?,
            Some(i) => write_nested(f, &v[i * inner..(i + 1) * inner], rest)?,
        }
    }
    write!(f, "]")
}

impl fmt::Display for Values<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f)
    }
}

impl fmt::Debug for Values<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ", self.0)?;
        self.write(f)
    }
}
