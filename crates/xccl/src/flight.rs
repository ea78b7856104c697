//! The flight recorder: the last operations of each communicator, kept in a ring and written
//! as JSON when the communicator fails (an abort, a timeout, a lost peer, a mismatch), so a
//! failed job says what every rank was doing.
//!
//! Each record holds the operation (a collective with its sequence number, sizes and
//! algorithm, or a point-to-point message with its peer and tag), its state (`queued`,
//! `running`, `done`, `failed`) and when it started and finished. Recording costs two reads
//! of the coarse clock (the scheduler tick: timings are good to a few milliseconds, which is
//! what telling a stuck operation from a slow one needs;
//! [`Communicator::record_timeline`](crate::Communicator::record_timeline) has exact ones), no atomic operation and no
//! allocation per operation; the text is made only when the file is written. The file is `XCCL_FLIGHT_DIR/xccl-flight-<comm id>-r<rank>.json` (by default in
//! `$TMPDIR/xccl-flight`), one per rank, and `xccl flight DIR` prints the ranks of a job side
//! by side. `XCCL_FLIGHT_RECORDS` sets how many operations are kept (64; `0` turns the
//! recorder off).
//!
//! The ring belongs to the stream: only the thread running operations touches it, as with the
//! engine, so it needs no lock.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::time::{ClockId, clock_gettime};

use crate::dtype::DType;
use crate::error::Error;
use crate::frame::OpDesc;

/// Operations kept by default.
pub const DEFAULT_RECORDS: usize = 64;

/// Where the files go and how much is kept (`XCCL_FLIGHT_DIR`, `XCCL_FLIGHT_RECORDS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlightConfig {
    /// Operations kept per communicator; 0: none, and no file.
    pub records: usize,
    /// The directory of the files.
    pub dir: PathBuf,
}

impl Default for FlightConfig {
    fn default() -> Self {
        FlightConfig { records: DEFAULT_RECORDS, dir: std::env::temp_dir().join("xccl-flight") }
    }
}

/// What an operation was.
enum Subject {
    Coll { desc: OpDesc, bytes: usize },
    P2p { send: bool, peer: usize, tag: u32, dtype: DType, bytes: usize },
}

/// One operation.
struct Record {
    subject: Subject,
    /// Nanoseconds of the coarse monotonic clock.
    started: u64,
    finished: Option<u64>,
    error: Option<String>,
}

/// A queued operation not yet started, as the recorder lists it.
pub(crate) struct Queued {
    /// Its description.
    pub what: String,
    /// Bytes it moves.
    pub bytes: usize,
}

/// A communicator's ring of recent operations.
pub(crate) struct Recorder {
    cfg: FlightConfig,
    rank: usize,
    size: usize,
    comm: u64,
    /// When the recorder was made, on the coarse clock.
    born: u64,
    born_unix: f64,
    /// Record `id` at index `id % records`: once the ring has filled, a new record takes the
    /// oldest one's place, written field by field, with nothing moved.
    ring: Vec<Record>,
    /// Records pushed so far: the id of the next.
    next: u64,
    written: bool,
}

impl Recorder {
    /// An empty ring for `rank` of communicator `comm` of `size` ranks.
    pub fn new(cfg: FlightConfig, rank: usize, size: usize, comm: u64) -> Recorder {
        let born_unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        Recorder {
            ring: Vec::with_capacity(cfg.records),
            cfg,
            rank,
            size,
            comm,
            born: now(),
            born_unix,
            next: 0,
            written: false,
        }
    }

    fn push(&mut self, subject: Subject) -> u64 {
        if self.cfg.records == 0 {
            return self.next;
        }
        let id = self.next;
        let started = now();
        if self.ring.len() < self.cfg.records {
            self.ring.push(Record { subject, started, finished: None, error: None });
        } else if let Some(r) = self.ring.get_mut((id % self.cfg.records as u64) as usize) {
            r.subject = subject;
            r.started = started;
            r.finished = None;
            r.error = None;
        }
        self.next += 1;
        id
    }

    /// The record of `id`, if it is still kept.
    fn get_mut(&mut self, id: u64) -> Option<&mut Record> {
        let first = self.next - self.ring.len() as u64;
        if id < first || id >= self.next {
            return None;
        }
        self.ring.get_mut((id % self.cfg.records.max(1) as u64) as usize)
    }

    /// The records kept, the oldest first.
    fn oldest_first(&self) -> impl Iterator<Item = &Record> {
        let start = (self.next - self.ring.len() as u64) % self.cfg.records.max(1) as u64;
        let (newer, older) = self.ring.split_at(start as usize);
        older.iter().chain(newer)
    }

    /// Collective `desc`, moving `bytes` per rank, starts; returns its record's id.
    pub fn coll(&mut self, desc: OpDesc, bytes: usize) -> u64 {
        self.push(Subject::Coll { desc, bytes })
    }

    /// A point-to-point message starts; returns its record's id.
    pub fn p2p(&mut self, send: bool, peer: usize, tag: u32, dtype: DType, bytes: usize) -> u64 {
        self.push(Subject::P2p { send, peer, tag, dtype, bytes })
    }

