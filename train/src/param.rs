//! Parameters: a tensor, its gradient, and the list an optimizer takes.

use rtx_runtime::{Error, Result, Tensor};

/// One trainable tensor and its gradient (set by the owning layer's backward).
#[derive(Debug)]
pub struct Param {
    name: String,
    /// Always `Some` outside [`Param::update`].
    value: Option<Tensor>,
    grad: Option<Tensor>,
}

impl Param {
    /// A parameter named `name` (for messages and exports, e.g. `"0.weight"`).
    pub fn new(name: impl Into<String>, value: Tensor) -> Self {
        Param {
            name: name.into(),
            value: Some(value),
            grad: None,
        }
    }
    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The current value.
    ///
    /// # Panics
    /// Only if an [`Param::update`] closure panicked, leaving no value.
    pub fn value(&self) -> &Tensor {
        self.value
            .as_ref()
            .expect("parameter value lost by a panicking update")
    }
    /// The gradient of the last backward, if one ran.
    pub fn grad(&self) -> Option<&Tensor> {
        self.grad.as_ref()
    }
    /// Sets the gradient; it must have the value's shape and dtype.
    pub fn set_grad(&mut self, grad: Tensor) -> Result<()> {
        self.check_like("set_grad", &grad)?;
        self.grad = Some(grad);
        Ok(())
    }
    /// Takes the gradient out (e.g. to hand it to an op by value), leaving none.
    pub fn take_grad(&mut self) -> Option<Tensor> {
        self.grad.take()
    }
    /// Takes the value out (for a multi-tensor in-place op); put it back with
    /// [`Param::restore_value`].
    pub(crate) fn take_value(&mut self) -> Option<Tensor> {
        self.value.take()
    }
    /// Puts a value back after [`Param::take_value`] (unchecked: the caller's op keeps
    /// the shape and dtype).
    pub(crate) fn restore_value(&mut self, value: Tensor) {
        self.value = Some(value);
    }
    /// Replaces the value; the new one must have the same shape and dtype.
    pub fn set_value(&mut self, value: Tensor) -> Result<()> {
        self.check_like("set_value", &value)?;
        self.value = Some(value);
        Ok(())
    }
    /// Replaces the value by `f(old value)` without keeping another handle to it, so
    /// that an in-place op (`*_` forms, which take their input by value) can write into
    /// its memory by donation. `f` returns the new value, or its error together with the
    /// old value (e.g. from a rejected submission's op), which is put back (boxed: an
    /// error is large, and this is the cold path). The new value must have the old one's
    /// shape and dtype.
    pub fn update(
        &mut self,
        f: impl FnOnce(Tensor) -> std::result::Result<Tensor, Box<(Error, Tensor)>>,
    ) -> Result<()> {
        let old = self
            .value
            .take()
            .ok_or_else(|| Error::invalid("Param::update", "parameter value lost"))?;
        let (shape, dtype) = (old.shape().clone(), old.dtype());
        match f(old) {
            Ok(new) => {
                if new.shape() != &shape || new.dtype() != dtype {
                    let detail = format!("update must keep the shape and dtype ({dtype})");
                    let e = Error::shape("Param::update", &shape, new.shape(), detail);
                    self.value = Some(new);
                    return Err(e);
                }
                self.value = Some(new);
                Ok(())
            }
            Err(rejected) => {
                let (e, old) = *rejected;
                self.value = Some(old);
                Err(e)
            }
        }
    }

    fn check_like(&self, what: &str, t: &Tensor) -> Result<()> {
        let v = self.value();
        if t.dtype() != v.dtype() {
            return Err(Error::dtype(what, v.dtype(), t.dtype()));
        }
        if t.shape() != v.shape() {
            let detail = format!("must match parameter {}", self.name);
            return Err(Error::shape(what, t.shape(), v.shape(), detail));
        }
        Ok(())
    }
}

/// The parameters of a model, in a fixed order: what an optimizer takes. Each entry
/// gives the value and the gradient ([`Param::value`], [`Param::grad`]) and allows
/// updating the value in place ([`Param::update`]).
#[derive(Debug, Default)]
pub struct Parameters<'a> {
    params: Vec<&'a mut Param>,
}

