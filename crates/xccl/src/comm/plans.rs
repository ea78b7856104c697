//! The plan cache and the choice of algorithm: a checked call becomes a plan (native) or an
//! MPI call, the plan is kept by everything it depends on (`PlanKey`), and the tuner picks
//! the algorithm from the group's topology unless the configuration names one.
//!
//! A thread also keeps the last few plans it ran (`RECENT`): a loop that calls the same
//! collectives again finds each there, borrowed for the call, without a lock or an atomic
//! operation (a lock, the key compared and the plan's `Arc` cloned and dropped cost about a
//! tenth of an 8-byte collective between two processes).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rustc_hash::FxHashMap;

use super::build::Fabric;
#[cfg(feature = "mpi")]
use super::mpi;
use super::{Backend, Call, Communicator, Native};
use crate::algo::tune::{self, Choice, LinkClass, Placement};
use crate::algo::{self, Algorithm, Shape};
use crate::coll::CollKind;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::exec::Plan;
use crate::frame::OpDesc;
use crate::reduce::ReduceOp;
use crate::schedule::{Buf, Region};

/// The plans of a communicator, by key, under a number no other cache of the process has
/// had, which names them in the threads' recent plans.
pub(super) struct Plans {
    id: u64,
    all: Mutex<FxHashMap<PlanKey, Arc<Plan>>>,
}

impl Plans {
    /// An empty cache under a new number.
    pub(super) fn new() -> Plans {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Plans { id: NEXT.fetch_add(1, Ordering::Relaxed), all: Mutex::default() }
    }
}

/// Plans a thread keeps, the newest first, whichever communicators they are of (a training
/// step that alternates between a few communicators and bucket sizes finds each one's).
const RECENT: usize = 8;

/// A plan a thread ran, with the cache it came from.
struct Recent {
    cache: u64,
    key: PlanKey,
    plan: Arc<Plan>,
}

thread_local! {
    /// This thread's recent plans. They outlive their communicator until newer ones push
    /// them out or the thread ends: a plan refers to nothing else.
    static RECENT_PLANS: RefCell<Vec<Recent>> = const { RefCell::new(Vec::new()) };
}

/// Everything a plan depends on (besides the communicator).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct PlanKey {
    pub(super) kind: CollKind,
    pub(super) dtype: DType,
    pub(super) op: Option<ReduceOp>,
    pub(super) root: Option<usize>,
    pub(super) count: u64,
    pub(super) shape: Shape,
    pub(super) elems: (usize, usize),
}

/// Plans kept per communicator before the cache starts over.
const PLAN_CACHE: usize = 1024;

/// A checked collective call on the native backend: the key of its plan, found (or built)
/// when it runs, and where its result lies.
pub(super) struct Wanted {
    key: PlanKey,
    result: Option<usize>,
}

/// What a collective call asks for.
pub(super) struct PlanArgs {
    pub(super) kind: CollKind,
    pub(super) op: Option<ReduceOp>,
    pub(super) root: Option<usize>,
    /// The count every rank agrees on (`u64::MAX` for the uneven variants).
    pub(super) count: u64,
    pub(super) shape: Shape,
    /// Elements of input and output, as validated.
    pub(super) elems: (usize, usize),
    /// Elements at the start of the output holding this rank's final reduced values.
    pub(super) result: Option<usize>,
}

impl Communicator {
    /// The algorithm for a collective: the one `XCCL_ALGO` names, else the tuner's pick.
    pub(super) fn choose(&self, key: &PlanKey) -> Result<Algorithm> {
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
            &self.placement(),
            key.kind,
            key.root.unwrap_or(0),
            &key.shape,
            key.dtype.size(),
        )?;
        tracing::info!(rank = self.rank(), "{} of {:?} ({}): {choice}", key.kind, key.shape, key.dtype);
        Ok(choice.algo)
    }

    /// The ranks' hosts and the links between them, as the tuner sees them. On the MPI
    /// backend: the hosts MPI reports (ranks that share memory), with the link classes of
    /// xccl's shared memory and TCP as the nearest estimate (MPI's own transports may be
    /// faster).
    pub fn placement(&self) -> Placement {
        let hosts = self.inner.group.hosts.clone();
        let cores = self.inner.group.cores.clone();
        let threads = matches!(&self.inner.backend, Backend::Native(Native { fabric: Fabric::Local, .. }));
        let (intra, inter) = match &self.inner.backend {
            _ if threads => (LinkClass::Local, LinkClass::Local),
            Backend::Native(_) if !self.inner.config.shm => (LinkClass::Tcp, LinkClass::Tcp),
            _ => (LinkClass::Shm, LinkClass::Tcp),
        };
        Placement {
            hosts,
            cores,
            intra,
            inter,
            protocols: self.inner.config.protocols.clone(),
            pull_min: super::build::pull_min(&self.inner.config, &self.inner.group, threads),
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
        tune::rank(&self.inner.config.costs, &self.placement(), kind, root, shape, dtype.size())
    }

    /// A checked collective for its backend: on the native backend the key of its plan (see
    /// [`Communicator::with_plan`]), on the MPI backend the MPI call.
    pub(super) fn plan<T: Element>(&self, p: PlanArgs) -> Result<Call> {
        #[cfg(feature = "mpi")]
        if let Backend::Mpi(_) = &self.inner.backend {
            return mpi::Coll::new(p, T::DTYPE, self.rank(), self.size()).map(Call::Mpi);
        }
        let key = PlanKey {
            kind: p.kind,
            dtype: T::DTYPE,
            op: p.op,
            root: p.root,
            count: p.count,
            shape: p.shape,
            elems: p.elems,
        };
        Ok(Call::Native(Wanted { key, result: p.result }))
    }

    /// Runs `f` on the plan `want` names: one of this thread's recent plans, borrowed while
    /// `f` runs, else the communicator's cached one, else a new one (algorithm, schedule,
    /// checks), which becomes this thread's newest.
    pub(super) fn with_plan<R>(
        &self,
        plans: &Plans,
        want: Wanted,
        f: impl FnOnce(&Arc<Plan>) -> R,
    ) -> Result<R> {
        let mut f = Some(f);
        let found = RECENT_PLANS.try_with(|recent| {
            // A thread that plans while it runs a plan (never today) takes the locked path.
            let r = recent.try_borrow().ok()?;
            let hit = r.iter().find(|e| e.cache == plans.id && e.key == want.key)?;
            f.take().map(|f| f(&hit.plan))
        });
        if let Ok(Some(out)) = found {
            return Ok(out);
        }
        let plan = self.cached_plan(plans, &want)?;
        let _ = RECENT_PLANS.try_with(|recent| {
            if let Ok(mut r) = recent.try_borrow_mut() {
                r.truncate(RECENT - 1);
                r.insert(0, Recent { cache: plans.id, key: want.key, plan: plan.clone() });
            }
        });
        let f = f.take().ok_or_else(|| Error::Internal("a plan was run twice".into()))?;
        Ok(f(&plan))
    }

    /// The plan `want` names from the communicator's cache, or built and cached.
    fn cached_plan(&self, plans: &Plans, want: &Wanted) -> Result<Arc<Plan>> {
        let key = &want.key;
        let mut all = plans.all.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(plan) = all.get(key) {
            return Ok(plan.clone());
        }
        let algo = self.choose(key)?;
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
            want.result.map(|len| Region::new(Buf::Output, 0, len)),
        )?);
        if all.len() >= PLAN_CACHE {
            all.clear();
        }
        all.insert(key.clone(), plan.clone());
        Ok(plan)
    }
}
