//! [`save`]: each rank's shard file and rank 0's commit (metadata, rename, `latest`,
//! clean-up), with every rank learning the outcome.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, View};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use xccl::Communicator;

use super::piece::first_gap;
use super::{
    CRASH_AFTER_SHARD, FORMAT, FileRecord, LATEST, METADATA, Metadata, Piece, Snapshot, StoredPiece, VERSION,
    bad, is_step_name, shard_file_name, step_dir_name,
};
use crate::error::{Error, Result, agree_with_root, gather_json};

/// What a rank tells rank 0 before writing: the pieces it holds, or why it cannot save.
#[derive(Serialize, Deserialize)]
enum Plan {
    Ready {
        /// A hash of the snapshot's list of tensors (it must be rank 0's).
        tensors: u64,
        pieces: Vec<Piece>,
    },
    Failed(String),
}

/// What a rank tells rank 0 after writing.
#[derive(Serialize, Deserialize)]
enum Written {
    File { bytes: u64 },
    Nothing,
    Failed(String),
}

/// Writes a checkpoint of `snapshot` (each rank's) into `dir` and makes it the one
/// `dir/latest` names; returns its step directory. Collective over every rank of `comm`:
/// every rank gets the same outcome (a rank whose own part failed gets its own error, the
/// others rank 0's account of it). See the [module](super) documentation for the layout and
/// why a crash at any point leaves the previous checkpoint readable.
pub fn save(comm: &Communicator, dir: &Path, snapshot: Snapshot) -> Result<PathBuf> {
    let (rank, root) = (comm.rank(), comm.rank() == 0);
    let step_dir = dir.join(step_dir_name(snapshot.step));
    let partial = dir.join(format!("{}.partial", step_dir_name(snapshot.step)));

    // 1. Every rank checks its snapshot; rank 0 prepares the directory; rank 0 learns every
    //    rank's pieces and decides which ones each writes.
    let check = check(&snapshot);
    let mut plan = match &check {
        Ok(()) => Plan::Ready {
            tensors: hash(&serde_json::to_vec(&snapshot.tensors).unwrap_or_default()),
            pieces: snapshot.pieces.iter().map(|(p, _)| p.clone()).collect(),
        },
        Err(msg) => Plan::Failed(msg.clone()),
    };
    if root && let Err(e) = prepare(dir, &partial) {
        plan = Plan::Failed(e.to_string());
    }
    let plans = gather_json(comm, &plan)?;
    let decision = plans.as_ref().map(|plans| {
        decide(&snapshot.tensors, plans).map_err(|msg| {
            let _ = std::fs::remove_dir_all(&partial);
            bad(dir, msg)
        })
    });
    let agreed = agree_with_root(comm, "start the checkpoint", decision);
    let keep: Vec<Vec<bool>> = match agreed {
        Ok(keep) => broadcast_json(comm, keep.as_ref())?,
        Err(e) => return Err(check.err().map_or(e, |msg| bad(dir, msg))),
    };
    let mine = keep.get(rank).ok_or_else(|| Error::internal("rank 0 decided nothing for this rank"))?;
    let pieces: Vec<(&Piece, &[f32])> =
        snapshot.pieces.iter().zip(mine).filter(|(_, k)| **k).map(|((p, v), _)| (p, v.as_slice())).collect();

    // 2. Every rank writes its shard file and tells rank 0 how it went.
    let written = if pieces.is_empty() { Ok(None) } else { write_shard(&partial, rank, &pieces).map(Some) };
    if std::env::var(CRASH_AFTER_SHARD).ok().and_then(|v| v.trim().parse::<usize>().ok()) == Some(rank) {
        eprintln!("{CRASH_AFTER_SHARD}={rank}: rank {rank} aborts after writing its shard file");
        std::process::abort();
    }
    let status = match &written {
        Ok(Some(bytes)) => Written::File { bytes: *bytes },
        Ok(None) => Written::Nothing,
        Err(e) => Written::Failed(e.to_string()),
    };
    let statuses = gather_json(comm, &status)?;

    // 3. Rank 0 commits; everybody learns whether it worked.
    let attempt = match (statuses, plans) {
        (Some(statuses), Some(plans)) => {
            let commit = Commit { dir, partial: &partial, step_dir: &step_dir, snapshot: &snapshot };
            let done = commit.run(&plans, &keep, &statuses);
            if done.is_err() {
                let _ = std::fs::remove_dir_all(&partial);
            }
            Some(done)
        }
        _ => None,
    };
    match agree_with_root(comm, "commit the checkpoint", attempt) {
        Ok(_) => Ok(step_dir),
        Err(e) => Err(written.err().unwrap_or(e)),
    }
}

