"""Errors raised as the exceptions the package documents.

    python check_errors.py args          bad arguments: InvalidArgumentError before communicating
    python check_errors.py timeout       a rank that never joins: TimeoutError (XCCL_TIMEOUT=1)
    python check_errors.py mismatch      ranks calling different things: MismatchError (threads)
    xccl run -n 3 -- python check_errors.py mismatch   the same between processes
    xccl run -n 3 -- python check_errors.py lost       rank 2 exits before a collective:
                                                       PeerLostError naming it on the others

Each rank prints "rank R: ok <what>" for every check that passed; a failed check raises.
"""

import os
import signal
import sys

import numpy as np

import xccl
from ranks import in_threads


def expect(cls, fn, *needles):
    """Calls fn(); it must raise `cls` whose message contains every needle. Returns it."""
    try:
        fn()
    except cls as e:
        msg = str(e)
        for n in needles:
            assert n in msg, f"{cls.__name__} message {msg!r} lacks {n!r}"
        return e
    except Exception as e:
        raise AssertionError(f"expected {cls.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {cls.__name__}, nothing raised")


def bad_arguments(comm):
    r, n = comm.rank, comm.size
    f32 = np.ones(4, dtype=np.float32)
    readonly = np.ones(4 * n, dtype=np.float32)
    readonly.setflags(write=False)
    bad = xccl.InvalidArgumentError
    cases = [
        ("not a buffer", lambda: comm.all_reduce([1.0, 2.0]), "does not export a buffer"),
        ("non-contiguous", lambda: comm.all_reduce(np.ones(8, dtype=np.float32)[::2]), "not C-contiguous"),
        ("read-only", lambda: comm.all_reduce(readonly), "read-only"),
        ("read-only bytes", lambda: comm.broadcast(b"abcd", 0), "read-only"),
        ("read-only output", lambda: comm.all_gather(f32, readonly), "output is read-only"),
        ("unknown op", lambda: comm.all_reduce(f32, "median"), "unknown op 'median'"),
        ("unknown dtype", lambda: comm.all_reduce(f32, dtype="float128"), "unknown dtype 'float128'"),
        ("dtype of another size", lambda: comm.all_reduce(f32, dtype="float64"), "same size"),
        ("unsupported format", lambda: comm.all_reduce(np.ones(4, dtype=np.int16)), "bfloat16"),
        ("bool", lambda: comm.all_reduce(np.ones(4, dtype=bool)), "does not handle"),
        ("mixed types", lambda: comm.all_gather(f32, np.zeros(4 * n, dtype=np.float64)), "float32 but output of type float64"),
        ("wrong output size", lambda: comm.all_gather(f32, np.zeros(4 * n + 1, dtype=np.float32)),
         f"expected {4 * n}"),
        ("indivisible all_to_all", lambda: comm.all_to_all(np.ones(4 * n + 1, dtype=np.float32),
                                                          np.ones(4 * n + 1, dtype=np.float32)), "blocks"),
        ("counts of another length", lambda: comm.all_gather_v(f32, np.zeros(8, dtype=np.float32), [4]),
         "counts"),
        ("negative count", lambda: comm.reduce_scatter_v(f32, f32, [-1] * n), "counts[0] is -1"),
        ("root outside", lambda: comm.broadcast(f32, n + 3), f"root {n + 3} is outside"),
        ("negative root", lambda: comm.broadcast(f32, -1), "root is -1"),
        ("send to self", lambda: comm.send(f32, r), "itself"),
        ("peer outside", lambda: comm.recv(f32, n), f"peer {n} is outside"),
        ("tag too large", lambda: comm.send(f32, (r + 1) % n, 2**40), "tag"),
        ("async unknown op", lambda: comm.all_reduce_async(f32, "median"), "unknown op"),
        ("async wrong size", lambda: comm.reduce_scatter_async(np.ones(4 * n + 1, dtype=np.float32), f32),
         "expected"),
        ("async read-only", lambda: comm.irecv(readonly, (r + 1) % n), "read-only"),
        ("root's missing output", lambda: comm.gather(f32, None, r), "output"),
        ("negative group size", lambda: xccl.Communicator.local(-1), "n is -1"),
    ]
    for what, fn, needle in cases:
        e = expect(bad, fn, needle)
        assert isinstance(e, ValueError) and isinstance(e, xccl.XcclError) and e.rank is None, what
    # Nothing was communicated: the group is still in step, and sums are right.
    x = np.array([r + 1], dtype=np.int64)
    comm.all_reduce(x)
    assert x[0] == n * (n + 1) // 2, x
    print(f"rank {r}: ok {len(cases)} bad arguments raised InvalidArgumentError" + "\n", end="", flush=True)


def timeout_case(comm):
    if comm.rank == 0:
        e = expect(xccl.TimeoutError, lambda: comm.all_reduce(np.ones(4, dtype=np.float32)),
                   "timed out", "XCCL_TIMEOUT")
        assert isinstance(e, xccl.XcclError)
        print(f"rank {comm.rank}: ok TimeoutError: {e}" + "\n", end="", flush=True)


def mismatch(comm):
    r = comm.rank
    counts, kinds = comm.dup(), comm.dup()
    # Rank 0 reduces 4 elements, the others 8.
    e = expect(xccl.MismatchError, lambda: counts.all_reduce(np.ones(4 if r == 0 else 8, dtype=np.float32)),
               "mismatch")
    print(f"rank {r}: ok MismatchError (counts): {e}" + "\n", end="", flush=True)
    # Rank 0 all-reduces, the others all-gather: every rank receives something unexpected.
    x = np.ones(16, dtype=np.float32)
    out = np.zeros(16 * comm.size, dtype=np.float32)
    call = (lambda: kinds.all_reduce(x)) if r == 0 else (lambda: kinds.all_gather(x, out))
    e = expect(xccl.MismatchError, call, "mismatch")
    assert "all_gather" in str(e) and "all_reduce" in str(e), e
    print(f"rank {r}: ok MismatchError (collectives): {e}" + "\n", end="", flush=True)
    # Later calls on a failed communicator raise the same kind of error.
    expect(xccl.MismatchError, lambda: kinds.barrier(), "unusable")
    # Communicators fail independently.
    y = np.array([1.0])
    comm.all_reduce(y)
    assert y[0] == comm.size
    print(f"rank {r}: ok the original communicator still works" + "\n", end="", flush=True)


def lost(comm):
    r = comm.rank
    # The launcher stops the others (SIGTERM) once a rank failed; they report first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    x = np.ones(1 << 16, dtype=np.float32)
    comm.all_reduce(x)
    if r == 2:
        os._exit(1)
    e = expect(xccl.PeerLostError, lambda: comm.all_reduce(x), "rank 2")
    assert e.rank == 2, (e.rank, e)
    print(f"rank {r}: ok PeerLostError (rank {e.rank}): {e}" + "\n", end="", flush=True)
    w = comm.all_reduce_async(x)
    e = expect(xccl.PeerLostError, w.wait, "rank 2")
    assert e.rank == 2 and w.is_completed()
    print(f"rank {r}: ok later operations raise PeerLostError too" + "\n", end="", flush=True)


if __name__ == "__main__":
    case = sys.argv[1]
    fn = {"args": bad_arguments, "timeout": timeout_case, "mismatch": mismatch, "lost": lost}[case]
    if "RANK" in os.environ:
        fn(xccl.Communicator.from_env())
    else:
        sys.exit(in_threads(3, fn))
