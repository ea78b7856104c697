//! A TCP key-value store through which ranks find each other, served by the launcher or by
//! rank 0 (as torchrun's static rendezvous does).
//!
//! After the handshake, each request is `op, key length, key, value length, value`; `get`
//! blocks on the server until the key is set or the client's deadline passes. Keys and
//! values have size limits, so a misbehaving client cannot make the server allocate without
//! bound.
//!
//! The server also answers PyTorch's `TCPStore` protocol on the same port and the same keys
//! (see [`c10d`]): the first byte of a connection tells which it speaks.
//! Counters (`add`) are kept as decimal text, as PyTorch keeps them, so both kinds of client
//! can count on one key.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::auth::{self, Auth, Purpose};
use super::c10d;
use super::conn::Conn;
pub use super::keys::KeyValue;
use super::keys::{Data, MAX_KEY, MAX_VALUE, WAITS, Waits, dial, read_exactly};
use crate::error::{Error, Result};

pub(crate) const SET: u8 = 1;
pub(crate) const GET: u8 = 2;
pub(crate) const ADD: u8 = 3;
const OK: u8 = 0;
const MISSING: u8 = 1;
const BAD: u8 = 2;
/// How long the server gives a client to finish the handshake.
const HANDSHAKE_PATIENCE: Duration = Duration::from_secs(10);

/// Refusals remembered.
const MAX_REFUSALS: usize = 4;

