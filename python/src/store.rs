//! `Communicator.from_store`: ranks meet through a key-value store the Python program
//! brings, such as the store PyTorch hands to each process group (`torch.distributed.Store`:
//! `set`, a blocking `get`, `add`), so every group gets its own communicator without any
//! variables. Who may join is `xccl::bootstrap::group`'s rule: `XCCL_SECRET` where set, else
//! a secret the group draws and shares through the store.

use std::net::IpAddr;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use xccl::bootstrap::{KeyValue, Rendezvous, group};
use xccl::{Communicator, Config, Error, Result};

/// A Python object with `set(key, bytes)`, `get(key) -> bytes` (blocking until the key is
/// set) and `add(key, int) -> int`, as xccl's store.
pub(crate) struct PyStore {
    store: Py<PyAny>,
}

impl PyStore {
    fn call<T>(&self, what: &str, f: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>) -> Result<T> {
        Python::attach(|py| f(self.store.bind(py)))
            .map_err(|e| Error::Bootstrap(format!("the store's {what} failed: {e}")))
    }
}

impl KeyValue for PyStore {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.call("set", |s| s.call_method1("set", (key, PyBytes::new(s.py(), value))).map(drop))
    }

    fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        self.call("get", |s| s.call_method1("get", (key,))?.extract::<Vec<u8>>())
    }

    fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        self.call("add", |s| s.call_method1("add", (key, delta))?.extract::<i64>())
    }
}

/// Rank `rank` of `size` joins the group whose store is `store`, listening on `ip`.
pub(crate) fn connect(
    store: Py<PyAny>,
    rank: usize,
    size: usize,
    timeout: Duration,
    ip: IpAddr,
) -> Result<Communicator> {
    let mut store = PyStore { store };
    let auth = group::store_auth(&mut store, rank, group::env_secret())?;
    let rv = Rendezvous::for_store(rank, size, auth, timeout)?;
    Communicator::connect_with_store(&rv, &mut store, ip, Config::from_env()?)
}
