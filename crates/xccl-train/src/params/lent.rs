//! A gathered buffer lent to the parameters as views, and taken back whole for the next
//! gather: ZeRO's parameters without a copy, and (stage 3) without fresh memory per fetch.

use std::cell::Cell;

use candle_core::{CpuStorage, Device, Layout, Tensor};

use super::ParamSet;
use crate::error::{Error, Result};

/// A buffer whose pieces some parameters hold as their values ([`ParamSet::lend_range`]),
/// to be [taken back](ParamSet::take_back) whole.
///
/// Taking it back returns its memory without a copy and leaves every view of it empty, so
/// that a view still held anywhere (a saved graph, a layer's copy) fails at its next use
/// instead of reading what the buffer holds next.
#[derive(Debug)]
pub struct Lent {
    flat: Tensor,
    /// Where it lies in the flat vector of the parameters.
    at: usize,
}

impl ParamSet {
    /// Lends the parameters whose elements are `at .. at + values.len()` of this rank's
    /// flat vector (whole parameters only) their pieces of `values`, which becomes one
    /// tensor: each parameter holds a view of it ([`super::Param::lend`]) and no element
    /// is copied. The buffer is freed once every view is released or replaced, or taken
    /// back through the returned [`Lent`].
    pub fn lend_range(&self, at: usize, values: Vec<f32>) -> Result<Lent> {
        let n = values.len();
        let flat = Tensor::from_vec(values, n, &Device::Cpu)?;
        self.each_whole(at..at + n, |s| {
            let r = s.range();
            s.param.lend(flat.narrow(0, r.start - at, r.len())?.reshape(s.shape.as_slice())?)
        })?;
        Ok(Lent { flat, at })
    }

    /// The buffer of `lent` (its values as they are now), the parameters it was lent to
    /// released ([`super::Param::release`]) first: no copy, and the tensor every view
    /// shares holds no elements from now on.
    pub fn take_back(&self, lent: Lent) -> Result<Vec<f32>> {
        let len = lent.flat.elem_count();
        self.each_whole(lent.at..lent.at + len, |s| s.param.release())?;
        let op = TakeBack { len, taken: Cell::new(None) };
        lent.flat.inplace_op1(&op)?;
        op.taken.take().ok_or_else(|| Error::internal("a lent buffer was not taken back"))
    }
}

/// Candle's in-place custom operation, which hands out a tensor's storage mutably, used to
/// move the storage's vector out.
struct TakeBack {
    /// The elements the storage must hold (the whole of it, from its start).
    len: usize,
    taken: Cell<Option<Vec<f32>>>,
}

impl candle_core::InplaceOp1 for TakeBack {
    fn name(&self) -> &'static str {
        "lent buffer taken back"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        match (storage, layout.contiguous_offsets()) {
            (CpuStorage::F32(v), Some((0, b))) if b == self.len && v.len() == self.len => {
                self.taken.set(Some(std::mem::take(v)));
                Ok(())
            }
            _ => candle_core::bail!("a lent buffer taken back must be a whole contiguous f32 tensor"),
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Var;

    use super::*;
    use crate::params::Param;

    fn set() -> ParamSet {
        let a = Param::new("a", Var::zeros((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap());
        let b = Param::new("b", Var::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap());
        ParamSet::new(&[&[a, b]]).unwrap()
    }

    #[test]
    fn a_buffer_lent_and_taken_back_is_the_same_memory_and_its_views_fail_after() {
        let set = set();
        let values: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let at = values.as_ptr();
        let lent = set.lend_range(0, values).unwrap();
        let a = set.slots()[0].param.tensor();
        assert_eq!(a.to_vec2::<f32>().unwrap(), vec![vec![0.0, 1.0, 2.0], vec![3.0, 4.0, 5.0]]);
        assert_eq!(set.slots()[1].param.tensor().to_vec1::<f32>().unwrap(), vec![6.0, 7.0, 8.0, 9.0]);
        let back = set.take_back(lent).unwrap();
        assert!(set.slots().iter().all(|s| !s.param.is_resident()));
        assert_eq!(back.as_ptr(), at, "not the buffer lent");
        assert_eq!(back, (0..10).map(|i| i as f32).collect::<Vec<_>>());
        // A view kept past the release holds nothing: reading it fails (candle's read of a
        // storage shorter than the view's layout panics).
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.to_vec2::<f32>()));
        assert!(read.map_or(true, |r| r.is_err()), "a view read the buffer after it was taken back");
    }
}
