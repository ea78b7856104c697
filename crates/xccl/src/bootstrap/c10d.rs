//! PyTorch's key-value store protocol (c10d's `TCPStore`), as a client and as a server.
//!
//! torchrun's agent serves a `TCPStore` at `MASTER_ADDR:MASTER_PORT` and tells its workers
//! to join it (`TORCHELASTIC_USE_AGENT_STORE=True`): [`C10dClient`] is how xccl ranks do.
//! Our own [`StoreServer`](super::StoreServer) also answers this protocol, so a PyTorch
//! process started by `xccl run` (`torch.distributed.TCPStore(..., is_master=False)`, or
//! `init_process_group` with the `env://` defaults) uses the store of the job.
//!
//! The wire format, as PyTorch 2.x speaks it: every request starts with a one-byte query
//! type; strings and byte vectors are a little-endian `u64` length and the bytes; numbers
//! are little-endian. A client opens with `VALIDATE` and the magic number `0x3C85F7CE` (no
//! reply), then `PING` with a 32-bit nonce that the server echoes. `GET` is preceded by a
//! `WAIT` for the key, which the server answers once the key exists.
//!
//! PyTorch's clients put `/` before every key; ours does too, so keys mean the same to both.
//! Our server keeps keys without it, so that the key `k` of an xccl client is the key `k`
//! of a `TCPStore` client.
//!
//! Trust: the protocol has no authentication. Anyone who reaches a store that speaks it can
//! read and write its keys, exactly as with PyTorch's own `TCPStore`; links between ranks
//! stay authenticated by the job's secret (see [`auth`](super::auth)), so a forged address in
//! the store makes the job fail, not talk to a stranger. `XCCL_STORE_C10D=0` makes our
//! store refuse the protocol.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::PoisonError;
use std::time::Duration;

use super::conn::Conn;
use super::keys::{Data, KeyValue, MAX_KEY, MAX_VALUE, Waits, dial, read_exactly};
use crate::error::{Error, Result};

/// The number a client sends after `VALIDATE`.
pub(crate) const MAGIC: u32 = 0x3C85_F7CE;

/// Query types of the protocol (the first byte of every request).
pub(crate) mod query {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
}

/// Replies to `CHECK` and `WAIT`.
const READY: u8 = 0;
const NOT_READY: u8 = 1;
const STOP_WAITING: u8 = 0;
const WAIT_CANCELED: u8 = 1;
/// Most keys in one `CHECK`, `WAIT` or multi request.
const MAX_KEYS: u64 = 1 << 16;
/// The largest reply to one `MULTI_GET`: without a bound, one key of a large value asked for
/// `MAX_KEYS` times would make the server build a reply of a terabyte.
const MAX_REPLY: usize = 4 * MAX_VALUE;

fn bad(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
}

fn read_u8(r: &mut impl Read) -> std::io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// A length-prefixed byte vector of at most `max` bytes (refused before allocating; then
/// allocated as it arrives).
fn read_bytes(r: &mut impl Read, max: usize) -> std::io::Result<Vec<u8>> {
    let len = read_u64(r)?;
    if len > max as u64 {
        return Err(bad(format!("a length of {len} bytes, more than the {max} allowed")));
    }
    read_exactly(r, len)
}

/// A key of a PyTorch client, without the `/` that PyTorch's clients put before every key.
fn read_key(r: &mut impl Read) -> std::io::Result<String> {
    let key = String::from_utf8(read_bytes(r, MAX_KEY)?).map_err(|_| bad("a key that is not UTF-8"))?;
    Ok(match key.strip_prefix('/') {
        Some(k) => k.to_string(),
        None => key,
    })
}

fn read_count(r: &mut impl Read) -> std::io::Result<usize> {
    let n = read_u64(r)?;
    if n > MAX_KEYS {
        return Err(bad(format!("{n} keys in one request, more than the {MAX_KEYS} allowed")));
    }
    Ok(n as usize)
}

fn put_bytes(b: &mut Vec<u8>, v: &[u8]) {
    b.extend_from_slice(&(v.len() as u64).to_le_bytes());
    b.extend_from_slice(v);
}

/// A connection to a store that speaks PyTorch's protocol (torchrun's agent store, a
/// `torch.distributed.TCPStore`, or ours). Every key is used under `prefix`.
pub struct C10dClient {
    stream: Option<TcpStream>,
    addr: String,
    prefix: String,
    timeout: Duration,
}

