//! `xccl.Communicator`: construction, sub-groups, and every operation in a blocking form
//! and an asynchronous `_async` twin (`isend` / `irecv` for `send` / `recv`).
//!
//! A call exports its Python buffers ([`crate::buffer`]), checks them, and runs the operation
//! on their memory with the GIL released: the blocking form borrows the memory for the call,
//! the asynchronous one lends it to the returned [`Work`] until the operation completes.

use std::mem::ManuallyDrop;

use pyo3::prelude::*;
use xccl::Communicator;

use crate::calls::{One, Two};
use crate::dispatch::{counts, index, reduce_op, tag};
use crate::error::{invalid, to_py};
use crate::work::Work;

/// One rank's handle on a group of ranks that run collectives together.
///
/// Every rank of the group calls the same collectives in the same order. Buffers are
/// Python buffers (NumPy arrays, memoryviews, bytearrays), C-contiguous, borrowed without
/// copies for the call (or until the `Work` of an `_async` call completes); the GIL is
/// released while communicating.
#[pyclass(name = "Communicator", module = "xccl")]
pub struct PyCommunicator {
    /// Taken only by `drop`.
    pub(crate) comm: ManuallyDrop<Communicator>,
}

impl PyCommunicator {
    pub(crate) fn new(comm: Communicator) -> PyCommunicator {
        PyCommunicator { comm: ManuallyDrop::new(comm) }
    }
}

impl Drop for PyCommunicator {
    fn drop(&mut self) {
        // SAFETY: `comm` is taken here, once, and never used again.
        let comm = unsafe { ManuallyDrop::take(&mut self.comm) };
        // Dropping the last handle finishes the operations still queued, which may need
        // other Python threads (the other ranks of `local`): without the GIL.
        let mut comm = Some(comm);
        Python::try_attach(|py| {
            let c = comm.take();
            py.detach(move || drop(c));
        });
        drop(comm);
    }
}

