"""What a torch.distributed call costs before any communication: a 1-rank "xccl" group (xccl's
all-reduce of one rank is a copy-free no-op), timed through `dist.all_reduce` (PyTorch's
Python layer, its dispatcher, the backend) and through the backend object directly
(`Backend.allreduce` with asyncOp false: pybind and ProcessGroupXCCL only).

    python bench/native/torch_floor.py        # prints both, in µs per call, 5 blocks each
"""

import os
import tempfile
import time

import torch
import torch.distributed as dist

import xccl.torch  # noqa: F401  (registers "xccl")


def timed(fn, n=20000):
    for _ in range(n // 10):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    torch.set_num_threads(1)
    d = tempfile.mkdtemp()
    dist.init_process_group("xccl", store=dist.FileStore(os.path.join(d, "store"), 1), rank=0, world_size=1)
    t = torch.ones(2)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    sync = dist.AllreduceOptions()
    sync.asyncOp = False
    for what, fn in [
        ("dist.all_reduce", lambda: dist.all_reduce(t)),
        ("Backend.allreduce sync", lambda: backend.allreduce([t], sync)),
    ]:
        xs = sorted(timed(fn) for _ in range(5))
        print(f"floor {what}: {xs[2]:.2f} us (min {xs[0]:.2f}, max {xs[-1]:.2f}, 5 blocks)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