/// The snapshot's own consistency: unique tensor names, pieces of listed tensors inside
/// their shapes, as many values as elements.
fn check(snapshot: &Snapshot) -> std::result::Result<(), String> {
    let mut shapes = HashMap::new();
    for (name, shape) in &snapshot.tensors {
        if shapes.insert(name.as_str(), shape.as_slice()).is_some() {
            return Err(format!("tensor {name} is listed twice"));
        }
    }
    for (piece, values) in &snapshot.pieces {
        let shape = shapes
            .get(piece.tensor.as_str())
            .ok_or_else(|| format!("piece {piece} of tensor {}: no such tensor in the list", piece.tensor))?;
        piece.validate(shape)?;
        if values.len() != piece.len() {
            return Err(format!(
                "piece {piece} of tensor {} has {} values for {} elements",
                piece.tensor,
                values.len(),
                piece.len()
            ));
        }
    }
    Ok(())
}

/// FNV-1a, 64 bits.
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Rank 0's decision from every rank's plan: which pieces each rank writes (the first copy
/// of identical pieces; none of the empty ones), once every rank is ready, lists the same
/// tensors, and every element of every tensor is held by some rank.
fn decide(
    tensors: &[(String, Vec<usize>)],
    plans: &[std::result::Result<Plan, String>],
) -> std::result::Result<Vec<Vec<bool>>, String> {
    let mut failed = Vec::new();
    let mut ready = Vec::new();
    for (r, plan) in plans.iter().enumerate() {
        match plan {
            Ok(Plan::Ready { tensors, pieces }) => ready.push((r, *tensors, pieces)),
            Ok(Plan::Failed(msg)) => failed.push(format!("rank {r}: {msg}")),
            Err(msg) => failed.push(format!("rank {r} sent an unreadable plan: {msg}")),
        }
    }
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    let ours = ready.first().map(|(_, t, _)| *t);
    if let Some((r, _, _)) = ready.iter().find(|(_, t, _)| Some(*t) != ours) {
        return Err(format!(
            "rank {r}'s list of tensors differs from rank 0's (it must be the same on every rank)"
        ));
    }
    let index: HashMap<&str, usize> = tensors.iter().enumerate().map(|(i, (n, _))| (n.as_str(), i)).collect();
    let mut seen = HashSet::new();
    let mut covered = vec![Vec::new(); tensors.len()];
    let mut keep = Vec::with_capacity(ready.len());
    for (_, _, pieces) in &ready {
        let mut k = Vec::with_capacity(pieces.len());
        for p in pieces.iter() {
            let new = !p.is_empty() && seen.insert(p);
            if new && let Some(&t) = index.get(p.tensor.as_str()) {
                let whole = Piece::whole(&p.tensor, &tensors[t].1);
                p.overlap(&whole, |_, at, n| covered[t].push((at, at + n)));
            }
            k.push(new);
        }
        keep.push(k);
    }
    for ((name, shape), covered) in tensors.iter().zip(&mut covered) {
        let whole = Piece::whole(name, shape);
        if let Some(at) = first_gap(covered, whole.len()) {
            let idx = super::piece::global_index(&whole, shape, at);
            return Err(format!(
                "element {idx:?} of tensor {name} (shape {shape:?}) is in no rank's pieces: every element of \
                 every listed tensor must be"
            ));
        }
    }
    Ok(keep)
}

/// Rank 0: `dir` exists, and `partial` is a new empty directory (a stale one removed).
fn prepare(dir: &Path, partial: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create checkpoint directory", dir, e))?;
    match std::fs::remove_dir_all(partial) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("cannot remove the stale", partial, e)),
    }
    std::fs::create_dir(partial).map_err(|e| Error::io("cannot create", partial, e))
}

