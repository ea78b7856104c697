"""The PyTorch process-group backend ``"xccl"``.

Importing this module registers the backend with
``torch.distributed.Backend.register_backend`` for CPU tensors, so that an unmodified
program runs on xccl::

    import torch.distributed as dist
    import xccl.torch  # noqa: F401  (registers "xccl")

    dist.init_process_group("xccl")  # under torchrun, `xccl run`, or with MASTER_ADDR/PORT set
    dist.all_reduce(tensor)

Each process group (the default one and every ``dist.new_group``) is one xccl
:class:`~xccl.Communicator`, bootstrapped through the key-value store PyTorch hands to the
backend (torchrun's store, or the one of ``init_method``), so no other variables are
needed. Calls return :class:`torch.distributed.Work` objects whose futures complete when
xccl's operation does, which lets DistributedDataParallel overlap its bucketed
all-reduces with the backward pass. Tensors are passed to xccl without copies when they
are contiguous; list forms (``all_gather`` into a list, ``reduce_scatter`` from a list,
``all_to_all`` of lists, ``gather``/``scatter``) go through one contiguous buffer, as
Gloo's do.

Calls xccl does not provide (bitwise and pre-multiplied reductions, sparse tensors,
receiving from any source, tensors off the CPU) raise ``RuntimeError`` naming the call.
"""

from __future__ import annotations

import queue
import socket
import threading
from datetime import timedelta
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from . import _xccl

__all__ = ["ProcessGroupXccl", "BACKEND"]

#: The name programs pass to ``torch.distributed.init_process_group``.
BACKEND = "xccl"

_OPS = {
    ReduceOp.RedOpType.SUM: "sum",
    ReduceOp.RedOpType.PRODUCT: "prod",
    ReduceOp.RedOpType.MIN: "min",
    ReduceOp.RedOpType.MAX: "max",
    ReduceOp.RedOpType.AVG: "avg",
}


def _unsupported(call: str, why: str) -> RuntimeError:
    return RuntimeError(f"xccl backend: {call}: {why}")


def _op(call: str, reduce_op) -> str:
    kind = getattr(reduce_op, "op", reduce_op)
    name = _OPS.get(kind)
    if name is None:
        raise _unsupported(
            call, f"reduction {kind} is not supported (xccl reduces with SUM, PRODUCT, MIN, MAX, AVG)"
        )
    return name


class _Call:
    """Buffers of one call: NumPy views of contiguous CPU tensors, and the copies that bring
    results back into the caller's tensors once the operation is done."""

    def __init__(self, name: str):
        self.name = name
        self.after: list[Callable[[], None]] = []
        self.dtype: Optional[str] = None

    def _check(self, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"xccl backend: {self.name}: expected a tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise _unsupported(
                self.name,
                f"a tensor on {t.device}: the xccl backend serves CPU tensors "
                "(for a mixed job use e.g. init_process_group('cpu:xccl,cuda:nccl'))",
            )
        if t.layout != torch.strided:
            raise _unsupported(self.name, f"{t.layout} tensors are not supported")

    def _view(self, t: torch.Tensor, reduces: bool):
        t = t.detach()
        if t.dtype == torch.bfloat16:
            dtype, arr = "bfloat16", t.view(torch.int16).numpy()
        elif t.dtype == torch.bool:
            if reduces:
                raise _unsupported(self.name, "reductions of bool tensors are not supported")
            dtype, arr = None, t.view(torch.uint8).numpy()
        elif t.is_complex():
            if reduces:
                raise _unsupported(self.name, "reductions of complex tensors are not supported")
            dtype, arr = None, torch.view_as_real(t).numpy()
        else:
            dtype, arr = None, t.numpy()
        if self.dtype is None:
            self.dtype = dtype
        return arr

    def input(self, t: torch.Tensor, reduces: bool = False):
        """A read-only view of `t` (a contiguous copy if `t` is not contiguous)."""
        self._check(t)
        return self._view(t if t.is_contiguous() else t.contiguous(), reduces)

    def output(self, t: torch.Tensor, reduces: bool = False):
        """A writable view of `t`; a contiguous stand-in copied back afterwards if needed."""
        self._check(t)
        if t.is_contiguous():
            return self._view(t, reduces)
        stand_in = t.contiguous()
        self.after.append(lambda: t.copy_(stand_in))
        return self._view(stand_in, reduces)

    def flat(self, tensors: Sequence[torch.Tensor], fill: bool, back: bool, reduces: bool = False):
        """One contiguous buffer for `tensors` one after the other: filled with their values
        (`fill`) and/or copied back into them once the operation is done (`back`)."""
        if not tensors:
            raise _unsupported(self.name, "an empty list of tensors")
        for t in tensors:
            self._check(t)
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise _unsupported(self.name, f"tensors of different dtypes {sorted(map(str, dtypes))}")
        if fill:
            buf = torch.cat([t.detach().reshape(-1) for t in tensors])
        else:
            buf = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype)
        if back:

            def copy_back(buf=buf, tensors=list(tensors)):
                offset = 0
                for t in tensors:
                    n = t.numel()
                    t.copy_(buf[offset : offset + n].view_as(t))
                    offset += n

            self.after.append(copy_back)
        return self._view(buf, reduces)


