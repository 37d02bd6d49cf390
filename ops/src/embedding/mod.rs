//! Embedding: [`embedding`] gathers rows of a table by index; [`embedding_backward`]
//! scatter-adds the output gradient back into a table-shaped gradient, deterministically.
//!
//! - `cpu.rs`: the CPU kernels (the reference).
//! - `cuda.rs`: the launches of `kernels/cuda/embedding.cu`.
//! - here: the public constructors, validation and dispatch.
//!
//! Ids are `u32` or `i32` tensors of any shape `[N...]`; rows are `[D]` of the table's
//! float dtype. Ids live in device memory, so their range cannot be checked at submit:
//! on the CPU an out-of-range id fails the op with [`Error::InvalidOp`]; on CUDA it is
//! never used as an address: its output row is zeros (forward) or it is left out of
//! the sum (backward), and the op's second output, a `[1]` `u32` tensor, counts such ids
//! (0 when all are valid; always 0 on the CPU, which reports an error instead).
//!
//! # Determinism of the backward
//!
//! Row `v` of the gradient is the sum of the `dy` rows whose id is `v`, added in
//! increasing position: on CUDA through a stable counting sort of the positions by id
//! (count, scan, stable rank in chunks of 256 in one block, then one thread per
//! gradient element sums its bucket in order), so the result is bit-identical from run
//! to run (no floating-point atomics).

pub mod cpu;
mod cuda;

use rtx_runtime::{
    BackendCx, Buffer, Cost, DType, Element, Error, ExecCx, Op, Plan, PlanCx, Result, Shape,
    Tensor, TensorSpec,
};

use crate::cpu_util::Float;
use crate::kernels::{check_float, cpu_out, float_dispatch};

/// Most ids, and most rows, the kernels index (`u32` positions, one value reserved).
const MAX_INDEX: usize = u32::MAX as usize - 1;

/// An embedding lookup, built by [`embedding`].
pub struct Embedding {
    table: Tensor,
    ids: Tensor,
}

/// An embedding gradient, built by [`embedding_backward`].
pub struct EmbeddingBackward {
    dy: Tensor,
    ids: Tensor,
    rows: usize,
}

impl Embedding {
    /// Gives the inputs back: (table, ids).
    pub fn into_inputs(self) -> (Tensor, Tensor) {
        (self.table, self.ids)
    }
}

impl EmbeddingBackward {
    /// Gives the inputs back: (dy, ids).
    pub fn into_inputs(self) -> (Tensor, Tensor) {
        (self.dy, self.ids)
    }
}

/// The rows of `table` (`[V, D]`, float) named by `ids` (`u32`/`i32`, shape `[N...]`):
/// `y[n..., :] = table[ids[n...], :]`, shape `[N..., D]`. Outputs `(y, bad)`: `bad` is
/// the `[1]` `u32` count of out-of-range ids (see the module docs).
///
/// # Errors (at submit)
///
/// [`Error::InvalidDim`] unless `table` has rank 2, [`Error::DTypeMismatch`] for a
/// non-float table or non-integer ids, [`Error::InvalidOp`] for sizes beyond 2^32 - 2.
/// On the CPU, an out-of-range id fails the op with [`Error::InvalidOp`].
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let table = rt.upload(&[0.0f32, 1.0, 10.0, 11.0, 20.0, 21.0], [3, 2])?;
/// let ids = rt.upload(&[2u32, 0], [2])?;
/// let (y, bad) = rt.submit(rtx_ops::embedding::embedding(&table, &ids))?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&y)?.wait()?, vec![20.0, 21.0, 0.0, 1.0]);
/// assert_eq!(rt.to_vec::<u32>(&bad)?.wait()?, vec![0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn embedding(table: &Tensor, ids: &Tensor) -> Embedding {
    Embedding {
        table: table.clone(),
        ids: ids.clone(),
    }
}

/// The gradient of [`embedding`] with respect to a `[rows, D]` table: `dtable[v, :] =
/// sum of dy[n..., :] over the positions with ids[n...] == v` (rows no id names are 0),
/// summed in increasing position (deterministic). `dy` is `[N..., D]`, `ids` `[N...]`.
/// Outputs `(dtable, bad)` as [`embedding`].
///
/// # Errors (at submit)
///
/// [`Error::ShapeMismatch`] unless `dy` is `ids`' shape plus one dim,
/// [`Error::DTypeMismatch`] for a non-float `dy` or non-integer ids,
/// [`Error::InvalidOp`] for `rows == 0` or sizes beyond 2^32 - 2. On the CPU, an
/// out-of-range id fails the op with [`Error::InvalidOp`].
///
/// # Examples
///
/// ```
/// use rtx_runtime::Runtime;
/// let rt = Runtime::cpu(1);
/// let dy = rt.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2])?;
/// let ids = rt.upload(&[1i32, 0, 1], [3])?;
/// let op = rtx_ops::embedding::embedding_backward(&dy, &ids, 3);
/// let (dt, _) = rt.submit(op)?.wait()?;
/// assert_eq!(rt.to_vec::<f32>(&dt)?.wait()?, vec![3.0, 4.0, 6.0, 8.0, 0.0, 0.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn embedding_backward(dy: &Tensor, ids: &Tensor, rows: usize) -> EmbeddingBackward {
    EmbeddingBackward {
        dy: dy.clone(),
        ids: ids.clone(),
        rows,
    }
}

fn check_ids(name: &str, ids: &Tensor) -> Result<()> {
    if !matches!(ids.dtype(), DType::U32 | DType::I32) {
        return Err(Error::dtype(name, DType::U32, ids.dtype()));
    }
    if ids.numel() > MAX_INDEX {
        return Err(Error::invalid(
            name,
            format!("{} ids: at most {MAX_INDEX}", ids.numel()),
        ));
    }
    Ok(())
}

