//! The connection handshake: magic number, protocol version, job id, and mutual proof of
//! the job secret by HMAC-SHA256 over both sides' random nonces.
//!
//! ```text
//! client → server  "XCCLHELO" version purpose comm from to job nonce_c
//! server → client  "XCCLSRVR" version status message nonce_s HMAC(secret, "server" | transcript)
//! client → server  HMAC(secret, "client" | transcript)
//! server → client  status message
//! ```
//! A peer of another job, of another protocol version or without the secret is refused, and
//! both sides get an error that says which.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::conn::{Conn, NONCE};
use crate::error::{Error, Result};

const HELLO: &[u8; 8] = b"XCCLHELO";
const REPLY: &[u8; 8] = b"XCCLSRVR";
/// Bumped on any incompatible change of the handshake or the wire.
pub(crate) const PROTOCOL_VERSION: u16 = 2;
const MAC: usize = 32;
const MAX_JOB: usize = 256;
const MAX_MSG: usize = 1024;

/// Who may connect: the job's id and its shared secret (empty: no proof required beyond
/// knowing the job id).
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    job: String,
    secret: Vec<u8>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").field("job", &self.job).field("secret", &"<hidden>").finish()
    }
}

impl Auth {
    /// Credentials of job `job` with `secret`.
    pub fn new(job: impl Into<String>, secret: impl Into<Vec<u8>>) -> Result<Auth> {
        let job = job.into();
        if job.len() > MAX_JOB {
            return Err(Error::Config(format!("job id longer than {MAX_JOB} bytes")));
        }
        Ok(Auth { job, secret: secret.into() })
    }

    /// Whether the job has a secret (an empty one is none).
    pub fn has_secret(&self) -> bool {
        !self.secret.is_empty()
    }

    /// Refuses to listen on `ip` where other hosts could connect unless the job has a
    /// secret: without one, anyone who reaches the port could join the job, read its data
    /// and feed it wrong values. `what` names the listener in the error.
    pub fn may_listen(&self, ip: std::net::IpAddr, what: &str) -> Result<()> {
        if ip.is_loopback() || self.has_secret() {
            return Ok(());
        }
        Err(Error::Config(format!(
            "refusing to listen for {what} on {ip}, an address other hosts can reach, without a job secret: \
             anyone reaching the port could join job '{}'. Set XCCL_SECRET to the same random value on every \
             rank (for example `export XCCL_SECRET=$(openssl rand -hex 16)` before launching), or launch with \
             `xccl run`, which makes one; a job on one host can use MASTER_ADDR=127.0.0.1 instead",
            self.job
        )))
    }

    /// The job id.
    pub fn job(&self) -> &str {
        &self.job
    }

    fn mac(&self, role: &[u8], transcript: &[u8]) -> [u8; MAC] {
        let mut m =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret).expect("HMAC takes keys of any length");
        m.update(role);
        m.update(transcript);
        m.finalize().into_bytes().into()
    }
}

/// Why a connection was opened.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A client of the key-value store.
    Store,
    /// A link of communicator `comm` from rank `from` to rank `to`.
    Link { comm: u64, from: u32, to: u32 },
}

fn nonce(s: &mut impl Conn) -> Result<[u8; NONCE]> {
    s.nonce().map_err(|e| Error::Config(e.to_string()))
}

fn io_ctx(peer: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Handshake {
        peer: peer.to_string(),
        detail: format!("connection failed during the handshake: {e}"),
    }
}

fn read_msg(s: &mut impl Conn, peer: &str) -> Result<(u8, String)> {
    let mut head = [0u8; 3];
    s.read_exact(&mut head).map_err(io_ctx(peer))?;
    let len = usize::from(u16::from_le_bytes([head[1], head[2]]));
    if len > MAX_MSG {
        return Err(Error::Handshake { peer: peer.into(), detail: "oversized handshake message".into() });
    }
    let mut msg = vec![0u8; len];
    s.read_exact(&mut msg).map_err(io_ctx(peer))?;
    Ok((head[0], String::from_utf8_lossy(&msg).into_owned()))
}

fn status_bytes(ok: bool, msg: &str) -> Vec<u8> {
    let msg = &msg.as_bytes()[..msg.len().min(MAX_MSG)];
    let mut b = vec![u8::from(!ok)];
    b.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    b.extend_from_slice(msg);
    b
}

