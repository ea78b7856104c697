//! [`Error`]: everything training can fail with, each saying what to do about it.

use std::path::PathBuf;

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

/// After world rank 0 tried something alone (`attempt` is `Some` there, `None` elsewhere),
/// every rank learns whether it worked and, if not, why: rank 0 gets its own error back,
/// the others an error that carries its message. Nobody then waits for a broadcast that
/// will never come, and every rank reports the reason, even when rank 0's own output is
/// cut short by the launcher stopping the job on the first failure. `what` completes
/// "rank 0 could not …". Collective over `world`.
pub(crate) fn agree_with_root<T>(
    world: &xccl::Communicator,
    what: &str,
    attempt: Option<Result<T>>,
) -> Result<Option<T>> {
    let (value, why) = match attempt {
        Some(Ok(v)) => (Some(v), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let mut text = why.as_ref().map(|e| e.to_string().into_bytes()).unwrap_or_default();
    let mut header = [u64::from(why.is_some()), text.len() as u64];
    world.broadcast(&mut header, 0)?;
    if header[0] == 0 {
        return Ok(value);
    }
    let len = usize::try_from(header[1]).map_err(|_| Error::internal("rank 0's error is too long"))?;
    text.resize(len, 0);
    world.broadcast(&mut text, 0)?;
    match why {
        Some(e) => Err(e),
        None => Err(Error::Thread(format!("rank 0 could not {what}: {}", String::from_utf8_lossy(&text)))),
    }
}
