//! The keys of a store, shared by the two protocols its server speaks (ours, `store.rs`, and
//! PyTorch's, `c10d.rs`) and by their clients: the limits on keys and values, the data and
//! what waiters wait on, the [`KeyValue`] trait every store offers, and dialing a store
//! that may not be up yet.

use std::collections::HashMap;
use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Longest key, in bytes.
pub(crate) const MAX_KEY: usize = 4096;
/// Largest value, in bytes.
pub(crate) const MAX_VALUE: usize = 16 << 20;

/// `len` bytes from `r` (`len` already checked against a limit), the buffer growing as they
/// arrive: a peer that claims a length and sends less makes the reader hold what came, not
/// what was claimed.
pub(crate) fn read_exactly(r: &mut impl Read, len: u64) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(len.min(64 << 10) as usize);
    Read::take(&mut *r, len).read_to_end(&mut v)?;
    if (v.len() as u64) < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(v)
}

/// How long the store's servers let a request wait (see [`WAITS`]).
#[derive(Copy, Clone, Debug)]
pub(crate) struct Waits {
    /// The longest a `get` of our protocol waits for its key.
    pub get_max: Duration,
    /// How often a PyTorch client's `WAIT` looks whether the client cancelled or left.
    pub tick: Duration,
}

/// The waits of a served store: a client's `get` waits as long as it asks, up to a day
/// (the fuzzer found that a garbage wait kept a server thread blocked for good). The
/// fuzzer's replayed connections use zeros: nobody else could set the key meanwhile.
pub(crate) const WAITS: Waits =
    Waits { get_max: Duration::from_secs(24 * 3600), tick: Duration::from_millis(50) };

/// The keys of a store and what its clients wait on.
#[derive(Default)]
pub(crate) struct Data {
    pub(crate) map: Mutex<HashMap<String, Vec<u8>>>,
    /// Notified whenever keys change.
    pub(crate) cv: Condvar,
    /// The last refused handshakes, reported to clients whose `get` times out: the usual
    /// reason a rank never shows up is that it was refused.
    pub(crate) refusals: Mutex<Vec<String>>,
}

impl Data {
    /// Changes the keys with `f` and wakes every waiter.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut HashMap<String, Vec<u8>>) -> R) -> R {
        let r = f(&mut self.map.lock().unwrap_or_else(PoisonError::into_inner));
        self.cv.notify_all();
        r
    }

    /// Adds `delta` to the counter `key` (decimal text; 0 if unset or not a number).
    pub(crate) fn add(&self, key: String, delta: i64) -> i64 {
        self.update(|map| {
            let cur = map
                .get(&key)
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|t| t.parse::<i64>().ok())
                .unwrap_or(0);
            let new = cur.wrapping_add(delta);
            map.insert(key, new.to_string().into_bytes());
            new
        })
    }
}

/// A key-value store that ranks meet through: ours ([`StoreClient`](super::StoreClient)), PyTorch's
/// ([`C10dClient`](super::C10dClient)), or one a program provides (the Python package
/// hands PyTorch's store of a process group).
pub trait KeyValue: Send {
    /// Sets `key` to `value`.
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits until `key` is set (within the store's timeout) and returns its value.
    fn get(&mut self, key: &str) -> Result<Vec<u8>>;
    /// Adds `delta` to the counter `key` (0 if unset); returns the new value.
    fn add(&mut self, key: &str, delta: i64) -> Result<i64>;
}

/// A TCP connection to the store at `addr`, retried until `timeout` while nobody listens yet
/// (the store may start after its clients); `who` names what should be serving it.
pub(crate) fn dial(addr: &str, timeout: Duration, who: &str) -> Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(10);
    loop {
        let attempt = addr
            .to_socket_addrs()
            .map_err(|e| Error::Bootstrap(format!("cannot resolve the store address '{addr}': {e}")))?
            .find_map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).ok());
        if let Some(stream) = attempt {
            return Ok(stream);
        }
        if Instant::now() >= deadline {
            return Err(Error::Bootstrap(format!(
                "no store answered at {addr} within {:.0} s: {who}, and are MASTER_ADDR/MASTER_PORT the same \
                 on every rank?",
                timeout.as_secs_f64()
            )));
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}
