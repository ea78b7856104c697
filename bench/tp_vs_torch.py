"""PyTorch tensor parallelism (DTensor, Gloo, CPU) training the GPT of `xccl train`, for a side-by-side comparison.

    python bench/tp_vs_torch.py --tp 2 --width 128 --layers 2 --heads 4 --digits 3 \
        --batch 64 --steps 100 --out torch_tp.json

The model, data, loss and optimizer are those of bench/train_vs_torch.py (xccl-train's GPT:
token + position embedding, pre-norm decoder layers with LayerNorm eps 1e-5, qkv projection,
causal softmax attention, output projection, 4x MLP with tanh-GELU, final LayerNorm, untied
head without bias; 3-digit sums with reversed answers; cross-entropy of the answer tokens
divided by the number of answer tokens in the global batch; AdamW lr 1e-3, weight decay
0.01). The batch is not split: with tensor parallelism alone (dp = 1) every rank sees the
whole global batch of --batch sequences.

Sharding (Megatron style, `torch.distributed.tensor.parallel.parallelize_module` on a 1-D
DeviceMesh("cpu", [tp]) over Gloo):
  - attention qkv: ColwiseParallel. Colwise splits the output features of a Linear into tp
    contiguous blocks. A plain fused qkv weight [3d, d] laid out (q | k | v) would give rank
    0 all of q and half of k, not whole heads. With --qkv fused (default) the fused weight's
    rows are instead ordered (rank, {q,k,v}, local head, head dim): rank r's contiguous block
    is [q_r; k_r; v_r] for its heads r*H/tp .. (r+1)*H/tp - 1, so one GEMM per rank gives whole
    heads. This is only a permutation of the rows of an i.i.d.-initialised parameter: the
    same model, the same FLOPs (tp = 1 is exactly the layout of train_vs_torch.py). With
    --qkv separate, q, k and v are three Linears [d, d], each ColwiseParallel (three GEMMs).
  - attention output projection: RowwiseParallel (all-reduce of the output in forward).
  - MLP fc: ColwiseParallel; MLP out: RowwiseParallel (all-reduce in forward).
  - heads are split across ranks: each rank's attention runs heads / tp local heads.
  - the Colwise inputs are Replicate, so backward all-reduces their input gradients: 4
    all-reduces of batch x tokens x width floats per layer per step (2 forward, 2 backward).
  - token/position embedding, LayerNorms and the head stay replicated plain tensors (not
    DTensors): every rank computes them (and their identical gradients) redundantly. A
    vocab-parallel embedding/head makes no sense for a vocabulary of 12 tokens.
No sequence parallelism. Checked: with --qkv separate, --tp 2 reproduces the losses of
--tp 1 (same seed) to float rounding; with --qkv fused it reproduces --tp 1 whose qkv rows
were permuted into the (rank, {q,k,v}, head) order.

The optimizer is AdamW with fused=True by default (--adamw; the fastest on CPU here: PyTorch's
own default on CPU is a per-parameter loop, and over DTensors each of its ~10 ops per
parameter pays DTensor's Python dispatch). It gets two parameter groups with the same
hyper-parameters, the sharded DTensors and the replicated plain tensors, because the
foreach/fused kernels refuse a list that mixes the two; gradients are zeroed in place by
model.zero_grad(set_to_none=False) for the same reason.

With --tp 1 the model is plain (no DTensor, no process group
traffic) and runs with --threads compute threads: the single-rank baseline.

Each of the --tp processes runs with torch.set_num_threads(--threads) (default 1; xccl
train --tp 2 on 2 cores gives one thread per rank). Per step we time the whole step
(forward, backward, optimizer step) after --warmup steps; the step time of a step is the
largest over ranks (they are in lock step through the all-reduces anyway). Rank 0 writes
mean and median step ms, the loss curve and per-rank memory to --out as JSON and prints it.
"""

import argparse
import json
import os
import resource
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from train_vs_torch import Gpt, sums  # the same model and data (bench/train_vs_torch.py)


class Layer(nn.Module):
    """A decoder layer running `heads` attention heads (the local ones under TP)."""

    def __init__(self, d, heads, local_heads, qkv):
        super().__init__()
        self.heads = local_heads
        self.dh = d // heads
        self.fused = qkv == "fused"
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        if self.fused:
            self.qkv = nn.Linear(d, 3 * d)
        else:
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, _ = x.shape
        h, dh = self.heads, self.dh
        a = self.ln1(x)
        if self.fused:
            # The local block is [q_r; k_r; v_r] of this rank's heads (see the docstring).
            q, k, v = self.qkv(a).view(b, t, 3, h, dh).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = (m(a).view(b, t, h, dh).transpose(1, 2) for m in (self.q, self.k, self.v))
        att = (q @ k.transpose(-1, -2)) / dh**0.5 + mask[:t, :t]
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h * dh)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def tensor_parallel(model, tp):
    """Shards every decoder layer over a 1-D CPU mesh of tp ranks (Megatron layout)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    for layer in model.layers:
        plan = {"proj": RowwiseParallel(), "fc": ColwiseParallel(), "out": RowwiseParallel()}
        plan.update({n: ColwiseParallel() for n in (("qkv",) if layer.fused else ("q", "k", "v"))})
        parallelize_module(layer, mesh, plan)
    return mesh


def current_rss():
    """This process's resident set now, bytes (the peak also counts the full model that
    every rank builds before parallelize_module shards it)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def local_numel(p):
    return p.to_local().numel() if hasattr(p, "to_local") else p.numel()


