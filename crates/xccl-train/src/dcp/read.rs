//! [`Reader`]: a checkpoint's metadata, its shard files memory-mapped, and any piece of any
//! tensor assembled from the stored pieces that overlap it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::piece::{first_gap, global_index};
use super::{FORMAT, LATEST, METADATA, Metadata, Piece, VERSION, bad, latest_step_dir};
use crate::error::{Error, Result};

/// A stored piece: where its values start in which mapped file.
struct Stored {
    file: usize,
    start: usize,
    piece: Piece,
}

/// An open checkpoint.
///
/// [`open`](Reader::open) checks everything it can without reading the values: the
/// metadata, every file's presence and size, every piece's key, type and length in its
/// file's header. [`read`](Reader::read) then touches only the bytes of the stored pieces
/// that overlap the piece asked for. A `Reader` is `Send + Sync`: ranks' threads may read
/// from one reader at once.
pub struct Reader {
    dir: PathBuf,
    meta: Metadata,
    maps: Vec<Mmap>,
    shapes: HashMap<String, usize>,
    stored: HashMap<String, Vec<Stored>>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("dir", &self.dir).field("step", &self.meta.step).finish()
    }
}

impl Reader {
    /// Opens the checkpoint `dir/latest` names (or `dir` itself, if it is a step directory,
    /// with its own `metadata.json`). Errors say which: no checkpoint in `dir`, `latest`
    /// naming a missing directory, unreadable metadata, another format or version, a missing
    /// or truncated shard file, a piece its file does not hold.
    pub fn open(dir: &Path) -> Result<Reader> {
        if !dir.is_dir() {
            let what = if dir.exists() { "is not a directory" } else { "does not exist" };
            return Err(bad(dir, format!("{what}: no checkpoint there")));
        }
        let step_dir = if dir.join(METADATA).is_file() {
            dir.to_path_buf()
        } else {
            let found = latest_step_dir(dir)?.ok_or_else(|| {
                bad(dir, format!("no checkpoint here: there is no '{LATEST}' file (nor a {METADATA})"))
            })?;
            if !found.is_dir() {
                let name = found.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                return Err(bad(&dir.join(LATEST), format!("names {name}, which does not exist")));
            }
            found
        };
        let meta = read_metadata(&step_dir.join(METADATA))?;
        let mut shapes = HashMap::new();
        for (i, (name, _)) in meta.tensors.iter().enumerate() {
            if shapes.insert(name.clone(), i).is_some() {
                return Err(bad(&step_dir.join(METADATA), format!("tensor {name} is listed twice")));
            }
        }
        let mut maps = Vec::with_capacity(meta.files.len());
        let mut stored: HashMap<String, Vec<Stored>> = HashMap::new();
        for (i, record) in meta.files.iter().enumerate() {
            let path = step_dir.join(&record.name);
            if record.name.contains('/') || record.name.starts_with('.') {
                return Err(bad(
                    &step_dir.join(METADATA),
                    format!("file name '{}' is not plain", record.name),
                ));
            }
            let map = map_file(&path, record.bytes)?;
            let (n, header) = SafeTensors::read_metadata(&map)
                .map_err(|e| bad(&path, format!("not a readable safetensors file: {e}")))?;
            for s in &record.pieces {
                let shape =
                    shapes.get(&s.piece.tensor).map(|&t| meta.tensors[t].1.as_slice()).ok_or_else(|| {
                        bad(
                            &path,
                            format!(
                                "holds a piece of tensor {}, which the metadata does not list",
                                s.piece.tensor
                            ),
                        )
                    })?;
                s.piece.validate(shape).map_err(|msg| bad(&path, msg))?;
                let info = header.info(&s.key).ok_or_else(|| {
                    bad(&path, format!("has no tensor '{}', which the metadata lists", s.key))
                })?;
                let (from, to) = info.data_offsets;
                if info.dtype != Dtype::F32 || to - from != 4 * s.piece.len() {
                    return Err(bad(
                        &path,
                        format!(
                            "tensor '{}' is {:?} of {} bytes, the metadata says F32 of {} elements",
                            s.key,
                            info.dtype,
                            to - from,
                            s.piece.len()
                        ),
                    ));
                }
                let start = 8 + n + from;
                stored.entry(s.piece.tensor.clone()).or_default().push(Stored {
                    file: i,
                    start,
                    piece: s.piece.clone(),
                });
            }
            maps.push(map);
        }
        Ok(Reader { dir: step_dir, meta, maps, shapes, stored })
    }

