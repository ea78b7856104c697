"""Type stubs of the native module xccl._xccl (re-exported by the package xccl).

Buffers
-------
Every ``buf``, ``input`` and ``output`` is an object exporting the Python buffer protocol
(a NumPy array, a memoryview, a bytearray; a torch tensor through ``.numpy()``),
C-contiguous, and writable where the call writes into it. Its element type comes from the
buffer's format, or from ``dtype=``, which reinterprets the elements as another type of the
same size: one of "float32", "float64", "float16", "bfloat16", "int8", "int32", "int64",
"uint8", "uint32", "uint64" (bfloat16 data arrives as an int16/uint16 view, since NumPy has
no bfloat16). Lengths are counted in elements. The memory is used in place, never copied
(except an input that overlaps its output, which is copied first): a blocking call borrows
it for the call, an ``_async`` call until its :class:`Work` has completed. The GIL is
released while communicating.

``op`` is one of "sum", "prod", "min", "max", "avg" (integer averages truncate; integer sums
and products wrap).

Bad arguments raise :class:`InvalidArgumentError` before anything is communicated. An
operation that fails (a lost peer, a mismatch, a timeout) fails the communicator: its later
operations raise the same kind of error.
"""

from typing import Any, Optional

__version__: str

class XcclError(Exception):
    """Base of every error xccl raises."""

    rank: Optional[int]
    """The rank at fault when known (a lost or misbehaving peer, the rank a failure began
    on), else None."""

class PeerLostError(XcclError):
    """A peer died or closed its communicator; the message names the rank."""

class MismatchError(XcclError):
    """Ranks called different collectives, or the same one with different counts, types or
    roots; the message describes both sides."""

class TimeoutError(XcclError):
    """An operation made no progress for XCCL_TIMEOUT seconds; the message names the ranks
    not heard from."""

class InvalidArgumentError(XcclError, ValueError):
    """Bad arguments (a buffer of the wrong size, type or layout, an unknown op or dtype, a
    root outside the group), found before anything was communicated."""