/// A running store server; stops when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Serves a store on `bind` (port 0 picks a free port) for clients of `auth`'s job.
    pub fn start(bind: impl ToSocketAddrs, auth: Auth) -> Result<StoreServer> {
        let addrs: Vec<SocketAddr> =
            bind.to_socket_addrs().map_err(|e| Error::io("resolving the store's address", e))?.collect();
        for a in &addrs {
            auth.may_listen(a.ip(), "its store")?;
        }
        let listener =
            TcpListener::bind(&addrs[..]).map_err(|e| Error::io("binding the store's address", e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("store address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let data = Arc::new(Data::default());
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("xccl-store".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(mut s) = conn else { continue };
                    let _ = s.set_nodelay(true);
                    let (data, auth) = (data.clone(), auth.clone());
                    let _ = std::thread::Builder::new().name("xccl-store-client".into()).spawn(move || {
                        let peer = s.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
                        handle(&mut s, &peer, &data, &auth, WAITS);
                    });
                }
            })
            .map_err(|e| Error::io("starting the store thread", e))?;
        Ok(StoreServer { addr, stop, thread: Some(thread) })
    }

    /// Serves the store at `rv.store` (rank 0's part when no launcher serves it), on that
    /// address if it is this host's, else on all interfaces at its port.
    pub(crate) fn serve(rv: &super::Rendezvous) -> Result<StoreServer> {
        let addr = rv
            .store
            .to_socket_addrs()
            .map_err(|e| Error::Bootstrap(format!("cannot resolve the store address '{}': {e}", rv.store)))?
            .next()
            .ok_or_else(|| Error::Bootstrap(format!("'{}' resolves to no address", rv.store)))?;
        StoreServer::start(addr, rv.auth.clone()).or_else(|first| {
            if matches!(first, Error::Config(_)) {
                return Err(first);
            }
            StoreServer::start(("0.0.0.0", addr.port()), rv.auth.clone()).map_err(|e| match e {
                // No secret: say so rather than blame the port.
                Error::Config(_) => e,
                _ => Error::Bootstrap(format!(
                    "rank 0 cannot serve the store at {}: {first} (is the port in use?)",
                    rv.store
                )),
            })
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves one accepted connection from `peer` (a socket, in every real use) on the store's
/// `data` until it ends: PyTorch's protocol if its first byte says so, ours after the
/// handshake with `auth` otherwise.
pub(crate) fn handle(s: &mut impl Conn, peer: &str, data: &Data, auth: &Auth, waits: Waits) {
    if speaks_c10d(s) {
        if let Err(e) = c10d::serve(s, data, waits) {
            tracing::warn!("store: PyTorch client {peer}: {e}; dropped");
        }
        return;
    }
    match auth::server(s, auth, peer, HANDSHAKE_PATIENCE) {
        Ok(Purpose::Store) => serve(s, data, waits),
        Ok(other) => {
            tracing::warn!("store: {peer} asked for {other:?}; dropped")
        }
        Err(e) => {
            tracing::warn!("store: {e}");
            let mut r = data.refusals.lock().unwrap_or_else(PoisonError::into_inner);
            if r.len() == MAX_REFUSALS {
                r.remove(0);
            }
            r.push(e.to_string());
        }
    }
}

/// Whether a new connection opens with PyTorch's `VALIDATE` (ours opens with `XCCLHELO`),
/// and the protocol is served.
fn speaks_c10d(s: &mut impl Conn) -> bool {
    matches!(s.peek_byte(HANDSHAKE_PATIENCE), Ok(Some(0))) && c10d::enabled()
}

fn read_u64(s: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_bytes(s: &mut impl Read, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let len = read_u64(s)?;
    if len > max as u64 {
        return Ok(None);
    }
    read_exactly(s, len).map(Some)
}

fn reply(s: &mut impl Write, status: u8, value: &[u8]) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(9 + value.len());
    b.push(status);
    b.extend_from_slice(&(value.len() as u64).to_le_bytes());
    b.extend_from_slice(value);
    s.write_all(&b)
}

/// Serves one client until it disconnects or misbehaves.
fn serve(s: &mut impl Conn, data: &Data, waits: Waits) {
    loop {
        let mut op = [0u8; 1];
        if s.read_exact(&mut op).is_err() {
            return;
        }
        let res = (|| -> std::io::Result<bool> {
            let (Some(key), Some(value)) = (read_bytes(s, MAX_KEY)?, read_bytes(s, MAX_VALUE)?) else {
                reply(s, BAD, b"key or value too large")?;
                return Ok(false);
            };
            let key = String::from_utf8_lossy(&key).into_owned();
            match op[0] {
                SET => {
                    data.update(|map| map.insert(key, value));
                    reply(s, OK, &[])?;
                }
                GET => {
                    let wait =
                        value.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
                    // A client's wait is its own business, up to a day: the fuzzer found
                    // that a garbage wait kept a server thread blocked for good.
                    let deadline = Instant::now() + Duration::from_millis(wait).min(waits.get_max);
                    let mut map = data.map.lock().unwrap_or_else(PoisonError::into_inner);
                    loop {
                        if let Some(v) = map.get(&key) {
                            let v = v.clone();
                            drop(map);
                            reply(s, OK, &v)?;
                            break;
                        }
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            drop(map);
                            let refusals =
                                data.refusals.lock().unwrap_or_else(PoisonError::into_inner).join("; ");
                            reply(s, MISSING, refusals.as_bytes())?;
                            break;
                        }
                        map = data.cv.wait_timeout(map, left).unwrap_or_else(PoisonError::into_inner).0;
                    }
                }
                ADD => {
                    let delta =
                        value.get(..8).map_or(0, |b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
                    let new = data.add(key, delta);
                    reply(s, OK, &new.to_le_bytes())?;
                }
                _ => {
                    reply(s, BAD, b"unknown request")?;
                    return Ok(false);
                }
            }
            Ok(true)
        })();
        if !matches!(res, Ok(true)) {
            s.close();
            return;
        }
    }
}

impl KeyValue for StoreClient {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        StoreClient::set(self, key, value)
    }
    fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        StoreClient::get(self, key)
    }
    fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        StoreClient::add(self, key, delta)
    }
}

/// A connection to a store.
pub struct StoreClient {
    stream: TcpStream,
    addr: String,
    timeout: Duration,
}

impl StoreClient {
    /// Connects to the store at `addr` (`host:port`), retrying until `timeout` while the
    /// server is not up yet; `timeout` also bounds every later `get`.
    pub fn connect(addr: &str, auth: &Auth, timeout: Duration) -> Result<StoreClient> {
        let mut stream = dial(addr, timeout, "is rank 0 (or the launcher) running")?;
        auth::client(&mut stream, auth, Purpose::Store, addr, timeout.min(Duration::from_secs(30)))?;
        let _ = stream.set_nodelay(true);
        Ok(StoreClient { stream, addr: addr.to_string(), timeout })
    }

    /// The local address of the connection: an address of this host that reaches the store.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.stream.local_addr().map_err(|e| Error::io("local address", e))
    }

    fn request(&mut self, op: u8, key: &str, value: &[u8], read_timeout: Duration) -> Result<(u8, Vec<u8>)> {
        let ctx = |e: std::io::Error| Error::Bootstrap(format!("store at {} failed: {e}", self.addr));
        if key.len() > MAX_KEY || value.len() > MAX_VALUE {
            return Err(Error::Bootstrap(format!("store key or value too large (key '{key:.40}')")));
        }
        let mut b = vec![op];
        b.extend_from_slice(&(key.len() as u64).to_le_bytes());
        b.extend_from_slice(key.as_bytes());
        b.extend_from_slice(&(value.len() as u64).to_le_bytes());
        b.extend_from_slice(value);
        self.stream.write_all(&b).map_err(ctx)?;
        self.stream.set_read_timeout(Some(read_timeout)).map_err(ctx)?;
        let mut status = [0u8; 1];
        self.stream.read_exact(&mut status).map_err(ctx)?;
        let v = read_bytes(&mut self.stream, MAX_VALUE)
            .map_err(ctx)?
            .ok_or_else(|| ctx(std::io::Error::other("oversized reply")))?;
        if status[0] == BAD {
            return Err(Error::Bootstrap(format!(
                "store refused the request: {}",
                String::from_utf8_lossy(&v)
            )));
        }
        Ok((status[0], v))
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.set_within(key, value, Duration::from_secs(30))
    }

    /// Sets `key` to `value`, failing if the store does not confirm within `patience`.
    pub fn set_within(&mut self, key: &str, value: &[u8], patience: Duration) -> Result<()> {
        self.request(SET, key, value, patience).map(|_| ())
    }

    /// The value of `key` if it is set, without waiting for it (the answer within
    /// `patience`).
    pub fn peek(&mut self, key: &str, patience: Duration) -> Result<Option<Vec<u8>>> {
        let (status, v) = self.request(GET, key, &0u64.to_le_bytes(), patience)?;
        Ok((status != MISSING).then_some(v))
    }

    /// Waits until `key` is set (at most the client's timeout) and returns its value.
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        let ms = self.timeout.as_millis().min(u128::from(u64::MAX)) as u64;
        let (status, v) = self.request(GET, key, &ms.to_le_bytes(), self.timeout + Duration::from_secs(5))?;
        if status == MISSING {
            let refused = if v.is_empty() {
                String::new()
            } else {
                format!("; meanwhile the store refused: {}", String::from_utf8_lossy(&v))
            };
            return Err(Error::Bootstrap(format!(
                "timed out after {:.0} s waiting for '{key}' in the store at {}{refused}",
                self.timeout.as_secs_f64(),
                self.addr
            )));
        }
        Ok(v)
    }

    /// Adds `delta` to the counter `key` (0 if unset); returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let (_, v) = self.request(ADD, key, &delta.to_le_bytes(), Duration::from_secs(30))?;
        let b: [u8; 8] = v
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| Error::Bootstrap("short counter reply".into()))?;
        Ok(i64::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> Auth {
        Auth::new("store-test", "k").unwrap()
    }

    #[test]
    fn set_get_add_and_blocking_get() {
        let srv = StoreServer::start("127.0.0.1:0", auth()).unwrap();
        let addr = srv.addr().to_string();
        let mut a = StoreClient::connect(&addr, &auth(), Duration::from_secs(5)).unwrap();
        a.set("x", b"hello").unwrap();
        assert_eq!(a.get("x").unwrap(), b"hello");
        assert_eq!(a.add("n", 5).unwrap(), 5);
        assert_eq!(a.add("n", -2).unwrap(), 3);
        let addr2 = addr.clone();
        let waiter = std::thread::spawn(move || {
            let mut b = StoreClient::connect(&addr2, &auth(), Duration::from_secs(5)).unwrap();
            b.get("later").unwrap()
        });
        std::thread::sleep(Duration::from_millis(50));
        a.set("later", b"now").unwrap();
        assert_eq!(waiter.join().unwrap(), b"now");
    }

    #[test]
    fn missing_key_times_out_with_its_name() {
        let srv = StoreServer::start("127.0.0.1:0", auth()).unwrap();
        let mut a =
            StoreClient::connect(&srv.addr().to_string(), &auth(), Duration::from_millis(200)).unwrap();
        assert!(a.get("nobody/sets/this").unwrap_err().to_string().contains("nobody/sets/this"));
    }

    #[test]
    fn wrong_secret_cannot_use_the_store_and_waiters_hear_why() {
        let srv = StoreServer::start("127.0.0.1:0", auth()).unwrap();
        let bad = Auth::new("store-test", "other").unwrap();
        let err = StoreClient::connect(&srv.addr().to_string(), &bad, Duration::from_secs(2)).err().unwrap();
        assert!(err.to_string().contains("XCCL_SECRET"), "{err}");
        let mut good =
            StoreClient::connect(&srv.addr().to_string(), &auth(), Duration::from_millis(300)).unwrap();
        let err = good.get("addr/1").unwrap_err().to_string();
        assert!(err.contains("refused") && err.contains("XCCL_SECRET"), "{err}");
    }

    #[test]
    fn oversized_values_are_refused_without_allocating() {
        let srv = StoreServer::start("127.0.0.1:0", auth()).unwrap();
        let mut a = StoreClient::connect(&srv.addr().to_string(), &auth(), Duration::from_secs(2)).unwrap();
        // A raw request claiming a 1 TB value: the server replies BAD and hangs up.
        let mut req = vec![SET];
        req.extend_from_slice(&1u64.to_le_bytes());
        req.push(b'k');
        req.extend_from_slice(&(1u64 << 40).to_le_bytes());
        a.stream.write_all(&req).unwrap();
        let mut status = [0u8; 1];
        a.stream.read_exact(&mut status).unwrap();
        assert_eq!(status[0], BAD);
    }

    #[test]
    fn nobody_listening_is_a_clear_error() {
        let err = StoreClient::connect("127.0.0.1:1", &auth(), Duration::from_millis(100)).err().unwrap();
        assert!(err.to_string().contains("MASTER_ADDR"), "{err}");
    }
}
