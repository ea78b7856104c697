"""Checks the PyTorch backend "xccl" against "gloo" in the same processes.

Run as every rank of a job (`xccl run -n 3 -- python check_torch_backend.py`, or torchrun):
the default group is "xccl"; a "gloo" group of the same ranks computes the reference of
every call. Each torch.distributed call the backend serves is made on both groups with the
same inputs, for several dtypes, and the results must be equal (exactly for integers and
for data movement; for floating-point reductions to the rounding of a different summation
order). Then a sub-group from `new_group`, asynchronous calls with futures, and the errors
of calls xccl does not serve, and a `Work.wait(timeout)` that times out (the group is aborted
and the peer's next call on it fails naming this rank). Prints "ok <rank>" at the end; any
failure raises.
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import xccl.torch  # noqa: F401  (registers "xccl")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]


def close(a, b, what):
    if a.dtype.is_floating_point:
        tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(a.dtype, 1e-6)
        ok = torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(a, b)
    if not ok:
        raise AssertionError(f"rank {dist.get_rank()}: {what}: xccl {a.flatten()[:8]} != gloo {b.flatten()[:8]}")


def data(shape, dtype, salt, rank=None):
    """Rank `rank`'s (default: this rank's) test values."""
    rank = dist.get_rank() if rank is None else rank
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    hi = 4 if dtype == torch.uint8 else 100
    return torch.randint(0, hi, shape, generator=g).to(dtype)


def both(fn, *tensor_sets):
    """Runs fn(group, *tensors) on xccl and on gloo with copies of the same tensors."""
    mine = [clone(t) for t in tensor_sets]
    ref = [clone(t) for t in tensor_sets]
    fn(None, *mine)
    fn(GLOO, *ref)
    return mine, ref


def clone(t):
    if isinstance(t, list):
        return [x.clone() for x in t]
    return t.clone() if t is not None else None


def check_pair(mine, ref, what):
    for m, r in zip(mine, ref):
        if isinstance(m, list):
            for i, (a, b) in enumerate(zip(m, r)):
                close(a, b, f"{what}[{i}]")
        elif m is not None:
            close(m, r, what)


def main():
    global GLOO
    torch.manual_seed(0)
    dist.init_process_group("xccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "xccl", dist.get_backend()
    GLOO = dist.new_group(backend="gloo")
    for dtype in DTYPES:
        reductions = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN]
        if dtype not in (torch.float16, torch.bfloat16, torch.uint8):
            reductions.append(dist.ReduceOp.PRODUCT)
        for count in [1, 5, 1000]:
            x = data((count,), dtype, count)
            for op in reductions:
                mine, ref = both(lambda g, t: dist.all_reduce(t, op=op, group=g), x)
                check_pair(mine, ref, f"all_reduce {dtype} {op} n={count}")
                root = count % n
                mine, ref = both(lambda g, t: dist.reduce(t, dst=root, op=op, group=g), x)
                if rank == root:
                    check_pair(mine, ref, f"reduce {dtype} {op}")
            mine, ref = both(lambda g, t: dist.broadcast(t, src=n - 1, group=g), x)
            check_pair(mine, ref, f"broadcast {dtype}")
            outs = [torch.zeros(count, dtype=dtype) for _ in range(n)]
            mine, ref = both(lambda g, o, t: dist.all_gather(o, t, group=g), outs, x)
            check_pair(mine, ref, f"all_gather list {dtype}")
            big = torch.zeros(n * count, dtype=dtype)
            mine, ref = both(lambda g, o, t: dist.all_gather_into_tensor(o, t, group=g), big, x)
            check_pair(mine, ref, f"all_gather_into_tensor {dtype}")
            pieces = [data((count,), dtype, 7 + i) for i in range(n)]
            out = torch.zeros(count, dtype=dtype)
            mine, ref = both(lambda g, o, p: dist.reduce_scatter(o, p, group=g), out, pieces)
            check_pair(mine, ref, f"reduce_scatter list {dtype}")
            whole = data((n * count,), dtype, 3)
            mine, ref = both(lambda g, o, t: dist.reduce_scatter_tensor(o, t, group=g), out, whole)
            check_pair(mine, ref, f"reduce_scatter_tensor {dtype}")
            got = torch.zeros(n * count, dtype=dtype)
            mine, ref = both(lambda g, o, t: dist.all_to_all_single(o, t, group=g), got, whole)
            check_pair(mine, ref, f"all_to_all_single {dtype}")
            # Uneven splits: rank r sends 1 + (r + j) % 2 rows of 3 to rank j.
            send = [1 + (rank + j) % 2 for j in range(n)]
            recv = [1 + (j + rank) % 2 for j in range(n)]
            src = data((sum(send), 3), dtype, 11)
            dst = torch.zeros(sum(recv), 3, dtype=dtype)
            mine, ref = both(
                lambda g, o, t: dist.all_to_all_single(o, t, output_split_sizes=recv, input_split_sizes=send, group=g),
                dst,
                src,
            )
            check_pair(mine, ref, f"all_to_all_single uneven {dtype}")
            # Gloo's list form takes equal sizes only.
            ins = [data((2, 3), dtype, 20 + j) for j in range(n)]
            outs = [torch.zeros(2, 3, dtype=dtype) for _ in range(n)]
            mine, ref = both(lambda g, o, i: dist.all_to_all(o, i, group=g), outs, ins)
            check_pair(mine, ref, f"all_to_all list {dtype}")
            root = (count + 1) % n
            gl = [torch.zeros(count, dtype=dtype) for _ in range(n)] if rank == root else None
            mine, ref = both(lambda g, t, o: dist.gather(t, o, dst=root, group=g), x, gl)
            if rank == root:
                check_pair(mine, ref, f"gather {dtype}")
            sl = [data((count,), dtype, 30 + i) for i in range(n)] if rank == root else None
            mine, ref = both(lambda g, o, s: dist.scatter(o, s, src=root, group=g), out, sl)
            check_pair(mine, ref, f"scatter {dtype}")
    # Non-contiguous tensors and tensors that require grad.
    base = data((6, 4), torch.float32, 5)
    mine, ref = both(lambda g, t: dist.all_reduce(t.t(), group=g), base)
    check_pair(mine, ref, "all_reduce of a transposed view")
    # Send and receive around a ring, blocking and not.
    x = data((17,), torch.float64, 40)
    y = torch.zeros(17, dtype=torch.float64)
    right, left = (rank + 1) % n, (rank - 1) % n
    reqs = [dist.isend(x, right), dist.irecv(y, left)]
    for r in reqs:
        r.wait()
    close(y, data((17,), torch.float64, 40, rank=left), "isend/irecv ring")
    if rank == 0:
        dist.send(x, 1)
    elif rank == 1:
        z = torch.zeros(17, dtype=torch.float64)
        dist.recv(z, 0)
        close(z, data((17,), torch.float64, 40, rank=0), "send/recv")
    dist.barrier()
    # A sub-group of the even ranks, created by every rank as new_group requires.
    evens = list(range(0, n, 2))
    sub = dist.new_group(evens, backend="xccl")
    sub_gloo = dist.new_group(evens, backend="gloo")
    if rank in evens:
        a = data((9,), torch.float32, 50)
        b = a.clone()
        dist.all_reduce(a, group=sub)
        dist.all_reduce(b, group=sub_gloo)
        close(a, b, "all_reduce on a new_group")
    # Asynchronous calls: futures complete with the reduced tensors.
    t = data((1000,), torch.float32, 60)
    ref = t.clone()
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    dist.all_reduce(ref, group=GLOO)
    close(fut.wait(), ref * 2, "future of an async all_reduce")
    assert work.is_completed()
    # What xccl does not serve is a clear error naming the call.
    for call, fn in [
        ("BAND", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)),
        ("recv from any source", lambda: dist.recv(torch.zeros(2))),
    ]:
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            assert call in str(e) and "xccl" in str(e), f"{call}: {e}"
        else:
            raise AssertionError(f"{call} did not raise")
    # Work.wait(timeout) honours its timeout: a receive nobody sends times out, the group's
    # communicator is aborted, and the peer's next call on that group fails naming rank 0.
    pair = dist.new_group([0, 1], backend="xccl")
    if rank == 0:
        w = dist.irecv(torch.zeros(3), src=1, group=pair)
        t0 = time.monotonic()
        try:
            w.wait(timeout=timedelta(milliseconds=300))
        except Exception as e:  # noqa: BLE001
            assert "timed out" in str(e) and "aborted" in str(e), f"wait(timeout): {e}"
        else:
            raise AssertionError("a receive nobody sent completed")
        assert time.monotonic() - t0 < 10, "wait(timeout) took far longer than its timeout"
    dist.barrier(group=GLOO)
    if rank == 1:
        try:
            dist.all_reduce(torch.ones(1), group=pair)
        except Exception as e:  # noqa: BLE001
            assert "rank 0" in str(e) and "timed out" in str(e), f"the peer of an aborted group: {e}"
        else:
            raise AssertionError("a call on a group aborted by rank 0 succeeded")
    dist.barrier()
    print(f"rank {rank}: torch backend ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
