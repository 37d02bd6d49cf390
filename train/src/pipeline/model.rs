//! What a pipeline trains: a classifier whose step is forward, cross-entropy and
//! backward, all submissions.

use rtx_ops::convert::cast;
use rtx_ops::loss::{cross_entropy, cross_entropy_backward};
use rtx_runtime::{Result, Runtime, Tensor};

use crate::param::{Module, Parameters};
use crate::{Cnn, Mlp};

/// A model trained on class labels: logits `[N, classes]` from inputs `[N, features]`.
pub trait Classifier: Send {
    /// The logits; submissions only.
    fn logits(&self, rt: &Runtime, x: &Tensor) -> Result<Tensor>;
    /// Forward, mean cross-entropy against `y`, and backward of `scale · loss`: stores
    /// every parameter's gradient and returns the loss (`[1]` f32); submissions only.
    fn loss_backward(&mut self, rt: &Runtime, x: &Tensor, y: &Tensor, scale: f32)
        -> Result<Tensor>;
    /// The parameters, in a fixed order.
    fn params(&mut self) -> Parameters<'_>;
    /// How many models this classifier trains at once on each batch: 1, or `K` for a
    /// stacked ensemble ([`crate::StackedMlp`]), whose logits are `[K·N, classes]` for
    /// a batch of `N` rows (member by member) against the batch's labels repeated `K`
    /// times. Samples per second count every member's rows.
    fn members(&self) -> usize {
        1
    }
}

/// `x` in the dtype of `mlp`'s weights (a cast on the device when they differ: f32
/// batches into a bf16 model, as autocast does).
fn as_model_dtype(mlp: &Mlp, rt: &Runtime, x: &Tensor) -> Result<Tensor> {
    let want = mlp
        .layers()
        .first()
        .map_or(x.dtype(), |l| l.weight().value().dtype());
    if x.dtype() == want {
        Ok(x.clone())
    } else {
        rt.run(cast(x, want))
    }
}

/// An MLP classifies with its output layer's values as logits; inputs of another float
/// dtype than its weights are cast to theirs first.
impl Classifier for Mlp {
    fn logits(&self, rt: &Runtime, x: &Tensor) -> Result<Tensor> {
        let x = as_model_dtype(self, rt, x)?;
        Ok(self.forward(rt, &x)?.0)
    }
    fn loss_backward(
        &mut self,
        rt: &Runtime,
        x: &Tensor,
        y: &Tensor,
        scale: f32,
    ) -> Result<Tensor> {
        let x = as_model_dtype(self, rt, x)?;
        let (logits, ctx) = self.forward(rt, &x)?;
        let (loss, dlogits) = loss_and_grad(rt, &logits, y, scale)?;
        self.backward(rt, &dlogits, &ctx)?;
        Ok(loss)
    }
    fn params(&mut self) -> Parameters<'_> {
        self.parameters()
    }
}

/// The mean cross-entropy of `logits` against `labels` and the gradient of
/// `scale · loss` with respect to the logits; submissions only.
pub(crate) fn loss_and_grad(
    rt: &Runtime,
    logits: &Tensor,
    labels: &Tensor,
    scale: f32,
) -> Result<(Tensor, Tensor)> {
    let ce = rt.run(cross_entropy(logits, labels))?;
    let d = rt.run(cross_entropy_backward(logits, labels, &ce.lse, scale))?;
    Ok((ce.loss, d))
}

/// A CNN classifies rows of `c_in · h · w` features as images `[N, c_in, h, w]` (a
/// reshape; inputs of another float dtype than its weights are cast to theirs first).
impl Classifier for Cnn {
    fn logits(&self, rt: &Runtime, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward(rt, &images(self, rt, x)?)?.0)
    }
    fn loss_backward(
        &mut self,
        rt: &Runtime,
        x: &Tensor,
        y: &Tensor,
        scale: f32,
    ) -> Result<Tensor> {
        let (logits, ctx) = self.forward(rt, &images(self, rt, x)?)?;
        let (loss, dlogits) = loss_and_grad(rt, &logits, y, scale)?;
        self.backward(rt, &dlogits, &ctx)?;
        Ok(loss)
    }
    fn params(&mut self) -> Parameters<'_> {
        self.parameters()
    }
}

/// Rows `[N, c·h·w]` as images `[N, c, h, w]` in the CNN's dtype.
fn images(cnn: &Cnn, rt: &Runtime, x: &Tensor) -> Result<Tensor> {
    let c = cnn.config();
    let (h, w) = c.hw;
    let per = c.c_in * h * w;
    if x.rank() != 2 || x.dims()[1] != per {
        return Err(rtx_runtime::Error::invalid_dim(
            "Cnn as a classifier",
            format!(
                "rows {}: expected [N, {per}] ({} x {h} x {w} images)",
                x.shape(),
                c.c_in
            ),
        ));
    }
    let want = c.dtype;
    let x = if x.dtype() == want {
        x.clone()
    } else {
        rt.run(cast(x, want))?
    };
    x.reshape([x.dims()[0], c.c_in, h, w])
}
