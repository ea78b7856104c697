"""PyTorch DDP on Gloo (CPU) training the GPT of `xccl train`, for a side-by-side comparison.

With --backend xccl the same DDP runs on xccl's PyTorch backend (bench/torch_backend.sh).
Started by torchrun (RANK, LOCAL_RANK set) it is one rank of torchrun's job (--dp = the world
size); otherwise it spawns --dp ranks itself (bench/torch_cluster.sh runs it across hosts).

    python bench/train_vs_torch.py --dp 2 --width 128 --layers 2 --heads 4 --digits 3 \
        --batch 64 --steps 300 --out torch.json

The model is the same as xccl-train's GPT: token + position embedding, pre-norm decoder
layers (LayerNorm eps 1e-5, fused qkv projection, causal softmax attention, output
projection, 4x MLP with tanh-GELU), final LayerNorm, untied head without bias; the data
are the same 3-digit sums with reversed answers, the loss is the cross-entropy of the answer
tokens divided by the global number of answer tokens, the optimizer is AdamW (lr 1e-3,
weight decay 0.01). Each of --dp processes runs with torch.set_num_threads(1)
(xccl train gives max(1, cores / ranks) threads per rank: 1 on 2 cores with 2 ranks).

Per step we time the whole DDP step (forward, backward with DDP's bucketed all-reduce
overlapped by its autograd hooks, optimizer step) and the same step under `no_sync()` (no
communication); the two kinds alternate in blocks of 10 steps so that machine drift hits
both alike. Inside each we time the tail of backward: from the last parameter gradient
being accumulated (post-accumulate-grad hooks) to `backward()` returning. Exposed
communication = synced tail - no_sync tail: the wait for the all-reduces that backward did
not hide, plus DDP copying the reduced buckets back into `.grad` (what xccl train counts).
The difference of the mean step times (synced - no_sync) is a second, noisier estimate.
Rank 0 writes the means over ranks (ms) to --out as JSON.
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Layer(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        dh = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / dh**0.5 + mask[:t, :t]
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        h = x + self.proj(y)
        return h + self.out(F.gelu(self.fc(self.ln2(h)), approximate="tanh"))


class Gpt(nn.Module):
    """The GPT; `make_layer()` builds each decoder layer (default: `Layer(d, heads)`)."""

    def __init__(self, vocab, context, d, layers, heads, make_layer=None):
        super().__init__()
        make_layer = make_layer or (lambda: Layer(d, heads))
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(context, d) * 0.02)
        self.layers = nn.ModuleList(make_layer() for _ in range(layers))
        self.norm = nn.LayerNorm(d, eps=1e-5)
        self.head = nn.Linear(d, vocab, bias=False)
        mask = torch.full((context, context), -1e9).triu(1)
        self.register_buffer("mask", mask)

    def forward(self, ids):
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        for layer in self.layers:
            x = layer(x, self.mask)
        return self.head(self.norm(x))


def sums(digits, rows, gen):
    """Rows of `a+b=reversed(a+b)` as (inputs, targets, mask), tokens 0-9, + = 10, = = 11."""
    hi = 10**digits
    a = torch.randint(0, hi, (rows,), generator=gen)
    b = torch.randint(0, hi, (rows,), generator=gen)
    c = a + b

    def digits_of(x, n, reverse=False):
        ds = [(x // 10**i) % 10 for i in range(n)]  # least significant first
        return torch.stack(ds if reverse else ds[::-1], 1)

    plus = torch.full((rows, 1), 10)
    eq = torch.full((rows, 1), 11)
    seq = torch.cat([digits_of(a, digits), plus, digits_of(b, digits), eq, digits_of(c, digits + 1, True)], 1)
    ids, targets = seq[:, :-1], seq[:, 1:]
    mask = torch.zeros_like(targets, dtype=torch.float32)
    mask[:, 2 * digits + 1 :] = 1.0
    return ids, targets, mask


def rank_main(rank, args, port):
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    if port is not None:  # spawned here; under torchrun its variables stay
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    if args.backend == "xccl":
        import xccl.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend, rank=rank, world_size=args.dp)
    torch.manual_seed(args.seed)
    context = 3 * args.digits + 2
    model = Gpt(12, context, args.width, args.layers, args.heads)
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    share = args.batch // args.dp + (1 if rank < args.batch % args.dp else 0)
    start = rank * (args.batch // args.dp) + min(rank, args.batch % args.dp)
    times = {"sync": [], "nosync": [], "tail": [], "tail_nosync": []}
    last_grad = [0.0]
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda _p: last_grad.__setitem__(0, time.perf_counter()))

    def step(sync):
        ids, targets, mask = sums(args.digits, args.batch, gen)
        norm = mask.sum()
        ids, targets, mask = (t[start : start + share] for t in (ids, targets, mask))
        t0 = time.perf_counter()
        logits = ddp(ids)
        ce = F.cross_entropy(logits.reshape(-1, 12), targets.reshape(-1), reduction="none")
        loss = (ce * mask.reshape(-1)).sum() / norm
        opt.zero_grad(set_to_none=False)
        if sync:
            loss.backward()
            times["tail"].append(time.perf_counter() - last_grad[0])
        else:
            with ddp.no_sync():
                loss.backward()
            times["tail_nosync"].append(time.perf_counter() - last_grad[0])
        opt.step()
        return time.perf_counter() - t0

    for i in range(args.warmup):
        step(i % 2 == 0)
    times["tail"].clear()
    times["tail_nosync"].clear()
    dist.barrier()
    for i in range(args.steps):
        sync = (i // 10) % 2 == 0
        times["sync" if sync else "nosync"].append(step(sync))
    dist.barrier()
    mean = {k: 1e3 * sum(v) / len(v) for k, v in times.items()}
    both = torch.tensor([mean["sync"], mean["nosync"], mean["tail"], mean["tail_nosync"]], dtype=torch.float64)
    dist.all_reduce(both)
    both /= args.dp
    if rank == 0:
        sync, nosync, tail, tail_nosync = both.tolist()
        result = {
            "framework": f"torch {torch.__version__} DDP {args.backend}",
            "dp": args.dp,
            "threads_per_rank": torch.get_num_threads(),
            "params": sum(p.numel() for p in model.parameters()),
            "step_ms": sync,
            "step_no_sync_ms": nosync,
            "exposed_ms": tail - tail_nosync,
            "exposed_share": (tail - tail_nosync) / sync,
            "exposed_ab_ms": sync - nosync,
            "tail_ms": tail,
            "tail_no_sync_ms": tail_nosync,
            "tokens_per_second": args.batch * context / (sync / 1e3),
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result), flush=True)
    dist.barrier()
    # Gloo's threads sometimes abort the interpreter's teardown ("terminate called without
    # an active exception"); the results are written, so leave without it.
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=300, help="timed steps (half synced, half no_sync)")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="torch_ddp.json")
    p.add_argument(
        "--backend",
        default="gloo",
        choices=["gloo", "xccl"],
        help='process-group backend ("xccl": the package xccl, see python/README.md)',
    )
    args = p.parse_args()
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:  # one rank of torchrun's job
        assert int(os.environ["WORLD_SIZE"]) == args.dp, "--dp must equal torchrun's world size"
        rank_main(int(os.environ["RANK"]), args, None)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=args.dp, join=True)


if __name__ == "__main__":
    main()