/// Runs the client side on a fresh connection to `peer` (a socket, in every real use).
pub(crate) fn client(
    s: &mut impl Conn,
    auth: &Auth,
    purpose: Purpose,
    peer: &str,
    patience: Duration,
) -> Result<()> {
    s.set_patience(Some(patience)).map_err(io_ctx(peer))?;
    let (kind, comm, from, to) = match purpose {
        Purpose::Store => (1u8, 0u64, 0u32, 0u32),
        Purpose::Link { comm, from, to } => (2, comm, from, to),
    };
    let mut hello = HELLO.to_vec();
    hello.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    hello.push(kind);
    hello.extend_from_slice(&comm.to_le_bytes());
    hello.extend_from_slice(&from.to_le_bytes());
    hello.extend_from_slice(&to.to_le_bytes());
    hello.extend_from_slice(&(auth.job.len() as u16).to_le_bytes());
    hello.extend_from_slice(auth.job.as_bytes());
    hello.extend_from_slice(&nonce(s)?);
    s.write_all(&hello).map_err(io_ctx(peer))?;

    let mut head = [0u8; 10];
    s.read_exact(&mut head).map_err(io_ctx(peer))?;
    if &head[..8] != REPLY {
        return Err(Error::Handshake {
            peer: peer.into(),
            detail: "the peer is not an xccl endpoint".into(),
        });
    }
    let version = u16::from_le_bytes([head[8], head[9]]);
    let (status, msg) = read_msg(s, peer)?;
    if status != 0 {
        return Err(Error::Handshake { peer: peer.into(), detail: msg });
    }
    if version != PROTOCOL_VERSION {
        return Err(Error::Handshake {
            peer: peer.into(),
            detail: format!("it speaks protocol version {version}, this build {PROTOCOL_VERSION}"),
        });
    }
    let mut rest = [0u8; NONCE + MAC];
    s.read_exact(&mut rest).map_err(io_ctx(peer))?;
    let mut transcript = hello;
    transcript.extend_from_slice(&rest[..NONCE]);
    // Send our proof even if theirs failed, so that the server can tell its side why.
    let _ = s.write_all(&auth.mac(b"client", &transcript));
    if auth.mac(b"server", &transcript) != rest[NONCE..] {
        return Err(Error::Handshake {
            peer: peer.into(),
            detail: "it could not prove the job secret: XCCL_SECRET differs between the ranks".into(),
        });
    }
    let (status, msg) = read_msg(s, peer)?;
    if status != 0 {
        return Err(Error::Handshake { peer: peer.into(), detail: msg });
    }
    s.set_patience(None).map_err(io_ctx(peer))?;
    Ok(())
}

