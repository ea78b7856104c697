//! Every operation as data, and how each runs on typed buffers: blocking (borrowing the
//! memory for the call) or asynchronous (lending it to a [`Work`](crate::work::Work)).
//!
//! The Python methods only parse arguments into a [`One`] (one buffer, read and written in
//! place) or a [`Two`] (an input and an output); these functions are the one place that
//! maps them onto xccl's API.

use xccl::{Communicator, Element, ReduceOp};

use crate::buffer::{Input, Lent};
use crate::work::Pending;

/// An operation on one buffer.
pub(crate) enum One {
    AllReduce(ReduceOp),
    Broadcast {
        root: usize,
    },
    /// `reduce` with the same buffer as input and output.
    ReduceInPlace(ReduceOp, usize),
    Send {
        peer: usize,
        tag: u32,
    },
    Recv {
        peer: usize,
        tag: u32,
    },
}

/// An operation from an input buffer to an output buffer.
pub(crate) enum Two {
    Reduce(ReduceOp, usize),
    AllGather,
    AllGatherV(Vec<usize>),
    ReduceScatter(ReduceOp),
    ReduceScatterV(Vec<usize>, ReduceOp),
    AllToAll,
    AllToAllV { send: Vec<usize>, recv: Vec<usize> },
    Gather { root: usize },
    GatherV { counts: Vec<usize>, root: usize },
    Scatter { root: usize },
    ScatterV { counts: Vec<usize>, root: usize },
}

impl One {
    /// Runs on `buf`, returning when done.
    pub fn run<T: Element>(&self, comm: &Communicator, mut buf: Lent<T>) -> xccl::Result<()> {
        use xccl::Buffer as _;
        match *self {
            One::AllReduce(op) => comm.all_reduce(buf.as_mut_slice(), op),
            One::Broadcast { root } => comm.broadcast(buf.as_mut_slice(), root),
            One::ReduceInPlace(op, root) => comm.reduce_in_place(buf.as_mut_slice(), op, root),
            One::Send { peer, tag } => comm.send(buf.as_slice(), peer, tag),
            One::Recv { peer, tag } => comm.recv(buf.as_mut_slice(), peer, tag),
        }
    }

    /// Starts on `buf`.
    pub fn spawn<T: Element>(&self, comm: &Communicator, buf: Lent<T>) -> Box<dyn Pending> {
        match *self {
            One::AllReduce(op) => Box::new(comm.all_reduce_async(buf, op)),
            One::Broadcast { root } => Box::new(comm.broadcast_async(buf, root)),
            One::ReduceInPlace(op, root) => Box::new(comm.reduce_in_place_async(buf, op, root)),
            One::Send { peer, tag } => Box::new(comm.isend(buf, peer, tag)),
            One::Recv { peer, tag } => Box::new(comm.irecv(buf, peer, tag)),
        }
    }
}

impl Two {
    /// The one-buffer form of this operation, for an input that is also the output.
    pub fn in_place(&self) -> Option<One> {
        match *self {
            Two::Reduce(op, root) => Some(One::ReduceInPlace(op, root)),
            _ => None,
        }
    }

    /// Runs from `input` into `output`, returning when done.
    pub fn run<T: Element>(
        &self,
        comm: &Communicator,
        input: Input<T>,
        mut output: Lent<T>,
    ) -> xccl::Result<()> {
        use xccl::Buffer as _;
        let (i, o) = (input.as_slice(), output.as_mut_slice());
        match self {
            Two::Reduce(op, root) => comm.reduce(i, o, *op, *root),
            Two::AllGather => comm.all_gather(i, o),
            Two::AllGatherV(counts) => comm.all_gather_v(i, o, counts),
            Two::ReduceScatter(op) => comm.reduce_scatter(i, o, *op),
            Two::ReduceScatterV(counts, op) => comm.reduce_scatter_v(i, o, counts, *op),
            Two::AllToAll => comm.all_to_all(i, o),
            Two::AllToAllV { send, recv } => comm.all_to_all_v(i, send, o, recv),
            Two::Gather { root } => comm.gather(i, o, *root),
            Two::GatherV { counts, root } => comm.gather_v(i, o, counts, *root),
            Two::Scatter { root } => comm.scatter(i, o, *root),
            Two::ScatterV { counts, root } => comm.scatter_v(i, o, counts, *root),
        }
    }

    /// Starts from `input` into `output`.
    pub fn spawn<T: Element>(
        &self,
        comm: &Communicator,
        input: Input<T>,
        output: Lent<T>,
    ) -> Box<dyn Pending> {
        let (i, o) = (input, output);
        match self {
            Two::Reduce(op, root) => Box::new(comm.reduce_async(i, o, *op, *root)),
            Two::AllGather => Box::new(comm.all_gather_async(i, o)),
            Two::AllGatherV(counts) => Box::new(comm.all_gather_v_async(i, o, counts)),
            Two::ReduceScatter(op) => Box::new(comm.reduce_scatter_async(i, o, *op)),
            Two::ReduceScatterV(counts, op) => Box::new(comm.reduce_scatter_v_async(i, o, counts, *op)),
            Two::AllToAll => Box::new(comm.all_to_all_async(i, o)),
            Two::AllToAllV { send, recv } => Box::new(comm.all_to_all_v_async(i, send, o, recv)),
            Two::Gather { root } => Box::new(comm.gather_async(i, o, *root)),
            Two::GatherV { counts, root } => Box::new(comm.gather_v_async(i, o, counts, *root)),
            Two::Scatter { root } => Box::new(comm.scatter_async(i, o, *root)),
            Two::ScatterV { counts, root } => Box::new(comm.scatter_v_async(i, o, counts, *root)),
        }
    }
}