def rank_main(rank, args, port):
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tp = args.tp
    if tp > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=tp)
    torch.manual_seed(args.seed)  # the same full parameters on every rank before sharding
    context = 3 * args.digits + 2
    model = Gpt(
        12, context, args.width, args.layers, args.heads,
        make_layer=lambda: Layer(args.width, args.heads, args.heads // tp, args.qkv),
    )
    params_full = sum(p.numel() for p in model.parameters())
    if tp > 1:
        tensor_parallel(model, tp)
    params_held = sum(local_numel(p) for p in model.parameters())
    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[args.adamw]
    # Two parameter groups (same hyper-parameters): the sharded DTensors and the replicated plain
    # tensors, since the foreach and fused kernels refuse lists mixing the two.
    sharded = [p for p in model.parameters() if hasattr(p, "to_local")]
    plain = [p for p in model.parameters() if not hasattr(p, "to_local")]
    groups = [{"params": g} for g in (sharded, plain) if g]
    opt = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.01, eps=1e-8, **impl)
    gen = torch.Generator().manual_seed(args.seed)  # the same batch on every rank
    losses, times, phases = [], [], []

    def step():
        ids, targets, mask = sums(args.digits, args.batch, gen)
        t0 = time.perf_counter()
        logits = model(ids)
        ce = F.cross_entropy(logits.reshape(-1, 12), targets.reshape(-1), reduction="none")
        loss = (ce * mask.reshape(-1)).sum() / mask.sum()
        t1 = time.perf_counter()
        model.zero_grad(set_to_none=False)  # per tensor (foreach refuses mixed lists)
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        losses.append(loss.item())
        phases.append((t1 - t0, t2 - t1, t3 - t2))
        return t3 - t0

    for _ in range(args.warmup):
        step()
    phases.clear()
    if tp > 1:
        dist.barrier()
    for _ in range(args.steps):
        times.append(step())
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    me = {
        "rank": rank,
        "params_held": params_held,
        "peak_rss_bytes": rss_peak,
        "rss_before_model_bytes": rss_start,
        "rss_end_bytes": current_rss(),
        "step_ms_mean": 1e3 * statistics.mean(times),
        # this rank's mean forward (with the loss), backward (with zero_grad), optimizer step
        "forward_ms": 1e3 * statistics.mean(p[0] for p in phases),
        "backward_ms": 1e3 * statistics.mean(p[1] for p in phases),
        "optimizer_ms": 1e3 * statistics.mean(p[2] for p in phases),
    }
    if tp > 1:
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times = t.tolist()
        per_rank = [None] * tp
        dist.all_gather_object(per_rank, me)
    else:
        per_rank = [me]
    if rank == 0:
        ms = [1e3 * s for s in times]
        k = min(5, len(losses))
        tokens = args.batch * (context - 1)
        result = {
            "framework": f"torch {torch.__version__} DTensor TP gloo" if tp > 1 else f"torch {torch.__version__} single process",
            "tp": tp,
            "qkv": args.qkv,
            "adamw": args.adamw,
            "threads_per_rank": torch.get_num_threads(),
            "width": args.width,
            "layers": args.layers,
            "heads": args.heads,
            "local_heads": args.heads // tp,
            "batch": args.batch,
            "warmup": args.warmup,
            "steps": args.steps,
            "params": params_full,
            "step_ms": statistics.mean(ms),
            "step_ms_median": statistics.median(ms),
            "step_ms_min": min(ms),
            "step_ms_max": max(ms),
            "tokens_per_second": tokens / (statistics.mean(ms) / 1e3),
            # Payload of the TP all-reduces per step and rank (4 per layer of batch x tokens x
            # width fp32), not bytes on the wire.
            "tp_allreduce_payload_bytes": (4 * args.layers * tokens * args.width * 4) if tp > 1 else 0,
            "loss_first": sum(losses[:k]) / k,
            "loss_last": sum(losses[-k:]) / k,
            "losses": losses,
            "per_rank": per_rank,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        every = max(1, len(losses) // 8)
        print("loss: " + ", ".join(f"{i}: {l:.4f}" for i, l in enumerate(losses) if i % every == 0 or i == len(losses) - 1))
        short = {k: v for k, v in result.items() if k != "losses"}
        print(json.dumps(short), flush=True)
    if tp > 1:
        dist.barrier()
    # Gloo's threads sometimes abort the interpreter's teardown ("terminate called without
    # an active exception"); the results are written, so leave without it.
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    p.add_argument("--qkv", choices=("fused", "separate"), default="fused")
    p.add_argument("--adamw", choices=("default", "foreach", "fused"), default="fused",
                   help="AdamW implementation (default: PyTorch's own choice, the per-tensor loop on CPU)")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=100, help="timed steps")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="torch_tp.json")
    args = p.parse_args()
    if args.heads % args.tp or args.width % args.heads:
        p.error("--heads must be a multiple of --tp and --width a multiple of --heads")
    if args.tp == 1:
        rank_main(0, args, 0)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=args.tp, join=True)


if __name__ == "__main__":
    main()