/// Runs the server side on an accepted connection from `peer` (a socket, in every real use);
/// returns what the client wants.
pub(crate) fn server(s: &mut impl Conn, auth: &Auth, peer: &str, patience: Duration) -> Result<Purpose> {
    s.set_patience(Some(patience)).map_err(io_ctx(peer))?;
    let mut head = [0u8; 29];
    s.read_exact(&mut head[..8]).map_err(io_ctx(peer))?;
    if &head[..8] != HELLO {
        return Err(Error::Handshake {
            peer: peer.into(),
            detail: "not an xccl client (bad magic); connection dropped".into(),
        });
    }
    s.read_exact(&mut head[8..]).map_err(io_ctx(peer))?;
    let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let version = u16::from_le_bytes([head[8], head[9]]);
    let kind = head[10];
    let mut c = [0u8; 8];
    c.copy_from_slice(&head[11..19]);
    let comm = u64::from_le_bytes(c);
    let (from, to) = (u32_at(19), u32_at(23));
    let job_len = usize::from(u16::from_le_bytes([head[27], head[28]]));
    if job_len > MAX_JOB {
        return Err(Error::Handshake {
            peer: peer.into(),
            detail: "oversized job id; connection dropped".into(),
        });
    }
    let mut rest = vec![0u8; job_len + NONCE];
    s.read_exact(&mut rest).map_err(io_ctx(peer))?;
    let job = String::from_utf8_lossy(&rest[..job_len]).into_owned();
    let mut hello = head.to_vec();
    hello.extend_from_slice(&rest);

    let refusal = if version != PROTOCOL_VERSION {
        Some(format!("it speaks protocol version {PROTOCOL_VERSION}, the client {version}"))
    } else if job != auth.job {
        Some(format!("it belongs to job '{}', the client to job '{job}'", auth.job))
    } else if !matches!(kind, 1 | 2) {
        Some(format!("unknown connection purpose {kind}"))
    } else {
        None
    };
    let mut reply = REPLY.to_vec();
    reply.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    if let Some(why) = refusal {
        reply.extend_from_slice(&status_bytes(false, &why));
        let _ = s.write_all(&reply);
        return Err(Error::Handshake { peer: peer.into(), detail: why });
    }
    reply.extend_from_slice(&status_bytes(true, ""));
    let ns = nonce(s)?;
    let mut transcript = hello;
    transcript.extend_from_slice(&ns);
    reply.extend_from_slice(&ns);
    reply.extend_from_slice(&auth.mac(b"server", &transcript));
    s.write_all(&reply).map_err(io_ctx(peer))?;
    let mut proof = [0u8; MAC];
    s.read_exact(&mut proof).map_err(io_ctx(peer))?;
    if auth.mac(b"client", &transcript) != proof {
        let why = "the client could not prove the job secret: XCCL_SECRET differs between the ranks";
        let _ = s.write_all(&status_bytes(false, why));
        return Err(Error::Handshake { peer: peer.into(), detail: why.into() });
    }
    s.write_all(&status_bytes(true, "")).map_err(io_ctx(peer))?;
    s.set_patience(None).map_err(io_ctx(peer))?;
    Ok(if kind == 1 { Purpose::Store } else { Purpose::Link { comm, from, to } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    fn pair(server_auth: Auth, client_auth: Auth) -> (Result<Purpose>, Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            server(&mut s, &server_auth, "client", Duration::from_secs(5))
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let purpose = Purpose::Link { comm: 7, from: 3, to: 1 };
        let cres = client(&mut c, &client_auth, purpose, "server", Duration::from_secs(5));
        (srv.join().unwrap(), cres)
    }

    #[test]
    fn listening_beyond_loopback_needs_a_secret() {
        let open = Auth::new("j", "").unwrap();
        let closed = Auth::new("j", "s3cret").unwrap();
        let lan: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        assert!(open.may_listen("127.0.0.1".parse().unwrap(), "x").is_ok());
        assert!(open.may_listen("::1".parse().unwrap(), "x").is_ok());
        let e = open.may_listen(lan, "its store").unwrap_err().to_string();
        assert!(e.contains("XCCL_SECRET") && e.contains("10.1.2.3") && e.contains("its store"), "{e}");
        assert!(
            open.may_listen("0.0.0.0".parse().unwrap(), "x").is_err(),
            "every address is beyond loopback"
        );
        assert!(closed.may_listen(lan, "x").is_ok());
        // The listeners themselves refuse, before binding anything.
        let e = crate::bootstrap::StoreServer::start("0.0.0.0:0", open.clone()).err().unwrap().to_string();
        assert!(e.contains("XCCL_SECRET"), "{e}");
        assert!(crate::bootstrap::StoreServer::start("0.0.0.0:0", closed).is_ok());
        let e = crate::bootstrap::mesh::Acceptor::start("0.0.0.0".parse().unwrap(), open)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("XCCL_SECRET"), "{e}");
    }

    #[test]
    fn same_job_and_secret_connect() {
        let a = Auth::new("job", "s3cret").unwrap();
        let (s, c) = pair(a.clone(), a);
        assert_eq!(s.unwrap(), Purpose::Link { comm: 7, from: 3, to: 1 });
        c.unwrap();
    }

    #[test]
    fn wrong_secret_is_refused_on_both_sides() {
        let (s, c) = pair(Auth::new("job", "right").unwrap(), Auth::new("job", "wrong").unwrap());
        assert!(s.is_err());
        assert!(c.unwrap_err().to_string().contains("XCCL_SECRET"));
    }

    #[test]
    fn other_job_is_refused_with_both_names() {
        let (s, c) = pair(Auth::new("alpha", "x").unwrap(), Auth::new("beta", "x").unwrap());
        assert!(s.is_err());
        let msg = c.unwrap_err().to_string();
        assert!(msg.contains("alpha") && msg.contains("beta"), "{msg}");
    }

    #[test]
    fn garbage_client_is_dropped() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            server(&mut s, &Auth::new("j", "").unwrap(), "client", Duration::from_secs(5))
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(srv.join().unwrap().unwrap_err().to_string().contains("bad magic"));
    }
}