impl C10dClient {
    /// Connects to the store at `addr` (`host:port`), retrying until `timeout` while nobody
    /// listens yet, and validates the connection; keys are used under `prefix`. `timeout`
    /// also bounds every later `get`.
    pub fn connect(addr: &str, prefix: &str, timeout: Duration) -> Result<C10dClient> {
        let stream = dial(addr, timeout, "is torchrun's agent (or rank 0) running")?;
        let mut client =
            C10dClient { stream: Some(stream), addr: addr.into(), prefix: prefix.into(), timeout };
        client.validate()?;
        Ok(client)
    }

    fn validate(&mut self) -> Result<()> {
        let nonce = std::process::id();
        let mut b = vec![query::VALIDATE];
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.push(query::PING);
        b.extend_from_slice(&nonce.to_le_bytes());
        let echo = self.exchange(&b, Duration::from_secs(30), "the handshake", read_u32)?;
        if echo != nonce {
            return Err(Error::Bootstrap(format!(
                "the store at {} answered the handshake with {echo:#x} instead of {nonce:#x}: it does not \
                 speak PyTorch's TCPStore protocol",
                self.addr
            )));
        }
        Ok(())
    }

    /// The local address of the connection: an address of this host that reaches the store.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.stream
            .as_ref()
            .ok_or_else(|| self.broken())?
            .local_addr()
            .map_err(|e| Error::io("local address", e))
    }

    fn broken(&self) -> Error {
        Error::Bootstrap(format!("the connection to the store at {} failed earlier", self.addr))
    }

    /// Sends `request` and reads the reply with `read`, within `patience`; a failure closes
    /// the connection (a late reply would otherwise answer the next request). `what` is
    /// what the reply was awaited for, for the error.
    fn exchange<T>(
        &mut self,
        request: &[u8],
        patience: Duration,
        what: &str,
        read: impl FnOnce(&mut TcpStream) -> std::io::Result<T>,
    ) -> Result<T> {
        let Some(stream) = self.stream.as_mut() else { return Err(self.broken()) };
        let result = (|| {
            stream.write_all(request)?;
            stream.set_read_timeout(Some(patience.max(Duration::from_millis(1))))?;
            read(stream)
        })();
        result.map_err(|e| {
            if let Some(s) = self.stream.take() {
                let _ = s.shutdown(Shutdown::Both);
            }
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                Error::Bootstrap(format!(
                    "timed out after {:.0} s waiting for {what} from the store at {}",
                    patience.as_secs_f64(),
                    self.addr
                ))
            } else {
                Error::Bootstrap(format!("store at {} failed ({what}): {e}", self.addr))
            }
        })
    }

    fn key(&self, key: &str) -> Result<String> {
        let full = format!("/{}{key}", self.prefix);
        if full.len() > MAX_KEY {
            return Err(Error::Bootstrap(format!("store key longer than {MAX_KEY} bytes: '{full:.60}...'")));
        }
        Ok(full)
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.set_within(key, value, Duration::from_secs(30))
    }

    /// Sets `key` to `value`, failing if the store does not confirm within `patience`.
    pub fn set_within(&mut self, key: &str, value: &[u8], patience: Duration) -> Result<()> {
        if value.len() > MAX_VALUE {
            return Err(Error::Bootstrap(format!("store value of '{key}' larger than {MAX_VALUE} bytes")));
        }
        let mut b = vec![query::SET];
        put_bytes(&mut b, self.key(key)?.as_bytes());
        put_bytes(&mut b, value);
        // No reply: a PING after it tells that the server took it (and keeps errors near).
        b.push(query::PING);
        b.extend_from_slice(&1u32.to_le_bytes());
        let echo = self.exchange(&b, patience, "a set", read_u32)?;
        if echo != 1 {
            return Err(Error::Bootstrap(format!("store at {} answered out of turn", self.addr)));
        }
        Ok(())
    }

    /// Waits until `key` is set (at most the client's timeout) and returns its value.
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        let full = self.key(key)?;
        let mut b = vec![query::WAIT];
        b.extend_from_slice(&1u64.to_le_bytes());
        put_bytes(&mut b, full.as_bytes());
        let waited = self.exchange(&b, self.timeout, &format!("'{full}' to be set"), read_u8)?;
        if waited != STOP_WAITING {
            return Err(Error::Bootstrap(format!("store at {} cancelled the wait for '{full}'", self.addr)));
        }
        let mut b = vec![query::GET];
        put_bytes(&mut b, full.as_bytes());
        self.exchange(&b, Duration::from_secs(30), "a value", |s| read_bytes(s, MAX_VALUE))
    }

    /// Adds `delta` to the counter `key` (0 if unset); returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let mut b = vec![query::ADD];
        put_bytes(&mut b, self.key(key)?.as_bytes());
        b.extend_from_slice(&delta.to_le_bytes());
        let v = self.exchange(&b, Duration::from_secs(30), "a counter", read_u64)?;
        Ok(v as i64)
    }

    /// Whether every key of `keys` is set, without waiting.
    pub fn check(&mut self, keys: &[&str]) -> Result<bool> {
        let mut b = vec![query::CHECK];
        b.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for k in keys {
            put_bytes(&mut b, self.key(k)?.as_bytes());
        }
        Ok(self.exchange(&b, Duration::from_secs(30), "a check", read_u8)? == READY)
    }

    /// The value of `key` if it is set, without waiting for it (each answer within
    /// `patience`).
    pub fn peek(&mut self, key: &str, patience: Duration) -> Result<Option<Vec<u8>>> {
        let mut b = vec![query::CHECK];
        b.extend_from_slice(&1u64.to_le_bytes());
        put_bytes(&mut b, self.key(key)?.as_bytes());
        if self.exchange(&b, patience, "a check", read_u8)? != READY {
            return Ok(None);
        }
        let mut b = vec![query::GET];
        put_bytes(&mut b, self.key(key)?.as_bytes());
        self.exchange(&b, patience, "a value", |s| read_bytes(s, MAX_VALUE)).map(Some)
    }

    /// Deletes `key`; whether it existed.
    pub fn delete(&mut self, key: &str) -> Result<bool> {
        let mut b = vec![query::DELETE_KEY];
        put_bytes(&mut b, self.key(key)?.as_bytes());
        Ok(self.exchange(&b, Duration::from_secs(30), "a delete", read_u64)? > 0)
    }
}