class Work:
    """The handle on an asynchronous operation. It holds the buffers the operation borrowed
    until the operation has completed; do not read or write them before. Dropping a Work does
    not cancel the operation (every rank takes part in it); its buffers stay borrowed until
    it completes. A Work may be waited on and polled from several threads at once."""

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the operation has completed (True; the buffers are the caller's
        again), or until `timeout` seconds have passed (False). Raises the operation's error
        if it failed."""
    def is_completed(self) -> bool:
        """Whether the operation has completed, successfully or not; does not block."""

class Communicator:
    """One rank's handle on a group of ranks that run collectives together. Every rank calls
    the same collectives in the same order."""

    @staticmethod
    def from_env() -> Communicator:
        """Joins the job this process belongs to, as its environment describes it: `xccl run`,
        torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Slurm or mpirun variables.
        Collective."""
    @staticmethod
    def from_store(
        store: Any, rank: int, size: int, timeout: float = 300.0, local_ip: str | None = None
    ) -> Communicator:
        """Rank `rank` of `size`, meeting through `store` (an object with `set(key, bytes)`,
        a blocking `get(key) -> bytes` and `add(key, int) -> int`, e.g. a
        `torch.distributed.Store`); peers connect to this rank at `local_ip` (default: the
        address this host's name resolves to); `timeout` seconds bound the wait for the
        others. Links prove `XCCL_SECRET` where it is set, else a secret the group draws and
        shares through `store`."""
    @staticmethod
    def local(n: int) -> list[Communicator]:
        """`n` ranks as threads of this process: hand one communicator to each Python
        thread."""
    @property
    def rank(self) -> int:
        """This rank's index in the group, 0..size."""
    @property
    def size(self) -> int:
        """The number of ranks in the group."""
    def split(self, color: Optional[int], key: int = 0) -> Optional[Communicator]:
        """Ranks passing the same `color` form a new group, ordered by `key`, then by rank; a
        rank passing None gets None. Collective."""
    def dup(self) -> Communicator:
        """A new communicator of the same ranks whose operations never mix with this one's.
        Collective."""

    def all_reduce(self, buf: Any, op: str = "sum", *, dtype: Optional[str] = None) -> None:
        """Replaces `buf` on every rank with the reduction by `op` of every rank's `buf`."""
    def all_reduce_async(self, buf: Any, op: str = "sum", *, dtype: Optional[str] = None) -> Work:
        """Asynchronous `all_reduce`."""
    def broadcast(self, buf: Any, root: int, *, dtype: Optional[str] = None) -> None:
        """Copies the root's `buf` into every other rank's `buf` (all of one length)."""
    def broadcast_async(self, buf: Any, root: int, *, dtype: Optional[str] = None) -> Work:
        """Asynchronous `broadcast`."""
    def reduce(
        self, input: Any, output: Optional[Any], root: int, op: str = "sum", *, dtype: Optional[str] = None
    ) -> None:
        """Reduces every rank's `input` by `op` into the root's `output` (same length).
        `output` may be `input` (in place) and may be None off the root."""
    def reduce_async(
        self, input: Any, output: Optional[Any], root: int, op: str = "sum", *, dtype: Optional[str] = None
    ) -> Work:
        """Asynchronous `reduce`."""
    def all_gather(self, input: Any, output: Any, *, dtype: Optional[str] = None) -> None:
        """Concatenates every rank's `input` (all of one length) in rank order into every
        rank's `output` (size times as long)."""
    def all_gather_async(self, input: Any, output: Any, *, dtype: Optional[str] = None) -> Work:
        """Asynchronous `all_gather`."""
    def all_gather_v(self, input: Any, output: Any, counts: list[int], *, dtype: Optional[str] = None) -> None:
        """`all_gather` with uneven inputs: rank i contributes `counts[i]` elements; every rank
        passes the same `counts`, and `output` holds their sum."""
    def all_gather_v_async(
        self, input: Any, output: Any, counts: list[int], *, dtype: Optional[str] = None
    ) -> Work:
        """Asynchronous `all_gather_v`."""
    def reduce_scatter(self, input: Any, output: Any, op: str = "sum", *, dtype: Optional[str] = None) -> None:
        """Reduces every rank's `input` (size blocks of len(output) elements) by `op`; rank i
        gets block i of the result in `output`."""
    def reduce_scatter_async(
        self, input: Any, output: Any, op: str = "sum", *, dtype: Optional[str] = None
    ) -> Work:
        """Asynchronous `reduce_scatter`."""
    def reduce_scatter_v(
        self, input: Any, output: Any, counts: list[int], op: str = "sum", *, dtype: Optional[str] = None
    ) -> None:
        """`reduce_scatter` with uneven blocks: `input` holds size blocks, block i of
        `counts[i]` elements; rank i gets block i reduced in `output` (`counts[i]`
        elements)."""
    def reduce_scatter_v_async(
        self, input: Any, output: Any, counts: list[int], op: str = "sum", *, dtype: Optional[str] = None
    ) -> Work:
        """Asynchronous `reduce_scatter_v`."""
    def all_to_all(self, input: Any, output: Any, *, dtype: Optional[str] = None) -> None:
        """Block j of rank i's `input` becomes block i of rank j's `output`; both hold size
        equal blocks."""
    def all_to_all_async(self, input: Any, output: Any, *, dtype: Optional[str] = None) -> Work:
        """Asynchronous `all_to_all`."""
    def all_to_all_v(
        self, input: Any, send_counts: list[int], output: Any, recv_counts: list[int], *, dtype: Optional[str] = None
    ) -> None:
        """`all_to_all` with uneven blocks: `send_counts[j]` elements of `input` go to rank j,
        `recv_counts[j]` elements of `output` come from rank j."""
    def all_to_all_v_async(
        self, input: Any, send_counts: list[int], output: Any, recv_counts: list[int], *, dtype: Optional[str] = None
    ) -> Work:
        """Asynchronous `all_to_all_v`."""
    def gather(self, input: Any, output: Optional[Any], root: int, *, dtype: Optional[str] = None) -> None:
        """Concatenates every rank's `input` in rank order into the root's `output`; `output`
        may be None off the root."""
    def gather_async(self, input: Any, output: Optional[Any], root: int, *, dtype: Optional[str] = None) -> Work:
        """Asynchronous `gather`."""
    def gather_v(
        self, input: Any, output: Optional[Any], counts: list[int], root: int, *, dtype: Optional[str] = None
    ) -> None:
        """`gather` with uneven inputs: rank i contributes `counts[i]` elements; every rank
        passes the same `counts`, and the root's `output` holds their sum. `output` may be
        None off the root."""
    def gather_v_async(
        self, input: Any, output: Optional[Any], counts: list[int], root: int, *, dtype: Optional[str] = None
    ) -> Work:
        """Asynchronous `gather_v`."""
    def scatter(self, input: Optional[Any], output: Any, root: int, *, dtype: Optional[str] = None) -> None:
        """Splits the root's `input` (size blocks of len(output) elements) so that rank i gets
        block i in `output`; `input` may be None off the root."""
    def scatter_async(self, input: Optional[Any], output: Any, root: int, *, dtype: Optional[str] = None) -> Work:
        """Asynchronous `scatter`."""
    def scatter_v(
        self, input: Optional[Any], output: Any, counts: list[int], root: int, *, dtype: Optional[str] = None
    ) -> None:
        """`scatter` with uneven blocks: the root's `input` holds size blocks, block i of
        `counts[i]` elements, and rank i gets block i in `output` (`counts[i]` elements);
        every rank passes the same `counts`. `input` may be None off the root."""
    def scatter_v_async(
        self, input: Optional[Any], output: Any, counts: list[int], root: int, *, dtype: Optional[str] = None
    ) -> Work:
        """Asynchronous `scatter_v`."""
    def barrier(self) -> None:
        """Returns once every rank has called `barrier`."""
    def barrier_async(self) -> Work:
        """Asynchronous `barrier`."""
    def send(self, buf: Any, peer: int, tag: int = 0, *, dtype: Optional[str] = None) -> None:
        """Sends `buf` to rank `peer` with `tag`; returns once the data is handed to the
        transport. The matching `recv` asks for the same element type and length."""
    def recv(self, buf: Any, peer: int, tag: int = 0, *, dtype: Optional[str] = None) -> None:
        """Receives into `buf` the next message from rank `peer` with `tag`."""
    def isend(self, buf: Any, peer: int, tag: int = 0, *, dtype: Optional[str] = None) -> Work:
        """Asynchronous `send`."""
    def irecv(self, buf: Any, peer: int, tag: int = 0, *, dtype: Optional[str] = None) -> Work:
        """Asynchronous `recv`."""
