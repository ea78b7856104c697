//! Valid inputs of every fuzz target, made by the real code where there is one to make them
//! (the handshake's two sides, two executors recording what one sends the other) and by
//! the protocols' formats otherwise: where the fuzzer's corpora start.

use super::{PATIENCE, credentials};
use crate::algo::Algorithm;
use crate::bootstrap::auth::{self, Purpose};
use crate::bootstrap::c10d::{self, query};
use crate::bootstrap::conn::Replayed;
use crate::bootstrap::store::{ADD, GET, SET};
use crate::coll::CollKind;
use crate::dtype::DType;
use crate::exec::fuzzing::{Scenario, record};
use crate::frame::{ACK_LEN, Farewells, FrameKind, Header, OpDesc, PULL_LEN, pad_for};
use crate::reduce::ReduceOp;
use crate::transport::Farewell;
use crate::transport::tcp::LastWords;

/// The communicator the frame header seeds name.
pub(super) const COMM: u64 = 9;

/// The call the frame header seeds belong to.
pub(crate) fn desc() -> OpDesc {
    OpDesc {
        kind: CollKind::AllReduce,
        seq: 7,
        dtype: DType::F32,
        op: Some(ReduceOp::Sum),
        count: 1000,
        root: None,
        algo: Algorithm::Ring,
    }
}

/// Valid inputs of the fuzz target `target` (none for a name that is not one).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "frame_header" => frame_headers(),
        "frame_stream" => Scenario::all().into_iter().filter_map(|s| record(s).ok()).collect(),
        "handshake_server" => handshake_server(),
        "handshake_client" => handshake_client(),
        "store" => store(),
        "store_c10d" => store_c10d(),
        "ll" => ll(),
        _ => Vec::new(),
    }
}

fn frame_headers() -> Vec<Vec<u8>> {
    let words = Farewells { comm: COMM };
    let mut data = Header::data(COMM, &desc(), 1, 2);
    (data.total, data.offset, data.len) = (4000, 1000, 13);
    let mut stream = data.encode().to_vec();
    stream.extend_from_slice(&[1; 13]);
    stream.resize(stream.len() + pad_for(13), 0);
    stream.extend(words.say(&Farewell::Goodbye));
    let fixed = |kind, len| Header::control(kind, COMM, len).encode().to_vec();
    vec![
        data.encode().to_vec(),
        stream,
        words.say(&Farewell::Goodbye),
        words.say(&Farewell::Abort { origin: 3, reason: "disk on fire".into() }),
        fixed(FrameKind::Pull, PULL_LEN),
        fixed(FrameKind::Push, PULL_LEN),
        fixed(FrameKind::Ack, ACK_LEN),
        fixed(FrameKind::Pushed, ACK_LEN),
        fixed(FrameKind::Grant, PULL_LEN),
    ]
}

/// What the client side writes when it reads `from_server`.
fn client_writes(purpose: Purpose, from_server: &[u8]) -> Vec<u8> {
    let mut c = Replayed::new(from_server);
    let _ = auth::client(&mut c, credentials(), purpose, "seed", PATIENCE);
    c.kept
}

/// What the server side writes when it reads `from_client`.
fn server_writes(from_client: &[u8]) -> Vec<u8> {
    let mut c = Replayed::new(from_client);
    let _ = auth::server(&mut c, credentials(), "seed", PATIENCE);
    c.kept
}

/// A whole handshake for `purpose`: what the client sends (its hello and proof), and what
/// the server answers (its reply and verdict).
fn handshake(purpose: Purpose) -> (Vec<u8>, Vec<u8>) {
    let hello = client_writes(purpose, &[]);
    let reply = server_writes(&hello);
    let client = client_writes(purpose, &reply);
    let server = server_writes(&client);
    (client, server)
}

fn handshake_server() -> Vec<Vec<u8>> {
    let (store, _) = handshake(Purpose::Store);
    let (link, _) = handshake(Purpose::Link { comm: 0xc0ffee, from: 3, to: 1 });
    let hello = client_writes(Purpose::Store, &[]);
    let mut wrong = store.clone();
    if let Some(last) = wrong.last_mut() {
        *last ^= 1;
    }
    vec![store, link, hello, wrong]
}

fn handshake_client() -> Vec<Vec<u8>> {
    let (_, accepted) = handshake(Purpose::Store);
    // A refusal: the reply to a hello of another protocol version.
    let mut hello = client_writes(Purpose::Store, &[]);
    hello[8] ^= 0x40;
    vec![accepted, server_writes(&hello)]
}

/// A request of our store's protocol.
fn request(op: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut b = vec![op];
    for part in [key, value] {
        b.extend_from_slice(&(part.len() as u64).to_le_bytes());
        b.extend_from_slice(part);
    }
    b
}

fn store() -> Vec<Vec<u8>> {
    let (hello, _) = handshake(Purpose::Store);
    let after = |requests: &[Vec<u8>]| [hello.clone(), requests.concat()].concat();
    vec![
        after(&[
            request(SET, b"addr/0", b"10.0.0.1:4000"),
            request(GET, b"addr/0", &100u64.to_le_bytes()),
            request(ADD, b"count", &5i64.to_le_bytes()),
            request(ADD, b"count", &(-2i64).to_le_bytes()),
            request(GET, b"count", &0u64.to_le_bytes()),
        ]),
        after(&[request(GET, b"nobody", &1000u64.to_le_bytes()), request(9, b"k", b"")]),
        after(&[request(SET, b"k", &[7; 40]), request(SET, b"k", b""), request(GET, b"k", b"")]),
        hello,
    ]
}