    /// The step directory read.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Steps done.
    pub fn step(&self) -> u64 {
        self.meta.step
    }

    /// The entries the run recorded besides tensors.
    pub fn extra(&self) -> &BTreeMap<String, serde_json::Value> {
        &self.meta.extra
    }

    /// Every tensor with its global shape.
    pub fn tensors(&self) -> &[(String, Vec<usize>)] {
        &self.meta.tensors
    }

    /// Whether the checkpoint has tensor `tensor`.
    pub fn has(&self, tensor: &str) -> bool {
        self.shapes.contains_key(tensor)
    }

    /// The global shape of `tensor`, if the checkpoint has it.
    pub fn shape(&self, tensor: &str) -> Option<&[usize]> {
        self.shapes.get(tensor).map(|&t| self.meta.tensors[t].1.as_slice())
    }

    /// The whole metadata: the files and the pieces each holds.
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// The values of `piece`, assembled from whatever stored pieces overlap it (only their
    /// bytes are read). Errors name the tensor: not in the checkpoint, a piece outside its
    /// shape, an element no stored piece holds.
    pub fn read(&self, piece: &Piece) -> Result<Vec<f32>> {
        let shape = self
            .shape(&piece.tensor)
            .ok_or_else(|| bad(&self.dir, format!("has no tensor {}", piece.tensor)))?;
        piece.validate(shape).map_err(|msg| bad(&self.dir, msg))?;
        let mut out = vec![0.0f32; piece.len()];
        let mut covered = Vec::new();
        for s in self.stored.get(&piece.tensor).map_or(&[][..], Vec::as_slice) {
            let map = &self.maps[s.file];
            let bytes = map.get(s.start..s.start + 4 * s.piece.len()).ok_or_else(|| {
                Error::internal(format!("piece of {} outside its mapped file", piece.tensor))
            })?;
            match bytemuck::try_cast_slice::<u8, f32>(bytes) {
                Ok(src) if cfg!(target_endian = "little") => s.piece.overlap(piece, |a, d, n| {
                    out[d..d + n].copy_from_slice(&src[a..a + n]);
                    covered.push((d, d + n));
                }),
                _ => s.piece.overlap(piece, |a, d, n| {
                    for (x, c) in out[d..d + n].iter_mut().zip(bytes[4 * a..4 * (a + n)].chunks_exact(4)) {
                        *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                    covered.push((d, d + n));
                }),
            }
        }
        if let Some(at) = first_gap(&mut covered, piece.len()) {
            let idx = global_index(piece, shape, at);
            return Err(bad(
                &self.dir,
                format!(
                    "element {idx:?} of tensor {} (asked for {piece}) is in no stored piece",
                    piece.tensor
                ),
            ));
        }
        Ok(out)
    }
}

/// The metadata at `path`, of this format and version.
fn read_metadata(path: &Path) -> Result<Metadata> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("cannot read", path, e))?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(path, format!("unreadable metadata: {e}")))?;
    let format = value.get("format").and_then(|f| f.as_str()).unwrap_or_default();
    if format != FORMAT {
        return Err(bad(
            path,
            format!("format is '{format}', not '{FORMAT}': not an xccl distributed checkpoint"),
        ));
    }
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(VERSION) => {}
        v => {
            let v = v.map_or("none".to_string(), |v| v.to_string());
            return Err(bad(path, format!("format version {v}; this build reads version {VERSION}")));
        }
    }
    serde_json::from_value(value).map_err(|e| bad(path, format!("unreadable metadata: {e}")))
}

/// Maps the shard file `path`, which must be `bytes` long.
fn map_file(path: &Path, bytes: u64) -> Result<Mmap> {
    let file = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            bad(path, "is missing; the metadata lists it")
        } else {
            Error::io("cannot open", path, e)
        }
    })?;
    let len = file.metadata().map_err(|e| Error::io("cannot stat", path, e))?.len();
    if len != bytes {
        return Err(bad(path, format!("is {len} bytes, the metadata says {bytes}: truncated or replaced")));
    }
    // SAFETY: a committed checkpoint's files are never written again: saves write new
    // directories and replace whole ones by renames, which leave an open mapping intact. A
    // file truncated by someone else while mapped would fault on access, not be misread.
    unsafe { Mmap::map(&file) }.map_err(|e| Error::io("cannot map", path, e))
}
