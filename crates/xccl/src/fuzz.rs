//! Fuzzing the parsers of what peers send: frame headers, the handshake (both sides) and the
//! store (ours and PyTorch's protocol, which the store also answers). Inputs are random bytes
//! and valid messages with fields mutated, lengths huge or off by one, and truncations; real
//! sockets carry them to the real server code. Nothing may panic (a panic hook counts them,
//! on any thread), hang (every call has a deadline) or allocate what a length field claims;
//! a server must go on serving well-behaved clients.
//!
//! Runs on stable Rust as ordinary tests with a bounded number of cases; `XCCL_FUZZ_CASES`
//! (per target) and `XCCL_FUZZ_SEED` run it longer: `bash bench/fuzz.sh`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use crate::bootstrap::auth::{self, Auth, Purpose};
use crate::bootstrap::{StoreClient, StoreServer};
use crate::frame::{FrameKind, HEADER_LEN, Header};

/// Panics anywhere in the process since the hook was installed.
static PANICS: AtomicUsize = AtomicUsize::new(0);
/// The fuzz tests count panics process-wide: one at a time.
static ONE: Mutex<()> = Mutex::new(());

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

/// SplitMix64: small, seedable, good enough to draw inputs.
struct Rng(u64);

impl Rng {
    fn new(salt: u64) -> Rng {
        let seed = std::env::var("XCCL_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
        Rng(seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// Up to `max` random bytes.
    fn some_bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max);
        self.bytes(n)
    }
    /// A length a peer might claim: small, at a limit, or absurd.
    fn length(&mut self) -> u64 {
        match self.below(6) {
            0 => self.below(64) as u64,
            1 => self.below(1 << 20) as u64,
            2 => u64::from(u32::MAX) + self.below(3) as u64,
            3 => u64::MAX - self.below(3) as u64,
            4 => (64 << 20) + self.below(3) as u64 - 1,
            _ => self.next(),
        }
    }
    /// `valid` mutated: bytes flipped, a field overwritten with a claimed length, cut short
    /// or extended.
    fn mutate(&mut self, mut valid: Vec<u8>) -> Vec<u8> {
        for _ in 0..1 + self.below(4) {
            match self.below(5) {
                0 if !valid.is_empty() => {
                    let i = self.below(valid.len());
                    valid[i] ^= 1 << self.below(8);
                }
                1 if valid.len() >= 8 => {
                    let i = self.below(valid.len() - 7);
                    let l = self.length().to_le_bytes();
                    valid[i..i + 8].copy_from_slice(&l);
                }
                2 if !valid.is_empty() => {
                    let n = self.below(valid.len());
                    valid.truncate(n);
                }
                3 => {
                    let extra = self.some_bytes(64);
                    valid.extend(extra);
                }
                _ if !valid.is_empty() => {
                    let i = self.below(valid.len());
                    valid[i] = self.next() as u8;
                }
                _ => {}
            }
        }
        valid
    }
}

fn cases(default: usize) -> usize {
    std::env::var("XCCL_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn finish(name: &str, n: usize, started: Instant) {
    let secs = started.elapsed().as_secs_f64();
    eprintln!("fuzz {name}: {n} inputs in {secs:.2} s ({:.0}/s)", n as f64 / secs.max(1e-9));
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "fuzz {name}: something panicked (see above)");
}

#[test]
fn frame_headers_decode_or_refuse_without_panicking() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    count_panics();
    let mut rng = Rng::new(1);
    let n = cases(200_000);
    let started = Instant::now();
    let desc = crate::fuzzing::seeds::desc();
    let valid = [
        Header::data(9, &desc, 1, 2).encode().to_vec(),
        Header::control(FrameKind::Abort, 9, 12).encode().to_vec(),
        Header::control(FrameKind::Pull, 9, crate::frame::PULL_LEN).encode().to_vec(),
    ];
    let mut accepted = 0;
    for i in 0..n {
        let input = if i % 2 == 0 { rng.bytes(HEADER_LEN) } else { rng.mutate(valid[i % 3].clone()) };
        let mut b = [0u8; HEADER_LEN];
        let k = input.len().min(HEADER_LEN);
        b[..k].copy_from_slice(&input[..k]);
        if let Ok(h) = Header::decode(&b) {
            accepted += 1;
            // Whatever decodes can be described and checked against a call.
            let _ = h.describe();
            let _ = h.matches(&desc);
            assert!(
                h.kind != FrameKind::Data || (h.len as usize) <= crate::frame::MAX_PAYLOAD,
                "a data frame longer than the limit passed: {h:?}"
            );
        }
    }
    assert!(
        accepted > 0,
        "no mutated header decoded: the structure-aware inputs are not reaching the checks"
    );
    finish("frame headers", n, started);
}

/// A listener whose accepted connections go to `serve` on their own thread.
fn listen(serve: impl Fn(TcpStream) + Send + Sync + 'static) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("loopback listener");
    let addr = l.local_addr().expect("its address");
    let serve = std::sync::Arc::new(serve);
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let serve = serve.clone();
            std::thread::spawn(move || serve(s));
        }
    });
    addr
}

