//! [`Saver`]: checkpoints written in the background, on a communicator of their own.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use xccl::Communicator;

use super::{Snapshot, save};
use crate::error::{Error, Result};

/// Writes snapshots in the background on its own communicator, one save at a time.
///
/// The communicator is a duplicate of the training one (`dup_with` its settings): the same
/// ranks, its own stream, so the saves' collectives never interleave with training's, and
/// a [`Communicator`] is `Send + Sync` and made to be used from several threads at once.
/// Each save runs [`save`] on a thread of its own. Every rank submits the same sequence of
/// snapshots; training goes on while they are written (the caller copies the values at the
/// step, so later updates do not change them).
///
/// Dropping a `Saver` waits for the save in flight (without reporting its outcome: call
/// [`wait`](Saver::wait) for that).
pub struct Saver {
    comm: Communicator,
    in_flight: Option<JoinHandle<Result<PathBuf>>>,
}

impl Saver {
    /// A saver for the ranks of `comm`, which it uses on its own thread: a communicator
    /// nothing else uses (a duplicate, `Mesh::world_for_background`), so that saves never
    /// queue behind the training's operations or deadlock with them.
    pub fn new(comm: Communicator) -> Saver {
        Saver { comm, in_flight: None }
    }

    /// Hands over a snapshot to be written into `dir`. Waits first for the previous save to
    /// finish; if that one failed, returns its error and does not start this one (every rank
    /// learns a failure alike, so every rank stops alike).
    pub fn submit(&mut self, dir: &Path, snapshot: Snapshot) -> Result<()> {
        self.wait()?;
        let comm = self.comm.clone();
        let dir = dir.to_path_buf();
        let handle = std::thread::Builder::new()
            .name(format!("dcp-save-{}", comm.rank()))
            .spawn(move || save(&comm, &dir, snapshot))
            .map_err(|e| Error::Thread(format!("cannot start the checkpoint writer: {e}")))?;
        self.in_flight = Some(handle);
        Ok(())
    }

    /// Waits for the save in flight: its step directory, or `None` if there was none.
    pub fn wait(&mut self) -> Result<Option<PathBuf>> {
        match self.in_flight.take() {
            None => Ok(None),
            Some(handle) => match handle.join() {
                Ok(done) => done.map(Some),
                Err(_) => Err(Error::Thread("the checkpoint writer panicked".into())),
            },
        }
    }

    /// Whether a save is still being written.
    pub fn busy(&self) -> bool {
        self.in_flight.as_ref().is_some_and(|h| !h.is_finished())
    }
}

impl Drop for Saver {
    fn drop(&mut self) {
        if let Some(handle) = self.in_flight.take() {
            let _ = handle.join();
        }
    }
}

/// A `Communicator` moves into the writer thread.
const _: fn() = || {
    fn send<T: Send + Sync>() {}
    send::<Communicator>();
};
