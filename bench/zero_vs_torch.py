"""PyTorch DDP and FSDP2 (Gloo, CPU) training the GPT of `xccl train` on byte-level text, for a side-by-side comparison with xccl's ZeRO stages.

    python bench/zero_vs_torch.py --mode fsdp --data text.txt --context 64 --width 1024 \
        --layers 8 --heads 16 --batch 8 --steps 6 --out torch_fsdp.json

The model is that of bench/train_vs_torch.py (`Gpt`: token + position embedding, pre-norm
decoder layers with LayerNorm eps 1e-5, fused qkv, causal softmax attention, output
projection, 4x tanh-GELU MLP, final LayerNorm, untied head without bias) with vocabulary
256 and xccl-train's initialisation (bench/pp_vs_torch.py's `xccl_init`: normal std 0.02,
residual projections 0.02 / sqrt(2 layers), zero biases). The data are those of `xccl train
--data FILE --byte-level --context C`: the file's bytes are the tokens, the first 90% are
for training (the last max(n / 10, C + 1) held out), every global batch is --batch random
windows of C + 1 bytes, the loss is the cross-entropy at every position. Each rank takes a
contiguous share of the global batch's rows (as xccl does) and its loss is the mean over
its share; DDP and FSDP average the gradients over the ranks, so the gradient is that of
the global mean. The windows come from torch's generator, not xccl's ChaCha stream: the
same distribution, not the same rows. AdamW lr 1e-3, weight decay 0.01, eps 1e-8, f32.

Modes (--dp processes on Gloo, torch.set_num_threads(--threads), default 1 each):
  ddp      DistributedDataParallel (bucket 25 MiB, gradient_as_bucket_view=True so the
           gradients live in the all-reduce buckets: 16 bytes per parameter as in the ZeRO
           paper's baseline; --no-bucket-view for PyTorch's default, which keeps both).
  fsdp     FSDP2: `fully_shard` on every decoder layer and then on the root (ZeRO-3:
           parameters, gradients and AdamW state sharded; reshard after forward; the root's
           own parameters, embeddings, final norm and head, are one more group).
  fsdp-ac  the same with activation checkpointing on every decoder layer (`checkpoint_wrapper`,
           non-reentrant, applied before `fully_shard`): each layer's forward runs again in
           backward, as xccl's stage 3 does.
With fsdp and fsdp-ac the model is built on the meta device, sharded, then materialised
shard by shard (`to_empty`) and initialised, so no rank ever holds the whole model; with
ddp every rank builds it whole. A tiny model (e.g. --width 16 --layers 1 --heads 1) in
mode ddp measures the baseline: the runtime, Gloo and the data.

AdamW is fused=True (--adamw; as bench/tp_vs_torch.py, the fastest on CPU). The timed step
is forward with the loss, backward (with DDP's bucketed all-reduces or FSDP's all-gathers
and reduce-scatters), optimizer step and zero_grad(set_to_none=False). The first --warmup
steps (default 1) are left out; the time of a step is the largest over ranks. Memory per
rank: peak RSS (getrusage ru_maxrss, as bench/tp_vs_torch.py and bench/pp_vs_torch.py),
RSS before the model (after init_process_group and the data: getrusage at that point), RSS
at the end (tp_vs_torch.current_rss). Communication per rank and step: every collective
DDP or FSDP issues is counted as xccl counts its own (metrics::bus_bytes, the ring
convention): all-reduce of n bytes 2(p-1)/p n, all-gather (p-1) n of its input,
reduce-scatter (p-1)/p n of its input. DDP's all-reduces are counted by a comm hook that
then runs PyTorch's own allreduce_hook; FSDP's by wrapping torch.distributed's
all_gather_single / all_gather_into_tensor / reduce_scatter_single / reduce_scatter_tensor /
all_reduce, which FSDP2 calls. Rank 0 writes everything to --out as JSON and prints it.
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
import torch.nn.functional as F

from pp_vs_torch import xccl_init  # xccl-train's initialisation (bench/pp_vs_torch.py)
from tp_vs_torch import current_rss  # the same memory measures as the TP comparison
from train_vs_torch import Gpt  # the same model (bench/train_vs_torch.py)

VOCAB = 256
MODES = ("ddp", "fsdp", "fsdp-ac")


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def block_params(d):
    """Parameters of one decoder layer: qkv 3d^2+3d, proj d^2+d, fc 4d^2+4d, out 4d^2+d, 2 LayerNorms 4d."""
    return 12 * d * d + 13 * d


class Text:
    """xccl-train's byte-level text task (data/text.rs): tokens, training part, random windows."""

    def __init__(self, path, context):
        with open(path, "rb") as f:
            raw = f.read()
        raw.decode("utf-8")  # xccl refuses a file that is not UTF-8; so do we
        self.tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
        n = len(raw)
        held = max(n // 10, context + 1)
        if n < held + context + 1:
            raise SystemExit(f"{path}: too short for rows of {context} tokens ({n} bytes)")
        self.split = n - held
        self.context = context
        self.offsets = torch.arange(context + 1)

    def batch(self, gen, rows):
        starts = torch.randint(0, self.split - self.context, (rows,), generator=gen)
        w = self.tokens[starts[:, None] + self.offsets]
        return w[:, :-1], w[:, 1:]


class Counter:
    """Ring-equivalent bytes sent by this rank (xccl's metrics::bus_bytes convention)."""

    def __init__(self, world):
        self.p = world
        self.bytes = 0.0
        self.calls = {}

    def add(self, kind, n):
        p = self.p
        factor = {"all_reduce": 2 * (p - 1) / p, "all_gather": p - 1, "reduce_scatter": (p - 1) / p}[kind]
        self.bytes += factor * n
        self.calls[kind] = self.calls.get(kind, 0) + 1

    def wrap_torch_distributed(self):
        """Counts FSDP's collectives: it calls these through the torch.distributed module."""
        def wrapped(name, kind, which):
            f = getattr(dist, name)

            def g(*a, **k):
                t = which(a, k)
                self.add(kind, t.numel() * t.element_size())
                return f(*a, **k)

            setattr(dist, name, g)

        arg = lambda i, key: (lambda a, k: k[key] if key in k else a[i])  # noqa: E731
        wrapped("all_gather_single", "all_gather", arg(1, "input_tensor"))
        wrapped("all_gather_into_tensor", "all_gather", arg(1, "input_tensor"))
        wrapped("reduce_scatter_single", "reduce_scatter", arg(1, "input"))
        wrapped("reduce_scatter_tensor", "reduce_scatter", arg(1, "input"))
        wrapped("all_reduce", "all_reduce", arg(0, "tensor"))

    def ddp_hook(self):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def hook(state, bucket):
            buf = bucket.buffer()
            self.add("all_reduce", buf.numel() * buf.element_size())
            return allreduce_hook(state, bucket)

        return hook


def build(args, mode, world):
    """The model of this mode, initialised as xccl-train does; its full parameter count."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(args.seed)
    if mode == "ddp":
        model = Gpt(VOCAB, args.context, args.width, args.layers, args.heads)
        xccl_init(model, args.layers)
        params = sum(p.numel() for p in model.parameters())
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=args.bucket_view)
        return ddp, model, params
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    with torch.device("meta"):
        model = Gpt(VOCAB, args.context, args.width, args.layers, args.heads)
    params = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    if mode == "fsdp-ac":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

        for i, layer in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.mask.copy_(torch.full((args.context, args.context), -1e9).triu(1))
    # Each rank initialises its shards (DTensor random ops on CPU: the distribution of the
    # whole model's, not the same numbers).
    xccl_init(model, args.layers)
    return model, model, params


def rank_main(rank, args, port):
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    rss_start = peak_rss()
    world = args.dp
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    counter = Counter(world)
    data = Text(args.data, args.context)
    dist.barrier()
    rss_before_model = peak_rss()
    rss_before_model_now = current_rss()

    net, model, params_full = build(args, args.mode, world)
    local = lambda p: p.to_local() if hasattr(p, "to_local") else p  # noqa: E731
    params_held = sum(local(p).numel() for p in model.parameters())
    if args.mode == "ddp":
        net.register_comm_hook(None, counter.ddp_hook())
    else:
        counter.wrap_torch_distributed()
    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[args.adamw]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-8, **impl)
    rss_model = peak_rss()

    gen = torch.Generator().manual_seed(args.seed)  # the same global batch on every rank
    share = args.batch // world + (1 if rank < args.batch % world else 0)
    start = rank * (args.batch // world) + min(rank, args.batch % world)
    losses, times, phases, sent = [], [], [], []

    def step():
        ids, targets = data.batch(gen, args.batch)
        ids, targets = ids[start : start + share], targets[start : start + share]
        b0 = counter.bytes
        t0 = time.perf_counter()
        logits = net(ids)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t3 = time.perf_counter()
        losses.append(loss.item())
        phases.append((t1 - t0, t2 - t1, t3 - t2))
        sent.append(counter.bytes - b0)
        return t3 - t0

    dist.barrier()
    for _ in range(args.steps):
        times.append(step())
    rss_peak = peak_rss()
    calls = dict(counter.calls)  # the steps' collectives (not the report's below)
    w = args.warmup
    timed = times[w:] if len(times) > w else times
    me = {
        "rank": rank,
        "params_held": params_held,
        "peak_rss_bytes": rss_peak,
        "rss_start_bytes": rss_start,  # before init_process_group
        "rss_before_model_bytes": rss_before_model,  # peak after Gloo and the data
        "rss_before_model_now_bytes": rss_before_model_now,
        "rss_after_model_bytes": rss_model,  # peak after the model, DDP/FSDP and the optimizer
        "rss_end_bytes": current_rss(),
        "step_ms_mean": 1e3 * statistics.mean(timed),
        "forward_ms": 1e3 * statistics.mean(p[0] for p in phases[w:] or phases),
        "backward_ms": 1e3 * statistics.mean(p[1] for p in phases[w:] or phases),
        "optimizer_ms": 1e3 * statistics.mean(p[2] for p in phases[w:] or phases),
        "comm_bytes_per_step": statistics.mean(sent[w:] or sent),
        "comm_bytes_first_step": sent[0],
        "collective_calls": calls,  # over all steps, by kind
    }
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    times = t.tolist()
    ls = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(ls)
    losses = (ls / world).tolist()
    per_rank = [None] * world
    dist.all_gather_object(per_rank, me)
    if rank == 0:
        ms = [1e3 * s for s in (times[w:] if len(times) > w else times)]
        names = {"ddp": "DDP", "fsdp": "FSDP2 fully_shard", "fsdp-ac": "FSDP2 fully_shard + activation checkpointing"}
        result = {
            "framework": f"torch {torch.__version__} {names[args.mode]} gloo",
            "mode": args.mode,
            "dp": world,
            "bucket_view": args.bucket_view if args.mode == "ddp" else None,
            "adamw": args.adamw,
            "threads_per_rank": torch.get_num_threads(),
            "data": os.path.abspath(args.data),
            "data_bytes": len(data.tokens),
            "context": args.context,
            "width": args.width,
            "layers": args.layers,
            "heads": args.heads,
            "batch": args.batch,
            "steps": args.steps,
            "warmup": w,
            "params": params_full,
            "params_block": block_params(args.width),
            "step_ms": statistics.mean(ms),
            "step_ms_median": statistics.median(ms),
            "step_ms_min": min(ms),
            "step_ms_max": max(ms),
            "step_ms_all": [1e3 * s for s in times],
            "tokens_per_second": args.batch * args.context / (statistics.mean(ms) / 1e3),
            "comm_bytes_per_step": statistics.mean(r["comm_bytes_per_step"] for r in per_rank),
            "losses": losses,
            "per_rank": per_rank,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps({k: v for k, v in result.items() if k != "per_rank"}), flush=True)
        for r in per_rank:
            print(json.dumps(r), flush=True)
    dist.barrier()
    # Gloo's threads sometimes abort the interpreter's teardown ("terminate called without
    # an active exception"); the results are written, so leave without it.
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=MODES, default="ddp")
    p.add_argument("--dp", type=int, default=2, help="ranks (processes)")
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    p.add_argument("--adamw", choices=("default", "foreach", "fused"), default="fused")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size (MiB)")
    p.add_argument("--no-bucket-view", dest="bucket_view", action="store_false",
                   help="DDP: gradients apart from the buckets (PyTorch's default; 4 more bytes per parameter)")
    p.add_argument("--data", required=True, help="UTF-8 text file (bytes are the tokens)")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=8, help="rows per global step")
    p.add_argument("--steps", type=int, default=6, help="steps, the first --warmup of them not timed")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="torch_zero.json")
    args = p.parse_args()
    if args.width % args.heads:
        p.error("--width must be a multiple of --heads")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=args.dp, join=True)


if __name__ == "__main__":
    main()
