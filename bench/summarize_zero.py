"""Summarises bench/zero_vs_torch.sh's results: medians over repetitions, against the ZeRO paper.

    python bench/summarize_zero.py OUT > OUT/summary.md

Reads OUT/config.json and OUT/skipped.txt (bench/zero_vs_torch.sh's settings and the runs it
skipped, and why), OUT/torch_{base,ddp,fsdp,fsdp-ac}_{cfg}_r{rep}.json (bench/zero_vs_torch.py) and
OUT/xccl_{base,ddp,zero1,zero2,zero3}_{cfg}_r{rep}/summary.json (`xccl train --dp 2
[--zero K]`). The `base` runs are the same commands on a tiny model: their peak RSS per rank
is the baseline subtracted from the other runs' peaks. Every field it wants from xccl's
summary.json (`step_seconds`, `params`, `losses`, `final_loss`, per_rank[i].rank /
params_held / peak_rss_bytes / comm_bytes.dp) may be missing: it prints "n/a" then.

Theory (ZeRO paper, f32 AdamW: 4 bytes of parameter, 4 of gradient, 8 of AdamW state per
parameter; Ψ parameters, N data-parallel ranks, Ψ_block the parameters of one decoder layer,
12 d² + 13 d):
  model states per rank   DDP 16Ψ; stage 1 8Ψ + 8Ψ/N; stage 2 4Ψ + 12Ψ/N;
                          stage 3 (and FSDP) 16Ψ/N + 2 · 4 · Ψ_block (two layers' full
                          parameters gathered at a time: the one computing, the next prefetched)
  bytes sent per step     DDP, stages 1 and 2: 2(N − 1)/N · 4Ψ (one all-reduce of the gradients,
                          or its reduce-scatter + all-gather); stage 3 (and FSDP): 1.5× that
                          (parameters all-gathered in forward and again in backward, gradients
                          reduce-scattered)
Measured bytes are counted the ring way on both sides (xccl's metrics::bus_bytes; PyTorch's by
bench/zero_vs_torch.py with the same convention).
Step times: xccl's `step_seconds` (mean over each rank's steps after its first), PyTorch's
mean over the steps after its warm-up of the slowest rank's time per step; beside them the
medians (PyTorch's; xccl's from its trace.json: the slowest rank's time from one step's
`data` span to the next, median over the steps after the first that have a next).
xccl's bytes per step are taken from trace.json too (see from_trace): its summary's
comm_bytes.dp is a mean over all steps whose first also counts the initial broadcast.
"""

import glob
import json
import os
import re
import statistics
import sys

from summarize_tp import NA, fmt, load, med, mib  # the same helpers as the TP summary

