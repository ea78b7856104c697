"""Every collective and point-to-point call, blocking and asynchronous, on every element type,
checked against references computed here with NumPy (bfloat16: with PyTorch).

    python check_collectives.py threads          3 ranks as threads (Communicator.local)
    xccl run -n 3 -- python check_collectives.py  ranks as processes (Communicator.from_env)

Every rank computes every rank's input itself (``values(rank, n)``), so each reference is
independent of xccl. Prints one line per rank and exits non-zero on the first failure.
"""

import sys

import numpy as np

import xccl
from ranks import in_threads

OPS = ["sum", "prod", "min", "max", "avg"]


def values(rank, n):
    """Rank `rank`'s `n` input values: small positive integers, exact in every type."""
    return [((i * 7 + rank * 3) % 11) + 1 for i in range(n)]


class Numpy:
    """Buffers of one NumPy element type; references with NumPy in that type."""

    def __init__(self, dtype):
        self.dt = np.dtype(dtype)
        self.name = self.dt.name
        self.kw = {}

    def make(self, vals):
        return np.array(vals, dtype=np.float64).astype(self.dt)

    def zeros(self, n):
        return np.zeros(n, dtype=self.dt)

    def value(self, buf):
        return buf

    def reduce(self, bufs, op):
        s = np.stack(bufs)
        if op == "sum":
            return np.sum(s, axis=0, dtype=self.dt)
        if op == "prod":
            return np.prod(s, axis=0, dtype=self.dt)
        if op == "min":
            return np.min(s, axis=0)
        if op == "max":
            return np.max(s, axis=0)
        total = np.sum(s, axis=0, dtype=self.dt)
        if self.dt.kind == "f":
            return (total.astype(np.float64) / len(bufs)).astype(self.dt)
        return total // self.dt.type(len(bufs))

    def check(self, got, want, what):
        got, want = np.asarray(got), np.asarray(want)
        if self.dt.kind == "f":
            rtol = {2: 2e-3, 4: 1e-6, 8: 1e-12}[self.dt.itemsize]
            np.testing.assert_allclose(got, want, rtol=rtol, err_msg=what)
        else:
            np.testing.assert_array_equal(got, want, err_msg=what)


class Bfloat16:
    """bfloat16 buffers: torch tensors, passed as int16 NumPy views with dtype="bfloat16";
    references with torch in bfloat16."""

    name = "bfloat16"
    kw = {"dtype": "bfloat16"}

    def __init__(self, torch):
        self.torch = torch

    def make(self, vals):
        t = self.torch.tensor(vals, dtype=self.torch.bfloat16)
        return t.view(self.torch.int16).numpy()

    def zeros(self, n):
        return self.make([0] * n)

    def tensor(self, buf):
        return self.torch.from_numpy(buf).view(self.torch.bfloat16)

    def value(self, buf):
        return self.tensor(buf).float().numpy()

    def reduce(self, bufs, op):
        s = self.torch.stack([self.tensor(b) for b in bufs])
        r = {
            "sum": lambda: s.sum(0),
            "prod": lambda: s.prod(0),
            "min": lambda: s.min(0).values,
            "max": lambda: s.max(0).values,
            "avg": lambda: s.sum(0) / len(bufs),
        }[op]()
        return r.to(self.torch.bfloat16).float().numpy()

    def check(self, got, want, what):
        np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, rtol=8e-3, err_msg=what)


def backends():
    out = [Numpy(d) for d in ["float32", "float64", "float16", "int32", "int64", "uint8"]]
    try:
        import torch
    except ImportError as e:
        print(f"skipping: bfloat16 checks need torch ({e})" + "\n", end="", flush=True)
    else:
        out.append(Bfloat16(torch))
    return out


def call(comm, name, asynchronous, *args, **kw):
    """comm.name(*args, **kw), or its asynchronous twin waited for."""
    if not asynchronous:
        assert getattr(comm, name)(*args, **kw) is None
        return
    twin = {"send": "isend", "recv": "irecv"}.get(name, name + "_async")
    work = getattr(comm, twin)(*args, **kw)
    assert isinstance(work, xccl.Work), work
    assert work.wait() is True
    assert work.is_completed()


def offsets(counts):
    return [sum(counts[:i]) for i in range(len(counts))]


