"""All-reduce from Python (the xccl package): latency of a small message and bandwidth of a
large one, to compare with `xccl bench all_reduce` (the same collective from Rust).

    xccl run -n 2 -- python bench/python_all_reduce.py [--small 8] [--large 64M] [--iters 2000]

Rank 0 prints, per size, the median time of one call started together on every rank
(after a barrier), the mean time of calls back to back (as `xccl bench` measures), and the
bus bandwidth of each (2 (n-1)/n x bytes / time, as nccl-tests and `xccl bench` report it).
"""

import argparse
import time

import numpy as np

import xccl


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def timed(comm, buf, iters):
    """Seconds of one all_reduce: the median over `iters` calls each started together, and
    the mean over `iters` calls back to back (the slowest rank's)."""
    for _ in range(min(iters, 10)):
        comm.all_reduce(buf)
    times = []
    for _ in range(iters):
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_reduce(buf)
        times.append(time.perf_counter() - t0)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.all_reduce(buf)
    t = np.array([np.median(times), (time.perf_counter() - t0) / iters])
    comm.all_reduce(t, "max")
    return t


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", default="8")
    p.add_argument("--large", default="64M")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--large-iters", type=int, default=20)
    a = p.parse_args()
    comm = xccl.Communicator.from_env()
    n = comm.size
    for nbytes, iters in [(size(a.small), a.iters), (size(a.large), a.large_iters)]:
        buf = np.ones(nbytes // 4, dtype=np.float32)
        median, mean = timed(comm, buf, iters)
        if comm.rank == 0:
            bus = 2 * (n - 1) / n * nbytes / 1e9
            print(
                f"all_reduce {nbytes:>10} B  median {median * 1e6:10.1f} us {bus / median:7.2f} GB/s bus"
                f"  back to back {mean * 1e6:10.1f} us {bus / mean:7.2f} GB/s bus  ({n} ranks, Python)"
            )


if __name__ == "__main__":
    main()