    /// Record `id` ended, well or with `error`.
    pub fn end(&mut self, id: u64, error: Option<&Error>) {
        if let Some(r) = self.get_mut(id) {
            r.finished = Some(now());
            r.error = error.map(ToString::to_string);
        }
    }

    /// Every record still running ends with `error`.
    pub fn fail_running(&mut self, error: &Error) {
        for r in self.ring.iter_mut().filter(|r| r.finished.is_none()) {
            r.finished = Some(now());
            r.error = Some(error.to_string());
        }
    }

    /// Writes the file once, on the communicator's first failure (`error`), with the
    /// operations still `queued` behind it; returns its path.
    pub fn write_once(&mut self, error: &Error, queued: &[Queued]) -> Option<PathBuf> {
        if self.written || self.cfg.records == 0 {
            return None;
        }
        self.written = true;
        let path = self.cfg.dir.join(format!("xccl-flight-{:016x}-r{}.json", self.comm, self.rank));
        match self.write(&path, error, queued) {
            Ok(()) => Some(path),
            Err(e) => {
                tracing::warn!(rank = self.rank, "could not write the flight record {}: {e}", path.display());
                None
            }
        }
    }

    fn write(&self, path: &Path, error: &Error, queued: &[Queued]) -> std::io::Result<()> {
        let at = |t: u64| t.saturating_sub(self.born) as f64 * 1e-6;
        let mut ops: Vec<serde_json::Value> = self
            .oldest_first()
            .map(|r| {
                let (what, kind, seq, algo, bytes, peer) = match &r.subject {
                    Subject::Coll { desc, bytes } => (
                        desc.to_string(),
                        desc.kind.to_string(),
                        Some(desc.seq),
                        Some(desc.algo.name()),
                        *bytes,
                        None,
                    ),
                    Subject::P2p { send, peer, tag, dtype, bytes } => {
                        let (verb, dir) = if *send { ("send", "to") } else { ("recv", "from") };
                        let what =
                            format!("{verb} {dir} {peer} (tag {tag}, {dtype} x {})", bytes / dtype.size());
                        (what, verb.to_string(), None, None, *bytes, Some(*peer))
                    }
                };
                let state = match (&r.finished, &r.error) {
                    (None, _) => "running",
                    (Some(_), None) => "done",
                    (Some(_), Some(_)) => "failed",
                };
                serde_json::json!({
                    "op": what, "kind": kind, "seq": seq, "algo": algo, "bytes": bytes, "peer": peer,
                    "state": state,
                    "started_ms": at(r.started),
                    "finished_ms": r.finished.map(at),
                    "error": r.error,
                })
            })
            .collect();
        ops.extend(
            queued.iter().map(|q| serde_json::json!({"op": q.what, "bytes": q.bytes, "state": "queued"})),
        );
        let doc = serde_json::json!({
            "comm": format!("{:016x}", self.comm),
            "rank": self.rank,
            "size": self.size,
            "pid": std::process::id(),
            "created_unix": self.born_unix,
            "written_ms": at(now()),
            "error": error.to_string(),
            "ops": ops,
        });
        std::fs::create_dir_all(&self.cfg.dir)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&doc).map_err(std::io::Error::other)?)?;
        std::fs::rename(&tmp, path)
    }
}

/// The coarse monotonic clock, in nanoseconds.
fn now() -> u64 {
    let t = clock_gettime(ClockId::MonotonicCoarse);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(records: usize, dir: &Path) -> FlightConfig {
        FlightConfig { records, dir: dir.to_path_buf() }
    }

    #[test]
    fn keeps_the_last_records_and_writes_them_once() {
        let dir = std::env::temp_dir().join(format!("xccl-flight-test-{}", std::process::id()));
        let mut r = Recorder::new(cfg(3, &dir), 1, 4, 0xabc);
        for i in 0..5 {
            let id = r.p2p(i % 2 == 0, 2, i as u32, DType::F32, 16);
            if i < 4 {
                r.end(id, None);
            }
        }
        let err = Error::Internal("boom".into());
        let path = r.write_once(&err, &[Queued { what: "barrier #9".into(), bytes: 0 }]).unwrap();
        assert!(r.write_once(&err, &[]).is_none(), "written once");
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let ops = doc["ops"].as_array().unwrap();
        // The last three of five, then the queued one.
        let tags: Vec<_> = ops.iter().map(|o| o["op"].as_str().unwrap().to_string()).collect();
        assert_eq!(tags.len(), 4, "{tags:?}");
        assert!(tags[0].contains("tag 2") && tags[2].contains("tag 4"), "{tags:?}");
        let states: Vec<_> = ops.iter().map(|o| o["state"].as_str().unwrap()).collect();
        assert_eq!(states, ["done", "done", "running", "queued"]);
        assert_eq!(doc["rank"], 1);
        assert_eq!(doc["error"].as_str().unwrap(), err.to_string());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn zero_records_keeps_nothing_and_writes_nothing() {
        let dir = std::env::temp_dir().join(format!("xccl-flight-off-{}", std::process::id()));
        let mut r = Recorder::new(cfg(0, &dir), 0, 2, 1);
        let id = r.p2p(true, 1, 0, DType::U8, 1);
        r.end(id, None);
        assert!(r.write_once(&Error::Internal("x".into()), &[]).is_none());
        assert!(!dir.exists());
    }
}
