"""DistributedDataParallel on backend "xccl" against "gloo": the same model trained 20 steps
from the same seed on each (in the same processes, one group per backend) ends with equal
parameters (rel. 1e-6), and both differ from their start (the check can fail).

Run as every rank of a job: `xccl run -n 3 -- python check_torch_ddp.py`.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import xccl.torch  # noqa: F401


def main():
    torch.set_num_threads(1)
    dist.init_process_group("xccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    start = [p.detach().clone() for p in net.parameters()]
    # Small buckets: several all-reduces per step, overlapped with backward.
    models = {
        "xccl": DDP(copy.deepcopy(net), bucket_cap_mb=0.01),
        "gloo": DDP(copy.deepcopy(net), process_group=gloo, bucket_cap_mb=0.01),
    }
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in models.items()}
    gen = torch.Generator().manual_seed(7 + rank)
    for _ in range(20):
        x = torch.randn(32, 16, generator=gen)
        y = torch.randn(32, 4, generator=gen)
        for k, m in models.items():
            opts[k].zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opts[k].step()
    for (name, a), b, s in zip(
        models["xccl"].module.named_parameters(), models["gloo"].module.parameters(), start
    ):
        err = ((a - b).norm() / b.norm()).item()
        assert err < 1e-6, f"rank {rank}: {name}: xccl and gloo differ by {err:.2e} (rel.)"
        assert not torch.equal(a, s), f"rank {rank}: {name} did not train"
    # DDP keeps replicas equal: every rank ends with rank 0's parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in models["xccl"].module.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0, group=gloo)
    assert torch.equal(flat, ref), f"rank {rank}: replicas diverged"
    print(f"rank {rank}: ddp ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