class _Work(dist.Work):
    """A :class:`torch.distributed.Work` backed by an xccl operation."""

    def __init__(self, native, result: list, after: list, completer: "_Completer"):
        super().__init__()
        self._native = native
        self._result = result
        self._after = after
        self._completer = completer
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self._future: Optional[torch.futures.Future] = None

    def _finish(self) -> Optional[BaseException]:
        with self._lock:
            if self._native is not None:
                try:
                    self._native.wait()
                    for step in self._after:
                        step()
                except BaseException as e:  # the operation's error, handed to every waiter
                    self._error = e
                self._native = None
                self._after = []
            return self._error

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        error = self._finish()
        if error is not None:
            raise error
        return True

    def is_completed(self) -> bool:
        native = self._native
        return native is None or native.is_completed()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                self._completer.submit(self)
            return self._future

    def _complete_future(self) -> None:
        error = self._finish()
        future = self._future
        if future is None or future.done():
            return
        if error is None:
            future.set_result(self._result)
        else:
            future.set_exception(error)


class _Completer:
    """One thread per process group completing the futures of its operations in issue
    order (an operation's future completes when xccl's operation does)."""

    def __init__(self, name: str):
        self._queue: "queue.SimpleQueue[_Work]" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: _Work) -> None:
        self._queue.put(work)

    def _run(self) -> None:
        while True:
            self._queue.get()._complete_future()


