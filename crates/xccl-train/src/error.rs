//! [`Error`]: everything training can fail with, each saying what to do about it.

use std::path::PathBuf;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A training failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed (shapes, dtypes, autograd).
    #[error("tensor computation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    /// A collective or the communicator failed (a peer died, a deadline passed, ...).
    #[error("communication failed: {0}")]
    Comm(#[from] xccl::Error),
    /// The configuration cannot work; the message says which setting to change.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The training data cannot be used.
    #[error("training data {path}: {msg}")]
    Data {
        /// The file.
        path: PathBuf,
        /// What is wrong with it and what to do.
        msg: String,
    },
    /// A checkpoint cannot be written, read or used.
    #[error("checkpoint {path}: {msg}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// A helper thread of this rank failed or panicked.
    #[error("{0}")]
    Thread(String),
    /// A broken internal invariant (a bug: please report it).
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io { what, path: path.into(), source }
    }

    /// An [`Error::Internal`].
    pub(crate) fn internal(msg: impl Into<String>) -> Error {
        Error::Internal(msg.into())
    }

    /// An [`Error::Config`].
    pub(crate) fn config(msg: impl Into<String>) -> Error {
        Error::Config(msg.into())
    }
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// After every rank tried something of its own (`attempt`), every rank learns whether all
/// succeeded and, if not, why: a rank that failed gets its own error back, the others an
/// error that carries the message of the lowest rank that failed. Nobody then waits for a
/// collective a failed rank will never join, and every rank reports the reason, even when
/// the failed rank's own output is cut short by the launcher stopping the job on the first
/// failure. `what` completes "rank R could not …". Collective over `world`.
pub(crate) fn agree_all<T>(world: &xccl::Communicator, what: &str, attempt: Result<T>) -> Result<T> {
    let size = world.size() as u64;
    let mut first = [if attempt.is_err() { world.rank() as u64 } else { size }];
    world.all_reduce(&mut first, xccl::ReduceOp::Min)?;
    if first[0] == size {
        return attempt;
    }
    let root = usize::try_from(first[0]).map_err(|_| Error::internal("rank out of range"))?;
    let mut text = match &attempt {
        Err(e) if world.rank() == root => e.to_string().into_bytes(),
        _ => Vec::new(),
    };
    let mut len = [text.len() as u64];
    world.broadcast(&mut len, root)?;
    let len = usize::try_from(len[0]).map_err(|_| Error::internal("error message too long"))?;
    text.resize(len, 0);
    world.broadcast(&mut text, root)?;
    match attempt {
        Err(e) => Err(e),
        Ok(_) => {
            Err(Error::Thread(format!("rank {root} could not {what}: {}", String::from_utf8_lossy(&text))))
        }
    }
}

/// After world rank 0 tried something alone (`attempt` is `Some` there, `None` elsewhere),
/// every rank learns whether it worked and, if not, why ([`agree_all`]).
pub(crate) fn agree_with_root<T>(
    world: &xccl::Communicator,
    what: &str,
    attempt: Option<Result<T>>,
) -> Result<Option<T>> {
    agree_all(world, what, attempt.transpose())
}

/// Gathers every rank's `value` to rank 0 with the communicator's own collectives (an
/// all-gather of the sizes, then a gather of the padded JSON bytes). Rank 0 gets them in
/// rank order (an entry is the text's parse error if it cannot be read back); the others
/// `None`.
pub(crate) fn gather_json<T: Serialize + DeserializeOwned>(
    comm: &xccl::Communicator,
    value: &T,
) -> Result<Option<Vec<std::result::Result<T, String>>>> {
    let bytes = serde_json::to_vec(value).map_err(|e| Error::internal(format!("cannot encode: {e}")))?;
    let mut lens = vec![0u64; comm.size()];
    comm.all_gather(&[bytes.len() as u64], &mut lens)?;
    let max = lens.iter().copied().max().unwrap_or(0) as usize;
    let mut padded = bytes;
    padded.resize(max, 0);
    let mut all = if comm.rank() == 0 { vec![0u8; max * comm.size()] } else { Vec::new() };
    comm.gather(&padded, &mut all, 0)?;
    if comm.rank() != 0 {
        return Ok(None);
    }
    let values = lens
        .iter()
        .enumerate()
        .map(|(r, &len)| {
            serde_json::from_slice(&all[r * max..r * max + len as usize]).map_err(|e| e.to_string())
        })
        .collect();
    Ok(Some(values))
}
