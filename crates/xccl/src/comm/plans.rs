//! The plan cache and the choice of algorithm: a checked call becomes a plan (native) or an
//! MPI call, the plan is kept by everything it depends on (`PlanKey`), and the tuner picks
//! the algorithm from the group's topology unless the configuration names one.

use std::sync::{Arc, PoisonError};

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

/// The plans of a communicator: the last one used (a loop calling one collective finds it
/// without hashing its key), and all others by key.
#[derive(Default)]
pub(super) struct Plans {
    pub(super) last: Option<(PlanKey, Arc<Plan>)>,
    pub(super) all: FxHashMap<PlanKey, Arc<Plan>>,
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
    pub(super) fn choose<T: Element>(&self, key: &PlanKey) -> Result<Algorithm> {
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
            T::DTYPE.size(),
        )?;
        tracing::info!(rank = self.rank(), "{} of {:?} ({}): {choice}", key.kind, key.shape, T::DTYPE);
        Ok(choice.algo)
    }

    /// The ranks' hosts and the links between them, as the tuner sees them. On the MPI
    /// backend: the hosts MPI reports (ranks that share memory), with the link classes of
    /// xccl's shared memory and TCP as the nearest estimate (MPI's own transports may be
    /// faster).
    pub fn placement(&self) -> Placement {
        let hosts = self.inner.group.hosts.clone();
        let cores = self.inner.group.cores.clone();
        let (intra, inter) = match &self.inner.backend {
            Backend::Native(Native { fabric: Fabric::Local, .. }) => (LinkClass::Local, LinkClass::Local),
            Backend::Native(_) if !self.inner.config.shm => (LinkClass::Tcp, LinkClass::Tcp),
            _ => (LinkClass::Shm, LinkClass::Tcp),
        };
        Placement {
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
        tune::rank(&self.inner.config.costs, &self.placement(), kind, root, shape, dtype.size())
    }

    /// The plan of a collective: from the cache, or built (algorithm, schedule, checks); on
    /// the MPI backend, the MPI call.
    pub(super) fn plan<T: Element>(&self, p: PlanArgs) -> Result<Call> {
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
}
