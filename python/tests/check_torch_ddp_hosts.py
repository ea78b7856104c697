"""An ordinary DDP program across hosts: backend "xccl" trains like "gloo".

Run as every rank of a job spread over at least two hosts, e.g. under torchrun on the
emulated cluster of `bench/cluster.sh` (crates/xccl-cli/tests/torch_cluster.rs does that):

    python -m torch.distributed.run --nnodes 2 --nproc_per_node 2 --rdzv-backend c10d \
        --rdzv-endpoint HOST0:PORT ... check_torch_ddp_hosts.py

The default process group is "gloo" (the reference, and the group the checks themselves
talk over); `dist.new_group(backend="xccl")` makes an xccl group of the same ranks. Two
copies of one small convolutional net (batch norm, a linear head), made from the same seed,
are trained by DistributedDataParallel for a few epochs over the same DistributedSampler
shards of a synthetic data set, one copy on each group, with SGD and momentum. At the end:

- the two copies' parameters and batch-norm statistics agree: `allclose` with rtol 1e-5 and
  atol 1e-6. Not bitwise: gloo and xccl add the ranks' gradients in different orders (a
  ring, a tree, shared memory first), so each sum may differ in its last bit (float32:
  about 6e-8 relative), and a dozen SGD steps with momentum carry such differences on; far
  from the differences a wrong sum, a missing rank or a stale bucket would make (1e-2 and
  more);
- the training moved every parameter (the check can fail);
- every rank holds the same xccl-trained parameters (bitwise; DDP keeps replicas equal);
- the job really spans hosts: the ranks sit in at least two network namespaces with
  different addresses (so the test cannot pass on one host by accident), and the xccl
  group opened TCP connections to the other host's addresses.

Rank 0 prints "ddp hosts ok: max |xccl - gloo| = ..."; each rank prints "rank R: ddp ok".

If making the xccl group fails (say, ranks of different hosts have different XCCL_SECRET),
each rank prints "rank R: xccl group failed: <error>" and exits with status 1.
"""

import copy
import ipaddress
import os
import socket
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import xccl.torch  # noqa: F401  (registers "xccl")

RTOL, ATOL = 1e-5, 1e-6
EPOCHS, BATCH, SAMPLES = 3, 8, 128


def say(line):
    """Prints `line` in one write: the ranks of a host share torchrun's output."""
    os.write(1, (line + "\n").encode())


def where_am_i():
    """This rank's network namespace (inode) and the address it uses toward the store's host."""
    ns = os.stat("/proc/self/ns/net").st_ino
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(master), 1))  # picks the route; sends nothing
        addr = s.getsockname()[0]
    return {"ns": ns, "addr": addr, "host_key": os.environ.get("XCCL_HOST_KEY", "")}


def tcp_connections_to(addrs):
    """How many established TCP connections of this process lead to one of `addrs` (IPv4)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    with open("/proc/self/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state != "01" or inode not in inodes:  # 01: ESTABLISHED
                continue
            ip = str(ipaddress.IPv4Address(bytes.fromhex(remote.split(":")[0])[::-1]))
            count += ip in addrs
    return count


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.features(x))


def dataset():
    """A fixed synthetic task: 8x8 images, the label from a fixed random teacher."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, 1, 8, 8, generator=g)
    teacher = torch.randn(64, 4, generator=g)
    y = (x.reshape(SAMPLES, -1) @ teacher).argmax(dim=1)
    return TensorDataset(x, y)


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    places = [None] * world
    dist.all_gather_object(places, where_am_i())
    addrs = {p["addr"] for p in places}
    nss = {p["ns"] for p in places}
    assert len(addrs) >= 2 and len(nss) >= 2, f"rank {rank}: the job does not span hosts: {places}"
    mine = places[rank]
    others = {p["addr"] for p in places if p["ns"] != mine["ns"]}
    dist.barrier()
    before = tcp_connections_to(others)

    try:
        group = dist.new_group(backend="xccl", timeout=timedelta(seconds=30))
    except Exception as e:  # noqa: BLE001  (the test reads why)
        say(f"rank {rank}: xccl group failed: {e}")
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # not a clean exit: the peers may be stuck where this rank left them

    torch.manual_seed(0)
    net = Net()
    start = {k: v.detach().clone() for k, v in net.state_dict().items()}
    # Small buckets: several all-reduces per step, overlapped with backward.
    models = {
        "gloo": DDP(copy.deepcopy(net), bucket_cap_mb=0.01),
        "xccl": DDP(copy.deepcopy(net), process_group=group, bucket_cap_mb=0.01),
    }
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for k, m in models.items()}
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    steps = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            for k, m in models.items():
                opts[k].zero_grad()
                nn.functional.cross_entropy(m(x), y).backward()
                opts[k].step()
            steps += 1

    after = tcp_connections_to(others)
    xs, gs = models["xccl"].module.state_dict(), models["gloo"].module.state_dict()
    worst = 0.0
    for name, a in xs.items():
        b = gs[name]
        if not a.is_floating_point():
            assert torch.equal(a, b), f"rank {rank}: {name}: xccl {a} != gloo {b}"
            continue
        worst = max(worst, (a - b).abs().max().item())
        assert torch.allclose(a, b, rtol=RTOL, atol=ATOL), (
            f"rank {rank}: {name}: xccl and gloo differ by {(a - b).abs().max().item():.3e}"
        )
    for name, p in models["xccl"].module.named_parameters():
        assert not torch.equal(p.detach(), start[name]), f"rank {rank}: {name} did not train"
    flat = torch.cat([p.detach().reshape(-1) for p in models["xccl"].module.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    assert torch.equal(flat, ref), f"rank {rank}: the xccl replicas diverged"

    links = [0] * world
    dist.all_gather_object(links, after - before)
    assert sum(links) > 0, f"rank {rank}: the xccl group opened no TCP connection between hosts: {links}"
    worsts = [0.0] * world
    dist.all_gather_object(worsts, worst)
    say(f"rank {rank}: ddp ok")
    if rank == 0:
        hosts = sorted(addrs)
        per_host = {a: sum(p["addr"] == a for p in places) for a in hosts}
        say(
            f"ddp hosts ok: max |xccl - gloo| = {max(worsts):.3e} (rtol {RTOL}, atol {ATOL}) after "
            f"{steps} steps on {world} ranks; hosts {per_host}; "
            f"xccl tcp connections to other hosts per rank {links}"
        )
    dist.destroy_process_group(group)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