impl KeyValue for C10dClient {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        C10dClient::set(self, key, value)
    }
    fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        C10dClient::get(self, key)
    }
    fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        C10dClient::add(self, key, delta)
    }
}

/// Whether our store serves this protocol (`XCCL_STORE_C10D`, default on).
pub(crate) fn enabled() -> bool {
    !matches!(std::env::var("XCCL_STORE_C10D").as_deref(), Ok("0" | "false" | "off" | "no"))
}

/// Serves one client of PyTorch's protocol on our store's `data`, from its opening
/// `VALIDATE`, until it disconnects or misbehaves (then the connection is closed; the error
/// says why, for the log). A `WAIT` looks every `waits.tick` whether its client gave up.
pub(crate) fn serve(s: &mut impl Conn, data: &Data, waits: Waits) -> std::io::Result<()> {
    if read_u8(s)? != query::VALIDATE || read_u32(s)? != MAGIC {
        return Err(bad("not PyTorch's TCPStore handshake"));
    }
    loop {
        let mut op = [0u8; 1];
        if s.read(&mut op)? == 0 {
            return Ok(());
        }
        let mut reply = Vec::new();
        match op[0] {
            query::PING => reply.extend_from_slice(&read_u32(s)?.to_le_bytes()),
            query::SET => {
                let (k, v) = (read_key(s)?, read_bytes(s, MAX_VALUE)?);
                data.update(|map| {
                    map.insert(k, v);
                });
            }
            query::APPEND => {
                let (k, v) = (read_key(s)?, read_bytes(s, MAX_VALUE)?);
                data.update(|map| {
                    let e = map.entry(k).or_default();
                    if e.len() + v.len() <= MAX_VALUE {
                        e.extend_from_slice(&v);
                    }
                });
            }
            query::MULTI_SET => {
                let n = read_count(s)?;
                let mut pairs = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    pairs.push((read_key(s)?, read_bytes(s, MAX_VALUE)?));
                }
                data.update(|map| map.extend(pairs));
            }
            query::COMPARE_SET => {
                let k = read_key(s)?;
                let (expected, desired) = (read_bytes(s, MAX_VALUE)?, read_bytes(s, MAX_VALUE)?);
                let now = data.update(|map| match map.get(&k) {
                    None if expected.is_empty() => {
                        map.insert(k, desired.clone());
                        desired
                    }
                    None => expected,
                    Some(cur) if *cur == expected => {
                        map.insert(k, desired.clone());
                        desired
                    }
                    Some(cur) => cur.clone(),
                });
                put_bytes(&mut reply, &now);
            }
            query::GET => {
                let k = read_key(s)?;
                let v = data.map.lock().unwrap_or_else(PoisonError::into_inner).get(&k).cloned();
                let Some(v) = v else { return Err(bad(format!("GET of '{k}', which is not set"))) };
                put_bytes(&mut reply, &v);
            }
            query::MULTI_GET => {
                let keys = (0..read_count(s)?).map(|_| read_key(s)).collect::<std::io::Result<Vec<_>>>()?;
                let map = data.map.lock().unwrap_or_else(PoisonError::into_inner);
                for k in &keys {
                    let Some(v) = map.get(k) else {
                        return Err(bad(format!("MULTI_GET of '{k}', which is not set")));
                    };
                    if reply.len() + 8 + v.len() > MAX_REPLY {
                        return Err(bad(format!(
                            "MULTI_GET of {} keys, whose values exceed the {MAX_REPLY} bytes allowed in a reply",
                            keys.len()
                        )));
                    }
                    put_bytes(&mut reply, v);
                }
            }
            query::ADD => {
                let k = read_key(s)?;
                let delta = read_u64(s)? as i64;
                reply.extend_from_slice(&data.add(k, delta).to_le_bytes());
            }
            query::CHECK => {
                let keys = (0..read_count(s)?).map(|_| read_key(s)).collect::<std::io::Result<Vec<_>>>()?;
                let map = data.map.lock().unwrap_or_else(PoisonError::into_inner);
                reply.push(if keys.iter().all(|k| map.contains_key(k)) { READY } else { NOT_READY });
            }
            query::WAIT => {
                let keys = (0..read_count(s)?).map(|_| read_key(s)).collect::<std::io::Result<Vec<_>>>()?;
                reply.push(wait(s, data, &keys, waits.tick)?);
            }
            query::CANCEL_WAIT => reply.push(WAIT_CANCELED),
            query::GETNUMKEYS => {
                let n = data.map.lock().unwrap_or_else(PoisonError::into_inner).len() as i64;
                reply.extend_from_slice(&n.to_le_bytes());
            }
            query::DELETE_KEY => {
                let k = read_key(s)?;
                let gone = data.update(|map| i64::from(map.remove(&k).is_some()));
                reply.extend_from_slice(&gone.to_le_bytes());
            }
            other => return Err(bad(format!("unknown query type {other}"))),
        }
        if !reply.is_empty() {
            s.write_all(&reply)?;
        }
    }
}