/// A length-prefixed byte string of PyTorch's protocol.
fn put(b: &mut Vec<u8>, v: &[u8]) {
    b.extend_from_slice(&(v.len() as u64).to_le_bytes());
    b.extend_from_slice(v);
}

/// A PyTorch request: its query type, then its fields as `put` (bytes) or raw numbers.
fn query(q: u8, strings: &[&[u8]], tail: &[u8]) -> Vec<u8> {
    let mut b = vec![q];
    for s in strings {
        put(&mut b, s);
    }
    b.extend_from_slice(tail);
    b
}

fn store_c10d() -> Vec<Vec<u8>> {
    let open = [c10d::MAGIC.to_le_bytes().to_vec(), query(query::PING, &[], &42u32.to_le_bytes())].concat();
    let count = |n: u64| n.to_le_bytes().to_vec();
    let with_count = |q, n, keys: &[&[u8]]| [vec![q], count(n), query(q, keys, &[])[1..].to_vec()].concat();
    let session = |requests: &[Vec<u8>]| [open.clone(), requests.concat()].concat();
    vec![
        session(&[
            query(query::SET, &[b"/init/k", b"v1"], &[]),
            query(query::GET, &[b"/init/k"], &[]),
            query(query::ADD, &[b"/init/n"], &3i64.to_le_bytes()),
            with_count(query::CHECK, 2, &[b"/init/k", b"/init/n"]),
            with_count(query::WAIT, 1, &[b"/init/k"]),
            vec![query::GETNUMKEYS],
            query(query::DELETE_KEY, &[b"/init/n"], &[]),
        ]),
        session(&[
            query(query::APPEND, &[b"/a", b"xy"], &[]),
            query(query::COMPARE_SET, &[b"/a", b"xy", b"z"], &[]),
            query(query::COMPARE_SET, &[b"/b", b"", b"new"], &[]),
            with_count(query::MULTI_SET, 2, &[b"/c", b"1", b"/d", b"2"]),
            with_count(query::MULTI_GET, 2, &[b"/c", b"/d"]),
        ]),
        session(&[with_count(query::WAIT, 1, &[b"/never"]), vec![query::CANCEL_WAIT]]),
        session(&[vec![query::CANCEL_WAIT], query(query::PING, &[], &7u32.to_le_bytes())]),
    ]
}

/// Script steps of the `ll` target (see `shm.rs`), named.
mod step {
    pub const PEER_WORD: u8 = 0;
    pub const PEER_DATA: u8 = 1;
    pub const PEER_WRITE: u8 = 2;
    pub const PEER_LL_SEND: u8 = 3;
    pub const PEER_STATUS: u8 = 4;
    pub const READ: u8 = 5;
    pub const READ_WITH: u8 = 6;
    pub const HOLDS: u8 = 7;
    pub const LL_RECV: u8 = 8;
    pub const LL_PENDING: u8 = 9;
    pub const LL_SEND: u8 = 10;
    pub const WRITE: u8 = 11;
    pub const ROOM_FOR: u8 = 12;
    pub const HANGUP: u8 = 13;
    pub const PEER_READ: u8 = 14;
    pub const PEER_LL_RECV: u8 = 15;
}

fn ll() -> Vec<Vec<u8>> {
    let label = |a: u64, b: u64| [a.to_le_bytes(), b.to_le_bytes()].concat();
    let ll_send =
        |who: u8, l: &[u8], n: u8| [vec![who], l.to_vec(), vec![n], vec![0x5a; usize::from(n)]].concat();
    let write = |who: u8, n: u8| [vec![who, n], vec![0xa5; usize::from(n)]].concat();
    let read = |who: u8, n: u16| [vec![who], n.to_le_bytes().to_vec()].concat();
    let l = label(5, 1 << 63 | 3);
    let scripts = vec![
        // LL messages of several sizes, received under the right label, then a wrong one.
        [
            ll_send(step::PEER_LL_SEND, &l, 40),
            vec![step::LL_PENDING, step::LL_RECV, 0, 40],
            ll_send(step::PEER_LL_SEND, &l, 200),
            vec![step::LL_RECV, 0, 200],
            ll_send(step::PEER_LL_SEND, &l, 8),
            [vec![step::LL_RECV, 1], label(6, 1 << 63), vec![8]].concat(),
        ]
        .concat(),
        // Bytes through the ring, wrapping around it, read whole and in elements.
        [
            write(step::PEER_WRITE, 200),
            read(step::READ, 72),
            vec![step::HOLDS, 100, 0],
            [vec![step::READ_WITH, 2], 128u16.to_le_bytes().to_vec()].concat(),
            write(step::PEER_WRITE, 120),
            read(step::READ, 200),
        ]
        .concat(),
        // This side sends; the peer reads; the peer's counters change under it.
        [
            ll_send(step::LL_SEND, &l, 100),
            vec![step::PEER_LL_RECV, 100],
            write(step::WRITE, 250),
            vec![step::ROOM_FOR, 10, 0],
            read(step::PEER_READ, 250),
            [vec![step::PEER_WORD, 0, 1, 0], 3u64.to_le_bytes().to_vec()].concat(),
            write(step::WRITE, 16),
        ]
        .concat(),
        // The peer aborts with a reason after sending.
        [
            write(step::PEER_WRITE, 16),
            vec![step::PEER_STATUS, 1, 2, 5],
            b"boom!".to_vec(),
            vec![step::HANGUP],
            read(step::READ, 64),
            read(step::READ, 64),
            [vec![step::PEER_DATA, 0, 0], u64::MAX.to_le_bytes().to_vec()].concat(),
        ]
        .concat(),
    ];
    // No word forged before this side attaches.
    scripts.into_iter().map(|s| [vec![0], s].concat()).collect()
}