class ProcessGroupXccl(dist.ProcessGroup):
    """A process group whose collectives run on one xccl communicator."""

    def __init__(self, comm: "_xccl.Communicator", rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._comm = comm
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._completer = _Completer(f"xccl-futures-{rank}")

    # -- identity ---------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 (PyTorch's name)
        return BACKEND

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"ProcessGroupXccl(rank={self._rank}, size={self._size})"

    def _work(self, native, result: list, call: _Call) -> _Work:
        return _Work(native, result, call.after, self._completer)

    def _go(self, opts, call: _Call, result: list, name: str, *args, **kwargs) -> _Work:
        """Runs xccl's `name` on the call's buffers: blocking when PyTorch says the caller
        waits at once (``opts.asyncOp`` false: a synchronous ``dist.*`` call), which saves
        handing the operation to another thread; else its ``_async`` form, whose work the
        caller waits on, or whose future completes, later."""
        if opts is not None and not getattr(opts, "asyncOp", True):
            getattr(self._comm, name)(*args, **kwargs)
            for step in call.after:
                step()
            return _Work(None, result, [], self._completer)
        return self._work(getattr(self._comm, name + "_async")(*args, **kwargs), result, call)

    # -- reductions ---------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        call = _Call("all_reduce")
        op = _op(call.name, opts.reduceOp if opts is not None else ReduceOp.SUM)
        if len(tensors) == 1:
            buf = call.output(tensors[0], reduces=True)
        else:
            buf = call.flat(tensors, fill=True, back=True, reduces=True)
        return self._go(opts, call, tensors, "all_reduce", buf, op, dtype=call.dtype)

    def allreduce_coalesced(self, tensors, opts=None):
        call = _Call("all_reduce_coalesced")
        op = _op(call.name, opts.reduceOp if opts is not None else ReduceOp.SUM)
        buf = call.flat(tensors, fill=True, back=True, reduces=True)
        return self._go(opts, call, tensors, "all_reduce", buf, op, dtype=call.dtype)

    def reduce(self, tensors, opts=None):
        call = _Call("reduce")
        op = _op(call.name, opts.reduceOp)
        root = opts.rootRank
        buf = call.output(self._one(call, tensors), reduces=True)
        out = buf if self._rank == root else None
        return self._go(opts, call, tensors, "reduce", buf, out, root, op, dtype=call.dtype)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        call = _Call("reduce_scatter")
        op = _op(call.name, opts.reduceOp if opts is not None else ReduceOp.SUM)
        out_t = self._one(call, output_tensors)
        pieces = self._one(call, input_tensors)
        self._same_sizes(call, pieces, out_t)
        src = call.flat(pieces, fill=True, back=False, reduces=True)
        out = call.output(out_t, reduces=True)
        return self._go(opts, call, output_tensors, "reduce_scatter", src, out, op, dtype=call.dtype)

    def reduce_scatter_single(self, output, input, opts=None):
        call = _Call("reduce_scatter_tensor")
        op = _op(call.name, opts.reduceOp if opts is not None else ReduceOp.SUM)
        if input.numel() != output.numel() * self._size:
            raise ValueError(
                f"xccl backend: reduce_scatter_tensor: input has {input.numel()} elements; "
                f"it needs {self._size} x the output's {output.numel()}"
            )
        src = call.input(input, reduces=True)
        out = call.output(output, reduces=True)
        return self._go(opts, call, [output], "reduce_scatter", src, out, op, dtype=call.dtype)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._chain([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)])

    # -- data movement -----------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        call = _Call("broadcast")
        root = opts.rootRank if opts is not None else 0
        if len(tensors) == 1:
            buf = call.output(tensors[0])
        else:
            buf = call.flat(tensors, fill=True, back=True)
        return self._go(opts, call, tensors, "broadcast", buf, root, dtype=call.dtype)

    def allgather(self, output_tensors, input_tensors, opts=None):
        call = _Call("all_gather")
        outs = self._one(call, output_tensors)
        inp = self._one(call, input_tensors)
        self._same_sizes(call, outs, inp)
        src = call.input(inp)
        out = call.flat(outs, fill=False, back=True)
        return self._go(opts, call, output_tensors, "all_gather", src, out, dtype=call.dtype)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self._chain([self.allgather([o], [i], opts) for o, i in zip(output_lists, input_tensors)])

    def all_gather_single(self, output, input, opts=None):
        call = _Call("all_gather_into_tensor")
        if output.numel() != input.numel() * self._size:
            raise ValueError(
                f"xccl backend: all_gather_into_tensor: output has {output.numel()} elements; "
                f"it needs {self._size} x the input's {input.numel()}"
            )
        src = call.input(input)
        out = call.output(output)
        return self._go(opts, call, [output], "all_gather", src, out, dtype=call.dtype)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._chain([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        call = _Call("all_to_all_single")
        src = call.input(input)
        out = call.output(output)
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % self._size or output.numel() != input.numel():
                raise ValueError(
                    f"xccl backend: all_to_all_single: input ({input.numel()} elements) and output "
                    f"({output.numel()}) must be equal and divisible by the group size {self._size}"
                )
            return self._go(opts, call, [output], "all_to_all", src, out, dtype=call.dtype)
        else:
            send = self._counts(call, input, input_split_sizes)
            recv = self._counts(call, output, output_split_sizes)
            return self._go(opts, call, [output], "all_to_all_v", src, send, out, recv, dtype=call.dtype)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        call = _Call("all_to_all")
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(
                f"xccl backend: all_to_all: needs {self._size} input and output tensors, got "
                f"{len(input_tensors)} and {len(output_tensors)}"
            )
        src = call.flat(input_tensors, fill=True, back=False)
        out = call.flat(output_tensors, fill=False, back=True)
        send = [t.numel() for t in input_tensors]
        recv = [t.numel() for t in output_tensors]
        return self._go(opts, call, output_tensors, "all_to_all_v", src, send, out, recv, dtype=call.dtype)

    def gather(self, output_tensors, input_tensors, opts=None):
        call = _Call("gather")
        root = opts.rootRank
        inp = self._one(call, input_tensors)
        src = call.input(inp)
        out = None
        if self._rank == root:
            outs = self._one(call, output_tensors)
            self._same_sizes(call, outs, inp)
            out = call.flat(outs, fill=False, back=True)
        return self._go(opts, call, output_tensors, "gather", src, out, root, dtype=call.dtype)

    def gather_single(self, output, input, opts=None):
        call = _Call("gather_into_tensor")
        root = opts.rootRank
        src = call.input(input)
        out = call.output(output) if self._rank == root else None
        return self._go(opts, call, [output], "gather", src, out, root, dtype=call.dtype)

    def scatter(self, output_tensors, input_tensors, opts=None):
        call = _Call("scatter")
        root = opts.rootRank
        out_t = self._one(call, output_tensors)
        src = None
        if self._rank == root:
            ins = self._one(call, input_tensors)
            self._same_sizes(call, ins, out_t)
            src = call.flat(ins, fill=True, back=False)
        out = call.output(out_t)
        return self._go(opts, call, output_tensors, "scatter", src, out, root, dtype=call.dtype)

    def barrier(self, opts=None):
        return self._go(opts, _Call("barrier"), [], "barrier")

    def send(self, tensors, dst, tag=0):
        call = _Call("send")
        buf = call.input(self._one(call, tensors))
        return self._work(self._comm.isend(buf, dst, tag, dtype=call.dtype), tensors, call)

    def recv(self, tensors, src, tag=0):
        call = _Call("recv")
        buf = call.output(self._one(call, tensors))
        return self._work(self._comm.irecv(buf, src, tag, dtype=call.dtype), tensors, call)

    # -- what xccl does not do ---------------------------------------------------------------
    def recv_anysource(self, tensors, tag=0):
        raise _unsupported("recv from any source", "xccl receives from a named rank only; pass src")

    def allreduce_sparse(self, tensors, opts=None):
        raise _unsupported("all_reduce of sparse tensors", "not supported")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        raise _unsupported("monitored_barrier", "not supported; use barrier()")

    # -- helpers -----------------------------------------------------------------------------
    def _one(self, call: _Call, items):
        if len(items) != 1:
            raise _unsupported(call.name, f"{len(items)} tensors (or lists) per call; xccl takes one per process")
        return items[0]

    def _same_sizes(self, call: _Call, pieces, tensor) -> None:
        if len(pieces) != self._size:
            raise ValueError(
                f"xccl backend: {call.name}: the list holds {len(pieces)} tensors; the group has {self._size} ranks"
            )
        bad = [i for i, p in enumerate(pieces) if p.numel() != tensor.numel()]
        if bad:
            raise ValueError(
                f"xccl backend: {call.name}: list entries {bad} differ in size from the "
                f"{tensor.numel()}-element tensor (xccl's list forms need equal sizes)"
            )

    def _counts(self, call: _Call, tensor: torch.Tensor, splits) -> list:
        if not splits:
            if tensor.numel() % self._size:
                raise ValueError(
                    f"xccl backend: {call.name}: {tensor.numel()} elements do not split evenly over {self._size} ranks"
                )
            return [tensor.numel() // self._size] * self._size
        if len(splits) != self._size:
            raise ValueError(f"xccl backend: {call.name}: {len(splits)} split sizes for {self._size} ranks")
        row = tensor[0].numel() if tensor.dim() > 0 and tensor.shape[0] else 0
        if tensor.dim() > 0 and sum(splits) != tensor.shape[0]:
            raise ValueError(
                f"xccl backend: {call.name}: split sizes sum to {sum(splits)}, the tensor has {tensor.shape[0]} rows"
            )
        return [int(s) * row for s in splits]

    def _chain(self, works: list) -> dist.Work:
        """One work for several (the coalesced forms): done when all are."""
        return works[0] if len(works) == 1 else _Chain(works, self._completer)


class _Chain(_Work):
    """The work of a coalesced call: its parts, finished in order."""

    def __init__(self, parts: list, completer: _Completer):
        super().__init__(None, [t for p in parts for t in p._result], [], completer)
        self._parts = parts

    def _finish(self) -> Optional[BaseException]:
        for part in self._parts:
            error = part._finish()
            if error is not None:
                return error
        return None

    def is_completed(self) -> bool:
        return all(p.is_completed() for p in self._parts)

    def exception(self):
        return next((p.exception() for p in self._parts if p.exception() is not None), None)


def _local_ip(store) -> Optional[str]:
    """This host's address on the way to the host of `store` (a TCPStore, possibly behind
    PrefixStores): the address peers reach this rank at. None when it cannot be told."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if not host:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port or 1))
            return probe.getsockname()[0]
    except OSError:
        return None


def _create(store, rank: int, size: int, timeout: timedelta) -> ProcessGroupXccl:
    """The backend's constructor, called by ``init_process_group`` and ``new_group`` on the
    members of each group with the group's store."""
    comm = _xccl.Communicator.from_store(store, rank, size, timeout.total_seconds(), _local_ip(store))
    return ProcessGroupXccl(comm, rank, size, timeout)


def register() -> None:
    """Registers the backend (idempotent); importing this module does it. Also the entry
    point ``torch.distributed.backends`` of the package, so ``init_process_group("xccl")``
    finds the backend even without the import."""
    plugin = dist.Backend._plugins.get(BACKEND.upper()) if hasattr(dist.Backend, "_plugins") else None
    if plugin is not None and getattr(plugin, "creator_fn", None) is _create:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


register()
