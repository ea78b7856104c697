//! Entry points for coverage-guided fuzzing (`fuzz/` at the repository root, built with
//! cargo-fuzz): each hands one input, as a peer could send it, to the real code that reads
//! it, in process and without sockets: frame headers and last words, the executor reading a
//! peer's frames, both sides of the handshake, the store's two protocols, and the
//! shared-memory link (LL lines and labels, ring counters, status). Not an API: hidden from
//! the documentation, and nothing else calls it. Whatever the input, an entry point returns;
//! a panic, a hang or an allocation a length field asked for is a defect.
//!
//! `TARGETS` lists them by name (the names of `fuzz/fuzz_targets/`), `seeds` gives
//! valid inputs of each to start from.

pub(crate) mod seeds;
mod shm;

use std::time::Duration;

use crate::bootstrap::auth::{self, Auth, Purpose};
use crate::bootstrap::conn::Replayed;
use crate::bootstrap::keys::{Data, Waits};
use crate::bootstrap::store;
use crate::frame::{Farewells, HEADER_LEN, Header, OpDesc};
use crate::transport::tcp::LastWords;

pub use seeds::seeds;

/// A fuzz target: its name, and the function that runs one input.
pub type Target = (&'static str, fn(&[u8]));

/// The fuzz targets.
pub const TARGETS: [Target; 7] = [
    ("frame_header", frame_header),
    ("frame_stream", |d| {
        frame_stream(d);
    }),
    ("handshake_server", |d| {
        handshake_server(d);
    }),
    ("handshake_client", |d| {
        handshake_client(d);
    }),
    ("store", |d| {
        store(d);
    }),
    ("store_c10d", |d| {
        store_c10d(d);
    }),
    ("ll", ll),
];

/// The job both sides of the fuzzed handshakes belong to.
fn credentials() -> &'static Auth {
    static AUTH: std::sync::OnceLock<Auth> = std::sync::OnceLock::new();
    AUTH.get_or_init(|| Auth::new("fuzz-job", "fuzz-secret").expect("a job id of 8 bytes is short enough"))
}

/// How long a handshake waits for the peer (it never waits: the bytes are all there).
const PATIENCE: Duration = Duration::from_secs(1);

/// A frame header as a receiver decodes it (the first 72 bytes of `data`), with what is
/// done with a decoded one (described, compared with a call); then all of `data` as the
/// last bytes a closed connection left, read for its last word.
pub fn frame_header(data: &[u8]) {
    if let Some(head) = data.first_chunk::<HEADER_LEN>()
        && let Ok(h) = Header::decode(head)
    {
        let _ = h.describe();
        let desc = seeds::desc();
        let _ = h.matches(&desc) || h.matches(&OpDesc { seq: h.seq, ..desc });
        assert!(h.len as usize <= crate::frame::MAX_PAYLOAD, "a frame longer than the limit passed: {h:?}");
    }
    let _ = Farewells { comm: seeds::COMM }.read(data);
}

/// The executor reading a peer's frames: `data` is three bytes of scenario (the operation,
/// its algorithm, how the bytes arrive) and what the peer sent (see `exec/fuzzing.rs`).
/// Whether the operations completed.
pub fn frame_stream(data: &[u8]) -> bool {
    crate::exec::fuzzing::replay(data).is_ok()
}

/// The server side of the handshake reading what a connecting peer sent; whether it was
/// accepted (only with the proof of the secret, which the seeds carry).
pub fn handshake_server(data: &[u8]) -> bool {
    auth::server(&mut Replayed::new(data), credentials(), "fuzzer", PATIENCE).is_ok()
}

/// The client side of the handshake reading the server's answer to its hello; whether it
/// accepted the server.
pub fn handshake_client(data: &[u8]) -> bool {
    auth::client(&mut Replayed::new(data), credentials(), Purpose::Store, "fuzzer", PATIENCE).is_ok()
}

/// The store serving one connection of `data`, exactly as it serves an accepted socket:
/// PyTorch's protocol if the first byte says so, else our handshake, then our requests.
/// Requests never wait: nobody else could set a key meanwhile. The bytes answered.
pub fn store(data: &[u8]) -> usize {
    let mut conn = Replayed::new(data);
    serve(&mut conn);
    conn.written
}

/// The store serving a client of PyTorch's protocol: `data` follows the connection's first
/// byte, `VALIDATE`. The bytes answered.
pub fn store_c10d(data: &[u8]) -> usize {
    let mut input = Vec::with_capacity(data.len() + 1);
    input.push(0);
    input.extend_from_slice(data);
    let mut conn = Replayed::new(&input);
    serve(&mut conn);
    conn.written
}

fn serve(conn: &mut Replayed<'_>) {
    let waits = Waits { get_max: Duration::ZERO, tick: Duration::ZERO };
    store::handle(conn, "fuzzer", &Data::default(), credentials(), waits);
}

/// A shared-memory link as its peer may leave the memory: `data` is a script of the peer's
/// writes (honest sends, or any value in any word) and this side's reads and writes.
pub fn ll(data: &[u8]) {
    shm::run(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_runs_and_the_seeds_reach_past_the_checks() {
        for (name, run) in TARGETS {
            let seeds = seeds(name);
            assert!(!seeds.is_empty(), "{name} has no seeds");
            for s in &seeds {
                run(s);
            }
        }
        // The proofs of the secret are valid: both sides accept, and the store answers.
        assert!(handshake_server(&seeds("handshake_server")[0]));
        assert!(handshake_server(&seeds("handshake_server")[1]));
        assert!(!handshake_server(&seeds("handshake_server")[3]), "a proof with a bit flipped");
        assert!(handshake_client(&seeds("handshake_client")[0]));
        assert!(!handshake_client(&seeds("handshake_client")[1]));
        let (hello_only, full) = (store(&seeds("store")[3]), store(&seeds("store")[0]));
        assert!(full > hello_only + 5 * 9, "every request answered: {full} bytes after {hello_only}");
        assert!(store_c10d(&seeds("store_c10d")[0]) > 4 + 8, "PING and the replies");
    }

    #[test]
    fn the_recorded_streams_replay_to_completion_in_every_scenario() {
        let all = crate::exec::fuzzing::Scenario::all();
        let seeds = seeds("frame_stream");
        assert_eq!(seeds.len(), all.len(), "every scenario records");
        for s in &seeds {
            if let Err(e) = crate::exec::fuzzing::replay(s) {
                panic!("scenario {:?}: {e}", &s[..3]);
            }
            // In short reads too.
            let mut short = s.clone();
            short[2] |= 2 << 2;
            if let Err(e) = crate::exec::fuzzing::replay(&short) {
                panic!("scenario {:?} in short reads: {e}", &short[..3]);
            }
        }
    }
}
