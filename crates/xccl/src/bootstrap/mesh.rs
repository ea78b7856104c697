//! Building a full mesh of authenticated TCP links among the members of a communicator.
//!
//! Each rank runs one [`Acceptor`]: a listener whose thread authenticates incoming
//! connections and files them under (communicator, to, from) until the communicator being
//! built claims them. Rank `i` connects to every lower rank and waits for every higher one,
//! so each pair is connected exactly once. Sub-communicators reuse the same acceptors and
//! addresses, so splitting needs no store.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::auth::{self, Auth, Purpose};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::Link;
use crate::transport::tcp::{LastWords, TcpLink};

const HANDSHAKE_PATIENCE: Duration = Duration::from_secs(10);

type Key = (u64, u32, u32);

#[derive(Default)]
struct Arrivals {
    links: Mutex<HashMap<Key, TcpStream>>,
    cv: Condvar,
    /// The last connections refused at the handshake, and why: what a rank that waits in
    /// vain for a peer reports (a peer with another secret, another job, another version).
    refusals: Mutex<Vec<String>>,
}

/// Refusals an acceptor remembers.
const REFUSALS: usize = 4;

/// A rank's listener for links of all its communicators; stops when dropped.
pub(crate) struct Acceptor {
    addr: SocketAddr,
    arrivals: Arc<Arrivals>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    /// Listens on `ip` (any free port) for links of `auth`'s job.
    pub fn start(ip: std::net::IpAddr, auth: Auth) -> Result<Acceptor> {
        auth.may_listen(ip, "the links of its ranks")?;
        let listener = TcpListener::bind((ip, 0)).map_err(|e| Error::io(format!("listening on {ip}"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("listener address", e))?;
        let arrivals = Arc::new(Arrivals::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (arr2, stop2) = (arrivals.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("xccl-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(mut s) = conn else { continue };
                    let (arrivals, auth) = (arr2.clone(), auth.clone());
                    let _ = std::thread::Builder::new().name("xccl-handshake".into()).spawn(move || {
                        let peer = s.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
                        match auth::server(&mut s, &auth, &peer, HANDSHAKE_PATIENCE) {
                            Ok(Purpose::Link { comm, from, to }) => {
                                arrivals
                                    .links
                                    .lock()
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .insert((comm, to, from), s);
                                arrivals.cv.notify_all();
                            }
                            Ok(Purpose::Store) => {
                                tracing::warn!("{peer} asked a rank for the store; dropped")
                            }
                            Err(e) => {
                                tracing::warn!("refused a connection: {e}");
                                let mut r = arrivals.refusals.lock().unwrap_or_else(PoisonError::into_inner);
                                if r.len() == REFUSALS {
                                    r.remove(0);
                                }
                                r.push(format!("a connection from {peer} was refused: {e}"));
                            }
                        }
                    });
                }
            })
            .map_err(|e| Error::io("starting the acceptor", e))?;
        Ok(Acceptor { addr, arrivals, stop, thread: Some(thread) })
    }

    /// Where peers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connections refused lately, as a clause for an error ("" if none).
    fn refused(&self) -> String {
        let r = self.arrivals.refusals.lock().unwrap_or_else(PoisonError::into_inner);
        if r.is_empty() { String::new() } else { format!("; meanwhile {}", r.join("; ")) }
    }

    /// Waits for the link of `comm` from rank `from` to rank `to`.
    fn claim(&self, comm: u64, to: u32, from: u32, deadline: Instant) -> Option<TcpStream> {
        let mut links = self.arrivals.links.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(s) = links.remove(&(comm, to, from)) {
                return Some(s);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            links = self.arrivals.cv.wait_timeout(links, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects rank `me` of communicator `comm` to the members that have an address in `addrs`
/// (the acceptor of member `r`, or `None` for members reached another way, and for `me`).
/// `words` gives each link the format of its stream's last words.
pub(crate) fn connect(
    acceptor: &Acceptor,
    auth: &Auth,
    comm: u64,
    me: usize,
    addrs: &[Option<SocketAddr>],
    config: &Config,
    words: &dyn Fn() -> Box<dyn LastWords>,
) -> Result<Vec<Option<Box<dyn Link>>>> {
    let (max_frame, timeout, liveness) = (config.tcp_segment, config.timeout, config.link_timeout);
    let deadline = Instant::now() + timeout;
    let mut links: Vec<Option<Box<dyn Link>>> = (0..addrs.len()).map(|_| None).collect();
    for (peer, addr) in addrs.iter().enumerate().take(me) {
        let Some(addr) = addr else { continue };
        let mut delay = Duration::from_millis(5);
        let mut s = loop {
            match TcpStream::connect_timeout(addr, Duration::from_secs(2)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::Bootstrap(format!(
                        "rank {me} could not connect to rank {peer} at {addr}: {e}"
                    )));
                }
                Err(_) => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
            }
        };
        let purpose = Purpose::Link { comm, from: me as u32, to: peer as u32 };
        auth::client(
            &mut s,
            auth,
            purpose,
            &format!("rank {peer} at {addr}"),
            HANDSHAKE_PATIENCE.min(timeout),
        )?;
        links[peer] = Some(Box::new(
            TcpLink::new(s, words(), max_frame, liveness).map_err(|e| Error::io("configuring a link", e))?,
        ));
    }
    for (peer, slot) in links.iter_mut().enumerate().skip(me + 1) {
        if addrs[peer].is_none() {
            continue;
        }
        let s = acceptor.claim(comm, me as u32, peer as u32, deadline).ok_or_else(|| {
            Error::Bootstrap(format!(
                "rank {me} waited {:.0} s for rank {peer} to connect: it has not started, failed, or cannot reach {}{}",
                timeout.as_secs_f64(),
                acceptor.addr(),
                acceptor.refused()
            ))
        })?;
        *slot = Some(Box::new(
            TcpLink::new(s, words(), max_frame, liveness).map_err(|e| Error::io("configuring a link", e))?,
        ));
    }
    Ok(links)
}
