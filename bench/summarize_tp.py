"""Summarises bench/tp_vs_torch.sh's results: medians over repetitions, per config.

    python bench/summarize_tp.py OUT > OUT/summary.md

Reads OUT/torch_tp{N}_{cfg}_r{rep}.json (bench/tp_vs_torch.py) and
OUT/xccl_tp{N}_{cfg}_r{rep}/summary.json (`xccl train --dp 1 --tp N`). Every field it wants
from xccl's summary.json (`step_seconds`, `losses`, `final_loss`, `params`, and
per_rank[i].rank / params_held / peak_rss_bytes / comm_bytes.tp / comm_bytes.dp) may be
missing (the TP fields are new): it prints "n/a" then.
Step times are what each side reports: PyTorch's mean step over the timed steps after its
warm-up, xccl's `step_seconds` (its summary of the steps after each rank's first).
"""

import glob
import json
import os
import re
import statistics
import sys

NA = "n/a"


def med(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".2f"):
    return NA if x is None else format(x, spec)


def mib(x, spec=".0f"):
    return NA if x is None else format(x / 2**20, spec)


def kib(x):
    return NA if x is None else f"{x / 2**10:.1f}"


def cfg_key(cfg):
    return tuple(int(p) for p in re.findall(r"\d+", cfg))


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(out):
    runs = {}  # (framework, tp, cfg) -> [result dict]
    for path in glob.glob(os.path.join(out, "torch_tp*_r*.json")):
        m = re.match(r"torch_tp(\d+)_(.+)_r\d+\.json$", os.path.basename(path))
        r = load(path)
        if m and r is not None:
            runs.setdefault(("torch", int(m.group(1)), m.group(2)), []).append(r)
    for path in glob.glob(os.path.join(out, "xccl_tp*_r*", "summary.json")):
        m = re.match(r"xccl_tp(\d+)_(.+)_r\d+$", os.path.basename(os.path.dirname(path)))
        r = load(path)
        if m and r is not None:
            runs.setdefault(("xccl", int(m.group(1)), m.group(2)), []).append(r)
    cfgs = sorted({c for (_, _, c) in runs}, key=cfg_key)

    def step_ms(fw, tp, cfg):
        rs = runs.get((fw, tp, cfg), [])
        if fw == "torch":
            return med([r.get("step_ms") for r in rs]), len(rs)
        return med([1e3 * r["step_seconds"] for r in rs if isinstance(r.get("step_seconds"), (int, float))]), len(rs)

    def loss(fw, tp, cfg):
        rs = runs.get((fw, tp, cfg), [])
        if fw == "torch":
            return med([r.get("loss_first") for r in rs]), med([r.get("loss_last") for r in rs])
        first = med([r["losses"][0][1] for r in rs if r.get("losses")])
        return first, med([r.get("final_loss") for r in rs])

    print("## Tensor parallelism: PyTorch DTensor (Gloo) vs xccl train, 2 ranks x 1 thread")
    print()
    print("Config = width x layers x heads (3-digit sums, batch 64, AdamW). Step = forward + backward + optimizer,")
    print("median over repetitions of each run's mean step time. Loss = first -> last (PyTorch: means of 5 steps).")
    print()
    print("| config | params | PyTorch TP=2 step (ms) | xccl tp=2 step (ms) | xccl / PyTorch (target <= 1.0) | PyTorch loss | xccl loss | runs (torch/xccl) |")
    print("|---|---|---|---|---|---|---|---|")
    for cfg in cfgs:
        t, nt = step_ms("torch", 2, cfg)
        x, nx = step_ms("xccl", 2, cfg)
        if nt == 0 and nx == 0:
            continue
        params = next((r.get("params") for k in (("torch", 2, cfg), ("xccl", 2, cfg)) for r in runs.get(k, [])), None)
        ratio = fmt(x / t) if t and x else NA
        if t and x:
            ratio += " ok" if x / t <= 1.0 else " MISS"
        tl, xl = loss("torch", 2, cfg), loss("xccl", 2, cfg)
        print(f"| {cfg} | {params if params is not None else NA} | {fmt(t)} | {fmt(x)} | {ratio} "
              f"| {fmt(tl[0], '.3f')} -> {fmt(tl[1], '.3f')} | {fmt(xl[0], '.3f')} -> {fmt(xl[1], '.3f')} | {nt}/{nx} |")

    print()
    print("## TP overhead: xccl tp=2 (2 ranks x 1 thread) vs tp=1 (1 rank x 2 threads)")
    print()
    print("| config | tp=1 step (ms) | tp=2 step (ms) | step(tp=2) / step(tp=1) (target <= 1.15) | tp=4 step (ms) | runs (tp1/tp2/tp4) |")
    print("|---|---|---|---|---|---|")
    for cfg in cfgs:
        s1, n1 = step_ms("xccl", 1, cfg)
        s2, n2 = step_ms("xccl", 2, cfg)
        s4, n4 = step_ms("xccl", 4, cfg)
        if n1 == 0 and n4 == 0:
            continue
        ratio = fmt(s2 / s1) if s1 and s2 else NA
        if s1 and s2:
            ratio += " ok" if s2 / s1 <= 1.15 else " MISS"
        print(f"| {cfg} | {fmt(s1)} | {fmt(s2)} | {ratio} | {fmt(s4)} | {n1}/{n2}/{n4} |")

    print()
    print("## Memory per rank (medians over repetitions; MiB = 2^20 bytes)")
    print()
    print("Peak RSS is the whole process. PyTorch's includes its ~0.5 GB runtime ('RSS before model') and the full")
    print("model every rank builds before sharding it; 'RSS at end' is after the last step.")
    print("comm. is xccl's `comm_bytes` per rank and step (ring-equivalent bytes this rank sent through its tp / dp")
    print("communicator, KiB); PyTorch's TP all-reduce payload per step is in its JSON (`tp_allreduce_payload_bytes`).")
    print()
    print("| config | framework | tp | rank | params held | peak RSS (MiB) | RSS before model (MiB) | RSS at end (MiB) | comm. tp / step (KiB) | comm. dp / step (KiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cfg in cfgs:
        for fw in ("xccl", "torch"):
            for tp in sorted({k[1] for k in runs if k[0] == fw and k[2] == cfg}):
                by_rank = {}
                for r in runs[(fw, tp, cfg)]:
                    per_rank = r.get("per_rank")
                    if not isinstance(per_rank, list):
                        continue
                    for i, e in enumerate(per_rank):
                        if isinstance(e, dict):
                            by_rank.setdefault(e.get("rank", i), []).append(e)
                name = "xccl train" if fw == "xccl" else "PyTorch DTensor" if tp > 1 else "PyTorch 1 process"
                if not by_rank:
                    print(f"| {cfg} | {name} | {tp} | {NA} | {NA} | {NA} | {NA} | {NA} | {NA} | {NA} |")
                    continue
                for rank in sorted(by_rank, key=lambda x: (not isinstance(x, int), x)):
                    es = by_rank[rank]
                    comm = [e.get("comm_bytes") if isinstance(e.get("comm_bytes"), dict) else {} for e in es]
                    held = med([e.get("params_held") for e in es])
                    print(f"| {cfg} | {name} | {tp} | {rank} | {NA if held is None else int(held)} "
                          f"| {mib(med([e.get('peak_rss_bytes') for e in es]))} "
                          f"| {mib(med([e.get('rss_before_model_bytes') for e in es]))} "
                          f"| {mib(med([e.get('rss_end_bytes') for e in es]))} "
                          f"| {kib(med([c.get('tp') for c in comm]))} | {kib(med([c.get('dp') for c in comm]))} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
