//! How a communicator is made: the world from the environment, a rendezvous or a store
//! (`connect_via`: the store, the mesh of links, the shared-memory segment per host), ranks
//! as threads (`local`), MPI's world, and sub-communicators by split and dup; `TcpFabric`
//! makes the links of each (shared memory to ranks of the same host, TCP to the others).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

#[cfg(feature = "mpi")]
use super::mpi;
use super::plans::Plans;
use super::{Backend, Communicator, Group, Inner, Native, hash_str, mix, probe};
use crate::algo::tune::CostModel;
use crate::bootstrap::board::{StoreAddress, StoreBoard};
use crate::bootstrap::host;
use crate::bootstrap::mesh::{self, Acceptor};
use crate::bootstrap::{Auth, C10dClient, KeyValue, Rendezvous, StoreClient, StoreServer};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::{Bufs, Engine, Tuning};
use crate::flight::Recorder;
use crate::frame::Farewells;
use crate::protocol::{CpuVendor, PullMin};
use crate::stall::Board;
use crate::stream::Stream;
use crate::transport::local::{self, LocalMesh};
use crate::transport::shm::{self, ShmSegment};
use crate::transport::{Links, Memory};

/// How a world is joined, beside its rendezvous: its key space in the store, the address
/// to listen on, the store this rank serves, and how to reach the store again.
pub(super) struct Via {
    generation: u64,
    ip: IpAddr,
    served: Option<StoreServer>,
    board: Option<StoreAddress>,
    rank0_serves: bool,
}

/// How a communicator makes the links of its sub-communicators.
pub(super) enum Fabric {
    /// Ranks are threads of this process.
    Local,
    /// Ranks are reachable over TCP.
    Tcp(Arc<TcpFabric>),
}

pub(super) struct TcpFabric {
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
        let mut links = mesh::connect(&self.acceptor, &self.auth, id, rank, &addrs, config, &|| {
            Box::new(Farewells { comm: id })
        })?;
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

/// Whether `XCCL_BACKEND` asks for the MPI backend (`mpi`) rather than xccl's own
/// (`native`, the default).
pub(super) fn wants_mpi() -> Result<bool> {
    match std::env::var("XCCL_BACKEND").ok().as_deref().map(str::trim) {
        None | Some("" | "native") => Ok(false),
        Some("mpi") => Ok(true),
        Some(other) => Err(Error::Config(format!(
            "XCCL_BACKEND='{other}' is not a backend: use 'native' (xccl's own transports, the default) or 'mpi'"
        ))),
    }
}

/// From which lengths `group`'s rank pulls: `config`'s settings over the built-in thresholds
/// of its processor and the ranks on its host, or of any processor where the ranks are
/// `threads` of one process (a pull is then a copy, with no pages pinned).
pub(super) fn pull_min(config: &Config, group: &Group, threads: bool) -> PullMin {
    let here = group.hosts[group.rank];
    let ranks_on_host = group.hosts.iter().filter(|&&h| h == here).count();
    let built_in =
        if threads { PullMin::default() } else { PullMin::built_in(CpuVendor::this(), ranks_on_host) };
    config.pull_min(ranks_on_host, built_in)
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
            pull_min: pull_min(&config, &group, matches!(fabric, Fabric::Local)),
            protocols: config.protocols.clone(),
            board,
        };
        let engine = Engine::new(group.rank, group.size, group.id, links, tuning);
        let flight = Recorder::new(config.flight.clone(), group.rank, group.size, group.id);
        let stream = Stream::start(group.rank, engine, flight)?;
        let plans = Plans::new();
        let backend = Backend::Native(Native { stream, fabric, plans });
        Ok(Communicator { inner: Arc::new(Inner { backend, group, config, max_tag: u32::MAX }) })
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
        Ok(Communicator { inner: Arc::new(Inner::mpi(comm, group, config)) })
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
            match &mut inner.backend {
                Backend::Native(n) => n.plans = Plans::new(),
                #[cfg(feature = "mpi")]
                Backend::Mpi(_) => {}
            }
        }
        Ok(comm)
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
            return Ok(Communicator { inner: Arc::new(Inner::mpi(comm, group, config)) });
        }
        self.split_with(Some(0), 0, config)?
            .ok_or_else(|| Error::Internal("a rank left out of its own duplicate".into()))
    }

    fn split_with(&self, color: Option<u32>, key: i32, config: Config) -> Result<Option<Communicator>> {
        #[cfg(feature = "mpi")]
        if let Backend::Mpi(m) = &self.inner.backend {
            let made = m.split(&self.inner.group, color, key)?;
            return Ok(
                made.map(|(comm, group)| Communicator { inner: Arc::new(Inner::mpi(comm, group, config)) })
            );
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::PullSetting;

    #[test]
    fn ranks_pull_from_their_hosts_built_in_thresholds_unless_set() {
        // Rank 1 shares host 0 with ranks 0 and 3; rank 2 is alone on host 1.
        let group = |rank| Group {
            rank,
            size: 4,
            id: 1,
            members: vec![0, 1, 2, 3],
            hosts: vec![0, 0, 1, 0],
            cores: vec![2; 4],
        };
        let config = Config::default();
        assert_eq!(pull_min(&config, &group(1), false), PullMin::built_in(CpuVendor::this(), 3));
        assert_eq!(pull_min(&config, &group(2), false), PullMin::built_in(CpuVendor::this(), 1));
        // Threads of one process copy: the thresholds of any processor.
        assert_eq!(pull_min(&config, &group(1), true), PullMin::default());
        // What is set stands, on every kind of rank; a tuning file's line for the ranks on
        // the host, over the built-in thresholds.
        let set = PullMin { combining: 8 << 10, plain: 1 << 30 };
        let config = Config { pull: PullSetting::exactly(set), ..Config::default() };
        for threads in [false, true] {
            assert_eq!(pull_min(&config, &group(1), threads), set);
        }
        let costs = CostModel::default().with_text("t", "pull 16K off ranks=3").unwrap();
        let config = Config { costs, ..Config::default() };
        assert_eq!(pull_min(&config, &group(1), false), PullMin { combining: 16 << 10, plain: usize::MAX });
        assert_eq!(pull_min(&config, &group(2), false), PullMin::built_in(CpuVendor::this(), 1));
    }
}
