//! The [`Communicator`]: one group of ranks, its progress stream and how it was built.

#[cfg(feature = "mpi")]
mod mpi;
mod ops;
mod probe;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rustc_hash::FxHashMap;

use crate::algo::tune::{self, Choice, CostModel, LinkClass, Topology};
use crate::algo::{self, Algorithm, Shape};
use crate::bootstrap::board::{StoreAddress, StoreBoard};
use crate::bootstrap::host;
use crate::bootstrap::mesh::{self, Acceptor};
use crate::bootstrap::{Auth, C10dClient, KeyValue, Rendezvous, StoreClient, StoreServer};
use crate::coll::CollKind;
use crate::config::Config;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::exec::{Bufs, Engine, P2p, Plan, Tuning};
use crate::flight::Recorder;
use crate::frame::OpDesc;
use crate::reduce::ReduceOp;
use crate::schedule::{Buf, Region};
use crate::stall::Board;
use crate::stream::{JobOp, Stream};
use crate::transport::local::{self, LocalMesh};
use crate::transport::shm::{self, ShmSegment};
use crate::transport::{Links, Memory};
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

/// How a world is joined, beside its rendezvous: its key space in the store, the address
/// to listen on, the store this rank serves, and how to reach the store again.
struct Via {
    generation: u64,
    ip: IpAddr,
    served: Option<StoreServer>,
    board: Option<StoreAddress>,
    rank0_serves: bool,
}

/// How a communicator makes the links of its sub-communicators.
enum Fabric {
    /// Ranks are threads of this process.
    Local,
    /// Ranks are reachable over TCP.
    Tcp(Arc<TcpFabric>),
}

struct TcpFabric {
    acceptor: Acceptor,
    /// Acceptor address of every rank of the world, by world rank.
    addrs: Vec<SocketAddr>,
    /// Process id of every rank of the world.
    pids: Vec<i32>,
    auth: Auth,
    /// The store, when rank 0 serves it.
    _store: Option<StoreServer>,
    /// The job's store, where ranks that time out find the silent one (`None`: a store the
    /// program brought, which xccl cannot reach again).
    board: Option<StoreAddress>,
    /// Whether world rank 0's process serves that store.
    rank0_serves: bool,
}

impl TcpFabric {
    /// The links of `rank` in communicator `id` of world ranks `members` on `hosts`: shared
    /// memory to the members on this rank's host (unless disabled), TCP to the others.
    fn links(
        &self,
        id: u64,
        rank: usize,
        members: &[usize],
        hosts: &[usize],
        config: &Config,
    ) -> Result<Links> {
        let local: Vec<usize> = (0..members.len()).filter(|&q| hosts[q] == hosts[rank]).collect();
        let shm = config.shm && local.len() > 1;
        let addrs: Vec<Option<SocketAddr>> = (0..members.len())
            .map(|q| (q != rank && !(shm && hosts[q] == hosts[rank])).then(|| self.addrs[members[q]]))
            .collect();
        let mut links = mesh::connect(&self.acceptor, &self.auth, id, rank, &addrs, config)?;
        let mut memory = None;
        if shm {
            let me = local
                .iter()
                .position(|&q| q == rank)
                .ok_or_else(|| Error::Internal("rank not on its host".into()))?;
            let creator = self.pids[members[local[0]]];
            // The host is in the name too: several "hosts" may share one machine (XCCL_HOST_KEY).
            let name =
                format!("{}{id:016x}-h{}-{creator}", shm::segment_prefix(self.auth.job()), hosts[rank]);
            let pids: Vec<(usize, i32)> = local.iter().map(|&q| (q, self.pids[members[q]])).collect();
            let seg = ShmSegment::join(
                &name,
                local.len(),
                me,
                config.shm_ring_for(local.len()),
                config.timeout,
                &pids,
            )?;
            let mut procs = Vec::new();
            let mut index = vec![None; members.len()];
            for (i, &q) in local.iter().enumerate() {
                index[q] = Some(i);
                if q != rank {
                    links[q] = Some(Box::new(seg.link(me, i)));
                    procs.push((q, i, self.pids[members[q]]));
                }
            }
            memory = Some(Memory::new(seg, me, index, procs));
        }
        Links::new(rank, links, memory).map_err(|e| Error::io("setting up links", e))
    }
}

