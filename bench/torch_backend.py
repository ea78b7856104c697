"""torch.distributed collectives through backend "xccl" against "gloo", in the same processes.

    python bench/torch_backend.py --ranks 2 --out target/bench/torch_backend/collectives.json

Each of --ranks processes (spawned here, one thread each) joins the default group with
"gloo" and a second group of the same ranks with "xccl" (`import xccl.torch`). For each size
the two backends alternate in blocks of --reps calls so that machine drift hits both alike;
a call is `dist.all_reduce(t, group=g)` (synchronous, as a training loop calls it). Reported
per backend: the median time per call over the blocks, algorithm bandwidth (bytes / time) and
bus bandwidth (algorithm bandwidth x 2(n-1)/n, NCCL's convention). Rank 0 writes JSON.
"""

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip().lower()
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def rank_main(rank, args, port):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import xccl.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    groups = {"gloo": dist.group.WORLD, "xccl": dist.new_group(backend="xccl")}
    n = args.ranks
    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        elems = max(1, size // 4)
        t = torch.ones(elems, dtype=torch.float32)
        reps = args.reps if size <= (1 << 20) else args.big_reps
        samples = {k: [] for k in groups}
        for name, g in groups.items():  # warm up both
            for _ in range(3):
                dist.all_reduce(t, group=g)
        for block in range(args.blocks):
            order = list(groups.items()) if block % 2 == 0 else list(reversed(list(groups.items())))
            for name, g in order:
                dist.barrier(group=groups["gloo"])
                t0 = time.perf_counter()
                for _ in range(reps):
                    dist.all_reduce(t, group=g)
                samples[name].append((time.perf_counter() - t0) / reps)
        # The slowest rank's time per block is the collective's time.
        for name in groups:
            s = torch.tensor(samples[name], dtype=torch.float64)
            dist.all_reduce(s, op=dist.ReduceOp.MAX, group=groups["gloo"])
            sec = statistics.median(s.tolist())
            algbw = elems * 4 / sec / 1e9
            rows.append(
                {
                    "backend": name,
                    "bytes": elems * 4,
                    "ranks": n,
                    "us": sec * 1e6,
                    "algbw_GBps": algbw,
                    "busbw_GBps": algbw * 2 * (n - 1) / n,
                }
            )
    if rank == 0:
        result = {"torch": torch.__version__, "ranks": n, "rows": rows}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        for r in rows:
            print(
                f"{r['backend']:5} {r['bytes']:>10} B  {r['us']:10.1f} us  "
                f"algbw {r['algbw_GBps']:6.3f} GB/s  busbw {r['busbw_GBps']:6.3f} GB/s",
                flush=True,
            )
    dist.barrier()
    # Gloo's threads sometimes abort the interpreter's teardown; the results are written.
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", default="8,64M")
    p.add_argument("--reps", type=int, default=200, help="calls per block for sizes up to 1 MiB")
    p.add_argument("--big-reps", type=int, default=5, help="calls per block above 1 MiB")
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--out", default="torch_backend.json")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
