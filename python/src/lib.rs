//! The native module `xccl._xccl` of the Python package `xccl`: communicators and
//! collectives on Python buffers, without copies, the GIL released while communicating.
//!
//! | module | holds |
//! |---|---|
//! | `comm.rs` | `Communicator`: construction, `split` / `dup`, every operation and its `_async` twin |
//! | `dispatch.rs` | how a method runs: argument conversions, buffer export, blocking or asynchronous execution |
//! | `calls.rs` | the operations as data, and how each maps onto xccl's blocking and asynchronous API |
//! | `buffer.rs` | Python buffers as typed xccl buffers: export, checks, element types |
//! | `store.rs` | `Communicator.from_store`: meeting through a store the program brings (PyTorch's) |
//! | `work.rs` | `Work`: an asynchronous operation and the buffers it borrowed |
//! | `error.rs` | the exception classes and how each `xccl::Error` maps to one |
//!
//! The module also exports xccl's C API (`xcclAllReduce`, ... of `xccl::capi`, the
//! functions of `xccl.h`): the package's native PyTorch backend (`xccl/csrc/`, compiled
//! against the installed torch) links to this file and calls them, so one copy of xccl serves
//! both.
//!
//! Built by maturin into one abi3 wheel (Python 3.11 and later: the buffer protocol is in
//! the limited API from 3.11); see `python/README.md`.

mod buffer;
mod calls;
mod comm;
mod dispatch;
mod error;
mod store;
mod work;

use pyo3::prelude::*;

/// The C API, exported from the extension module for the native PyTorch backend.
pub use xccl::capi::*;

/// The native module (`xccl/__init__.py` re-exports it).
#[pymodule]
fn _xccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<comm::PyCommunicator>()?;
    m.add_class::<work::Work>()?;
    let c = error::classes(py)?;
    m.add("XcclError", c.base.bind(py))?;
    m.add("PeerLostError", c.peer_lost.bind(py))?;
    m.add("MismatchError", c.mismatch.bind(py))?;
    m.add("TimeoutError", c.timeout.bind(py))?;
    m.add("InvalidArgumentError", c.invalid.bind(py))?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
