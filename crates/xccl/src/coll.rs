//! The kinds of operation: what a rank is running, named in frames, errors and settings.

use std::fmt;

/// Which operation a rank is running. Travels in headers and names operations in errors.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CollKind {
    /// Point-to-point message (`send`/`recv`).
    SendRecv = 0,
    /// `broadcast`
    Broadcast = 1,
    /// `scatter`
    Scatter = 2,
    /// `gather`
    Gather = 3,
    /// `reduce`
    Reduce = 4,
    /// `all_reduce`
    AllReduce = 5,
    /// `all_gather` and `all_gather_v`
    AllGather = 6,
    /// `reduce_scatter`
    ReduceScatter = 7,
    /// `all_to_all` and `all_to_all_v`
    AllToAll = 8,
    /// `barrier`
    Barrier = 9,
}

impl CollKind {
    const ALL: [CollKind; 10] = [
        CollKind::SendRecv,
        CollKind::Broadcast,
        CollKind::Scatter,
        CollKind::Gather,
        CollKind::Reduce,
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Barrier,
    ];

    /// The API name (`all_reduce`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::SendRecv => "send/recv",
            CollKind::Broadcast => "broadcast",
            CollKind::Scatter => "scatter",
            CollKind::Gather => "gather",
            CollKind::Reduce => "reduce",
            CollKind::AllReduce => "all_reduce",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "all_to_all",
            CollKind::Barrier => "barrier",
        }
    }

    /// The kind a wire tag names, if any.
    pub(crate) fn from_tag(tag: u8) -> Option<CollKind> {
        CollKind::ALL.get(tag as usize).copied()
    }
}

impl fmt::Display for CollKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl CollKind {
    /// The nine collectives with schedules (all but point-to-point), in the order `xccl
    /// verify` reports them.
    pub const COLLECTIVES: [CollKind; 9] = [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllToAll,
        CollKind::Scatter,
        CollKind::Gather,
        CollKind::Barrier,
    ];

    /// The collective called `name` (`all_reduce`, `allreduce`, `All_Reduce`, ...), if any.
    pub fn named(name: &str) -> Option<CollKind> {
        let norm = name.trim().replace('_', "").to_ascii_lowercase();
        CollKind::COLLECTIVES.into_iter().find(|k| k.name().replace('_', "") == norm)
    }

    /// nccl-tests' factor from algorithm bandwidth to bus bandwidth on `n` ranks: what each
    /// rank sends, as a ring would, per byte of the operation's size (an all-gather's size is
    /// its output, a reduce-scatter's its input): `2(n−1)/n` for an all-reduce, `(n−1)/n` for
    /// the all-gather, reduce-scatter, all-to-all, scatter and gather, 1 otherwise.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            CollKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Scatter
            | CollKind::Gather => (n - 1.0) / n,
            CollKind::Broadcast | CollKind::Reduce | CollKind::SendRecv | CollKind::Barrier => 1.0,
        }
    }

    /// Whether receivers combine what arrives with what they hold (reduce, all-reduce,
    /// reduce-scatter), rather than only place it.
    pub fn combines(self) -> bool {
        matches!(self, CollKind::Reduce | CollKind::AllReduce | CollKind::ReduceScatter)
    }

    /// Whether data flows one way (broadcast, scatter, gather): a sender has nothing to do
    /// but send.
    pub fn one_way(self) -> bool {
        matches!(self, CollKind::Broadcast | CollKind::Scatter | CollKind::Gather)
    }
}