#[pymethods]
impl PyCommunicator {
    /// Joins the job this process belongs to, as its environment describes it: `xccl run`,
    /// torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Slurm or mpirun variables.
    /// Collective: every process of the job calls it.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<PyCommunicator> {
        py.detach(Communicator::from_env).map(PyCommunicator::new).map_err(|e| to_py(py, &e))
    }

    /// Rank `rank` of a group of `size` ranks that meet through `store`: any object with
    /// `set(key, bytes)`, `get(key) -> bytes` (blocking until the key is set) and
    /// `add(key, int) -> int`, such as a `torch.distributed.Store`. Every rank of the group
    /// passes its own store object of the same store; no other group may use its keys.
    /// Peers connect to this rank at `local_ip` (default: the address this host's name
    /// resolves to); `timeout` (seconds) bounds the wait for the others. Links prove
    /// `XCCL_SECRET` where it is set, else a secret the group draws and shares through `store`.
    #[staticmethod]
    #[pyo3(signature = (store, rank, size, timeout=300.0, local_ip=None))]
    fn from_store(
        py: Python<'_>,
        store: Py<PyAny>,
        rank: i64,
        size: i64,
        timeout: f64,
        local_ip: Option<&str>,
    ) -> PyResult<PyCommunicator> {
        const API: &str = "Communicator.from_store";
        let rank = index(py, API, "rank", rank)?;
        let size = index(py, API, "size", size)?;
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(invalid(
                py,
                API,
                format!("timeout is {timeout}; it must be a positive number of seconds"),
            ));
        }
        let ip = match local_ip {
            None => xccl::bootstrap::group::listen_ip(None).map_err(|e| to_py(py, &e))?,
            Some(s) => {
                s.parse().map_err(|_| invalid(py, API, format!("local_ip '{s}' is not an IP address")))?
            }
        };
        let timeout = std::time::Duration::from_secs_f64(timeout);
        py.detach(|| crate::store::connect(store, rank, size, timeout, ip))
            .map(PyCommunicator::new)
            .map_err(|e| to_py(py, &e))
    }

    /// `n` communicators of one group whose ranks are threads of this process: hand one to
    /// each Python thread (every rank's calls block until the others join them).
    #[staticmethod]
    fn local(py: Python<'_>, n: i64) -> PyResult<Vec<PyCommunicator>> {
        let n = index(py, "Communicator.local", "n", n)?;
        let comms = py.detach(|| Communicator::local(n)).map_err(|e| to_py(py, &e))?;
        Ok(comms.into_iter().map(PyCommunicator::new).collect())
    }

    /// This rank's index in the group, 0..size.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks in the group.
    #[getter]
    fn size(&self) -> usize {
        self.comm.size()
    }

    /// Splits the group (as MPI_Comm_split): ranks passing the same `color` form a new group,
    /// ordered by `key`, then by rank here; a rank passing None gets None. Collective.
    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: Option<i64>, key: i64) -> PyResult<Option<PyCommunicator>> {
        const API: &str = "Communicator.split";
        let color = color
            .map(|c| {
                u32::try_from(c)
                    .map_err(|_| invalid(py, API, format!("color is {c}; it must be in 0..2**32")))
            })
            .transpose()?;
        let key = i32::try_from(key)
            .map_err(|_| invalid(py, API, format!("key is {key}; it must fit in 32 bits")))?;
        let comm: &Communicator = &self.comm;
        let split = py.detach(|| comm.split(color, key)).map_err(|e| to_py(py, &e))?;
        Ok(split.map(PyCommunicator::new))
    }

    /// A new communicator of the same ranks in the same order whose operations never mix
    /// with this one's (as MPI_Comm_dup). Collective.
    fn dup(&self, py: Python<'_>) -> PyResult<PyCommunicator> {
        let comm: &Communicator = &self.comm;
        let dup = py.detach(|| comm.dup_with(comm.config().clone())).map_err(|e| to_py(py, &e))?;
        Ok(PyCommunicator::new(dup))
    }

    fn __repr__(&self) -> String {
        format!("<xccl.Communicator rank {} of {}>", self.comm.rank(), self.comm.size())
    }

    /// Replaces `buf` on every rank with the reduction by `op` of every rank's `buf`.
    #[pyo3(signature = (buf, op="sum", *, dtype=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "all_reduce";
        self.one(py, API, One::AllReduce(reduce_op(py, API, op)?), buf, dtype)
    }

    /// Asynchronous `all_reduce`.
    #[pyo3(signature = (buf, op="sum", *, dtype=None))]
    fn all_reduce_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "all_reduce_async";
        self.one_async(py, API, One::AllReduce(reduce_op(py, API, op)?), buf, dtype)
    }

    /// Copies the root's `buf` into every other rank's `buf` (all of one length).
    #[pyo3(signature = (buf, root, *, dtype=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "broadcast";
        self.one(py, API, One::Broadcast { root: index(py, API, "root", root)? }, buf, dtype)
    }

    /// Asynchronous `broadcast`.
    #[pyo3(signature = (buf, root, *, dtype=None))]
    fn broadcast_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "broadcast_async";
        self.one_async(py, API, One::Broadcast { root: index(py, API, "root", root)? }, buf, dtype)
    }

    /// Reduces every rank's `input` by `op` into the root's `output` (same length). `output`
    /// may be `input` (in place) and may be None off the root.
    #[pyo3(signature = (input, output, root, op="sum", *, dtype=None))]
    fn reduce(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        root: i64,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "reduce";
        let call = Two::Reduce(reduce_op(py, API, op)?, index(py, API, "root", root)?);
        self.two(py, API, call, Some(input), output, dtype)
    }

    /// Asynchronous `reduce`.
    #[pyo3(signature = (input, output, root, op="sum", *, dtype=None))]
    fn reduce_async(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        root: i64,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "reduce_async";
        let call = Two::Reduce(reduce_op(py, API, op)?, index(py, API, "root", root)?);
        self.two_async(py, API, call, Some(input), output, dtype)
    }

    /// Concatenates every rank's `input` (all of one length) in rank order into every rank's
    /// `output` (size times as long).
    #[pyo3(signature = (input, output, *, dtype=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        self.two(py, "all_gather", Two::AllGather, Some(input), Some(output), dtype)
    }

    /// Asynchronous `all_gather`.
    #[pyo3(signature = (input, output, *, dtype=None))]
    fn all_gather_async(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        self.two_async(py, "all_gather_async", Two::AllGather, Some(input), Some(output), dtype)
    }

    /// `all_gather` with uneven inputs: rank i contributes `counts[i]` elements; every rank
    /// passes the same `counts`, and `output` holds their sum.
    #[pyo3(signature = (input, output, counts, *, dtype=None))]
    fn all_gather_v(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        counts: Vec<i64>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "all_gather_v";
        let call = Two::AllGatherV(self::counts(py, API, "counts", counts)?);
        self.two(py, API, call, Some(input), Some(output), dtype)
    }

    /// Asynchronous `all_gather_v`.
    #[pyo3(signature = (input, output, counts, *, dtype=None))]
    fn all_gather_v_async(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        counts: Vec<i64>,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "all_gather_v_async";
        let call = Two::AllGatherV(self::counts(py, API, "counts", counts)?);
        self.two_async(py, API, call, Some(input), Some(output), dtype)
    }

    /// Reduces every rank's `input` (size blocks of len(output) elements) by `op`; rank i
    /// gets block i of the result in `output`.
    #[pyo3(signature = (input, output, op="sum", *, dtype=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "reduce_scatter";
        let call = Two::ReduceScatter(reduce_op(py, API, op)?);
        self.two(py, API, call, Some(input), Some(output), dtype)
    }

    /// Asynchronous `reduce_scatter`.
    #[pyo3(signature = (input, output, op="sum", *, dtype=None))]
    fn reduce_scatter_async(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "reduce_scatter_async";
        let call = Two::ReduceScatter(reduce_op(py, API, op)?);
        self.two_async(py, API, call, Some(input), Some(output), dtype)
    }

    /// `reduce_scatter` with uneven blocks: `input` holds size blocks, block i of
    /// `counts[i]` elements; rank i gets block i reduced in `output` (`counts[i]` elements).
    #[pyo3(signature = (input, output, counts, op="sum", *, dtype=None))]
    fn reduce_scatter_v(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        counts: Vec<i64>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "reduce_scatter_v";
        let call = Two::ReduceScatterV(self::counts(py, API, "counts", counts)?, reduce_op(py, API, op)?);
        self.two(py, API, call, Some(input), Some(output), dtype)
    }

    /// Asynchronous `reduce_scatter_v`.
    #[pyo3(signature = (input, output, counts, op="sum", *, dtype=None))]
    fn reduce_scatter_v_async(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        counts: Vec<i64>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "reduce_scatter_v_async";
        let call = Two::ReduceScatterV(self::counts(py, API, "counts", counts)?, reduce_op(py, API, op)?);
        self.two_async(py, API, call, Some(input), Some(output), dtype)
    }

    /// Block j of rank i's `input` becomes block i of rank j's `output`; both hold size
    /// equal blocks.
    #[pyo3(signature = (input, output, *, dtype=None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        self.two(py, "all_to_all", Two::AllToAll, Some(input), Some(output), dtype)
    }

    /// Asynchronous `all_to_all`.
    #[pyo3(signature = (input, output, *, dtype=None))]
    fn all_to_all_async(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        self.two_async(py, "all_to_all_async", Two::AllToAll, Some(input), Some(output), dtype)
    }

    /// `all_to_all` with uneven blocks: `send_counts[j]` elements of `input` go to rank j,
    /// `recv_counts[j]` elements of `output` come from rank j.
    #[pyo3(signature = (input, send_counts, output, recv_counts, *, dtype=None))]
    fn all_to_all_v(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        send_counts: Vec<i64>,
        output: &Bound<'_, PyAny>,
        recv_counts: Vec<i64>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "all_to_all_v";
        let send = counts(py, API, "send_counts", send_counts)?;
        let recv = counts(py, API, "recv_counts", recv_counts)?;
        self.two(py, API, Two::AllToAllV { send, recv }, Some(input), Some(output), dtype)
    }

    /// Asynchronous `all_to_all_v`.
    #[pyo3(signature = (input, send_counts, output, recv_counts, *, dtype=None))]
    fn all_to_all_v_async(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        send_counts: Vec<i64>,
        output: &Bound<'_, PyAny>,
        recv_counts: Vec<i64>,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "all_to_all_v_async";
        let send = counts(py, API, "send_counts", send_counts)?;
        let recv = counts(py, API, "recv_counts", recv_counts)?;
        self.two_async(py, API, Two::AllToAllV { send, recv }, Some(input), Some(output), dtype)
    }

    /// Concatenates every rank's `input` in rank order into the root's `output`; `output`
    /// may be None off the root.
    #[pyo3(signature = (input, output, root, *, dtype=None))]
    fn gather(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "gather";
        self.two(py, API, Two::Gather { root: index(py, API, "root", root)? }, Some(input), output, dtype)
    }

    /// Asynchronous `gather`.
    #[pyo3(signature = (input, output, root, *, dtype=None))]
    fn gather_async(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "gather_async";
        self.two_async(
            py,
            API,
            Two::Gather { root: index(py, API, "root", root)? },
            Some(input),
            output,
            dtype,
        )
    }

    /// `gather` with uneven inputs: rank i contributes `counts[i]` elements; every rank
    /// passes the same `counts`, and the root's `output` holds their sum. `output` may be
    /// None off the root.
    #[pyo3(signature = (input, output, counts, root, *, dtype=None))]
    fn gather_v(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        counts: Vec<i64>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "gather_v";
        let call = Two::GatherV {
            counts: self::counts(py, API, "counts", counts)?,
            root: index(py, API, "root", root)?,
        };
        self.two(py, API, call, Some(input), output, dtype)
    }

    /// Asynchronous `gather_v`.
    #[pyo3(signature = (input, output, counts, root, *, dtype=None))]
    fn gather_v_async(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        counts: Vec<i64>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "gather_v_async";
        let call = Two::GatherV {
            counts: self::counts(py, API, "counts", counts)?,
            root: index(py, API, "root", root)?,
        };
        self.two_async(py, API, call, Some(input), output, dtype)
    }

    /// Splits the root's `input` (size blocks of len(output) elements) so that rank i gets
    /// block i in `output`; `input` may be None off the root.
    #[pyo3(signature = (input, output, root, *, dtype=None))]
    fn scatter(
        &self,
        py: Python<'_>,
        input: Option<&Bound<'_, PyAny>>,
        output: &Bound<'_, PyAny>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "scatter";
        self.two(py, API, Two::Scatter { root: index(py, API, "root", root)? }, input, Some(output), dtype)
    }

    /// Asynchronous `scatter`.
    #[pyo3(signature = (input, output, root, *, dtype=None))]
    fn scatter_async(
        &self,
        py: Python<'_>,
        input: Option<&Bound<'_, PyAny>>,
        output: &Bound<'_, PyAny>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "scatter_async";
        self.two_async(
            py,
            API,
            Two::Scatter { root: index(py, API, "root", root)? },
            input,
            Some(output),
            dtype,
        )
    }

    /// `scatter` with uneven blocks: the root's `input` holds size blocks, block i of
    /// `counts[i]` elements, and rank i gets block i in `output` (`counts[i]` elements);
    /// every rank passes the same `counts`. `input` may be None off the root.
    #[pyo3(signature = (input, output, counts, root, *, dtype=None))]
    fn scatter_v(
        &self,
        py: Python<'_>,
        input: Option<&Bound<'_, PyAny>>,
        output: &Bound<'_, PyAny>,
        counts: Vec<i64>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "scatter_v";
        let call = Two::ScatterV {
            counts: self::counts(py, API, "counts", counts)?,
            root: index(py, API, "root", root)?,
        };
        self.two(py, API, call, input, Some(output), dtype)
    }

    /// Asynchronous `scatter_v`.
    #[pyo3(signature = (input, output, counts, root, *, dtype=None))]
    fn scatter_v_async(
        &self,
        py: Python<'_>,
        input: Option<&Bound<'_, PyAny>>,
        output: &Bound<'_, PyAny>,
        counts: Vec<i64>,
        root: i64,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "scatter_v_async";
        let call = Two::ScatterV {
            counts: self::counts(py, API, "counts", counts)?,
            root: index(py, API, "root", root)?,
        };
        self.two_async(py, API, call, input, Some(output), dtype)
    }

    /// Returns once every rank has called `barrier`.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let comm: &Communicator = &self.comm;
        py.detach(|| comm.barrier()).map_err(|e| to_py(py, &e))
    }

    /// Asynchronous `barrier`.
    fn barrier_async(&self, py: Python<'_>) -> PyResult<Work> {
        Work::start(py, Box::new(self.comm.barrier_async()), Vec::new())
    }

    /// Sends `buf` to rank `peer` with `tag`; returns once the data is handed to the
    /// transport. The matching `recv` asks for the same element type and length.
    #[pyo3(signature = (buf, peer, tag=0, *, dtype=None))]
    fn send(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: i64,
        tag: i64,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "send";
        let call = One::Send { peer: index(py, API, "peer", peer)?, tag: self::tag(py, API, tag)? };
        self.one(py, API, call, buf, dtype)
    }

    /// Receives into `buf` the next message from rank `peer` with `tag`.
    #[pyo3(signature = (buf, peer, tag=0, *, dtype=None))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: i64,
        tag: i64,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        const API: &str = "recv";
        let call = One::Recv { peer: index(py, API, "peer", peer)?, tag: self::tag(py, API, tag)? };
        self.one(py, API, call, buf, dtype)
    }

    /// Asynchronous `send`.
    #[pyo3(signature = (buf, peer, tag=0, *, dtype=None))]
    fn isend(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: i64,
        tag: i64,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "isend";
        let call = One::Send { peer: index(py, API, "peer", peer)?, tag: self::tag(py, API, tag)? };
        self.one_async(py, API, call, buf, dtype)
    }

    /// Asynchronous `recv`.
    #[pyo3(signature = (buf, peer, tag=0, *, dtype=None))]
    fn irecv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: i64,
        tag: i64,
        dtype: Option<&str>,
    ) -> PyResult<Work> {
        const API: &str = "irecv";
        let call = One::Recv { peer: index(py, API, "peer", peer)?, tag: self::tag(py, API, tag)? };
        self.one_async(py, API, call, buf, dtype)
    }
}
