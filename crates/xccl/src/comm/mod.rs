//! The [`Communicator`]: one group of ranks, its backend (xccl's own engine behind a
//! stream, or MPI's), and how an operation reaches it. How a communicator is made is in
//! `build.rs`, the plan cache and the choice of algorithm in `plans.rs`, the public
//! operations in `ops.rs`.

mod build;
#[cfg(feature = "mpi")]
mod mpi;
mod native;
mod ops;
mod plans;
mod probe;

use std::sync::Arc;

use build::Fabric;
use plans::{PlanArgs, Plans, Wanted};

use crate::config::Config;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::exec::{Bufs, Engine, P2p};
use crate::stream::{JobOp, Stream};
use crate::work::{Completion, Event, OpSpan, Work};

/// A group of ranks that run collectives together.
///
/// Every rank of the group holds one `Communicator` and calls the same collectives in the
/// same order. Operations run in issue order on the communicator's own progress thread;
/// blocking calls wait for theirs, asynchronous calls return a [`Work`]. A communicator is
/// `Send + Sync` and cheap to clone (clones share the group); several communicators (a
/// tensor-parallel group and a data-parallel group, say) can be used at once, from any
/// threads, without interfering.
///
/// If an operation fails (a peer died, ranks called different collectives, a deadline
/// passed) the communicator aborts: its peers are told, and every later operation fails
/// with the original error. Create a new communicator to continue.
///
/// A communicator runs on one of two backends, chosen when it is made and inherited by its
/// splits and duplicates: xccl's own (the default: algorithms, executor and transports of
/// this crate) or, with feature `mpi`, the MPI library's ([`Communicator::mpi_world`],
/// `XCCL_BACKEND=mpi`). The API is the same.
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
}

struct Inner {
    // Dropped first: joins the progress thread.
    backend: Backend,
    group: Group,
    config: Config,
    /// The largest message tag the backend accepts.
    max_tag: u32,
}

#[cfg(feature = "mpi")]
impl Inner {
    /// A communicator of MPI's communicator `comm`.
    fn mpi(comm: mpi::MpiComm, group: Group, config: Config) -> Inner {
        Inner { max_tag: comm.tag_ub, backend: Backend::Mpi(comm), group, config }
    }
}

/// A communicator's stream, and what only its backend has: how a collective is planned, how
/// the communicator is split.
enum Backend {
    /// xccl's own engine.
    Native(Native),
    /// The MPI library's communicator (feature `mpi`).
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiComm),
}

/// The native backend: the stream, how links are made, the plans.
struct Native {
    // Dropped first: joins the progress thread, which closes the links.
    stream: Stream<Engine>,
    fabric: Fabric,
    /// Plans of the collectives called so far, so that a repeated call builds nothing.
    plans: Plans,
}

/// A checked collective, ready for its backend.
enum Call {
    /// The key of the native plan.
    Native(Wanted),
    /// The MPI call.
    #[cfg(feature = "mpi")]
    Mpi(mpi::Coll),
}

/// Evaluates `$body` with `$s` bound to the stream of `$comm`, whichever its backend: the
/// operations that are the same on every backend.
macro_rules! on_stream {
    ($comm:expr, $s:ident => $body:expr) => {
        match &$comm.inner.backend {
            Backend::Native(n) => {
                let $s = &n.stream;
                $body
            }
            #[cfg(feature = "mpi")]
            Backend::Mpi(m) => {
                let $s = &m.stream;
                $body
            }
        }
    };
}

/// Who a communicator is.
#[derive(Clone)]
struct Group {
    rank: usize,
    size: usize,
    id: u64,
    /// World rank of each member.
    members: Vec<usize>,
    /// Host index of each member (equal for members that share a host).
    hosts: Vec<usize>,
    /// Cores of each member's host.
    cores: Vec<usize>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.inner.group.rank)
            .field("size", &self.inner.group.size)
            .field("id", &format_args!("{:#018x}", self.inner.group.id))
            .finish()
    }
}

