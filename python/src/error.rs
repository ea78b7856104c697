//! The exceptions of the `xccl` package and how each `xccl::Error` becomes one.
//!
//! ```text
//! XcclError(Exception)                 .rank: the rank at fault, when known
//! ├── PeerLostError                    a peer died or closed its communicator
//! ├── MismatchError                    ranks called different collectives / counts
//! ├── TimeoutError                     XCCL_TIMEOUT passed without progress
//! └── InvalidArgumentError(ValueError) bad arguments, found before communicating
//! ```
//!
//! The message is always the Rust error's `Display`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use xccl::Error;

/// The exception classes, created once per process.
pub(crate) struct Classes {
    /// `XcclError`, the base.
    pub base: Py<PyType>,
    /// `PeerLostError`.
    pub peer_lost: Py<PyType>,
    /// `MismatchError`.
    pub mismatch: Py<PyType>,
    /// `TimeoutError`.
    pub timeout: Py<PyType>,
    /// `InvalidArgumentError`.
    pub invalid: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// Makes `class name(*bases)` in module `xccl` with the docstring `doc` and the class
/// attributes `attrs`.
fn class(
    py: Python<'_>,
    name: &str,
    bases: &[&Bound<'_, PyType>],
    doc: &str,
    attrs: &[(&str, Bound<'_, PyAny>)],
) -> PyResult<Py<PyType>> {
    let dict = PyDict::new(py);
    dict.set_item("__doc__", doc)?;
    dict.set_item("__module__", "xccl")?;
    for (k, v) in attrs {
        dict.set_item(k, v)?;
    }
    let bases = PyTuple::new(py, bases)?;
    let made = py.get_type::<PyType>().call1((name, bases, dict))?;
    Ok(made.cast_into::<PyType>()?.unbind())
}

/// The exception classes (made on first use).
pub(crate) fn classes(py: Python<'_>) -> PyResult<&'static Classes> {
    CLASSES.get_or_try_init(py, || {
        let exception = py.get_type::<pyo3::exceptions::PyException>();
        let none = py.None().into_bound(py);
        let base = class(
            py,
            "XcclError",
            &[&exception],
            "Base of every error xccl raises. `rank` is the rank at fault when known (a lost or \
             misbehaving peer, the rank a failure began on), else None.",
            &[("rank", none)],
        )?;
        let b = base.bind(py);
        let peer_lost = class(
            py,
            "PeerLostError",
            &[b],
            "A peer died or closed its communicator; the message names the rank.",
            &[],
        )?;
        let mismatch = class(
            py,
            "MismatchError",
            &[b],
            "Ranks called different collectives, or the same one with different counts, types or \
             roots; the message describes both sides.",
            &[],
        )?;
        let timeout = class(
            py,
            "TimeoutError",
            &[b],
            "An operation made no progress for XCCL_TIMEOUT seconds; the message names the ranks \
             not heard from.",
            &[],
        )?;
        let value_error = py.get_type::<PyValueError>();
        let invalid = class(
            py,
            "InvalidArgumentError",
            &[b, &value_error],
            "Bad arguments (a buffer of the wrong size, type or layout, an unknown op or dtype, a \
             root outside the group), found before anything was communicated.",
            &[],
        )?;
        Ok(Classes { base, peer_lost, mismatch, timeout, invalid })
    })
}

/// Which exception class an error maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Base,
    PeerLost,
    Mismatch,
    Timeout,
    Invalid,
}

fn kind(e: &Error) -> Kind {
    match e {
        Error::InvalidArgument { .. } | Error::Config(_) => Kind::Invalid,
        Error::PeerLost { .. } => Kind::PeerLost,
        Error::Mismatch { .. } => Kind::Mismatch,
        Error::Timeout { .. } => Kind::Timeout,
        Error::Aborted(inner) => kind(inner),
        Error::RemoteAbort { reason, .. } => kind_of_reason(reason),
        _ => Kind::Base,
    }
}

/// The kind of the failure a relayed abort describes. The abort carries the failing rank's
/// error as text, `rank N: <Display of the error>` (see `Engine::abort` in xccl's exec.rs), so
/// the class is read from the shapes of `Error`'s messages.
fn kind_of_reason(reason: &str) -> Kind {
    let r = match reason.strip_prefix("rank ").and_then(|rest| rest.split_once(": ")) {
        Some((n, rest)) if n.parse::<usize>().is_ok() => rest,
        _ => reason,
    };
    let r = r.strip_prefix("communicator unusable after an earlier failure: ").unwrap_or(r);
    if r.starts_with("collective mismatch: ") {
        Kind::Mismatch
    } else if r.contains(": lost rank ") {
        Kind::PeerLost
    } else if r.contains(" timed out after ") && r.contains("(XCCL_TIMEOUT)") {
        Kind::Timeout
    } else {
        Kind::Base
    }
}

/// The Python exception of `e`: its class, its message, and `.rank` set to the culprit.
pub(crate) fn to_py(py: Python<'_>, e: &Error) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let c = classes(py)?;
        let class = match kind(e) {
            Kind::Base => &c.base,
            Kind::PeerLost => &c.peer_lost,
            Kind::Mismatch => &c.mismatch,
            Kind::Timeout => &c.timeout,
            Kind::Invalid => &c.invalid,
        };
        let exc = class.bind(py).call1((e.to_string(),))?;
        exc.setattr("rank", e.culprit())?;
        Ok(PyErr::from_value(exc))
    })();
    made.unwrap_or_else(|failed| failed)
}

/// An `InvalidArgumentError` for a bad argument of `api`.
pub(crate) fn invalid(py: Python<'_>, api: &'static str, msg: impl Into<String>) -> PyErr {
    to_py(py, &Error::InvalidArgument { op: api, msg: msg.into() })
}
