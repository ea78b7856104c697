//! The job's store as the board where ranks that time out say whom they wait for
//! (`crate::stall`). A fresh connection is made when a rank first times out: the one used
//! to bootstrap is long closed, and the store is outside the links that stalled.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::{Auth, C10dClient, StoreClient};
use crate::stall::{self, Board, NoAnswer};

/// How to reach the job's store again after bootstrap.
#[derive(Clone, Debug)]
pub(crate) enum StoreAddress {
    /// xccl's own store (`host:port`, the job's credentials).
    Ours {
        /// Where.
        addr: String,
        /// The job's id and secret.
        auth: Auth,
    },
    /// A store speaking PyTorch's protocol (torchrun's agent), the job's keys under `prefix`.
    C10d {
        /// Where.
        addr: String,
        /// The prefix of the job's keys.
        prefix: String,
    },
}

enum Client {
    Ours(StoreClient),
    C10d(C10dClient),
}

/// One communicator's board in the job's store.
pub(crate) struct StoreBoard {
    store: StoreAddress,
    /// The communicator, whose ranks the posts name.
    comm: u64,
    size: usize,
    /// The communicator's rank whose process serves the store, if one does.
    server: Option<usize>,
    client: Mutex<Option<Client>>,
}

impl std::fmt::Debug for StoreBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreBoard").field("store", &self.store).field("comm", &self.comm).finish()
    }
}

impl StoreBoard {
    /// The board of communicator `comm` (of `size` ranks) in `store`; `server` is the rank of
    /// the communicator whose process serves the store, if one does.
    pub fn new(store: StoreAddress, comm: u64, size: usize, server: Option<usize>) -> StoreBoard {
        StoreBoard { store, comm, size, server, client: Mutex::new(None) }
    }

    fn key(&self, rank: usize) -> String {
        format!("xccl-stall/{:016x}/{rank}", self.comm)
    }

    /// Runs `f` on a connection to the store (made within `patience` if there is none); a
    /// failure drops the connection.
    fn with<T>(
        &self,
        patience: Duration,
        f: impl FnOnce(&mut Client) -> crate::Result<T>,
    ) -> Result<T, NoAnswer> {
        let mut slot = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            // A refusal means the store's process has ended: say so at once rather than
            // retry as a rank joining a job does.
            let (StoreAddress::Ours { addr, .. } | StoreAddress::C10d { addr, .. }) = &self.store;
            if let Some(a) = addr.to_socket_addrs().ok().and_then(|mut a| a.next())
                && let Err(e) = TcpStream::connect_timeout(&a, patience.max(Duration::from_millis(1)))
            {
                let ended = e.kind() == std::io::ErrorKind::ConnectionRefused;
                return Err(NoAnswer { why: format!("the store at {addr}: {e}"), ended });
            }
            let client = match &self.store {
                StoreAddress::Ours { addr, auth } => {
                    StoreClient::connect(addr, auth, patience).map(Client::Ours)
                }
                StoreAddress::C10d { addr, prefix } => {
                    C10dClient::connect(addr, prefix, patience).map(Client::C10d)
                }
            };
            *slot = Some(client.map_err(|e| NoAnswer::from(e.to_string().as_str()))?);
        }
        let Some(client) = slot.as_mut() else { return Err("no connection to the store".into()) };
        let res = f(client).map_err(|e| NoAnswer::from(e.to_string().as_str()));
        if res.is_err() {
            *slot = None;
        }
        res
    }
}

impl Board for StoreBoard {
    fn post(&self, rank: usize, peers: &[usize], patience: Duration) -> Result<(), NoAnswer> {
        let (key, value) = (self.key(rank), stall::encode(peers));
        self.with(patience, |c| match c {
            Client::Ours(c) => c.set_within(&key, &value, patience),
            Client::C10d(c) => c.set_within(&key, &value, patience),
        })
    }

    fn peek(&self, rank: usize, patience: Duration) -> Result<Option<Vec<usize>>, NoAnswer> {
        let key = self.key(rank);
        let got = self.with(patience, |c| match c {
            Client::Ours(c) => c.peek(&key, patience),
            Client::C10d(c) => c.peek(&key, patience),
        })?;
        got.map(|v| stall::decode(&v, self.size).map_err(|why| NoAnswer::from(why.as_str()))).transpose()
    }

    fn server(&self) -> Option<usize> {
        self.server
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::StoreServer;

    #[test]
    fn posts_go_through_the_store_and_a_missing_post_is_none() {
        let auth = Auth::new("board-test", "k").unwrap();
        let server = StoreServer::start("127.0.0.1:0", auth.clone()).unwrap();
        let store = StoreAddress::Ours { addr: server.addr().to_string(), auth };
        let a = StoreBoard::new(store.clone(), 7, 4, None);
        let b = StoreBoard::new(store.clone(), 7, 4, None);
        let other_comm = StoreBoard::new(store, 8, 4, None);
        let t = Duration::from_secs(5);
        assert_eq!(b.peek(1, t), Ok(None));
        a.post(1, &[2, 3], t).unwrap();
        assert_eq!(b.peek(1, t), Ok(Some(vec![2, 3])));
        assert_eq!(other_comm.peek(1, t), Ok(None));
    }

    #[test]
    fn a_store_that_does_not_answer_is_an_error_within_the_patience() {
        // A listener nobody serves: the connection is accepted by the kernel, the handshake
        // never answered (as with a stopped process).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let auth = Auth::new("board-test", "k").unwrap();
        let store = StoreAddress::Ours { addr: listener.local_addr().unwrap().to_string(), auth };
        let board = StoreBoard::new(store, 7, 4, Some(0));
        let start = std::time::Instant::now();
        let e = board.post(1, &[0], Duration::from_millis(300)).unwrap_err();
        assert!(!e.ended, "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
        // Once nobody listens, the store's process has ended: refused at once.
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let store = StoreAddress::Ours { addr, auth: Auth::new("board-test", "k").unwrap() };
        let start = std::time::Instant::now();
        let e = StoreBoard::new(store, 7, 4, Some(0)).post(1, &[0], Duration::from_secs(2)).unwrap_err();
        assert!(e.ended, "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
    }
}