def run(comm, b, asynchronous, n):
    """Every operation once with backend `b`; returns how many results were checked."""
    r, size = comm.rank, comm.size
    kw = b.kw
    mode = "async" if asynchronous else "sync"
    inputs = [b.make(values(q, n)) for q in range(size)]
    checks = 0

    def check(got, want, what):
        nonlocal checks
        b.check(b.value(got), want, f"rank {r} {b.name} {mode} n={n} {what}")
        checks += 1

    for op in OPS:
        buf = b.make(values(r, n))
        call(comm, "all_reduce", asynchronous, buf, op, **kw)
        check(buf, b.reduce(inputs, op), f"all_reduce {op}")

    root = size - 1
    buf = b.make(values(r, n))
    call(comm, "broadcast", asynchronous, buf, root, **kw)
    check(buf, b.value(inputs[root]), "broadcast")

    root = 1 % size
    out = b.zeros(n) if r == root else None
    call(comm, "reduce", asynchronous, b.make(values(r, n)), out, root, "max", **kw)
    if r == root:
        check(out, b.reduce(inputs, "max"), "reduce")
    buf = b.make(values(r, n))
    call(comm, "reduce", asynchronous, buf, buf, root, "sum", **kw)
    check(buf, b.reduce(inputs, "sum") if r == root else b.value(inputs[r]), "reduce in place")

    out = b.zeros(n * size)
    call(comm, "all_gather", asynchronous, b.make(values(r, n)), out, **kw)
    check(out, np.concatenate([b.value(x) for x in inputs]), "all_gather")

    counts = [q + 1 for q in range(size)]
    out = b.zeros(sum(counts))
    call(comm, "all_gather_v", asynchronous, b.make(values(r, counts[r])), out, counts, **kw)
    want = np.concatenate([b.value(b.make(values(q, counts[q]))) for q in range(size)])
    check(out, want, "all_gather_v")

    big = [b.make(values(q, n * size)) for q in range(size)]
    for op in ["sum", "max"]:
        out = b.zeros(n)
        call(comm, "reduce_scatter", asynchronous, b.make(values(r, n * size)), out, op, **kw)
        check(out, b.reduce(big, op)[r * n:(r + 1) * n], f"reduce_scatter {op}")

    total = sum(counts)
    uneven = [b.make(values(q, total)) for q in range(size)]
    out = b.zeros(counts[r])
    call(comm, "reduce_scatter_v", asynchronous, b.make(values(r, total)), out, counts, "sum", **kw)
    at = offsets(counts)[r]
    check(out, b.reduce(uneven, "sum")[at:at + counts[r]], "reduce_scatter_v")

    out = b.zeros(n * size)
    call(comm, "all_to_all", asynchronous, b.make(values(r, n * size)), out, **kw)
    want = np.concatenate([b.value(big[q])[r * n:(r + 1) * n] for q in range(size)])
    check(out, want, "all_to_all")

    # Rank i sends i + j + 1 elements to rank j.
    send = [r + j + 1 for j in range(size)]
    recv = [j + r + 1 for j in range(size)]
    out = b.zeros(sum(recv))
    call(comm, "all_to_all_v", asynchronous, b.make(values(r, sum(send))), send, out, recv, **kw)
    parts = []
    for j in range(size):
        theirs = [j + k + 1 for k in range(size)]
        at = offsets(theirs)[r]
        parts.append(b.value(b.make(values(j, sum(theirs))))[at:at + theirs[r]])
    check(out, np.concatenate(parts), "all_to_all_v")

    root = 0
    out = b.zeros(n * size) if r == root else None
    call(comm, "gather", asynchronous, b.make(values(r, n)), out, root, **kw)
    if r == root:
        check(out, np.concatenate([b.value(x) for x in inputs]), "gather")

    out = b.zeros(n)
    src = b.make(values(root, n * size)) if r == root else None
    call(comm, "scatter", asynchronous, src, out, root, **kw)
    check(out, b.value(big[root])[r * n:(r + 1) * n], "scatter")

    call(comm, "barrier", asynchronous)

    if size > 1:
        nxt, prev = (r + 1) % size, (r - 1) % size
        got = b.zeros(n)
        if asynchronous:
            w_recv = comm.irecv(got, prev, 5, **kw)
            w_send = comm.isend(b.make(values(r, n)), nxt, 5, **kw)
            assert w_send.wait() and w_recv.wait(timeout=60)
        elif r == 0:
            comm.send(b.make(values(r, n)), nxt, 5, **kw)
            comm.recv(got, prev, 5, **kw)
        else:
            comm.recv(got, prev, 5, **kw)
            comm.send(b.make(values(r, n)), nxt, 5, **kw)
        check(got, b.value(inputs[prev]), "send/recv ring")
    return checks


def main(comm):
    checks = 0
    for b in backends():
        for asynchronous in (False, True):
            for n in (5, 4099):
                checks += run(comm, b, asynchronous, n)
    # Larger than the small-message paths: segmented, pulled.
    a = np.full(1 << 20, comm.rank + 1, dtype=np.float32)
    comm.all_reduce(a)
    assert (a == comm.size * (comm.size + 1) / 2).all(), a[:4]
    # Sub-groups: split and dup.
    sub = comm.split(comm.rank % 2, key=-comm.rank)
    members = [q for q in range(comm.size) if q % 2 == comm.rank % 2]
    assert sub.size == len(members) and sub.rank == sorted(members, reverse=True).index(comm.rank)
    x = np.array([comm.rank], dtype=np.int64)
    sub.all_reduce(x)
    assert x[0] == sum(members), (x, members)
    assert comm.split(None) is None
    d = comm.dup()
    assert (d.rank, d.size) == (comm.rank, comm.size)
    d.barrier()
    print(f"rank {comm.rank}: {checks} checks ok" + "\n", end="", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["threads"]:
        sys.exit(in_threads(3, main))
    main(xccl.Communicator.from_env())
