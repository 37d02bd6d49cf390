//! The embedding layer.

use rtx_runtime::{DType, Error, Result, Runtime, Tensor};

use crate::param::{Module, Param, Parameters};

/// What [`Embedding::backward`] needs from the forward: the ids.
#[derive(Clone, Debug)]
pub struct EmbeddingCtx {
    /// The forward's ids.
    pub ids: Tensor,
    /// The count of out-of-range ids (`[1]` u32; see `rtx_ops::embedding`): 0 unless an
    /// id was out of range on CUDA (on the CPU such an id fails the op instead).
    pub bad: Tensor,
}

/// `y[n.., :] = table[ids[n..], :]`: a `[V, D]` table, ids `u32`/`i32` of any shape, as
/// PyTorch's `nn.Embedding(V, D)`; the backward scatter-adds `dy` into the table's
/// gradient, deterministically (`rtx_ops::embedding_backward`).
#[derive(Debug)]
pub struct Embedding {
    table: Param,
}

impl Embedding {
    /// A `[rows, dim]` table initialized as PyTorch's: normal(0, 1), generated on the
    /// device from `seed` (`rtx_ops::normal`).
    pub fn new(rt: &Runtime, rows: usize, dim: usize, dtype: DType, seed: u64) -> Result<Self> {
        if rows == 0 || dim == 0 {
            let msg = format!("a {rows} x {dim} table: both must be at least 1");
            return Err(Error::invalid_dim("Embedding::new", msg));
        }
        let t = rt.run(rtx_ops::normal([rows, dim], dtype, 0.0, 1.0, seed, 0))?;
        Self::from_table(t)
    }

    /// A layer over an existing `[V, D]` float table.
    pub fn from_table(table: Tensor) -> Result<Self> {
        if table.rank() != 2 {
            let msg = format!("the table must be [V, D], got {}", table.shape());
            return Err(Error::invalid_dim("Embedding::from_table", msg));
        }
        if !table.dtype().is_float() {
            return Err(Error::dtype(
                "Embedding::from_table",
                DType::F32,
                table.dtype(),
            ));
        }
        Ok(Embedding {
            table: Param::new("weight", table),
        })
    }

    /// The table and its gradient.
    pub fn table(&self) -> &Param {
        &self.table
    }
    /// Rows (`V`).
    pub fn rows(&self) -> usize {
        self.table.value().dims()[0]
    }
    /// Row width (`D`).
    pub fn dim(&self) -> usize {
        self.table.value().dims()[1]
    }

    /// The rows named by `ids` (`[N.., D]`) and what the backward needs; submissions
    /// only.
    pub fn forward(&self, rt: &Runtime, ids: &Tensor) -> Result<(Tensor, EmbeddingCtx)> {
        let (y, bad) = rt.run(rtx_ops::embedding(self.table.value(), ids))?;
        let ctx = EmbeddingCtx {
            ids: ids.clone(),
            bad,
        };
        Ok((y, ctx))
    }

    /// Given `dy` (`[N.., D]`), stores the table's gradient; submissions only. The ids
    /// have no gradient.
    pub fn backward(&mut self, rt: &Runtime, dy: &Tensor, ctx: &EmbeddingCtx) -> Result<()> {
        let (dt, _bad) = rt.run(rtx_ops::embedding_backward(dy, &ctx.ids, self.rows()))?;
        self.table.set_grad(dt)
    }
}

impl Module for Embedding {
    /// The table.
    fn parameters(&mut self) -> Parameters<'_> {
        Parameters::new(vec![&mut self.table])
    }
}
