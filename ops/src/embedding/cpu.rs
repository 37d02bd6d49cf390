//! The CPU embedding kernels (the reference): gather, and the ordered scatter-add.

use crate::cpu_util::Float;

/// `id` as a row index below `v`, or `None`.
#[inline]
pub fn row(id: i64, v: usize) -> Option<usize> {
    (id >= 0 && (id as u64) < v as u64).then_some(id as usize)
}

/// The first out-of-range id and its position, if any.
pub fn first_bad(ids: &[i64], v: usize) -> Option<(usize, i64)> {
    ids.iter()
        .enumerate()
        .find(|(_, &id)| row(id, v).is_none())
        .map(|(i, &id)| (i, id))
}

/// `y[i, :] = table[ids[i], :]`; every id must be in range (see [`first_bad`]).
pub fn gather<T: Float>(table: &[T], ids: &[i64], d: usize, y: &mut [T]) {
    for (i, &id) in ids.iter().enumerate() {
        let r = id as usize;
        y[i * d..(i + 1) * d].copy_from_slice(&table[r * d..(r + 1) * d]);
    }
}

/// `dtable[v, :] = sum over i with ids[i] == v of dy[i, :]`, summed in f64 in
/// increasing `i` and rounded once; every id must be in range.
pub fn scatter_add<T: Float>(dy: &[T], ids: &[i64], d: usize, dtable: &mut [T]) {
    let mut acc = vec![0f64; dtable.len()];
    for (i, &id) in ids.iter().enumerate() {
        let r = id as usize;
        for (a, g) in acc[r * d..(r + 1) * d]
            .iter_mut()
            .zip(&dy[i * d..(i + 1) * d])
        {
            *a += g.to_f64();
        }
    }
    for (o, a) in dtable.iter_mut().zip(acc) {
        *o = T::from_f64(a);
    }
}
