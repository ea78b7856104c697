"""PyTorch pipeline parallelism (torch.distributed.pipelining, Gloo, CPU) training the GPT of `xccl train`, for a side-by-side comparison.

    python bench/pp_vs_torch.py --pp 2 --split 5,5 --schedule 1f1b --micro-batches 8 \
        --width 256 --layers 8 --heads 4 --batch 32 --steps 30 --out torch_pp.json

The model, data, loss and optimizer are those of bench/train_vs_torch.py (xccl-train's GPT:
token + position embedding, pre-norm decoder layers with fused qkv attention and a 4x
tanh-GELU MLP, final LayerNorm, untied head without bias; 3-digit sums with reversed answers;
cross-entropy of the answer tokens divided by the number of answer tokens in the global
batch; AdamW lr 1e-3, weight decay 0.01, fused=True as in bench/tp_vs_torch.py). Every rank
builds the whole `Gpt` from the same seed (so the parameters are those of the single-process
model) and keeps the blocks of its stage(s). --init xccl (default) re-initialises it as
xccl-train does (normal std 0.02, residual projections std 0.02 / sqrt(2 layers), zero
biases); --init torch keeps Gpt's own PyTorch-default initialisation (that of
train_vs_torch.py and tp_vs_torch.py).

Blocks, as xccl's GPT names them: `embed` (token + position embedding), `h00` ... `hNN`
(one per decoder layer), `head` (final LayerNorm and output projection). `--split 5,5`
gives stage 0 the first 5 blocks and stage 1 the next 5 (xccl: `--pp-balance 5,5`); without
it the blocks are cut into contiguous runs minimising the largest stage's parameter count.
With `--schedule interleaved --virtual-stages V` there are pp x V stages, stage s on rank
s % pp (ScheduleInterleaved1F1B), and --split lists pp x V counts. With `--schedule zb-v`
(ScheduleZBVZeroBubble; --virtual-stages is 2, the default for it) there are 2 pp stages in a
V: rank r holds stages r and 2 pp - 1 - r (rank 0 the first and the last); without --split
they are cut into equal layers per chunk (layers / (2 pp) layers each, embed with the first,
head with the last; --layers must be a multiple of 2 pp; pp_vs_torch.sh passes this cut to
both sides, --split here and --pp-balance to xccl), and M must be >= 2 pp - 1 (xccl's bound).

Schedules: `gpipe` = ScheduleGPipe, `1f1b` = Schedule1F1B, `interleaved` =
ScheduleInterleaved1F1B, `zb-h1` = ScheduleInterleavedZeroBubble with one stage per rank
(PyTorch's zero-bubble schedule: the backward split into input and weight gradients), `zb-v` =
ScheduleZBVZeroBubble (Qi et al.'s ZB-V, section 6: two stages per rank in a V, the backward
split likewise), each with n_microbatches = --micro-batches. How PyTorch splits and
scales (what xccl must match to train the same thing):
  - micro-batches: `step(ids, target=...)` splits the batch along dim 0 with
    torch.tensor_split into M contiguous pieces (first ones one row larger when M does not
    divide the batch; the stages' receive buffers are shaped from micro-batch 0, so this
    script requires batch % M == 0).
  - loss: loss_fn(output, target) is called once per micro-batch on the last stage and
    backward runs from each of those losses, so parameter gradients are the SUM over
    micro-batches; at the end `perform_reduce_grad(n_microbatches if scale_grads else 1)`
    divides every gradient by M when scale_grads=True (the default, meant for a loss_fn that
    is a per-micro-batch mean). Here loss_fn = sum of the micro-batch's counted-token
    cross-entropies / the number of counted tokens in the whole global batch, with
    scale_grads=False: the sum over micro-batches is then exactly the global mean loss of
    xccl (and train_vs_torch.py), and so are the gradients. The step's loss is the sum of
    the M micro-batch losses (`losses=` of the last stage).
  - uncounted targets are set to -100 (cross_entropy's ignore_index): the same sum as
    (ce * mask).sum().
--check compares, on the first batch, the pipelined loss with the single-process loss of
the whole model (train_vs_torch.py's Gpt, same seed, same batch) and every stage gradient
with the whole model's gradient, and puts the differences into the JSON ("check").

Each of the --pp processes runs with torch.set_num_threads(--threads) (default 1; 2 ranks on
2 cores). Per step we time schedule.step (the pipeline: forward, backward, point-to-point
sends) and the optimizer step, after --warmup steps; the step time of a step is the largest
over ranks. We also time the compute inside the stage (forward_one_chunk and
backward_one_chunk): busy, and span = from the start of schedule.step to the end of this
rank's last backward; bubble_measured = 1 - busy / span, per rank, averaged over ranks (as
xccl's pipeline.bubble_measured: 1 - busy / span, span up to the rank's last backward),
bubble_of_step = 1 - busy / (whole schedule.step), next to the closed form
(p - 1) / (v m + p - 1) (zb-h1: (p - 1) / (3 m + p - 1); zb-v: (p - 1) / (6 m + p - 1), in
units of one chunk's pass, as xccl's pipeline.bubble_schedule). Both count PyTorch's own work between the chunks (Python
scheduling, posting and waiting for sends and receives) as bubble.
Rank 0 writes mean and median step ms, the loss curve and per-rank memory (peak RSS from
getrusage maxrss, params held) to --out as JSON and prints it.
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
from tp_vs_torch import current_rss  # noqa: E402

VOCAB = 12
IGNORE = -100


def block_names(layers):
    return ["embed"] + [f"h{i:02d}" for i in range(layers)] + ["head"]


def block_params(model):
    """Parameter elements of each block, in block order."""
    embed = model.tok.weight.numel() + model.pos.numel()
    layers = [sum(p.numel() for p in l.parameters()) for l in model.layers]
    head = sum(p.numel() for p in model.norm.parameters()) + model.head.weight.numel()
    return [embed] + layers + [head]


def balance(sizes, stages):
    """Contiguous runs of `sizes` into `stages` non-empty parts minimising the largest sum:
    the counts per part (ties: the earliest cut that achieves the optimum)."""
    n = len(sizes)
    pre = [0]
    for s in sizes:
        pre.append(pre[-1] + s)
    inf = float("inf")
    # best[k][i]: the smallest max-sum cutting the first i blocks into k parts
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], pre[i] - pre[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    counts, i = [], n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        counts.append(i - j)
        i = j
    return counts[::-1]


def equal_layers(layers, chunks):
    """xccl's cut with virtual stages: every chunk the same number of layers, the embedding
    with the first chunk, the head with the last (counts of blocks per chunk)."""
    per = layers // chunks
    counts = [per] * chunks
    counts[0] += 1
    counts[-1] += 1
    return counts


def stages_of(rank, pp, v, schedule):
    """The global stage indices a rank holds: ZB-V's V (r and 2 pp - 1 - r), else looped
    (r, r + pp, ...)."""
    if schedule == "zb-v":
        return [rank, 2 * pp - 1 - rank]
    return list(range(rank, pp * v, pp))


class Stage(nn.Module):
    """A run of consecutive blocks of the whole model (sharing its parameters)."""

    def __init__(self, model, names):
        super().__init__()
        self.names = names
        self.embed = "embed" in names
        self.last = "head" in names
        if self.embed:
            self.tok, self.pos = model.tok, model.pos
        self.layers = nn.ModuleList(model.layers[int(n[1:])] for n in names if n not in ("embed", "head"))
        if self.last:
            self.norm, self.head = model.norm, model.head
        self.register_buffer("mask", model.mask.clone(), persistent=False)

    def forward(self, x):
        if self.embed:
            x = self.tok(x) + self.pos[: x.shape[1]]
        for layer in self.layers:
            x = layer(x, self.mask)
        if self.last:
            x = self.head(self.norm(x))
        return x


def xccl_init(model, layers):
    """xccl-train's initialisation: normal std 0.02 for embeddings and weights, std
    0.02 / sqrt(2 layers) for the residual projections (attn proj, mlp out), zero biases,
    LayerNorm 1 / 0."""
    std, res = 0.02, 0.02 / (2 * layers) ** 0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("norm."):
                p.fill_(1.0)
            elif name.endswith("proj.weight") or name.endswith("out.weight"):
                p.normal_(0.0, res)
            else:
                p.normal_(0.0, std)


def build_model(args):
    torch.manual_seed(args.seed)
    context = 3 * args.digits + 2
    model = Gpt(VOCAB, context, args.width, args.layers, args.heads)
    if args.init == "xccl":
        xccl_init(model, args.layers)
    return model


def masked_targets(targets, mask):
    return targets.masked_fill(mask == 0, IGNORE)


def rank_main(rank, args, port, counts):
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
    )

    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    pp, v, m = args.pp, args.virtual_stages, args.micro_batches
    n_stages = pp * v
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=pp)

    model = build_model(args)
    params_full = sum(p.numel() for p in model.parameters())
    names = block_names(args.layers)
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    mine = stages_of(rank, pp, v, args.schedule)  # stage indices on this rank
    modules = [Stage(model, names[bounds[s] : bounds[s + 1]]) for s in mine]

    reference = None
    if args.check:
        # The whole model's loss and gradients on the first batch (train_vs_torch.py's loss).
        g = torch.Generator().manual_seed(args.seed)
        ids, targets, mask = sums(args.digits, args.batch, g)
        logits = model(ids)
        ce = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none")
        loss = (ce * mask.reshape(-1)).sum() / mask.sum()
        model.zero_grad(set_to_none=True)
        loss.backward()
        held = {id(p) for mod in modules for p in mod.parameters()}
        reference = {
            "loss": loss.item(),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters() if id(p) in held},
        }
        model.zero_grad(set_to_none=True)
    full_names = {id(p): n for n, p in model.named_parameters()}
    del model  # the stages keep their parameters
    params_held = sum(p.numel() for mod in modules for p in mod.parameters())

    stages = [PipelineStage(mod, s, n_stages, torch.device("cpu")) for mod, s in zip(modules, mine)]
    norm = [1.0]  # counted target tokens of the current global batch

    def loss_fn(logits, target):
        ce = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=IGNORE, reduction="sum")
        return ce / norm[0]

    kind = {
        "gpipe": ScheduleGPipe,
        "1f1b": Schedule1F1B,
        "interleaved": ScheduleInterleaved1F1B,
        "zb-h1": ScheduleInterleavedZeroBubble,
    }.get(args.schedule)
    if args.schedule == "zb-v":
        from torch.distributed.pipelining import ScheduleZBVZeroBubble

        kind = ScheduleZBVZeroBubble  # V-style stage-to-rank mapping; exactly 2 stages per rank
    if args.schedule in ("interleaved", "zb-h1", "zb-v"):
        schedule = kind(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
    else:
        schedule = kind(stages[0], n_microbatches=m, loss_fn=loss_fn, scale_grads=False)

    # Compute time inside the stages (forward and backward of a micro-batch) and the end of
    # the last one.
    busy, last_end = [0.0], [0.0]

    def timed(f):
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                last_end[0] = time.perf_counter()
                busy[0] += last_end[0] - t

        return g

    for st in stages:
        st.forward_one_chunk = timed(st.forward_one_chunk)
        st.backward_one_chunk = timed(st.backward_one_chunk)
        if hasattr(st, "backward_weight_one_chunk"):
            st.backward_weight_one_chunk = timed(st.backward_weight_one_chunk)

    params = [p for mod in modules for p in mod.parameters()]
    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[args.adamw]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, eps=1e-8, **impl)
    has_first = 0 in mine
    has_last = (n_stages - 1) in mine
    gen = torch.Generator().manual_seed(args.seed)  # the same batch on every rank
    losses, times, phases, busies, spans = [], [], [], [], []
    check = {}

    def step(first=False):
        ids, targets, mask = sums(args.digits, args.batch, gen)
        norm[0] = mask.sum().item()
        target = masked_targets(targets, mask)
        for p in params:
            p.grad = None if p.grad is None else p.grad.zero_()
        busy[0] = 0.0
        mb_losses = []
        t0 = time.perf_counter()
        if has_first:
            schedule.step(ids, target=target if has_last else None, losses=mb_losses if has_last else None)
        elif has_last:
            schedule.step(target=target, losses=mb_losses)
        else:
            schedule.step()
        t1 = time.perf_counter()
        if first and reference is not None:
            diffs = []
            for p in params:
                r = reference["grads"][full_names[id(p)]]
                diffs.append(((p.grad - r).abs().max().item(), r.abs().max().item()))
            check["grad_max_abs_diff"] = max(d for d, _ in diffs)
            check["grad_max_abs"] = max(a for _, a in diffs)
            if has_last:
                check["loss_pipelined"] = sum(l.item() for l in mb_losses)
                check["loss_single_process"] = reference["loss"]
        opt.step()
        t2 = time.perf_counter()
        losses.append(sum(l.item() for l in mb_losses) if has_last else None)
        phases.append((t1 - t0, t2 - t1))
        busies.append(busy[0])
        spans.append(last_end[0] - t0)
        return t2 - t0

    for i in range(args.warmup):
        step(first=i == 0)
    if args.warmup == 0 and args.check:
        raise SystemExit("--check needs --warmup >= 1")
    phases.clear()
    busies.clear()
    spans.clear()
    dist.barrier()
    for _ in range(args.steps):
        times.append(step())
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    pipe = [p[0] for p in phases]
    bubble = [1 - b / s for b, s in zip(busies, spans)]
    bubble_step = [1 - b / t for b, t in zip(busies, pipe)]
    me = {
        "rank": rank,
        "stages": mine,
        "blocks": [mod.names for mod in modules],
        "params_held": params_held,
        "peak_rss_bytes": rss_peak,
        "rss_before_model_bytes": rss_start,
        "rss_end_bytes": current_rss(),
        "step_ms_mean": 1e3 * statistics.mean(times),
        "pipeline_ms": 1e3 * statistics.mean(pipe),
        "busy_ms": 1e3 * statistics.mean(busies),
        "optimizer_ms": 1e3 * statistics.mean(p[1] for p in phases),
        "span_ms": 1e3 * statistics.mean(spans),
        "bubble_measured": statistics.mean(bubble),
        "bubble_of_step": statistics.mean(bubble_step),
        "losses": losses if has_last else None,
        "check": check or None,
    }
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    times = t.tolist()
    per_rank = [None] * pp
    dist.all_gather_object(per_rank, me)
    if rank == 0:
        ms = [1e3 * s for s in times]
        losses = next(r["losses"] for r in per_rank if r["losses"] is not None)
        k = min(5, len(losses))
        context = 3 * args.digits + 2
        tokens = args.batch * (context - 1)
        checks = {}
        for r in per_rank:
            c = r.pop("check")
            if c:
                checks[f"rank{r['rank']}"] = c
        for r in per_rank:
            r.pop("losses")
        result = {
            "framework": f"torch {torch.__version__} pipelining gloo",
            "pp": pp,
            "schedule": args.schedule,
            "micro_batches": m,
            "virtual_stages": v,
            "split": counts,
            "blocks": [names[bounds[s] : bounds[s + 1]] for s in range(n_stages)],
            "init": args.init,
            "adamw": args.adamw,
            "threads_per_rank": torch.get_num_threads(),
            "width": args.width,
            "layers": args.layers,
            "heads": args.heads,
            "batch": args.batch,
            "warmup": args.warmup,
            "steps": args.steps,
            "params": params_full,
            "step_ms": statistics.mean(ms),
            "step_ms_median": statistics.median(ms),
            "step_ms_min": min(ms),
            "step_ms_max": max(ms),
            "tokens_per_second": tokens / (statistics.mean(ms) / 1e3),
            "bubble_schedule": (pp - 1) / ({"zb-h1": 3 * m, "zb-v": 6 * m}.get(args.schedule, v * m) + pp - 1),
            "bubble_measured": statistics.mean(r["bubble_measured"] for r in per_rank),
            "bubble_of_step": statistics.mean(r["bubble_of_step"] for r in per_rank),
            "loss_first": sum(losses[:k]) / k,
            "loss_last": sum(losses[-k:]) / k,
            "losses": losses,
            "check": checks or None,
            "per_rank": per_rank,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        every = max(1, len(losses) // 8)
        print("loss: " + ", ".join(f"{i}: {l:.4f}" for i, l in enumerate(losses) if i % every == 0 or i == len(losses) - 1))
        short = {k: v for k, v in result.items() if k != "losses"}
        print(json.dumps(short), flush=True)
    dist.barrier()
    # Gloo's threads sometimes abort the interpreter's teardown ("terminate called without
    # an active exception"); the results are written, so leave without it.
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pp", type=int, default=2, help="pipeline ranks")
    p.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"), default="1f1b")
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--virtual-stages", type=int, default=None, help="stages per rank (interleaved; zb-v: 2, its default; else 1)")
    p.add_argument("--split", default="", help="blocks per stage, e.g. 5,5 (default: balanced by parameters)")
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    p.add_argument("--adamw", choices=("default", "foreach", "fused"), default="fused")
    p.add_argument("--init", choices=("xccl", "torch"), default="xccl",
                   help="xccl: xccl-train's (std 0.02, GPT-2 residual scaling); torch: Gpt's own (PyTorch's defaults, as in tp_vs_torch.py)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check", action="store_true", help="compare loss and gradients of the first step with the whole model's")
    p.add_argument("--out", default="torch_pp.json")
    args = p.parse_args()
    if args.width % args.heads:
        p.error("--width must be a multiple of --heads")
    if args.virtual_stages is None:
        args.virtual_stages = 2 if args.schedule == "zb-v" else 1
    if args.schedule == "zb-v":
        if args.virtual_stages != 2:
            p.error("--schedule zb-v runs exactly 2 stages per rank (--virtual-stages 2)")
        if args.micro_batches < 2 * args.pp - 1:
            p.error(f"--schedule zb-v needs --micro-batches >= 2 --pp - 1 = {2 * args.pp - 1} (as xccl)")
    elif args.schedule != "interleaved" and args.virtual_stages != 1:
        p.error("--virtual-stages > 1 needs --schedule interleaved or zb-v")
    if args.batch % args.micro_batches:
        p.error("--batch must be a multiple of --micro-batches (PyTorch sizes its receive buffers from micro-batch 0)")
    if args.schedule in ("1f1b", "zb-h1") and args.micro_batches < args.pp:
        p.error(f"--schedule {args.schedule} needs --micro-batches >= --pp")
    n_stages = args.pp * args.virtual_stages
    n_blocks = args.layers + 2
    if args.split:
        counts = [int(c) for c in args.split.split(",")]
        if len(counts) != n_stages or sum(counts) != n_blocks or min(counts) < 1:
            p.error(f"--split needs {n_stages} positive counts summing to {n_blocks} blocks (embed, {args.layers} layers, head)")
    elif args.schedule == "zb-v":
        if args.layers % n_stages:
            p.error(f"--schedule zb-v cuts {n_stages} chunks of equal layers without --split: --layers must be a multiple of {n_stages}")
        counts = equal_layers(args.layers, n_stages)
    else:
        counts = balance(block_params(build_model(args)), n_stages)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port, counts), nprocs=args.pp, join=True)


if __name__ == "__main__":
    main()
