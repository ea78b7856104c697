//! Distributed checkpoints: every rank writes the pieces of the global tensors it holds to
//! its own file, rank 0 commits them with one metadata file, and any mesh reads any piece
//! back (the idea of PyTorch's distributed checkpoint and Megatron's `dist_checkpointing`).
//!
//! # Model
//!
//! A checkpoint holds named global `f32` tensors with their global shapes: parameters
//! `param.<name>` (e.g. `param.h00.attn.qkv.weight`) and optimiser state
//! `optim.<state>.<name>` (`optim.m.…`, `optim.v.…`, `optim.momentum.…`), as the
//! single-file [`checkpoint`](crate::checkpoint) names them. Each rank holds [`Piece`]s of
//! some of them: a box of the tensor (a tensor-parallel shard), and of that box a flat range
//! (a ZeRO shard of a flat vector). A [`Snapshot`] is what one rank contributes: the list of
//! tensors (the same on every rank), its pieces with their values, and `extra` JSON entries
//! (fingerprint, loss history, mesh, …). Pieces of different ranks may overlap only where
//! their values are equal (replicated copies): a piece several ranks hold identically is
//! written once, by the lowest rank.
//!
//! # Writing
//!
//! [`save`] is collective. Rank 0 prepares `DIR/step-N.partial/`; every rank writes its
//! pieces to `rank-RRRRR.safetensors` there and fsyncs it; the ranks tell rank 0 what they
//! wrote; rank 0 writes `metadata.json`, fsyncs, renames `step-N.partial` to `step-N`,
//! fsyncs `DIR`, replaces `DIR/latest` (a temporary file, a rename, an fsync of `DIR`), then
//! removes every other `step-*` directory (older checkpoints, stale `.partial` ones). Then
//! every rank learns whether it worked, so no rank goes on believing a failed save
//! succeeded. [`Saver`] does the same in the background on its own communicator.
//!
//! ```text
//! DIR/latest                          "step-00000010\n": the checkpoint to read
//! DIR/step-00000010/metadata.json     step, tensors and shapes, for each file its pieces
//!                                     and their keys, extra, format and version
//! DIR/step-00000010/rank-00000.safetensors
//! DIR/step-00000010/rank-00001.safetensors   (a rank with nothing to write has no file)
//! DIR/step-00000020.partial/          a save in progress, or one a crash interrupted
//! ```
//!
//! A crash of any rank at any point leaves the previous checkpoint readable: [`Reader`]
//! follows `latest`, which is replaced only once the new directory is complete and durable,
//! and never looks at `.partial` directories. Saving the same step again replaces it: the
//! new directory takes the old one's name in one atomic exchange (`renameat2`'s
//! `RENAME_EXCHANGE`; on a file system without it, the old directory is renamed away first,
//! which leaves a moment where `latest` names a missing directory). Every rank must see the
//! same `DIR` (one machine, or a shared file system).
//!
//! The bytes are deterministic: the same snapshots give identical files. `metadata.json` is
//! built from structs and ordered maps; a shard file is a safetensors file without
//! `__metadata__`, its pieces stored under the key `<tensor>#<j>` (the `j`-th piece of
//! that tensor in the file), with the box's shape when the piece holds its whole box and
//! flat (`[len]`) otherwise.
//!
//! # Reading
//!
//! [`Reader::open`] reads the metadata and maps the files; [`Reader::read`] assembles any
//! piece of any tensor from the stored pieces that overlap it, touching only their bytes,
//! so a checkpoint written by one mesh is read by another (resharding). The copy between
//! pieces works in runs along the last dimension ([`Piece::overlap`]).
//!
//! # Tensor-parallel shards
//!
//! [`shard_pieces`] cuts a rank's local tensor under a [`Shard`](crate::params::Shard) into
//! pieces of the global tensor (padding left out), [`read_shard`] reads it back, whatever
//! mesh wrote the checkpoint. A ZeRO shard of such a tensor is a flat range of one of its
//! boxes ([`Piece::with_flat`]).
//!
//! # Fault injection
//!
//! For tests of crashes mid-save: when the environment variable
//! `XCCL_DCP_CRASH_AFTER_SHARD` ([`CRASH_AFTER_SHARD`]) is set to a rank, that rank calls
//! `std::process::abort()` right after writing its shard file (before rank 0 commits).