#[cfg(test)]
/// Tests: `(directory, rank)` whose shard writes fail, as if the disk refused them.
pub(super) static FAIL_WRITES: std::sync::Mutex<Vec<(PathBuf, usize)>> = std::sync::Mutex::new(Vec::new());

/// A piece's values as a safetensors tensor: the box's shape if it holds the whole box,
/// else flat.
struct F32View<'a> {
    shape: Vec<usize>,
    values: &'a [f32],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            Cow::Borrowed(bytemuck::cast_slice(self.values))
        } else {
            Cow::Owned(self.values.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
    }

    fn data_len(&self) -> usize {
        4 * self.values.len()
    }
}

/// The keys of `pieces` in a shard file: `<tensor>#<j>` for the `j`-th piece of a tensor.
fn keys<'a>(pieces: impl IntoIterator<Item = &'a Piece>) -> Vec<String> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    pieces
        .into_iter()
        .map(|p| {
            let j = count.entry(p.tensor.as_str()).or_default();
            *j += 1;
            format!("{}#{}", p.tensor, *j - 1)
        })
        .collect()
}

/// Writes this rank's shard file into `partial` and fsyncs it; its size.
fn write_shard(partial: &Path, rank: usize, pieces: &[(&Piece, &[f32])]) -> Result<u64> {
    let path = partial.join(shard_file_name(rank));
    #[cfg(test)]
    {
        let fail = FAIL_WRITES.lock().map(|f| f.iter().any(|(d, r)| partial.starts_with(d) && *r == rank));
        if fail.unwrap_or(false) {
            let e = std::io::Error::new(std::io::ErrorKind::StorageFull, "injected failure");
            return Err(Error::io("cannot write", path, e));
        }
    }
    let views = keys(pieces.iter().map(|(p, _)| *p)).into_iter().zip(pieces).map(|(key, (p, values))| {
        let shape = if p.is_whole_box() { p.lengths.clone() } else { vec![p.len()] };
        (key, F32View { shape, values })
    });
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| bad(&path, format!("cannot write: {e}")))?;
    let file = std::fs::File::open(&path).map_err(|e| Error::io("cannot open", &path, e))?;
    file.sync_all().map_err(|e| Error::io("cannot sync", &path, e))?;
    Ok(file.metadata().map_err(|e| Error::io("cannot stat", &path, e))?.len())
}

/// Rank 0's commit of a save whose shard files are written.
struct Commit<'a> {
    dir: &'a Path,
    partial: &'a Path,
    step_dir: &'a Path,
    snapshot: &'a Snapshot,
}

impl Commit<'_> {
    fn run(
        &self,
        plans: &[std::result::Result<Plan, String>],
        keep: &[Vec<bool>],
        statuses: &[std::result::Result<Written, String>],
    ) -> Result<PathBuf> {
        let failed: Vec<String> = statuses
            .iter()
            .enumerate()
            .filter_map(|(r, s)| match s {
                Ok(Written::Failed(msg)) => Some(format!("rank {r}: {msg}")),
                Err(msg) => Some(format!("rank {r} sent an unreadable status: {msg}")),
                Ok(_) => None,
            })
            .collect();
        if !failed.is_empty() {
            return Err(bad(self.partial, format!("not every rank wrote its shard: {}", failed.join("; "))));
        }
        let mut files = Vec::new();
        for (r, ((plan, keep), status)) in plans.iter().zip(keep).zip(statuses).enumerate() {
            let (Ok(Plan::Ready { pieces, .. }), Ok(status)) = (plan, status) else {
                return Err(Error::internal(format!("rank {r} wrote without a plan")));
            };
            let kept: Vec<&Piece> = pieces.iter().zip(keep).filter(|(_, k)| **k).map(|(p, _)| p).collect();
            match status {
                Written::File { bytes } => {
                    let pieces = keys(kept.iter().copied())
                        .into_iter()
                        .zip(kept)
                        .map(|(key, p)| StoredPiece { key, piece: p.clone() })
                        .collect();
                    files.push(FileRecord { name: shard_file_name(r), rank: r, bytes: *bytes, pieces });
                }
                Written::Nothing if kept.is_empty() => {}
                _ => return Err(Error::internal(format!("rank {r} wrote no file for its pieces"))),
            }
        }
        let meta = Metadata {
            format: FORMAT.into(),
            version: VERSION,
            step: self.snapshot.step,
            tensors: self.snapshot.tensors.clone(),
            files,
            extra: self.snapshot.extra.clone(),
        };
        let mut text = serde_json::to_vec(&meta).map_err(|e| Error::internal(format!("metadata: {e}")))?;
        text.push(b'\n');
        let path = self.partial.join(METADATA);
        write_synced(&path, &text)?;
        sync_dir(self.partial)?;
        install(self.partial, self.step_dir)?;
        sync_dir(self.dir)?;
        let name = step_dir_name(self.snapshot.step);
        write_atomically(&self.dir.join(LATEST), format!("{name}\n").as_bytes())?;
        clean(self.dir, &name);
        Ok(self.step_dir.to_path_buf())
    }
}