/// The ids widened to i64 (host).
fn ids_i64(ids: &Buffer) -> Result<Vec<i64>> {
    Ok(match ids.dtype() {
        DType::I32 => ids.cpu::<i32>()?.iter().map(|&v| v as i64).collect(),
        _ => ids.cpu::<u32>()?.iter().map(|&v| v as i64).collect(),
    })
}

fn bad_error(name: &str, ids: &[i64], rows: usize) -> Result<()> {
    match cpu::first_bad(ids, rows) {
        Some((i, id)) => Err(Error::invalid(
            name,
            format!("id {id} at position {i} is out of range for {rows} rows"),
        )),
        None => Ok(()),
    }
}

impl Op for Embedding {
    type Output = (Tensor, Tensor);
    fn name(&self) -> &'static str {
        "embedding"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.table, &self.ids]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let name = self.name();
        if self.table.rank() != 2 {
            return Err(Error::invalid_dim(
                name,
                format!("table must be [V, D], got {}", self.table.shape()),
            ));
        }
        check_float(name, self.table.dtype())?;
        check_ids(name, &self.ids)?;
        let (v, d) = (self.table.dims()[0], self.table.dims()[1]);
        if v > MAX_INDEX {
            return Err(Error::invalid(
                name,
                format!("{v} rows: at most {MAX_INDEX}"),
            ));
        }
        let mut dims = self.ids.dims().to_vec();
        dims.push(d);
        let shape = Shape::new(dims);
        let n = shape
            .checked_numel()
            .ok_or_else(|| Error::invalid(name, format!("output {shape} overflows usize")))?;
        Ok(Plan {
            outputs: vec![
                TensorSpec::new(shape, self.table.dtype()),
                TensorSpec::new([1], DType::U32),
            ],
            cost: Cost {
                flops: 0.0,
                bytes: (2 * n * self.table.dtype().size() + 4 * self.ids.numel()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let name = self.name();
        let (rows, d) = (self.table.dims()[0], self.table.dims()[1]);
        let table = cx.input(&self.table)?;
        let ids = cx.input(&self.ids)?;
        let dtype = self.table.dtype();
        let (y, bad) = match cx.backend() {
            BackendCx::Cpu => {
                let ids = ids_i64(&ids)?;
                bad_error(name, &ids, rows)?;
                let y = float_dispatch!(dtype, name, |T| {
                    let mut y = cpu_out::<T>(ids.len() * d);
                    cpu::gather(table.cpu::<T>()?, &ids, d, &mut y);
                    Ok(Buffer::from_vec(y))
                })?;
                (y, Buffer::from_vec(vec![0u32]))
            }
            BackendCx::Cuda(scx) => cuda::forward(scx, name, dtype, &table, &ids, rows, d)?,
        };
        cx.set_output(0, y)?;
        cx.set_output(1, bad)
    }
}

impl Op for EmbeddingBackward {
    type Output = (Tensor, Tensor);
    fn name(&self) -> &'static str {
        "embedding_backward"
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.dy, &self.ids]
    }
    fn plan(&self, _cx: &PlanCx) -> Result<Plan> {
        let name = self.name();
        check_float(name, self.dy.dtype())?;
        check_ids(name, &self.ids)?;
        let (dd, id) = (self.dy.dims(), self.ids.dims());
        if dd.len() != id.len() + 1 || dd[..id.len()] != *id {
            let what = "dy must be the ids' shape plus a last dim D";
            return Err(Error::shape(name, self.dy.shape(), self.ids.shape(), what));
        }
        if self.rows == 0 || self.rows > MAX_INDEX {
            return Err(Error::invalid(
                name,
                format!("{} rows: want 1..={MAX_INDEX}", self.rows),
            ));
        }
        let d = dd[dd.len() - 1];
        let n = self
            .rows
            .checked_mul(d)
            .ok_or_else(|| Error::invalid(name, "rows * D overflows usize"))?;
        Ok(Plan {
            outputs: vec![
                TensorSpec::new([self.rows, d], self.dy.dtype()),
                TensorSpec::new([1], DType::U32),
            ],
            cost: Cost {
                flops: self.dy.numel() as f64,
                bytes: ((self.dy.numel() + n) * self.dy.dtype().size()) as f64,
            },
        })
    }
    fn run(&mut self, cx: &mut ExecCx<'_>) -> Result<()> {
        let name = self.name();
        let rows = self.rows;
        let d = *self.dy.dims().last().expect("rank >= 1");
        let dy = cx.input(&self.dy)?;
        let ids = cx.input(&self.ids)?;
        let dtype = self.dy.dtype();
        let (dt, bad) = match cx.backend() {
            BackendCx::Cpu => {
                let ids = ids_i64(&ids)?;
                bad_error(name, &ids, rows)?;
                let dt =
                    float_dispatch!(dtype, name, |T| Ok(scatter_cpu::<T>(&dy, &ids, rows, d)?))?;
                (dt, Buffer::from_vec(vec![0u32]))
            }
            BackendCx::Cuda(scx) => cuda::backward(scx, name, dtype, &dy, &ids, rows, d)?,
        };
        cx.set_output(0, dt)?;
        cx.set_output(1, bad)
    }
}

fn scatter_cpu<T: Float + Element>(
    dy: &Buffer,
    ids: &[i64],
    rows: usize,
    d: usize,
) -> Result<Buffer> {
    let mut out = cpu_out::<T>(rows * d);
    cpu::scatter_add(dy.cpu::<T>()?, ids, d, &mut out);
    Ok(Buffer::from_vec(out))
}