mod piece;
mod read;
mod saver;
mod shard;
mod write;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use piece::{Piece, copy_overlap};
pub use read::Reader;
pub use saver::Saver;
pub use shard::{read_shard, shard_boxes, shard_pieces};
pub use write::{save, write_atomically};

/// The `format` entry of `metadata.json`.
pub const FORMAT: &str = "xccl-dcp";
/// The version of the format this code writes and reads.
pub const VERSION: u32 = 1;
/// The metadata file's name inside a step directory.
pub const METADATA: &str = "metadata.json";
/// The file naming the current step directory, inside the checkpoint directory.
pub const LATEST: &str = "latest";
/// Fault injection for tests: the rank this variable names aborts the process right after
/// writing its shard file.
pub const CRASH_AFTER_SHARD: &str = "XCCL_DCP_CRASH_AFTER_SHARD";

/// What one rank contributes to a checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Steps done.
    pub step: u64,
    /// Every tensor of the checkpoint with its global shape (the same list on every rank).
    pub tensors: Vec<(String, Vec<usize>)>,
    /// This rank's pieces and their values (may be empty). Pieces of different ranks may
    /// overlap only where their values are equal (replicated copies); identical pieces are
    /// written once (the lowest rank's), partially overlapping ones each, and a reader takes
    /// either.
    pub pieces: Vec<(Piece, Vec<f32>)>,
    /// Anything else the run records (fingerprint, loss history, mesh, optimiser step),
    /// kept as JSON in the metadata. Rank 0's is written; other ranks' are ignored.
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// The contents of `metadata.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`] of the writer.
    pub version: u32,
    /// Steps done.
    pub step: u64,
    /// Every tensor with its global shape, in the snapshot's order.
    pub tensors: Vec<(String, Vec<usize>)>,
    /// The shard files, by rank.
    pub files: Vec<FileRecord>,
    /// The snapshot's `extra` entries.
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// One shard file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Its name in the step directory (`rank-00003.safetensors`).
    pub name: String,
    /// The rank that wrote it.
    pub rank: usize,
    /// Its size.
    pub bytes: u64,
    /// The pieces it holds, each under its safetensors key.
    pub pieces: Vec<StoredPiece>,
}

/// A piece in a shard file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPiece {
    /// Its key in the safetensors file.
    pub key: String,
    /// What it holds.
    #[serde(flatten)]
    pub piece: Piece,
}

/// The step directory's name: `step-00000010`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// A rank's shard file's name: `rank-00003.safetensors`.
pub fn shard_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.safetensors")
}

/// Whether `name` is a step directory's name or one of its stages (`step-<digits>` followed
/// by nothing or by `.` and anything: `.partial`).
fn is_step_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("step-") else { return false };
    let digits = rest.split('.').next().unwrap_or_default();
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// An [`Error::Checkpoint`](crate::Error::Checkpoint) about `path`.
fn bad(path: &Path, msg: impl Into<String>) -> crate::Error {
    crate::Error::Checkpoint { path: path.to_path_buf(), msg: msg.into() }
}

/// The step directory `dir/latest` names, checked to be a plain step name.
fn latest_step_dir(dir: &Path) -> crate::Result<Option<PathBuf>> {
    let latest = dir.join(LATEST);
    let text = match std::fs::read_to_string(&latest) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(crate::Error::io("cannot read", latest, e)),
    };
    let name = text.trim();
    if !is_step_name(name) || name.contains(['/', '.']) {
        return Err(bad(&latest, format!("names '{name}', not a step directory such as step-00000010")));
    }
    Ok(Some(dir.join(name)))
}