/// Mixes values into a communicator id that every member computes alike.
fn mix(parts: &[u64]) -> u64 {
    parts.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, &p| {
        let mut z = h ^ p.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

fn hash_str(s: &str) -> u64 {
    mix(&s.bytes().map(u64::from).collect::<Vec<_>>())
}

impl Communicator {
    /// The state of the native backend (an internal error on another backend).
    fn native(&self) -> Result<&Native> {
        match &self.inner.backend {
            Backend::Native(n) => Ok(n),
            #[cfg(feature = "mpi")]
            Backend::Mpi(_) => Err(Error::Internal("the native engine of an MPI communicator".into())),
        }
    }

    /// The name of this communicator's backend: `"native"` (xccl's own engine) or `"mpi"`.
    pub fn backend(&self) -> &'static str {
        match &self.inner.backend {
            Backend::Native(_) => "native",
            #[cfg(feature = "mpi")]
            Backend::Mpi(_) => "mpi",
        }
    }

    /// Aborts this communicator from any thread (NCCL's `ncclCommAbort`): the operation in
    /// progress fails within moments with [`Error::Cancelled`], as does every operation issued
    /// later, and the peers' operations fail naming this rank and `reason` (at once if they
    /// are waiting on it, else when the communicator is dropped). Its splits and duplicates
    /// are not affected. On the MPI backend there is no way to stop a call in progress: this
    /// returns an error that says so.
    pub fn abort(&self, reason: &str) -> Result<()> {
        if on_stream!(self, s => s.abort(reason)) {
            return Ok(());
        }
        Err(Error::Config(format!(
            "abort: the {} backend cannot stop a call in progress; drop the communicator, or end the job",
            self.backend()
        )))
    }

    /// This rank's index in the group, `0..size()`.
    pub fn rank(&self) -> usize {
        self.inner.group.rank
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.inner.group.size
    }

    /// The group's id, the same on every member (it appears in frame headers and errors).
    pub fn id(&self) -> u64 {
        self.inner.group.id
    }

    /// The settings this communicator runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Starts recording when each operation of this communicator ran (or stops, dropping
    /// what was recorded); see [`Communicator::take_timeline`].
    pub fn record_timeline(&self, on: bool) {
        on_stream!(self, s => s.record_timeline(on));
    }

    /// The spans of the operations that finished since recording started or since the last
    /// call, oldest first. Empty when not recording.
    pub fn take_timeline(&self) -> Vec<OpSpan> {
        on_stream!(self, s => s.take_timeline())
    }

    /// An event that completes when every operation issued before it has completed.
    pub fn record_event(&self) -> Event {
        let done = Arc::new(Completion::default());
        on_stream!(self, s => s.submit_unsequenced(JobOp::Marker, done.clone()));
        Event::new(done)
    }

    fn check_rank(&self, api: &'static str, what: &str, r: usize) -> Result<()> {
        if r >= self.size() {
            return Err(Error::invalid(
                api,
                format!("{what} {r} is outside this group of {} ranks", self.size()),
            ));
        }
        Ok(())
    }

    /// Runs a collective on borrowed buffers; returns its sequence number.
    fn block_seq(&self, call: Result<Call>, bufs: Bufs) -> Result<u64> {
        // The stream returns after the operation completed: the buffers behind `bufs` stay
        // borrowed until then.
        let (seq, result) = match (call?, &self.inner.backend) {
            (Call::Native(want), Backend::Native(n)) => self.with_plan(&n.plans, want, |plan| {
                // SAFETY: the plan is borrowed until `run` returns, after the collective
                // completed.
                n.stream.run(|seq| JobOp::Task { task: unsafe { native::Coll::lent(plan, bufs) }, seq })
            })?,
            #[cfg(feature = "mpi")]
            (Call::Mpi(coll), Backend::Mpi(m)) => {
                m.stream.run(|seq| JobOp::Task { task: mpi::Task::coll(coll, bufs), seq })
            }
            #[cfg(feature = "mpi")]
            _ => return Err(Error::Internal("a collective planned for another backend".into())),
        };
        result.map(|()| seq)
    }

    fn block(&self, call: Result<Call>, bufs: Bufs) -> Result<()> {
        self.block_seq(call, bufs).map(|_| ())
    }

    /// Runs a collective on buffers owned by `keep`, which `bufs` points into.
    fn spawn<K: Send + 'static>(&self, call: Result<Call>, bufs: Bufs, keep: K) -> Work<K> {
        let call = match call {
            Err(e) => return Work::new(Completion::finished(Err(e))),
            Ok(call) => call,
        };
        let done = Arc::new(Completion::default());
        // Park the buffers first: moving them does not move their heap memory.
        done.keep(Box::new(keep));
        match (call, &self.inner.backend) {
            (Call::Native(want), Backend::Native(n)) => match self.with_plan(&n.plans, want, Arc::clone) {
                Ok(plan) => {
                    let task = |seq| JobOp::Task { task: native::Coll::owned(plan, bufs), seq };
                    n.stream.submit(task, done.clone());
                }
                Err(e) => done.finish(Err(e)),
            },
            #[cfg(feature = "mpi")]
            (Call::Mpi(coll), Backend::Mpi(m)) => {
                m.stream.submit(|seq| JobOp::Task { task: mpi::Task::coll(coll, bufs), seq }, done.clone());
            }
            #[cfg(feature = "mpi")]
            _ => done.finish(Err(Error::Internal("a collective planned for another backend".into()))),
        }
        Work::new(done)
    }

    fn p2p_check(&self, api: &'static str, peer: usize, tag: u32) -> Result<()> {
        self.check_rank(api, "peer", peer)?;
        if peer == self.rank() {
            return Err(Error::invalid(
                api,
                "a rank cannot send to or receive from itself; copy the data instead",
            ));
        }
        if tag > self.inner.max_tag {
            let msg = format!(
                "tag {tag} is above the largest tag the {} backend accepts ({})",
                self.backend(),
                self.inner.max_tag
            );
            return Err(Error::invalid(api, msg));
        }
        Ok(())
    }

    /// Runs one point-to-point message on borrowed memory, returning once it completed.
    fn p2p_block(&self, msg: P2p) -> Result<()> {
        on_stream!(self, s => s.run_unsequenced(JobOp::P2p { msg }))
    }

    /// Queues one point-to-point message on memory parked in `done`; its outcome goes there.
    fn p2p_submit(&self, msg: P2p, done: Arc<Completion>) {
        on_stream!(self, s => s.submit_unsequenced(JobOp::P2p { msg }, done));
    }
}