/// A valid client hello for job `job`, to mutate.
fn hello(job: &str, rng: &mut Rng) -> Vec<u8> {
    let mut h = b"XCCLHELO".to_vec();
    h.extend(auth::PROTOCOL_VERSION.to_le_bytes());
    h.push(rng.below(3) as u8);
    h.extend(rng.next().to_le_bytes());
    h.extend((rng.below(8) as u32).to_le_bytes());
    h.extend((rng.below(8) as u32).to_le_bytes());
    h.extend((job.len() as u16).to_le_bytes());
    h.extend(job.as_bytes());
    h.extend(rng.bytes(16));
    h
}

#[test]
fn handshakes_refuse_garbage_on_both_sides() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    count_panics();
    let auth = Auth::new("fuzz-job", "secret").expect("auth");
    let patience = Duration::from_millis(300);
    // Servers: every fuzzed hello is refused (none can prove the secret) within patience.
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    let server_auth = auth.clone();
    let addr = listen(move |mut s| {
        let t0 = Instant::now();
        let r = auth::server(&mut s, &server_auth, "fuzzer", patience);
        let _ = tx.lock().map(|tx| tx.send((r.is_ok(), t0.elapsed())));
    });
    let mut rng = Rng::new(2);
    let n = cases(400);
    let started = Instant::now();
    for i in 0..n {
        let input = if i % 3 == 0 {
            rng.some_bytes(200)
        } else {
            let h = hello("fuzz-job", &mut rng);
            rng.mutate(h)
        };
        let mut c = TcpStream::connect(addr).expect("connect");
        let _ = c.write_all(&input);
        let _ = c.shutdown(std::net::Shutdown::Write);
        let (ok, took) = rx.recv_timeout(Duration::from_secs(10)).expect("the server answered every input");
        assert!(!ok, "a fuzzed hello passed the handshake: {input:?}");
        assert!(took < patience + Duration::from_secs(1), "the server took {took:?} on {input:?}");
    }
    // Clients: a server that answers garbage is refused, in time.
    let mut srng = Rng::new(3);
    let replies: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                srng.some_bytes(200)
            } else {
                let mut r = b"XCCLSRVR".to_vec();
                r.extend(auth::PROTOCOL_VERSION.to_le_bytes());
                r.extend(srng.bytes(80));
                srng.mutate(r)
            }
        })
        .collect();
    let replies = std::sync::Arc::new(Mutex::new(replies.into_iter()));
    let addr = listen(move |mut s| {
        let next = replies.lock().ok().and_then(|mut r| r.next());
        let mut sink = [0u8; 512];
        let _ = s.read(&mut sink);
        if let Some(r) = next {
            let _ = s.write_all(&r);
        }
    });
    for _ in 0..n {
        let mut c = TcpStream::connect(addr).expect("connect");
        let t0 = Instant::now();
        let r = auth::client(&mut c, &auth, Purpose::Store, "fuzzed server", patience);
        assert!(r.is_err(), "a garbage server was accepted");
        assert!(t0.elapsed() < patience + Duration::from_secs(1), "the client took {:?}", t0.elapsed());
    }
    finish("handshakes", 2 * n, started);
}

#[test]
fn the_store_survives_garbage_and_keeps_serving() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    count_panics();
    let auth = Auth::new("fuzz-store", "secret").expect("auth");
    let store = StoreServer::start("127.0.0.1:0", auth.clone()).expect("store");
    let addr = store.addr();
    let mut good = StoreClient::connect(&addr.to_string(), &auth, Duration::from_secs(5)).expect("client");
    let mut rng = Rng::new(4);
    let n = cases(600);
    let started = Instant::now();
    for i in 0..n {
        let mut c = TcpStream::connect(addr).expect("connect");
        let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
        match i % 3 {
            // Before any handshake: random bytes, or PyTorch's protocol (first byte 0) with
            // random requests.
            0 => {
                let mut b = rng.some_bytes(300);
                if rng.below(2) == 0 && !b.is_empty() {
                    b[0] = 0;
                }
                let _ = c.write_all(&b);
            }
            // After a proper handshake: requests with fuzzed operations, lengths and payloads.
            _ => {
                if auth::client(&mut c, &auth, Purpose::Store, "store", Duration::from_secs(5)).is_err() {
                    continue;
                }
                // The handshake leaves the socket blocking; a fuzzed `get` may wait long.
                let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
                let mut req = vec![rng.below(8) as u8];
                let klen = if rng.below(2) == 0 { rng.below(40) as u64 } else { rng.length() };
                req.extend(klen.to_le_bytes());
                req.extend(rng.bytes((klen as usize).min(64)));
                let vlen = if rng.below(2) == 0 { rng.below(40) as u64 } else { rng.length() };
                req.extend(vlen.to_le_bytes());
                req.extend(rng.bytes((vlen as usize).min(64)));
                let req = if rng.below(3) == 0 { rng.mutate(req) } else { req };
                let _ = c.write_all(&req);
            }
        }
        let _ = c.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = c.read_to_end(&mut sink);
        if i % 50 == 49 {
            let key = format!("health/{i}");
            good.set(&key, b"ok").expect("the store still serves a proper client");
            assert_eq!(good.get(&key).expect("and answers"), b"ok");
        }
    }
    finish("store", n, started);
}