NAME = re.compile(r"^(torch|xccl)_(base|ddp|fsdp|fsdp-ac|zero[123])_(.+)_r(\d+)$")
ORDER = ["base", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-ac"]
LABEL = {
    ("torch", "base"): "PyTorch baseline (tiny model, DDP)",
    ("torch", "ddp"): "PyTorch DDP",
    ("torch", "fsdp"): "PyTorch FSDP2",
    ("torch", "fsdp-ac"): "PyTorch FSDP2 + act. ckpt",
    ("xccl", "base"): "xccl baseline (tiny model, DDP)",
    ("xccl", "ddp"): "xccl DDP",
    ("xccl", "zero1"): "xccl ZeRO-1",
    ("xccl", "zero2"): "xccl ZeRO-2",
    ("xccl", "zero3"): "xccl ZeRO-3",
}


def num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def width_of(cfg):
    m = re.match(r"(\d+)x", cfg)
    return int(m.group(1)) if m else None


def stage_of(variant):
    return {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3, "fsdp-ac": 3}.get(variant)


def theory_memory(variant, psi, psi_block, n):
    s = stage_of(variant)
    if s is None or psi is None:
        return None
    return [16 * psi, 8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n, 16 * psi / n + 2 * 4 * (psi_block or 0)][s]


def theory_comm(variant, psi, n):
    s = stage_of(variant)
    if s is None or psi is None:
        return None
    ddp = 2 * (n - 1) / n * 4 * psi
    return 1.5 * ddp if s == 3 else ddp


def step_ms(fw, r):
    if fw == "torch":
        return r.get("step_ms")
    s = r.get("step_seconds")
    return 1e3 * s if num(s) else None


def losses(fw, r):
    if fw == "torch":
        ls = r.get("losses")
        return (ls[0], ls[-1]) if isinstance(ls, list) and ls else (None, None)
    ls = r.get("losses")
    first = ls[0][1] if isinstance(ls, list) and ls and isinstance(ls[0], list) and len(ls[0]) > 1 else None
    return first, r.get("final_loss")


def comm(fw, e):
    """Bytes this rank sent per step through the data-parallel group (None if not recorded)."""
    if fw == "torch":
        return e.get("comm_bytes_per_step")
    c = e.get("comm_bytes")
    v = c.get("dp") if isinstance(c, dict) else None
    return v if num(v) and v > 0 else None  # 0: the run was not traced


SIZES = {"u8": 1, "i8": 1, "f16": 2, "bf16": 2, "u16": 2, "i16": 2, "f32": 4, "u32": 4, "i32": 4, "f64": 8, "u64": 8, "i64": 8}
OP = re.compile(r"^(\w+) #\d+ \((\w+) x (\d+)")


def op_bytes(name, p):
    """Bytes an xccl operation sends, counted as metrics::bus_bytes does, from its trace name
    (`all_reduce #3 (f32 x 1024, sum, ring)`: the count is the input's, but a reduce-scatter's
    is its output block); None where the name does not say (all_gather_v, sends)."""
    if name.startswith("recv"):
        return 0.0
    m = OP.match(name)
    if not m or m.group(2) not in SIZES or int(m.group(3)) >= 2**63:
        return None
    kind, n = m.group(1), int(m.group(3)) * SIZES[m.group(2)]
    if p <= 1:
        return 0.0
    return {"all_reduce": 2 * (p - 1) / p * n, "all_gather": (p - 1) * n, "reduce_scatter": (p - 1) * n}.get(kind, float(n))


def from_trace(run_dir, p):
    """xccl's steps from its trace.json: a step of a rank runs from one `data` span (the
    step's batch) to the next, so the steps between the first and the last are bounded on
    both sides (what a run does before its first step, such as the parameters' broadcast,
    and after its last, such as the checkpoint's gathers, falls outside). Returns (median
    over those steps after the first of the slowest rank's step, ms; median over every
    bounded step of the bytes each rank sent through `comm dp`, mean over ranks), None
    where not known."""
    try:
        with open(os.path.join(run_dir, "trace.json")) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    tracks = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name") for e in events if e.get("name") == "thread_name"}
    starts, ops = {}, {}
    for e in events:
        if e.get("ph") != "X":
            continue
        track = tracks.get((e.get("pid"), e.get("tid")))
        if track == "compute" and e.get("name") == "data":
            starts.setdefault(e["pid"], []).append(e["ts"])
        elif track == "comm dp":
            ops.setdefault(e["pid"], []).append((e["ts"], e.get("name", "")))
    steps, sent = {}, []
    for rank, ts in starts.items():
        ts.sort()
        windows = list(zip(ts, ts[1:]))
        for k, (a, b) in enumerate(windows):
            if k >= 1:
                steps.setdefault(k, []).append((b - a) / 1e3)
        per_step = []
        for a, b in windows:
            bs = [op_bytes(n, p) for t, n in ops.get(rank, []) if a <= t < b]
            if any(x is None for x in bs):
                per_step = None
                break
            per_step.append(sum(bs))
        if per_step:
            sent.append(statistics.median(per_step))
    step = statistics.median(max(v) for v in steps.values()) if steps else None
    return step, (sum(sent) / len(sent) if sent and len(sent) == len(starts) else None)


def by_rank(rs):
    out = {}
    for r in rs:
        pr = r.get("per_rank")
        for i, e in enumerate(pr if isinstance(pr, list) else []):
            if isinstance(e, dict):
                out.setdefault(e.get("rank", i), []).append(e)
    return out


def ratio(a, b, spec=".2f"):
    return format(a / b, spec) if num(a) and num(b) and b else NA


def main(out):
    runs = {}  # (fw, variant, cfg) -> [result]
    paths = [(p, os.path.basename(p)[: -len(".json")]) for p in glob.glob(os.path.join(out, "torch_*_r*.json"))]
    paths += [(p, os.path.basename(os.path.dirname(p))) for p in glob.glob(os.path.join(out, "xccl_*_r*", "summary.json"))]
    for path, name in paths:
        m = NAME.match(name)
        r = load(path)
        if m and isinstance(r, dict):
            fw, variant, cfg, _ = m.groups()
            if fw == "xccl":
                r["_dir"] = os.path.dirname(path)
            runs.setdefault((fw, variant, cfg), []).append(r)
    cfgs = sorted({k[2] for k in runs}, key=lambda c: [int(x) for x in re.findall(r"\d+", c)])
    n = next((r.get("dp") for k, rs in runs.items() if k[0] == "torch" for r in rs if num(r.get("dp"))), None)
    n = n or next((r.get("ranks") for k, rs in runs.items() if k[0] == "xccl" for r in rs if num(r.get("ranks"))), 2)
    some = load(os.path.join(out, "config.json")) or next(
        (r for k, rs in runs.items() if k[0] == "torch" and k[1] != "base" for r in rs), {})

    def keys(cfg):
        ks = [k for k in runs if k[2] == cfg]
        return sorted(ks, key=lambda k: (ORDER.index(k[1]), k[0]))

    def get(fw, variant, cfg):
        return runs.get((fw, variant, cfg), [])

    def params_of(cfg):
        return next((r.get("params") for k in keys(cfg) if k[1] != "base" for r in runs[k] if num(r.get("params"))), None)

    for cfg in cfgs:
        psi = params_of(cfg)
        d = width_of(cfg)
        psi_block = 12 * d * d + 13 * d if d else None
        ctx = some.get("context", NA)
        batch = some.get("batch", NA)
        print(f"## ZeRO: xccl train --zero 1|2|3 against DDP and PyTorch FSDP2 (Gloo), {n} ranks x 1 thread")
        print()
        print(f"Model {cfg} (width x layers x heads), {psi if psi is not None else NA} parameters (Ψ), Ψ_block = "
              f"{psi_block if psi_block is not None else NA} per decoder layer; byte-level text (vocabulary 256), "
              f"context {ctx}, global batch {batch}, AdamW f32. xccl: mean step after each rank's first; PyTorch: mean "
              "(and median) of the slowest rank's step after the warm-up step. Medians over repetitions.")
        print()
        try:
            with open(os.path.join(out, "skipped.txt")) as f:
                skipped = [l.strip() for l in f if l.strip()]
        except OSError:
            skipped = []
        if skipped:
            print("Not run: " + "; ".join(skipped) + ".")
            print()
        print("### Step time")
        print()
        print("| framework | variant | step, mean (ms) | step, median (ms) | / DDP of the same framework (means) | tokens/s | loss first -> last | runs |")
        print("|---|---|---|---|---|---|---|---|")
        steps = {}
        for fw, variant, _ in keys(cfg):
            if variant == "base":
                continue
            rs = get(fw, variant, cfg)
            s = med([step_ms(fw, r) for r in rs])
            steps[(fw, variant)] = s
        for fw, variant, _ in keys(cfg):
            if variant == "base":
                continue
            rs = get(fw, variant, cfg)
            s = steps[(fw, variant)]
            if fw == "torch":
                tmed = med([r.get("step_ms_median") for r in rs])
            else:
                tmed = med([from_trace(r["_dir"], n)[0] for r in rs])
            tps = med([r.get("tokens_per_second") for r in rs])
            l0, l1 = med([losses(fw, r)[0] for r in rs]), med([losses(fw, r)[1] for r in rs])
            print(f"| {fw} | {LABEL.get((fw, variant), variant)} | {fmt(s, '.1f')} | {fmt(tmed, '.1f')} "
                  f"| {ratio(s, steps.get((fw, 'ddp')))} | {fmt(tps, '.0f')} | {fmt(l0, '.3f')} -> {fmt(l1, '.3f')} | {len(rs)} |")
        print()
        print("| comparison | step-time ratio |")
        print("|---|---|")
        pairs = [
            ("xccl DDP / PyTorch DDP", ("xccl", "ddp"), ("torch", "ddp")),
            ("xccl ZeRO-1 / xccl DDP", ("xccl", "zero1"), ("xccl", "ddp")),
            ("xccl ZeRO-2 / xccl DDP", ("xccl", "zero2"), ("xccl", "ddp")),
            ("xccl ZeRO-3 / xccl DDP", ("xccl", "zero3"), ("xccl", "ddp")),
            ("xccl ZeRO-3 / PyTorch FSDP2", ("xccl", "zero3"), ("torch", "fsdp")),
            ("xccl ZeRO-3 / PyTorch FSDP2 + act. ckpt", ("xccl", "zero3"), ("torch", "fsdp-ac")),
            ("PyTorch FSDP2 / PyTorch DDP", ("torch", "fsdp"), ("torch", "ddp")),
            ("PyTorch FSDP2 + act. ckpt / PyTorch FSDP2", ("torch", "fsdp-ac"), ("torch", "fsdp")),
        ]
        for label, a, b in pairs:
            print(f"| {label} | {ratio(steps.get(a), steps.get(b))} |")

        print()
        print("### Peak memory per rank against the model states (MiB = 2^20 bytes)")
        print()
        print("Peak RSS is the whole process (PyTorch: getrusage maxrss; xccl: VmHWM after its last step, before the")
        print("final checkpoint). Baseline = the peak RSS of the same rank in the same framework's run of a tiny model")
        print("(the runtime, Gloo or xccl's communicator, the data, a few thousand parameters): what the process needs")
        print("without the model. Peak - baseline is set against the ZeRO paper's model states; it also holds the")
        print("activations and what the allocator keeps, which the formula does not count (so a ratio above 1 is")
        print("expected; PyTorch FSDP2 + activation checkpointing shows how much is activations).")
        print()
        print("| framework | variant | rank | params held | peak RSS (MiB) | baseline (MiB) | peak - baseline (MiB) | theory (MiB) | formula | measured / theory | runs |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        formulas = {0: "16Ψ", 1: "8Ψ + 8Ψ/N", 2: "4Ψ + 12Ψ/N", 3: "16Ψ/N + 2·4·Ψ_block"}
        for fw, variant, _ in keys(cfg):
            rs = get(fw, variant, cfg)
            base = {rank: med([e.get("peak_rss_bytes") for e in es]) for rank, es in by_rank(get(fw, "base", cfg)).items()}
            th = theory_memory(variant, psi, psi_block, n)
            ranks = by_rank(rs)
            if not ranks:
                print(f"| {fw} | {LABEL.get((fw, variant), variant)} | {NA} | {NA} | {NA} | {NA} | {NA} | {mib(th)} "
                      f"| {formulas.get(stage_of(variant), '')} | {NA} | {len(rs)} |")
                continue
            for rank in sorted(ranks, key=lambda x: (not isinstance(x, int), x)):
                es = ranks[rank]
                peak = med([e.get("peak_rss_bytes") for e in es])
                held = med([e.get("params_held") for e in es])
                b = base.get(rank)
                if variant == "base":
                    print(f"| {fw} | {LABEL.get((fw, variant), variant)} | {rank} | {NA if held is None else int(held)} "
                          f"| {mib(peak)} | {mib(peak)} | 0 | | | | {len(rs)} |")
                    continue
                net = peak - b if num(peak) and num(b) else None
                print(f"| {fw} | {LABEL.get((fw, variant), variant)} | {rank} | {NA if held is None else int(held)} "
                      f"| {mib(peak)} | {mib(b)} | {mib(net)} | {mib(th)} | {formulas.get(stage_of(variant), '')} "
                      f"| {ratio(net, th)} | {len(rs)} |")

        print()
        print("### Bytes sent per step and rank against the theory")
        print()
        print("Ring-equivalent bytes sent through the data-parallel group per step, mean over the ranks. PyTorch: DDP's")
        print("comm hook or FSDP2's collectives, mean over the steps after the warm-up. xccl: from its trace.json, the")
        print("median over the steps bounded by the next step's `data` span of the bytes of the `comm dp` operations")
        print("in them (where the trace cannot say, the summary's figure, marked). Beside it the summary's")
        print("comm_bytes.dp, the mean over all steps, whose first step also counts what came before it (the initial")
        print("broadcast of the parameters: + 4Ψ / steps in DDP). FSDP2 does not reshard the root group (embeddings,")
        print("final norm, head) after forward, so it gathers those once, not twice.")
        print()
        print("| framework | variant | measured (bytes/step/rank) | theory | formula | measured / theory | xccl comm_bytes.dp | runs |")
        print("|---|---|---|---|---|---|---|---|")
        cformulas = {0: "2(N-1)/N·4Ψ", 1: "2(N-1)/N·4Ψ", 2: "2(N-1)/N·4Ψ", 3: "1.5·2(N-1)/N·4Ψ"}
        for fw, variant, _ in keys(cfg):
            if variant == "base":
                continue
            rs = get(fw, variant, cfg)
            per_run = []  # what the run reports: PyTorch per step; xccl a mean over all its steps
            for r in rs:
                cs = [comm(fw, e) for e in (r.get("per_rank") or []) if isinstance(e, dict)]
                cs = [c for c in cs if num(c)]
                if cs:
                    per_run.append(sum(cs) / len(cs))
            reported = med(per_run)
            meas = reported if fw == "torch" else med([from_trace(r["_dir"], n)[1] for r in rs])
            note = ""
            if meas is None and reported is not None:  # no steps in the trace: the summary's mean
                meas, note = reported, " (comm_bytes.dp)"
            th = theory_comm(variant, psi, n)
            also = "" if fw == "torch" else NA if reported is None else f"{reported:.0f}"
            print(f"| {fw} | {LABEL.get((fw, variant), variant)} | {NA if meas is None else f'{meas:.0f}{note}'} "
                  f"| {NA if th is None else f'{th:.0f}'} | {cformulas.get(stage_of(variant), '')} | {ratio(meas, th, '.3f')} "
                  f"| {also} | {len(rs)} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