impl Bufs {
    /// One buffer that is both input and output.
    fn in_place<T: Element>(buf: &mut [T]) -> Bufs {
        let bytes = std::mem::size_of_val(buf);
        let p = buf.as_mut_ptr().cast::<u8>();
        Bufs { input: p, input_len: bytes, output: p, output_len: bytes }
    }

    /// Separate input and output.
    fn pair<T: Element>(input: &[T], output: &mut [T]) -> Bufs {
        Bufs {
            input: input.as_ptr().cast(),
            input_len: std::mem::size_of_val(input),
            output: output.as_mut_ptr().cast(),
            output_len: std::mem::size_of_val(output),
        }
    }
}

/// The element type of a point-to-point message, for checks on the receiving side.
fn p2p<T: Element>(send: bool, peer: usize, tag: u32, ptr: *mut T, len: usize) -> P2p {
    P2p { send, peer, tag, dtype: <T as Element>::DTYPE, ptr: ptr.cast(), len: len * DType::size(T::DTYPE) }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use super::*;
    use crate::bootstrap::auth::{self, Purpose};
    use crate::bootstrap::{Auth, Rendezvous, StoreClient, StoreServer};
    use crate::reduce::ReduceOp;

    #[test]
    fn garbage_on_a_link_is_a_protocol_error_not_a_crash() {
        let auth = Auth::new("garbage-test", "s").unwrap();
        let store = StoreServer::start("127.0.0.1:0", auth.clone()).unwrap();
        let addr = store.addr().to_string();
        let rv = Rendezvous {
            rank: 0,
            size: 2,
            local_rank: 0,
            store: addr.clone(),
            serve_store: false,
            c10d_prefix: None,
            auth: auth.clone(),
            timeout: Duration::from_secs(10),
            host: "test-host".into(),
            launcher: "test",
        };
        let rank0 = std::thread::spawn(move || {
            let c =
                Communicator::connect(&rv, Config { timeout: Duration::from_secs(10), ..Config::default() })?;
            let mut v = vec![0f32; 16];
            c.all_reduce(&mut v, ReduceOp::Sum)
        });
        // Play rank 1 by hand: authenticate properly, then send garbage instead of frames.
        let mut client = StoreClient::connect(&addr, &auth, Duration::from_secs(5)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let record = format!("{} 2 0 1 another-host", listener.local_addr().unwrap());
        client.set("world0/addr/1", record.as_bytes()).unwrap();
        let rank0_addr = String::from_utf8(client.get("world0/addr/0").unwrap()).unwrap();
        let mut s = TcpStream::connect(rank0_addr.split(' ').next().unwrap()).unwrap();
        let comm = mix(&[hash_str(auth.job()), 0, 2]);
        auth::client(&mut s, &auth, Purpose::Link { comm, from: 1, to: 0 }, "rank 0", Duration::from_secs(5))
            .unwrap();
        s.write_all(&[0xAB; 200]).unwrap();
        let err = rank0.join().unwrap().unwrap_err();
        assert!(matches!(err, Error::Protocol { peer: 1, .. }), "{err}");
        assert!(err.to_string().contains("not an xccl frame"), "{err}");
    }
}