struct Inner {
    // Dropped first: joins the progress thread or the MPI worker.
    backend: Backend,
    group: Group,
    config: Config,
}

/// What runs a communicator's operations.
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
    stream: Stream,
    fabric: Fabric,
    /// Plans of the collectives called so far, so that a repeated call builds nothing.
    plans: Mutex<Plans>,
}

/// A checked collective, ready for its backend.
enum Call {
    /// The native plan.
    Native(Arc<Plan>),
    /// The MPI call.
    #[cfg(feature = "mpi")]
    Mpi(mpi::Coll),
}

/// The plans of a communicator: the last one used (a loop calling one collective finds it
/// without hashing its key), and all others by key.
#[derive(Default)]
struct Plans {
    last: Option<(PlanKey, Arc<Plan>)>,
    all: FxHashMap<PlanKey, Arc<Plan>>,
}

/// Everything a plan depends on (besides the communicator).
#[derive(Clone, PartialEq, Eq, Hash)]
struct PlanKey {
    kind: CollKind,
    dtype: DType,
    op: Option<ReduceOp>,
    root: Option<usize>,
    count: u64,
    shape: Shape,
    elems: (usize, usize),
}

/// Plans kept per communicator before the cache starts over.
const PLAN_CACHE: usize = 1024;

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
    fn build(group: Group, links: Links, config: Config, fabric: Fabric) -> Result<Communicator> {
        let board: Option<Arc<dyn Board>> = match &fabric {
            Fabric::Tcp(f) => f.board.clone().map(|store| {
                let server = f.rank0_serves.then(|| group.members.iter().position(|&m| m == 0)).flatten();
                Arc::new(StoreBoard::new(store, group.id, group.size, server)) as Arc<dyn Board>
            }),
            Fabric::Local => None,
        };
        let tuning = Tuning {
            timeout: config.timeout,
            max_stash: config.max_unexpected,
            pull_min: config.pull_min,
            protocols: config.protocols.clone(),
            board,
        };
        let engine = Engine::new(group.rank, group.size, group.id, links, tuning);
        let flight = Recorder::new(config.flight.clone(), group.rank, group.size, group.id);
        let stream = Stream::start(group.rank, engine, flight)?;
        let plans = Mutex::new(Plans::default());
        let backend = Backend::Native(Native { stream, fabric, plans });
        Ok(Communicator { inner: Arc::new(Inner { backend, group, config }) })
    }

    /// A communicator of every process of the MPI job this process belongs to (started by
    /// `mpirun` or `srun`), whose collectives and messages are the MPI library's: a
    /// duplicate of `MPI_COMM_WORLD`, with the rank and size MPI gives. Initialises MPI with
    /// `MPI_THREAD_MULTIPLE` on first use (or checks that level, if the program initialised
    /// MPI itself) and finalises it at process exit. Settings come from the `XCCL_*`
    /// variables; those of xccl's own engine (algorithms, timeouts, transports) do not apply.
    /// Collective over the MPI job. See `docs/MPI.md`.
    #[cfg(feature = "mpi")]
    pub fn mpi_world() -> Result<Communicator> {
        Communicator::mpi_world_with(Config::from_env()?)
    }

    /// Like [`Communicator::mpi_world`], with explicit settings.
    #[cfg(feature = "mpi")]
    pub fn mpi_world_with(config: Config) -> Result<Communicator> {
        let (comm, group) = mpi::MpiComm::world()?;
        Ok(Communicator { inner: Arc::new(Inner { backend: Backend::Mpi(comm), group, config }) })
    }

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

    /// `n` communicators of one group whose ranks are threads of this process; hand one to
    /// each thread. Settings come from the `XCCL_*` variables ([`Config::from_env`]).
    pub fn local(n: usize) -> Result<Vec<Communicator>> {
        Communicator::local_with(n, Config::from_env()?)
    }

    /// Like [`Communicator::local`], with explicit settings.
    pub fn local_with(n: usize, config: Config) -> Result<Vec<Communicator>> {
        if n == 0 {
            return Err(Error::invalid("Communicator::local", "a group needs at least one rank"));
        }
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = mix(&[u64::from(std::process::id()), NEXT.fetch_add(1, Ordering::Relaxed)]);
        let mesh = LocalMesh::new(n);
        (0..n)
            .map(|rank| {
                let cores = vec![host::cores(); n];
                let group = Group { rank, size: n, id, members: (0..n).collect(), hosts: vec![0; n], cores };
                Communicator::build(group, mesh.claim(rank)?, config.clone(), Fabric::Local)
            })
            .collect()
    }

    /// Joins the job described by this process's environment: torchrun (`RANK`,
    /// `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), Slurm (`SLURM_PROCID`, ...), Open MPI's
    /// mpirun (`OMPI_COMM_WORLD_RANK`, ...) or `xccl run`; see [`Rendezvous`]. With
    /// `XCCL_BACKEND=mpi`, the communicator is [`Communicator::mpi_world`] instead (an
    /// error if this xccl was built without feature `mpi`).
    pub fn from_env() -> Result<Communicator> {
        Communicator::from_env_with(Config::from_env()?)
    }

    /// Like [`Communicator::from_env`], with explicit settings.
    pub fn from_env_with(config: Config) -> Result<Communicator> {
        if wants_mpi()? {
            #[cfg(feature = "mpi")]
            return Communicator::mpi_world_with(config);
            #[cfg(not(feature = "mpi"))]
            return Err(Error::Config(
                "XCCL_BACKEND=mpi, but this xccl was built without MPI; rebuild with `--features mpi` \
                 (see docs/MPI.md), or unset XCCL_BACKEND to use xccl's own transports"
                    .into(),
            ));
        }
        Communicator::connect(&Rendezvous::from_env()?, config)
    }

    /// Joins the job described by `rv` over TCP. A job whose hosts meet over a network
    /// first measures the links between them, so the tuner prices them as they are
    /// (`XCCL_LINK_PROBE`; about 0.1 s; see `comm/probe.rs`).
    pub fn connect(rv: &Rendezvous, config: Config) -> Result<Communicator> {
        // The k-th world a rank of a job joins gets the k-th key space in the store.
        static WORLDS: Mutex<Option<HashMap<(String, usize), u64>>> = Mutex::new(None);
        let generation = {
            let mut g = WORLDS.lock().unwrap_or_else(PoisonError::into_inner);
            let n =
                g.get_or_insert_with(HashMap::new).entry((rv.auth.job().to_string(), rv.rank)).or_insert(0);
            *n += 1;
            *n - 1
        };
        let served = if rv.serve_store && rv.rank == 0 { Some(StoreServer::serve(rv)?) } else { None };
        let (mut store, ip): (Box<dyn KeyValue>, IpAddr) = match &rv.c10d_prefix {
            Some(prefix) => {
                let c = C10dClient::connect(&rv.store, prefix, rv.timeout)?;
                let ip = c.local_addr()?.ip();
                (Box::new(c), ip)
            }
            None => {
                let c = StoreClient::connect(&rv.store, &rv.auth, rv.timeout)?;
                let ip = c.local_addr()?.ip();
                (Box::new(c), ip)
            }
        };
        let board = match &rv.c10d_prefix {
            Some(prefix) => StoreAddress::C10d { addr: rv.store.clone(), prefix: prefix.clone() },
            None => StoreAddress::Ours { addr: rv.store.clone(), auth: rv.auth.clone() },
        };
        let via = Via { generation, ip, served, board: Some(board), rank0_serves: rv.serve_store };
        Communicator::connect_via(rv, store.as_mut(), via, config)
    }

    /// Joins the job described by `rv` (its rank, size, job and host; its `store` address
    /// unused) through `store`, listening for peers on `ip` (an address of this host the
    /// others reach). For programs that bring their own store: the Python package meets
    /// through the store PyTorch hands to each process group. Every rank of the group
    /// passes the same job id in `rv.auth`, which no other group of the store uses.
    pub fn connect_with_store(
        rv: &Rendezvous,
        store: &mut dyn KeyValue,
        ip: IpAddr,
        config: Config,
    ) -> Result<Communicator> {
        let via = Via { generation: 0, ip, served: None, board: None, rank0_serves: false };
        Communicator::connect_via(rv, store, via, config)
    }

    fn connect_via(
        rv: &Rendezvous,
        client: &mut dyn KeyValue,
        via: Via,
        config: Config,
    ) -> Result<Communicator> {
        let Via { generation, ip, served, board, rank0_serves } = via;
        let acceptor = Acceptor::start(ip, rv.auth.clone())?;
        let prefix = format!("world{generation}");
        let me =
            format!("{} {} {} {} {}", acceptor.addr(), rv.size, std::process::id(), host::cores(), rv.host);
        client.set(&format!("{prefix}/addr/{}", rv.rank), me.as_bytes())?;
        let mut addrs = Vec::with_capacity(rv.size);
        let mut keys = Vec::with_capacity(rv.size);
        let mut pids = Vec::with_capacity(rv.size);
        let mut cores = Vec::with_capacity(rv.size);
        for r in 0..rv.size {
            let v = client.get(&format!("{prefix}/addr/{r}"))?;
            let v = String::from_utf8_lossy(&v).into_owned();
            let bad = || Error::Bootstrap(format!("bad address record '{v}' of rank {r}"));
            let mut fields = v.splitn(5, ' ');
            let (addr, size, pid, ncores, key) = (
                fields.next().ok_or_else(bad)?,
                fields.next().ok_or_else(bad)?,
                fields.next().ok_or_else(bad)?,
                fields.next().ok_or_else(bad)?,
                fields.next().ok_or_else(bad)?,
            );
            if size != rv.size.to_string() {
                return Err(Error::Bootstrap(format!(
                    "rank {r} was started with a world of {size} ranks, rank {} with {}: every rank needs the same WORLD_SIZE",
                    rv.rank, rv.size
                )));
            }
            addrs.push(addr.parse().map_err(|_| bad())?);
            pids.push(pid.parse().map_err(|_| bad())?);
            cores.push(ncores.parse::<usize>().map_err(|_| bad())?.max(1));
            keys.push(key.to_string());
        }
        let id = mix(&[hash_str(rv.auth.job()), generation, rv.size as u64]);
        let fabric =
            TcpFabric { acceptor, addrs, pids, auth: rv.auth.clone(), _store: served, board, rank0_serves };
        let hosts = host::host_indices(&keys);
        let members: Vec<usize> = (0..rv.size).collect();
        let links = fabric.links(id, rv.rank, &members, &hosts, &config)?;
        let remote = fabric.addrs.iter().any(|a| !a.ip().is_loopback());
        let given = config.costs.tcp != CostModel::default().tcp;
        let measure = probe::wanted(config.link_probe, &hosts, remote, given);
        let group = Group { rank: rv.rank, size: rv.size, id, members, hosts, cores };
        let mut comm = Communicator::build(group, links, config, Fabric::Tcp(Arc::new(fabric)))?;
        if measure {
            let tcp = probe::measure(&comm, comm.inner.config.costs.tcp)?;
            tracing::info!(
                rank = comm.rank(),
                "links between hosts measured: {:.1} µs, {:.3} GB/s",
                tcp.alpha * 1e6,
                1e-9 / tcp.beta
            );
            let inner = Arc::get_mut(&mut comm.inner)
                .ok_or_else(|| Error::Internal("the link probe kept a handle on the communicator".into()))?;
            inner.config.costs.tcp = tcp;
            // The probe's own calls were planned with the old constants.
            match &inner.backend {
                Backend::Native(n) => {
                    *n.plans.lock().unwrap_or_else(PoisonError::into_inner) = Plans::default()
                }
                #[cfg(feature = "mpi")]
                Backend::Mpi(_) => {}
            }
        }
        Ok(comm)
    }

    /// Aborts this communicator from any thread (NCCL's `ncclCommAbort`): the operation in
    /// progress fails within moments with [`Error::Cancelled`], as does every operation issued
    /// later, and the peers' operations fail naming this rank and `reason` (at once if they
    /// are waiting on it, else when the communicator is dropped). Its splits and duplicates
    /// are not affected. On the MPI backend there is no way to stop a call in progress: this
    /// returns an error that says so.
    pub fn abort(&self, reason: &str) -> Result<()> {
        match &self.inner.backend {
            Backend::Native(n) => {
                n.stream.abort(reason);
                Ok(())
            }
            #[cfg(feature = "mpi")]
            Backend::Mpi(_) => Err(Error::Config(
                "abort: the MPI backend cannot stop an MPI call in progress; drop the communicator, or                  end the job (MPI_Abort)"
                    .into(),
            )),
        }
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

    /// Splits the group, as `MPI_Comm_split`: ranks passing the same `color` form a new
    /// group, ordered by `key` and then by their rank here; ranks passing `None` get `None`.
    /// Collective: every rank of this group must call it.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        self.split_with(color, key, self.inner.config.clone())
    }

    /// A new communicator of the same ranks, in the same order, with its own stream and the
    /// given settings (`MPI_Comm_dup`, with other settings): operations on it never mix
    /// with this one's. Collective: every rank of this group must call it, with settings
    /// that agree on what every rank must agree on (the algorithm overrides, say).
    pub fn dup_with(&self, config: Config) -> Result<Communicator> {
        #[cfg(feature = "mpi")]
        if let Backend::Mpi(m) = &self.inner.backend {
            let (comm, group) = m.dup(&self.inner.group)?;
            return Ok(Communicator {
                inner: Arc::new(Inner { backend: Backend::Mpi(comm), group, config }),
            });
        }
        self.split_with(Some(0), 0, config)?
            .ok_or_else(|| Error::Internal("a rank left out of its own duplicate".into()))
    }

    fn split_with(&self, color: Option<u32>, key: i32, config: Config) -> Result<Option<Communicator>> {
        #[cfg(feature = "mpi")]
        if let Backend::Mpi(m) = &self.inner.backend {
            let made = m.split(&self.inner.group, color, key)?;
            return Ok(made.map(|(comm, group)| Communicator {
                inner: Arc::new(Inner { backend: Backend::Mpi(comm), group, config }),
            }));
        }
        let fabric = &self.native()?.fabric;
        let mine = [color.map_or(-1, i64::from), i64::from(key)];
        let mut all = vec![0i64; 2 * self.size()];
        let seq =
            self.block_seq(self.plan_all_gather::<i64>(2, 2 * self.size()), Bufs::pair(&mine, &mut all))?;
        let Some(color) = color else { return Ok(None) };
        let mut group: Vec<(i64, usize)> = (0..self.size())
            .filter(|&r| all[2 * r] == i64::from(color))
            .map(|r| (all[2 * r + 1], r))
            .collect();
        group.sort_unstable();
        let rank = group
            .iter()
            .position(|&(_, r)| r == self.rank())
            .ok_or_else(|| Error::Internal("split lost this rank".into()))?;
        let size = group.len();
        let id = mix(&[self.inner.group.id, seq, u64::from(color)]);
        let members: Vec<usize> = group.iter().map(|&(_, r)| self.inner.group.members[r]).collect();
        let hosts: Vec<usize> = group.iter().map(|&(_, r)| self.inner.group.hosts[r]).collect();
        let cores: Vec<usize> = group.iter().map(|&(_, r)| self.inner.group.cores[r]).collect();
        match fabric {
            Fabric::Local => {
                let mesh = local::rendezvous(id, size);
                let links = mesh.claim(rank)?;
                let group = Group { rank, size, id, members, hosts, cores };
                Communicator::build(group, links, config, Fabric::Local).map(Some)
            }
            Fabric::Tcp(f) => {
                let links = f.links(id, rank, &members, &hosts, &config)?;
                let group = Group { rank, size, id, members, hosts, cores };
                Communicator::build(group, links, config, Fabric::Tcp(f.clone())).map(Some)
            }
        }
    }

    /// Starts recording when each operation of this communicator ran (or stops, dropping
    /// what was recorded); see [`Communicator::take_timeline`].
    pub fn record_timeline(&self, on: bool) {
        match &self.inner.backend {
            Backend::Native(n) => n.stream.record_timeline(on),
            #[cfg(feature = "mpi")]
            Backend::Mpi(m) => m.record_timeline(on),
        }
    }

    /// The spans of the operations that finished since recording started or since the last
    /// call, oldest first. Empty when not recording.
    pub fn take_timeline(&self) -> Vec<OpSpan> {
        match &self.inner.backend {
            Backend::Native(n) => n.stream.take_timeline(),
            #[cfg(feature = "mpi")]
            Backend::Mpi(m) => m.take_timeline(),
        }
    }

    /// An event that completes when every operation issued before it has completed.
    pub fn record_event(&self) -> Event {
        let done = Arc::new(Completion::default());
        match &self.inner.backend {
            Backend::Native(n) => n.stream.submit_unsequenced(JobOp::Marker, done.clone()),
            #[cfg(feature = "mpi")]
            Backend::Mpi(m) => m.marker(done.clone()),
        }
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

    /// The algorithm for a collective: the one `XCCL_ALGO` names, else the tuner's pick.
    fn choose<T: Element>(&self, key: &PlanKey) -> Result<Algorithm> {
        let n = self.size();
        if let Some(algo) = self.inner.config.algos.get(key.kind) {
            if !algo.supports(key.kind, n, &key.shape) {
                return Err(Error::Config(format!(
                    "XCCL_ALGO asks for {algo}, which cannot run {} on {n} ranks with this layout",
                    key.kind
                )));
            }
            return Ok(algo);
        }
        let choice = tune::rank(
            &self.inner.config.costs,
            &self.topology(),
            key.kind,
            key.root.unwrap_or(0),
            &key.shape,
            T::DTYPE.size(),
        )?;
        tracing::info!(rank = self.rank(), "{} of {:?} ({}): {choice}", key.kind, key.shape, T::DTYPE);
        Ok(choice.algo)
    }

    /// The ranks' hosts and the links between them, as the tuner sees them. On the MPI
    /// backend: the hosts MPI reports (ranks that share memory), with the link classes of
    /// xccl's shared memory and TCP as the nearest estimate (MPI's own transports may be
    /// faster).
    pub fn topology(&self) -> Topology {
        let hosts = self.inner.group.hosts.clone();
        let cores = self.inner.group.cores.clone();
        let (intra, inter) = match &self.inner.backend {
            Backend::Native(Native { fabric: Fabric::Local, .. }) => (LinkClass::Local, LinkClass::Local),
            Backend::Native(_) if !self.inner.config.shm => (LinkClass::Tcp, LinkClass::Tcp),
            _ => (LinkClass::Shm, LinkClass::Tcp),
        };
        Topology {
            hosts,
            cores,
            intra,
            inter,
            protocols: self.inner.config.protocols.clone(),
            pull_min: self.inner.config.pull_min,
        }
    }

    /// The algorithm a collective of `kind` on `count` elements of `dtype` (per rank, as the
    /// call takes them) would run with, and why: the tuner's ranking, or the override.
    pub fn algorithm_for(&self, kind: CollKind, count: usize, dtype: DType, root: usize) -> Result<Choice> {
        self.algorithm_for_shape(kind, &Shape::Count(count), dtype, root)
    }

    /// Like [`algorithm_for`](Self::algorithm_for), for any data layout: the blocks of an
    /// uneven call (`Shape::Scatter` for [`reduce_scatter_v`](Self::reduce_scatter_v), say).
    ///
    /// On the MPI backend MPI chooses its own algorithms: this is a
    /// [`Config`](Error::Config) error saying so (see [`backend`](Self::backend)).
    pub fn algorithm_for_shape(
        &self,
        kind: CollKind,
        shape: &Shape,
        dtype: DType,
        root: usize,
    ) -> Result<Choice> {
        if self.backend() != "native" {
            return Err(Error::Config(format!(
                "this communicator's {kind} runs on the {} backend, which chooses its own algorithms",
                self.backend()
            )));
        }
        if let Some(algo) = self.inner.config.algos.get(kind) {
            return Ok(Choice { algo, ranking: vec![(algo, f64::NAN)] });
        }
        tune::rank(&self.inner.config.costs, &self.topology(), kind, root, shape, dtype.size())
    }

    /// The plan of a collective: from the cache, or built (algorithm, schedule, checks); on
    /// the MPI backend, the MPI call.
    fn plan<T: Element>(&self, p: PlanArgs) -> Result<Call> {
        #[cfg(feature = "mpi")]
        if let Backend::Mpi(_) = &self.inner.backend {
            return mpi::Coll::new(p, T::DTYPE, self.rank(), self.size()).map(Call::Mpi);
        }
        let native = self.native()?;
        let key = PlanKey {
            kind: p.kind,
            dtype: T::DTYPE,
            op: p.op,
            root: p.root,
            count: p.count,
            shape: p.shape,
            elems: p.elems,
        };
        let mut plans = native.plans.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((last, plan)) = &plans.last
            && *last == key
        {
            return Ok(Call::Native(plan.clone()));
        }
        if let Some(plan) = plans.all.get(&key).cloned() {
            plans.last = Some((key, plan.clone()));
            return Ok(Call::Native(plan));
        }
        let algo = self.choose::<T>(&key)?;
        let program = algo::build(
            key.kind,
            algo,
            self.rank(),
            &self.inner.group.hosts,
            key.root.unwrap_or(0),
            &key.shape,
        )?;
        let desc = OpDesc {
            kind: key.kind,
            seq: 0,
            dtype: key.dtype,
            op: key.op,
            count: key.count,
            root: key.root.map(|r| r as u32),
            algo,
        };
        let plan = Arc::new(Plan::new(
            desc,
            program,
            self.rank(),
            self.size(),
            key.elems,
            p.result.map(|len| Region::new(Buf::Output, 0, len)),
        )?);
        if plans.all.len() >= PLAN_CACHE {
            plans.all.clear();
        }
        plans.all.insert(key.clone(), plan.clone());
        plans.last = Some((key, plan.clone()));
        Ok(Call::Native(plan))
    }

    /// Runs a collective on borrowed buffers; returns its sequence number (0 on the MPI
    /// backend, whose operations have none).
    fn block_seq(&self, call: Result<Call>, bufs: Bufs) -> Result<u64> {
        // Both backends return after the operation completed: the buffers behind `bufs`
        // stay borrowed until then.
        match (call?, &self.inner.backend) {
            (Call::Native(plan), Backend::Native(n)) => {
                let (seq, result) = n.stream.run(|seq| JobOp::Coll { plan, seq, bufs });
                result.map(|()| seq)
            }
            #[cfg(feature = "mpi")]
            (Call::Mpi(coll), Backend::Mpi(m)) => m.collective(coll, bufs).map(|()| 0),
            #[cfg(feature = "mpi")]
            _ => Err(Error::Internal("a collective planned for another backend".into())),
        }
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
            (Call::Native(plan), Backend::Native(n)) => {
                n.stream.submit(|seq| JobOp::Coll { plan, seq, bufs }, done.clone());
            }
            #[cfg(feature = "mpi")]
            (Call::Mpi(coll), Backend::Mpi(m)) => m.spawn(coll, bufs, done.clone()),
            #[cfg(feature = "mpi")]
            _ => done.finish(Err(Error::Internal("a collective planned for another backend".into()))),
        }
        Work::new(done)
    }

    fn p2p_check(&self, api: &'static str, peer: usize) -> Result<()> {
        self.check_rank(api, "peer", peer)?;
        if peer == self.rank() {
            return Err(Error::invalid(
                api,
                "a rank cannot send to or receive from itself; copy the data instead",
            ));
        }
        Ok(())
    }

    /// Runs one point-to-point message on borrowed memory, returning once it completed.
    fn p2p_block(&self, msg: P2p) -> Result<()> {
        match &self.inner.backend {
            Backend::Native(n) => n.stream.run_unsequenced(JobOp::P2p { msg }),
            #[cfg(feature = "mpi")]
            Backend::Mpi(m) => m.p2p(msg),
        }
    }

    /// Queues one point-to-point message on memory parked in `done`; its outcome goes there.
    fn p2p_submit(&self, msg: P2p, done: Arc<Completion>) {
        match &self.inner.backend {
            Backend::Native(n) => n.stream.submit_unsequenced(JobOp::P2p { msg }, done),
            #[cfg(feature = "mpi")]
            Backend::Mpi(m) => m.submit_p2p(msg, done),
        }
    }
}

/// What a collective call asks for.
struct PlanArgs {
    kind: CollKind,
    op: Option<ReduceOp>,
    root: Option<usize>,
    /// The count every rank agrees on (`u64::MAX` for the uneven variants).
    count: u64,
    shape: Shape,
    /// Elements of input and output, as validated.
    elems: (usize, usize),
    /// Elements at the start of the output holding this rank's final reduced values.
    result: Option<usize>,
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

/// Whether `XCCL_BACKEND` asks for the MPI backend (`mpi`) rather than xccl's own
/// (`native`, the default).
fn wants_mpi() -> Result<bool> {
    match std::env::var("XCCL_BACKEND").ok().as_deref().map(str::trim) {
        None | Some("" | "native") => Ok(false),
        Some("mpi") => Ok(true),
        Some(other) => Err(Error::Config(format!(
            "XCCL_BACKEND='{other}' is not a backend: use 'native' (xccl's own transports, the default) or 'mpi'"
        ))),
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
