//! How `xccl.Communicator`'s methods run an operation: argument conversions, exporting the
//! buffers, and running an operation ([`One`], [`Two`]) blocking on borrowed memory or
//! asynchronously on memory lent to a [`Work`], with the GIL released.

use pyo3::prelude::*;
use xccl::{Communicator, ReduceOp, with_element};

use crate::buffer::{Held, Input, Lent, dtype_name, export, parse_dtype};
use crate::calls::{One, Two};
use crate::comm::PyCommunicator;
use crate::error::{invalid, to_py};
use crate::work::Work;

/// A reduction operator from its name.
pub(crate) fn reduce_op(py: Python<'_>, api: &'static str, name: &str) -> PyResult<ReduceOp> {
    name.parse()
        .map_err(|_| invalid(py, api, format!("unknown op '{name}': expected one of sum prod min max avg")))
}

/// A rank, element count or index: non-negative.
pub(crate) fn index(py: Python<'_>, api: &'static str, what: &str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| invalid(py, api, format!("{what} is {v}; it must be 0 or more")))
}

pub(crate) fn counts(py: Python<'_>, api: &'static str, what: &str, v: Vec<i64>) -> PyResult<Vec<usize>> {
    v.into_iter().enumerate().map(|(i, c)| index(py, api, &format!("{what}[{i}]"), c)).collect()
}

pub(crate) fn tag(py: Python<'_>, api: &'static str, v: i64) -> PyResult<u32> {
    u32::try_from(v).map_err(|_| invalid(py, api, format!("tag is {v}; it must be in 0..2**32")))
}

/// The element type of a two-buffer call, from whichever buffers there are (they must agree).
fn common_dtype(
    py: Python<'_>,
    api: &'static str,
    input: Option<&Held>,
    output: Option<&Held>,
) -> PyResult<xccl::DType> {
    match (input, output) {
        (Some(i), Some(o)) if i.dtype != o.dtype => Err(invalid(
            py,
            api,
            format!(
                "input has elements of type {} but output of type {}: pass buffers of one type",
                dtype_name(i.dtype),
                dtype_name(o.dtype)
            ),
        )),
        (Some(b), _) | (None, Some(b)) => Ok(b.dtype),
        (None, None) => Err(invalid(py, api, "input and output are both None")),
    }
}