impl<'a> Parameters<'a> {
    /// A list from references (a layer's own parameters, in its order).
    pub fn new(params: Vec<&'a mut Param>) -> Self {
        Parameters { params }
    }
    /// This list followed by `other` (to combine layers).
    pub fn chain(mut self, other: Parameters<'a>) -> Self {
        self.params.extend(other.params);
        self
    }
    /// How many parameters.
    pub fn len(&self) -> usize {
        self.params.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }
    /// The parameters, read-only.
    pub fn iter(&self) -> impl Iterator<Item = &Param> {
        self.params.iter().map(|p| &**p)
    }
    /// The parameters, to update.
    pub fn iter_mut(&mut self) -> IterMut<'_, 'a> {
        IterMut(self.params.iter_mut())
    }
    /// `(value, gradient)` of each parameter.
    pub fn pairs(&self) -> Vec<(&Tensor, Option<&Tensor>)> {
        self.iter().map(|p| (p.value(), p.grad())).collect()
    }
    /// Total number of elements over all values.
    pub fn numel(&self) -> usize {
        self.iter().map(|p| p.value().numel()).sum()
    }

    /// Replaces every value at once by `f(old values)`, without keeping other handles
    /// to them, so that a multi-tensor in-place op (a fused optimizer step, which takes
    /// its parameters by value) can write into their memory by donation. As
    /// [`Param::update`]: on an error `f` gives the old values back and they are put
    /// back; the new values must keep each one's shape and dtype, and there must be one
    /// per parameter.
    #[allow(clippy::type_complexity)]
    pub fn update_all(
        &mut self,
        f: impl FnOnce(Vec<Tensor>) -> std::result::Result<Vec<Tensor>, Box<(Error, Vec<Tensor>)>>,
    ) -> Result<()> {
        let mut old = Vec::with_capacity(self.params.len());
        for p in self.params.iter_mut() {
            match p.value.take() {
                Some(v) => old.push(v),
                None => {
                    // Put back what was taken so far (in order), then fail.
                    for (q, v) in self.params.iter_mut().zip(old) {
                        q.value = Some(v);
                    }
                    return Err(Error::invalid(
                        "Parameters::update_all",
                        "parameter value lost",
                    ));
                }
            }
        }
        let like: Vec<_> = old.iter().map(|t| (t.shape().clone(), t.dtype())).collect();
        match f(old) {
            Ok(new)
                if new.len() == like.len()
                    && new
                        .iter()
                        .zip(&like)
                        .all(|(t, (s, d))| t.shape() == s && t.dtype() == *d) =>
            {
                for (p, v) in self.params.iter_mut().zip(new) {
                    p.value = Some(v);
                }
                Ok(())
            }
            Ok(new) => Err(Error::invalid(
                "Parameters::update_all",
                format!(
                    "{} new values for {} parameters, or a shape or dtype changed (values lost)",
                    new.len(),
                    like.len()
                ),
            )),
            Err(rejected) => {
                let (e, old) = *rejected;
                for (p, v) in self.params.iter_mut().zip(old) {
                    p.value = Some(v);
                }
                Err(e)
            }
        }
    }
}

/// The iterator of [`Parameters::iter_mut`].
#[derive(Debug)]
pub struct IterMut<'s, 'a>(std::slice::IterMut<'s, &'a mut Param>);

impl<'s> Iterator for IterMut<'s, '_> {
    type Item = &'s mut Param;
    fn next(&mut self) -> Option<&'s mut Param> {
        self.0.next().map(|p| &mut **p)
    }
}

impl<'a> IntoIterator for Parameters<'a> {
    type Item = &'a mut Param;
    type IntoIter = std::vec::IntoIter<&'a mut Param>;
    fn into_iter(self) -> Self::IntoIter {
        self.params.into_iter()
    }
}

/// Anything with trainable parameters (a layer, a model).
pub trait Module {
    /// The parameters, in a fixed order (the same on every call).
    fn parameters(&mut self) -> Parameters<'_>;
}