/// Blocks until every key of `keys` is set, or the client cancels its wait (it sends
/// `CANCEL_WAIT` when its own timeout passes) or goes away.
fn wait(s: &mut impl Conn, data: &Data, keys: &[String], tick: Duration) -> std::io::Result<u8> {
    let mut map = data.map.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if keys.iter().all(|k| map.contains_key(k)) {
            return Ok(STOP_WAITING);
        }
        map = data.cv.wait_timeout(map, tick).unwrap_or_else(PoisonError::into_inner).0;
        if keys.iter().all(|k| map.contains_key(k)) {
            return Ok(STOP_WAITING);
        }
        // Between ticks, see whether the client spoke (a cancel) or left, without the lock.
        drop(map);
        match s.peek_byte(Duration::ZERO) {
            Ok(None) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(Some(query::CANCEL_WAIT)) => {
                read_u8(s)?;
                return Ok(WAIT_CANCELED);
            }
            Ok(Some(_)) => return Err(bad("a request in the middle of a wait")),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        map = data.map.lock().unwrap_or_else(PoisonError::into_inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{Auth, StoreClient, StoreServer};

    fn server() -> StoreServer {
        StoreServer::start("127.0.0.1:0", Auth::new("c10d-test", "k").unwrap()).unwrap()
    }

    #[test]
    fn a_c10d_client_and_an_xccl_client_share_our_store() {
        let srv = server();
        let addr = srv.addr().to_string();
        let mut c = C10dClient::connect(&addr, "", Duration::from_secs(5)).unwrap();
        let mut x =
            StoreClient::connect(&addr, &Auth::new("c10d-test", "k").unwrap(), Duration::from_secs(5))
                .unwrap();
        c.set("from/torch", b"t").unwrap();
        assert_eq!(x.get("from/torch").unwrap(), b"t");
        x.set("from/xccl", b"x").unwrap();
        assert_eq!(c.get("from/xccl").unwrap(), b"x");
        assert_eq!(c.add("n", 5).unwrap(), 5);
        assert_eq!(c.add("n", -7).unwrap(), -2);
        assert!(c.check(&["from/torch", "from/xccl"]).unwrap());
        assert!(!c.check(&["nobody"]).unwrap());
        assert!(c.delete("from/torch").unwrap());
        assert!(!c.delete("from/torch").unwrap());
        // Looks without waiting, as a rank that timed out reads the others' posts.
        let t = Duration::from_secs(5);
        assert_eq!(c.peek("from/xccl", t).unwrap(), Some(b"x".to_vec()));
        assert_eq!(c.peek("nobody", t).unwrap(), None);
        c.set_within("post", b"1,2", t).unwrap();
        assert_eq!(x.peek("post", t).unwrap(), Some(b"1,2".to_vec()));
        assert_eq!(x.peek("nobody", t).unwrap(), None);
    }

    #[test]
    fn get_blocks_until_set_and_times_out_naming_the_key() {
        let srv = server();
        let addr = srv.addr().to_string();
        let mut a = C10dClient::connect(&addr, "job/", Duration::from_secs(5)).unwrap();
        let addr2 = addr.clone();
        let waiter = std::thread::spawn(move || {
            C10dClient::connect(&addr2, "job/", Duration::from_secs(5)).unwrap().get("later").unwrap()
        });
        std::thread::sleep(Duration::from_millis(100));
        a.set("later", b"now").unwrap();
        assert_eq!(waiter.join().unwrap(), b"now");
        let mut b = C10dClient::connect(&addr, "job/", Duration::from_millis(300)).unwrap();
        let err = b.get("never").unwrap_err().to_string();
        assert!(err.contains("job/never") && err.contains("timed out"), "{err}");
        assert!(b.set("x", b"y").is_err(), "a timed-out connection is closed, not reused out of turn");
    }

    #[test]
    fn oversized_and_truncated_requests_are_refused_without_allocating() {
        let srv = server();
        for req in [
            // SET of a key claiming 1 TB.
            [vec![query::SET], (1u64 << 40).to_le_bytes().to_vec()].concat(),
            // WAIT for 2^40 keys.
            [vec![query::WAIT], (1u64 << 40).to_le_bytes().to_vec()].concat(),
            // An unknown query type.
            vec![99],
            // A SET cut short.
            [vec![query::SET], 5u64.to_le_bytes().to_vec(), b"ab".to_vec()].concat(),
        ] {
            let mut s = TcpStream::connect(srv.addr()).unwrap();
            let mut hello = vec![query::VALIDATE];
            hello.extend_from_slice(&MAGIC.to_le_bytes());
            s.write_all(&hello).unwrap();
            s.write_all(&req).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut rest = Vec::new();
            // The server closes the connection without answering.
            assert!(matches!(s.read_to_end(&mut rest), Ok(0)), "{rest:?}");
        }
        // The store still serves others.
        let mut c = C10dClient::connect(&srv.addr().to_string(), "", Duration::from_secs(5)).unwrap();
        c.set("k", b"v").unwrap();
        assert_eq!(c.get("k").unwrap(), b"v");
    }

    #[test]
    fn a_multi_get_cannot_ask_for_a_reply_larger_than_the_limit() {
        // One large value asked for many times: the server refuses before building the reply
        // (without the limit, 2^16 keys of a 16 MiB value asked for a terabyte).
        let data = Data::default();
        let big = vec![7u8; 1 << 20];
        let mut req = vec![query::VALIDATE];
        req.extend_from_slice(&MAGIC.to_le_bytes());
        req.push(query::SET);
        put_bytes(&mut req, b"/big");
        put_bytes(&mut req, &big);
        let times = (MAX_REPLY >> 20) + 1;
        req.push(query::MULTI_GET);
        req.extend_from_slice(&(times as u64).to_le_bytes());
        for _ in 0..times {
            put_bytes(&mut req, b"/big");
        }
        let mut conn = crate::bootstrap::conn::Replayed::new(&req);
        let waits = crate::bootstrap::keys::WAITS;
        let err = serve(&mut conn, &data, waits).unwrap_err().to_string();
        assert!(err.contains("exceed") && err.contains(&times.to_string()), "{err}");
        assert_eq!(conn.written, 0, "nothing answered");
        // Within the limit, it answers.
        let key = 8 + b"/big".len();
        let mut ok = req[..req.len() - (times - 1) * key].to_vec();
        let at = ok.len() - key - 8;
        ok[at..at + 8].copy_from_slice(&1u64.to_le_bytes());
        let mut conn = crate::bootstrap::conn::Replayed::new(&ok);
        serve(&mut conn, &data, waits).unwrap();
        assert_eq!(conn.written, 8 + big.len());
    }

    #[test]
    fn a_server_that_does_not_speak_the_protocol_is_a_clear_error() {
        // Our store with the protocol turned off is one: it waits for its own handshake.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut b = [0u8; 9];
            s.read_exact(&mut b).unwrap();
            s.write_all(&[0xde, 0xad, 0xbe, 0xef]).unwrap();
        });
        let err = C10dClient::connect(&addr, "", Duration::from_secs(2)).err().unwrap().to_string();
        assert!(err.contains("TCPStore protocol"), "{err}");
        t.join().unwrap();
    }
}