impl PyCommunicator {
    /// Exports `buf` for a one-buffer call.
    pub(crate) fn one_held(
        py: Python<'_>,
        api: &'static str,
        call: &One,
        buf: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<Held> {
        let writable = !matches!(call, One::Send { .. });
        export(py, api, "buf", buf, parse_dtype(py, api, dtype)?, writable)
    }

    /// Runs `call` on `buf`, blocking.
    pub(crate) fn one(
        &self,
        py: Python<'_>,
        api: &'static str,
        call: One,
        buf: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let held = Self::one_held(py, api, &call, buf, dtype)?;
        self.run_one(py, &call, &held)
    }

    fn run_one(&self, py: Python<'_>, call: &One, held: &Held) -> PyResult<()> {
        let comm: &Communicator = &self.comm;
        let result = with_element!(held.dtype, T => {
            // SAFETY: `held` outlives the blocking call.
            let lent = unsafe { held.lend::<T>() };
            py.detach(|| call.run(comm, lent))
        });
        result.map_err(|e| to_py(py, &e))
    }

    /// Starts `call` on `buf`.
    pub(crate) fn one_async(
        &self,
        py: Python<'_>,
        api: &'static str,
        call: One,
        buf: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        let held = Self::one_held(py, api, &call, buf, dtype)?;
        self.spawn_one(py, &call, held, Vec::new())
    }

    /// Starts `call` on `held`; `also` are further exports the operation's `Work` keeps.
    fn spawn_one(&self, py: Python<'_>, call: &One, held: Held, mut also: Vec<Held>) -> PyResult<Work> {
        let pending = with_element!(held.dtype, T => {
            // SAFETY: `held` moves into the returned `Work`, which releases it only once the
            // operation has completed.
            call.spawn(&self.comm, unsafe { held.lend::<T>() })
        });
        also.push(held);
        Work::start(py, pending, also)
    }

    /// Exports the buffers of a two-buffer call (`None` where a rank passes none).
    pub(crate) fn two_held(
        py: Python<'_>,
        api: &'static str,
        input: Option<&Bound<'_, PyAny>>,
        output: Option<&Bound<'_, PyAny>>,
        dtype: Option<&str>,
    ) -> PyResult<(Option<Held>, Option<Held>)> {
        let dtype = parse_dtype(py, api, dtype)?;
        let input = input.map(|b| export(py, api, "input", b, dtype, false)).transpose()?;
        let output = output.map(|b| export(py, api, "output", b, dtype, true)).transpose()?;
        common_dtype(py, api, input.as_ref(), output.as_ref())?;
        Ok((input, output))
    }

    /// The one-buffer form of `call` when `input` and `output` are the same memory.
    fn in_place(call: &Two, input: &Option<Held>, output: &Option<Held>) -> Option<One> {
        match (input, output) {
            (Some(i), Some(o)) if i.same_memory(o) => call.in_place(),
            _ => None,
        }
    }

    /// Runs `call` from `input` into `output`, blocking.
    pub(crate) fn two(
        &self,
        py: Python<'_>,
        api: &'static str,
        call: Two,
        input: Option<&Bound<'_, PyAny>>,
        output: Option<&Bound<'_, PyAny>>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let (input, output) = Self::two_held(py, api, input, output, dtype)?;
        if let (Some(one), Some(o)) = (Self::in_place(&call, &input, &output), &output) {
            return self.run_one(py, &one, o);
        }
        let comm: &Communicator = &self.comm;
        let dtype = common_dtype(py, api, input.as_ref(), output.as_ref())?;
        let result = with_element!(dtype, T => {
            // SAFETY: `input` and `output` outlive the blocking call.
            let (i, o) = unsafe { lend_two::<T>(&input, &output) };
            py.detach(|| call.run(comm, i, o))
        });
        result.map_err(|e| to_py(py, &e))
    }

    /// Starts `call` from `input` into `output`.
    pub(crate) fn two_async(
        &self,
        py: Python<'_>,
        api: &'static str,
        call: Two,
        input: Option<&Bound<'_, PyAny>>,
        output: Option<&Bound<'_, PyAny>>,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        let (input, output) = Self::two_held(py, api, input, output, dtype)?;
        if let Some(one) = Self::in_place(&call, &input, &output)
            && let Some(o) = output
        {
            return self.spawn_one(py, &one, o, input.into_iter().collect());
        }
        let dtype = common_dtype(py, api, input.as_ref(), output.as_ref())?;
        let pending = with_element!(dtype, T => {
            // SAFETY: the exports move into the returned `Work`, which releases them only
            // once the operation has completed.
            let (i, o) = unsafe { lend_two::<T>(&input, &output) };
            call.spawn(&self.comm, i, o)
        });
        Work::start(py, pending, input.into_iter().chain(output).collect())
    }
}

/// The memory of a two-buffer call: empty where there is no buffer, the input copied where
/// it overlaps the output.
///
/// # Safety
/// As [`Held::lend`], for both.
unsafe fn lend_two<T: xccl::Element>(input: &Option<Held>, output: &Option<Held>) -> (Input<T>, Lent<T>) {
    let i = match input {
        // SAFETY: forwarded to the caller.
        Some(i) => unsafe { Input::of(i, output.as_ref()) },
        None => Input::Lent(Lent::empty()),
    };
    let o = match output {
        // SAFETY: forwarded to the caller.
        Some(o) => unsafe { o.lend::<T>() },
        None => Lent::empty(),
    };
    (i, o)
}
