"""The caller's own memory is used, never a copy, and an asynchronous operation holds its
buffers until it has completed.

    python check_zero_copy.py        2 ranks as threads

Prints one line per rank and check; a failed check raises.
"""

import gc
import sys
import threading
import time
import weakref

import numpy as np

import xccl
from ranks import in_threads


def main(comm):
    r, n = comm.rank, comm.size
    say = lambda what: print(f"rank {r}: ok {what}" + "\n", end="", flush=True)  # noqa: E731

    # The result lands in the array passed: same object, same memory, nothing returned.
    a = np.full(1000, r + 1, dtype=np.float64)
    address = a.ctypes.data
    assert comm.all_reduce(a) is None
    assert a.ctypes.data == address and (a == n * (n + 1) / 2).all()
    # A view writes through to its base array.
    base = np.zeros(12, dtype=np.int32)
    base[4:8] = r + 1
    comm.all_reduce(base[4:8])
    assert (base[4:8] == n * (n + 1) // 2).all() and (base[:4] == 0).all() and (base[8:] == 0).all()
    # bytearray and memoryview too.
    ba = bytearray([r + 1] * 8)
    comm.all_reduce(ba, dtype="uint8")
    mv = memoryview(bytearray(np.full(4, r, dtype=np.float32).tobytes())).cast("f")
    comm.all_reduce(mv, "max")
    assert ba == bytearray([n * (n + 1) // 2] * 8) and list(mv) == [n - 1.0] * 4
    say("blocking calls write into the caller's arrays")

    # An asynchronous call holds its buffer (a reference and an export) until wait().
    x = np.ones(1 << 18, dtype=np.float32)
    before = sys.getrefcount(x)
    w = comm.all_reduce_async(x)
    assert sys.getrefcount(x) > before, "the Work holds no reference to its buffer"
    assert w.wait() is True
    assert sys.getrefcount(x) == before, "the buffer is still held after wait()"
    assert (x == n).all()
    say("an async call holds its buffer until wait()")

    # Held even when the caller drops its own reference.
    y = np.ones(1 << 18, dtype=np.float32)
    gone = weakref.ref(y)
    w = comm.all_reduce_async(y)
    del y
    gc.collect()
    assert gone() is not None, "the buffer was freed while the operation used it"
    assert w.wait()
    gc.collect()
    assert gone() is None, "the buffer outlived its operation"
    say("the buffer lives as long as its operation, not longer")

    # While exported, a bytearray cannot be resized under the operation.
    ba = bytearray(1 << 16)
    w = comm.all_reduce_async(ba, dtype="uint8")
    try:
        ba.extend(b"x")
    except BufferError:
        pass
    else:
        raise AssertionError("a bytearray in use was resized")
    w.wait()
    ba.extend(b"x")
    say("an exported bytearray cannot be resized")

    # A Work dropped before its operation completed: the operation still runs, its buffer
    # stays alive until then, and is released by a later call.
    z = np.full(1 << 18, r + 1, dtype=np.float32)
    gone = weakref.ref(z)
    if r == 0:
        comm.all_reduce_async(z)  # the Work is dropped at once
        del z
        gc.collect()
        assert gone() is not None, "an orphaned operation's buffer was freed"
    else:
        time.sleep(0.2)  # rank 0's operation cannot complete before this rank joins
        comm.all_reduce(z)
        del z
    comm.barrier()
    assert gone() is None or (gone() == n * (n + 1) / 2).all()
    comm.barrier_async().wait()  # a later call releases finished orphans
    gc.collect()
    assert gone() is None, "an orphaned operation's buffer was never released"
    say("a dropped Work keeps its buffer until the operation completed")

    # One thread waits on a Work while another polls it, and a third waits with a timeout.
    q = np.ones(1 << 16, dtype=np.float32)
    side = comm.dup()  # says when rank 1 may join (its operations never mix with comm's)
    if r == 0:
        w = comm.all_reduce_async(q)
        waited = []
        waiters = [threading.Thread(target=lambda: waited.append(w.wait())),
                   threading.Thread(target=lambda: waited.append(w.wait(timeout=60)))]
        for t in waiters:
            t.start()
        assert w.wait(timeout=0.01) is False and not w.is_completed()
        side.barrier()  # rank 1 joins the all-reduce now
        while not w.is_completed():
            time.sleep(0.001)
        for t in waiters:
            t.join()
        assert waited == [True, True] and w.wait() is True and (q == n).all(), waited
    else:
        side.barrier()
        comm.all_reduce(q)
    say("a Work can be waited on and polled from several threads")

    # The input of reduce may be its output (in place); other overlaps are copied first.
    v = np.full(8, r + 1, dtype=np.int64)
    comm.reduce(v, v, 0)
    assert (v == (n * (n + 1) // 2 if r == 0 else r + 1)).all(), v
    buf = np.zeros(4 * n, dtype=np.int64)
    buf[4 * r:4 * r + 4] = r + 1
    comm.all_gather(buf[4 * r:4 * r + 4], buf)
    assert (buf == np.repeat(np.arange(1, n + 1), 4)).all(), buf
    say("in-place reduce and all_gather into the output's own block")


if __name__ == "__main__":
    sys.exit(in_threads(2, main))