/// Creates `path` with `bytes` and fsyncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| Error::io("cannot create", path, e))?;
    f.write_all(bytes).map_err(|e| Error::io("cannot write", path, e))?;
    f.sync_all().map_err(|e| Error::io("cannot sync", path, e))
}

/// Makes the entries of directory `dir` durable.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("cannot sync directory", dir, e))
}

/// Renames the complete directory `partial` to `step_dir`. If `step_dir` exists (the same
/// step saved again), the two are exchanged atomically and the old one, now called
/// `partial`, is left for [`clean`]; where the file system cannot exchange, the old one is
/// renamed away first ([`install_by_renames`]).
fn install(partial: &Path, step_dir: &Path) -> Result<()> {
    if !step_dir.exists() {
        return rename(partial, step_dir);
    }
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    match renameat_with(CWD, partial, CWD, step_dir, RenameFlags::EXCHANGE) {
        Ok(()) => Ok(()),
        Err(e) if [rustix::io::Errno::INVAL, rustix::io::Errno::NOSYS].contains(&e) => {
            install_by_renames(partial, step_dir)
        }
        Err(e) => Err(Error::io("cannot exchange the new checkpoint with", step_dir, e.into())),
    }
}

/// Renames the existing `step_dir` to `step_dir.replaced` (left for [`clean`]), then
/// `partial` to `step_dir`: between the two, `latest` names a missing directory.
pub(super) fn install_by_renames(partial: &Path, step_dir: &Path) -> Result<()> {
    let mut old = step_dir.as_os_str().to_owned();
    old.push(".replaced");
    let old = PathBuf::from(old);
    match std::fs::remove_dir_all(&old) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::io("cannot remove", &old, e));
        }
        _ => {}
    }
    rename(step_dir, &old)?;
    rename(partial, step_dir)
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| Error::io("cannot rename a checkpoint directory to", to, e))
}

/// Removes every `step-*` directory of `dir` but `current` (older checkpoints, stale and
/// replaced ones). Failures only warn: the checkpoint is committed already.
fn clean(dir: &Path, current: &str) {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!("cannot list {} to remove old checkpoints: {e}", dir.display());
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == current || !is_step_name(name) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Err(e) = std::fs::remove_dir_all(entry.path()) {
            tracing::warn!("cannot remove old checkpoint {}: {e}", entry.path().display());
        }
    }
}

/// Every rank gets rank 0's `value` (given on rank 0 only).
fn broadcast_json<T: Serialize + DeserializeOwned>(comm: &Communicator, value: Option<&T>) -> Result<T> {
    let mut bytes = match value {
        Some(v) => serde_json::to_vec(v).map_err(|e| Error::internal(format!("cannot encode: {e}")))?,
        None => Vec::new(),
    };
    let mut len = [bytes.len() as u64];
    comm.broadcast(&mut len, 0)?;
    bytes.resize(len[0] as usize, 0);
    comm.broadcast(&mut bytes, 0)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::internal(format!("rank 0 sent an unreadable decision: {e}")))
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io("cannot create", &tmp, e))?;
        f.write_all(bytes).map_err(|e| Error::io("cannot write", &tmp, e))?;
        f.sync_all().map_err(|e| Error::io("cannot sync", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io("cannot rename the new file onto", path, e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // Make the rename itself durable.
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("cannot sync directory", &dir, e))
}
