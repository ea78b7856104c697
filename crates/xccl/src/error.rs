//! The error type of every fallible xccl call.

use std::sync::Arc;

/// Shorthand for `std::result::Result<T, xccl::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in xccl.
///
/// Errors that happen inside a collective carry `op`, a description of the operation such as
/// `all_reduce #17 (f32 x 1024, sum)`, where `#17` is the operation's sequence number on the
/// communicator (the same on every rank).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something invalid: a buffer of the wrong length, a root or peer
    /// outside the communicator.
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The API call.
        op: &'static str,
        /// What was wrong and what to do.
        msg: String,
    },
    /// A configuration or environment problem (a malformed variable, a missing address).
    #[error("configuration error: {0}")]
    Config(String),
    /// No progress was made before the deadline (`XCCL_TIMEOUT`).
    #[error("{op} on rank {rank} timed out after {secs:.1} s without progress (XCCL_TIMEOUT): {detail}")]
    Timeout {
        /// The operation that timed out.
        op: String,
        /// This rank.
        rank: usize,
        /// How long it waited without progress.
        secs: f64,
        /// Which ranks were not heard from, which were not reading, (where the ranks share
        /// a store) which rank the waiting leads to, and which peers aborted meanwhile.
        detail: String,
        /// The ranks to blame: first where a failure that a peer reported meanwhile began,
        /// then the silent ranks, those the chain of waiting ranks leads to which did not
        /// time out in turn (empty if none was found).
        blamed: Vec<usize>,
    },
    /// A peer disappeared: its process died or its connection closed.
    #[error("{op}: lost rank {peer}: {detail}")]
    PeerLost {
        /// The operation in progress (or `idle`).
        op: String,
        /// The rank that was lost.
        peer: usize,
        /// How it was noticed.
        detail: String,
    },
    /// Two ranks called different collectives (or the same one with different arguments).
    #[error("collective mismatch: rank {rank} called {local}, but rank {peer} called {remote}")]
    Mismatch {
        /// The rank that detected the mismatch.
        rank: usize,
        /// What that rank called.
        local: String,
        /// The other rank.
        peer: usize,
        /// What the other rank called.
        remote: String,
    },
    /// The communicator failed elsewhere: rank `origin` failed first, and this rank heard
    /// of it from `peer` (the same rank, or one that relayed the news).
    #[error("{op}: rank {origin} failed: {reason}{}", relay(*peer, *origin))]
    RemoteAbort {
        /// The operation in progress here.
        op: String,
        /// The rank this rank heard it from.
        peer: usize,
        /// The rank where the failure began.
        origin: usize,
        /// What happened there.
        reason: String,
    },
    /// A peer broke the wire protocol (a garbage, oversized or unexpected frame).
    #[error("{op}: protocol violation by rank {peer}: {detail}")]
    Protocol {
        /// The operation in progress.
        op: String,
        /// The offending rank.
        peer: usize,
        /// What was wrong.
        detail: String,
    },
    /// Connection setup was refused (another job, another protocol version, a wrong secret).
    #[error("handshake with {peer} refused: {detail}")]
    Handshake {
        /// The remote address or rank.
        peer: String,
        /// Why.
        detail: String,
    },
    /// Rendezvous through the key-value store failed.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: Arc<std::io::Error>,
    },
    /// A call into the MPI library failed (the MPI backend, feature `mpi`): MPI's own
    /// description of its error code.
    #[error("{call} failed in the MPI library (error {code}): {detail}")]
    Mpi {
        /// The MPI call and what it was doing.
        call: String,
        /// MPI's error code.
        code: i32,
        /// MPI's description of the code (`MPI_Error_string`).
        detail: String,
    },
    /// The program aborted the communicator ([`Communicator::abort`](crate::Communicator::abort)):
    /// its operations in progress and all later ones fail, and its peers are told.
    #[error("{op}: rank {rank} aborted the communicator: {reason}")]
    Cancelled {
        /// The operation in progress (or the one issued after the abort).
        op: String,
        /// The rank whose program aborted.
        rank: usize,
        /// The program's reason.
        reason: String,
    },
    /// The communicator failed earlier and can no longer be used; the original error.
    #[error("communicator unusable after an earlier failure: {0}")]
    Aborted(Box<Error>),
    /// An internal invariant broke: a bug in xccl. Please report it.
    #[error("internal error (a bug in xccl): {0}")]
    Internal(String),
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source: Arc::new(source) }
    }

    pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument { op, msg: msg.into() }
    }

    /// The rank where this failure began, if it names one: a lost or misbehaving peer, or
    /// the rank an abort started from.
    pub fn culprit(&self) -> Option<usize> {
        match self {
            Error::PeerLost { peer, .. } | Error::Protocol { peer, .. } => Some(*peer),
            Error::RemoteAbort { origin, .. } => Some(*origin),
            Error::Cancelled { rank, .. } => Some(*rank),
            Error::Timeout { blamed, .. } => blamed.first().copied(),
            Error::Aborted(inner) => inner.culprit(),
            _ => None,
        }
    }
}

/// How an abort reached this rank, when it was relayed.
fn relay(peer: usize, origin: usize) -> String {
    if peer == origin { String::new() } else { format!(" (heard from rank {peer})") }
}
