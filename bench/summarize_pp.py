"""Summarises bench/pp_vs_torch.sh's results: medians over repetitions.

    python bench/summarize_pp.py OUT > OUT/summary.md

Reads OUT/torch_{kind}_{schedule}_p{P}[_v{V}]_m{M}_{cfg}_r{rep}.json (bench/pp_vs_torch.py)
and OUT/xccl_{kind}_{schedule}_p{P}[_v{V}]_m{M}_{cfg}_r{rep}/summary.json
(`xccl train --dp 1 --pp P ...`), kind = cmp (step time against PyTorch), bubble (xccl
--trace runs over P and M) or mem (peak memory per stage). Every field it wants from xccl's
summary.json (`step_seconds`, `losses`, `final_loss`, `params`, `pipeline.bubble_measured`,
`pipeline.bubble_schedule`, per_rank[i].rank / params_held / peak_rss_bytes, optional
per_rank[i].stage) may be missing: it prints "n/a" then.
Step times are what each side reports: PyTorch's mean step (the slowest rank's, per step)
over the timed steps after its warm-up, xccl's `step_seconds` (its mean over the steps after
each rank's first). The closed-form bubble is (P - 1) / (V M + P - 1); ZB-H1's
(P - 1 + max(P - M, 0)) / (3 M + P - 1 + max(P - M, 0)); ZB-V's (`zb-v`, V = 2, M >= 2P - 1)
(P - 1) / (6 M + P - 1), in units of one chunk's pass.
ZB-H1's and ZB-V's bubble times (pipeline.bubble_measured x step) are compared with 1F1B's at
the same P and M, per repetition, beside their closed forms (pipeline.bubble_schedule).
"""

import glob
import json
import os
import re
import statistics
import sys

from summarize_tp import NA, fmt, load, med, mib  # the same helpers as the TP summary

NAME = re.compile(r"^(torch|xccl)_(cmp|bubble|mem)_([a-z0-9]+(?:-h1|-v)?(?:-recompute)?)_p(\d+)(?:_v(\d+))?_m(\d+)_(.+)_r(\d+)$")
ORDER = {"gpipe": 0, "1f1b": 1, "1f1b-recompute": 2, "zb-h1": 3, "interleaved": 4, "zb-v": 5}


def num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def closed_form(p, v, m, sched=""):
    """The schedule's bubble in units of one pass (F = B = W = 1, a whole backward 2): (p-1)
    over the step; ZB-H1 (p-1) + max(p-m, 0) idle units over 3m + p-1 + max(p-m, 0); ZB-V
    (two chunks per rank, a unit one chunk's pass) p-1 idle units over 6m + p-1."""
    if sched == "zb-h1":
        idle = p - 1 + max(p - m, 0)
        return idle / (3 * m + idle)
    if sched == "zb-v":
        return (p - 1) / (6 * m + p - 1)
    return (p - 1) / (v * m + p - 1)


def step_ms(fw, r):
    if fw == "torch":
        return r.get("step_ms")
    s = r.get("step_seconds")
    return 1e3 * s if num(s) else None


def pipeline(fw, r):
    """(bubble_measured, bubble_schedule) as the run reports them."""
    if fw == "torch":
        return r.get("bubble_measured"), r.get("bubble_schedule")
    p = r.get("pipeline")
    if not isinstance(p, dict):
        return None, None
    return p.get("bubble_measured"), p.get("bubble_schedule")


def replayed_idle(r, sched, p, pooled=False):
    """The bubble, in ms per rank, that xccl run `r`'s own pass times leave its schedule with
    free communication: the last step's passes (pipeline.timeline) replayed in each rank's
    order, every pass taking the median time of its kind (F, B, Bi, W) on its rank and chunk
    (so a stage that computes more, the loss's, stays slower; `pooled`: of its kind over all
    ranks and chunks, stages as balanced as the kinds' medians), each waiting for what it needs
    from the neighbouring global stage (placement: looped, or ZB-V's V); the makespan minus
    the ranks' mean busy time. None without a timeline."""
    pipe = r.get("pipeline") if isinstance(r.get("pipeline"), dict) else {}
    lanes = pipe.get("timeline") or []
    if len(lanes) != p:
        return None
    cost, ops = {}, []
    for lane in lanes:
        mine = []
        for name, _, dur in lane:
            m = re.match(r"^(F|B|Bi|W)\((\d+),(\d+)\)$", name)
            if not m:
                return None
            cost.setdefault((m[1],) if pooled else (m[1], len(ops), int(m[3])), []).append(dur)
            mine.append((m[1], int(m[2]), int(m[3])))
        ops.append(mine)
    cost = {k: statistics.median(v) for k, v in cost.items()}
    chunks = 1 + max(c for lane in ops for (_, _, c) in lane)
    last = p * chunks - 1

    def stage(rank, c):
        return (2 * p - 1 - rank) if sched == "zb-v" and c == 1 else c * p + rank

    done, clock, nxt = {}, [0.0] * p, [0] * p
    moved = True
    while moved:
        moved = False
        for rank in range(p):
            while nxt[rank] < len(ops[rank]):
                kind, mb, c = ops[rank][nxt[rank]]
                g = stage(rank, c)
                if kind == "F":
                    need = [("F", mb, g - 1)] if g > 0 else []
                elif kind == "W":
                    need = [("Bi", mb, g)]
                elif g < last:
                    need = [k for k in (("B", mb, g + 1), ("Bi", mb, g + 1)) if k in done] or [("?", mb, g)]
                else:
                    need = [("F", mb, g)]
                if any(k not in done for k in need):
                    break
                t = max([clock[rank]] + [done[k] for k in need]) + cost[(kind,) if pooled else (kind, rank, c)]
                done[(kind, mb, g)] = clock[rank] = t
                nxt[rank] += 1
                moved = True
    if any(nxt[rank] < len(ops[rank]) for rank in range(p)):
        return None
    busy = statistics.mean(
        sum(cost[(k,) if pooled else (k, rank, c)] for (k, _, c) in lane) for rank, lane in enumerate(ops)
    )
    return max(clock) - busy


def losses(fw, r):
    if fw == "torch":
        return r.get("loss_first"), r.get("loss_last")
    ls = r.get("losses")
    first = ls[0][1] if isinstance(ls, list) and ls and isinstance(ls[0], list) and len(ls[0]) > 1 else None
    return first, r.get("final_loss")


def main(out):
    runs = {}  # (fw, kind, schedule, p, v, m, cfg) -> [result]
    paths = [(p, os.path.basename(p)[: -len(".json")]) for p in glob.glob(os.path.join(out, "torch_*_r*.json"))]
    paths += [(p, os.path.basename(os.path.dirname(p))) for p in glob.glob(os.path.join(out, "xccl_*_r*", "summary.json"))]
    for path, name in paths:
        mt = NAME.match(name)
        r = load(path)
        if not mt or not isinstance(r, dict):
            continue
        fw, kind, sched, p, v, m, cfg, rep = mt.groups()
        key = (fw, kind, sched, int(p), int(v or 1), int(m), cfg)
        r["_rep"] = int(rep)
        runs.setdefault(key, []).append(r)

    def keys(kind, fw=None):
        ks = {k[1:] for k in runs if k[1] == kind and (fw is None or k[0] == fw)}
        return sorted(ks, key=lambda k: (k[5], k[2], ORDER.get(k[1], 9), k[3], k[4]))

    def get(fw, k):
        return runs.get((fw,) + k, [])

    cfgs = sorted({k[6] for k in runs})
    cfg_note = ", ".join(cfgs) if cfgs else NA
    print("## Pipeline parallelism: PyTorch torch.distributed.pipelining (Gloo) vs xccl train, 2 ranks x 1 thread")
    print()
    print(f"Model {cfg_note} (width x layers x heads; untied head, 3-digit sums, AdamW). Step = the pipeline")
    print("(forward, backward, sends) + optimizer, median over repetitions of each run's mean step time;")
    print("xccl / PyTorch < 1 means xccl is faster. Bubble = 1 - busy / span per rank, mean over ranks (span: from the")
    print("step's start to the rank's last backward; PyTorch: busy = time in forward_one_chunk/backward_one_chunk, so its")
    print("own scheduling and p2p work count as bubble; xccl: summary.json's pipeline.bubble_measured); closed form")
    print("(P - 1) / (V M + P - 1), ZB-H1 (P - 1) / (3 M + P - 1) for M >= P, ZB-V (P - 1) / (6 M + P - 1). Loss = first -> last (PyTorch: means of the first and last 5 timed steps).")
    print()
    print("| config | schedule | P | V | M | params | PyTorch step (ms) | xccl step (ms) | xccl / PyTorch | PyTorch bubble | xccl bubble | closed form | PyTorch loss | xccl loss | runs (torch/xccl) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k in keys("cmp"):
        (_, sched, p, v, m, cfg) = k
        t, x = get("torch", k), get("xccl", k)
        ts, xs = med([step_ms("torch", r) for r in t]), med([step_ms("xccl", r) for r in x])
        params = next((r.get("params") for r in t + x if num(r.get("params"))), None)
        tb, xb = med([pipeline("torch", r)[0] for r in t]), med([pipeline("xccl", r)[0] for r in x])
        tl, xl = [med([losses("torch", r)[i] for r in t]) for i in (0, 1)], [med([losses("xccl", r)[i] for r in x]) for i in (0, 1)]
        ratio = fmt(xs / ts) if ts and xs else NA
        print(f"| {cfg} | {sched} | {p} | {v} | {m} | {params if params is not None else NA} | {fmt(ts)} | {fmt(xs)} | {ratio} "
              f"| {fmt(tb, '.3f')} | {fmt(xb, '.3f')} | {closed_form(p, v, m, sched):.3f} "
              f"| {fmt(tl[0], '.3f')} -> {fmt(tl[1], '.3f')} | {fmt(xl[0], '.3f')} -> {fmt(xl[1], '.3f')} | {len(t)}/{len(x)} |")

    print()
    print("## Bubble: measured (xccl, traced) vs closed form")
    print()
    print("xccl only, batch as in the comparison, default balance. P = 4 runs 4 ranks x 1 thread on 2 cores")
    print("(oversubscribed): a rank idle in the pipeline lends its core to another, so its measured bubble is not")
    print("that of 4 cores. 'xccl closed form' is what xccl's summary.json reports (pipeline.bubble_schedule).")
    print()
    print("| config | P | schedule | V | M | closed form (P-1)/(VM+P-1); ZB-H1 (P-1)/(3M+P-1); ZB-V (P-1)/(6M+P-1) | xccl closed form | xccl measured | measured - closed form | step (ms) | runs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in sorted(keys("bubble", "xccl"), key=lambda k: (k[5], k[2], ORDER.get(k[1], 9), k[3], k[4])):
        (_, sched, p, v, m, cfg) = k
        x = get("xccl", k)
        meas, sch = med([pipeline("xccl", r)[0] for r in x]), med([pipeline("xccl", r)[1] for r in x])
        cf = closed_form(p, v, m, sched)
        diff = fmt(meas - cf, "+.3f") if meas is not None else NA
        print(f"| {cfg} | {p} | {sched} | {v} | {m} | {cf:.3f} | {fmt(sch, '.3f')} | {fmt(meas, '.3f')} | {diff} "
              f"| {fmt(med([step_ms('xccl', r) for r in x]))} | {len(x)} |")

    # The zero-bubble targets: ZB-H1's and ZB-V's bubble time (measured fraction x step)
    # against 1F1B's at the same P and M, per repetition (the runs of one repetition are
    # interleaved), beside the closed forms: the fractions b that summary.json reports
    # (pipeline.bubble_schedule) and the bubble-time ratio they give for the same work per rank,
    # (b / (1 - b)) / (b_1F1B / (1 - b_1F1B)): 1/3 for ZB-H1 (M >= P), 1/6 for ZB-V (F = Bi = W).
    # For ZB-H1 also what its pass times give: Qi et al.'s bubbles, (P-1)(F + Bi - W) for ZB-H1
    # against (P-1)(F + Bi + W) for 1F1B, with the median F, Bi and W of the run's last step
    # (its pipeline.timeline); a third only where F + Bi = 2 W.
    def bubble_ms(r):
        b, step = pipeline("xccl", r)[0], step_ms("xccl", r)
        return b * step if num(b) and num(step) else None

    def passes(r):
        p = r.get("pipeline") if isinstance(r.get("pipeline"), dict) else {}
        times = {}
        for lane in p.get("timeline") or []:
            for name, _, dur in lane:
                times.setdefault(name.split("(")[0], []).append(dur)
        f, bi, w = (med(times.get(k, [])) for k in ("F", "Bi", "W"))
        return (f + bi - w) / (f + bi + w) if None not in (f, bi, w) else None

    def odds(b):
        return b / (1 - b) if num(b) and b < 1 else None

    def replayed(k, base_runs, pooled=False):
        """ZB's replayed bubble over 1F1B's, each from its own run's pass times (medians)."""
        (_, sched, p, _, _, _) = k
        zi = med([replayed_idle(r, sched, p, pooled) for r in get("xccl", k)])
        oi = med([replayed_idle(r, "1f1b", p, pooled) for r in base_runs])
        return zi / oi if num(zi) and num(oi) and oi > 0 else None

    for zsched, title, target in (("zb-h1", "ZB-H1", "1/3"), ("zb-v", "ZB-V", "1/3; its closed form 1/6")):
        zb = [k for k in keys("bubble", "xccl") if k[1] == zsched]
        if not zb:
            continue
        print()
        print(f"{title}'s bubble time (measured bubble x step) over 1F1B's at the same P and M (target <= {target}), per")
        print("repetition and their median; the closed forms (pipeline.bubble_schedule, medians) and the bubble-time")
        print("ratio they give for the same work, (b / (1 - b)) / (b_1F1B / (1 - b_1F1B))"
              + ("; the ratio its pass times give, (F + Bi - W) / (F + Bi + W)," if zsched == "zb-h1" else ";")
              + " and the ratio of the bubbles each schedule's own pass times leave it with free communication"
              + " (each run's last step replayed, every pass at the median time of its kind on its rank and chunk;"
              + " pooled: of its kind over the ranks, as if the stages were balanced):")
        print()
        print(f"| config | P | M | {title} bubble (ms) per repetition | 1F1B's (ms) | ratio per repetition | median ratio "
              f"| {title} closed form | 1F1B closed form | closed-form ratio |" + (" from the pass times |" if zsched == "zb-h1" else "")
              + " replayed | replayed, pooled |")
        print("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if zsched == "zb-h1" else "") + "---|---|")
        for k in sorted(zb, key=lambda k: (k[5], k[2], k[4])):
            (_, sched, p, v, m, cfg) = k
            base_runs = [r for kk in keys("bubble", "xccl") if kk[1:3] == ("1f1b", p) and kk[4:] == (m, cfg)
                         for r in get("xccl", kk)]
            base = {r["_rep"]: bubble_ms(r) for r in base_runs}
            mine = {r["_rep"]: bubble_ms(r) for r in get("xccl", k)}
            reps = sorted(rep for rep in mine if num(mine[rep]) and num(base.get(rep)) and base[rep] > 0)
            ratios = [mine[rep] / base[rep] for rep in reps]
            cz = med([pipeline("xccl", r)[1] for r in get("xccl", k)])
            c1 = med([pipeline("xccl", r)[1] for r in base_runs])
            oz, o1 = odds(cz), odds(c1)
            cratio = fmt(oz / o1, ".3f") if oz is not None and o1 else NA
            row = (f"| {cfg} | {p} | {m} | {' / '.join(fmt(mine[r], '.1f') for r in reps)} "
                   f"| {' / '.join(fmt(base[r], '.1f') for r in reps)} | {' / '.join(f'{x:.2f}' for x in ratios)} "
                   f"| {fmt(med(ratios), '.2f')} | {fmt(cz, '.3f')} | {fmt(c1, '.3f')} | {cratio} |")
            if zsched == "zb-h1":
                row += f" {fmt(med([passes(r) for r in get('xccl', k)]), '.2f')} |"
            row += f" {fmt(replayed(k, base_runs), '.2f')} | {fmt(replayed(k, base_runs, True), '.2f')} |"
            print(row)

    print()
    print("## Memory per stage (medians over repetitions; MiB = 2^20 bytes)")
    print()
    print("Peak RSS is the whole process (getrusage maxrss): PyTorch's includes its ~0.7 GB runtime and the whole")
    print("model every rank builds before keeping its stage. 'vs gpipe' = peak RSS - that of the same framework's")
    print("gpipe run on the same rank.")
    print()
    print("| config | framework | schedule | P | M | rank | stage | params held | peak RSS (MiB) | vs gpipe (MiB) | step (ms) | runs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for fw in ("xccl", "torch"):
        mem = keys("mem", fw)
        gpipe_rss = {}
        rows = []
        for k in mem:
            (_, sched, p, v, m, cfg) = k
            rs = get(fw, k)
            by_rank = {}
            for r in rs:
                pr = r.get("per_rank")
                for i, e in enumerate(pr if isinstance(pr, list) else []):
                    if isinstance(e, dict):
                        by_rank.setdefault(e.get("rank", i), []).append(e)
            step = med([step_ms(fw, r) for r in rs])
            if not by_rank:
                rows.append((k, NA, NA, None, None, step, len(rs)))
                continue
            for rank in sorted(by_rank, key=lambda x: (not isinstance(x, int), x)):
                es = by_rank[rank]
                stage = es[0].get("stage", es[0].get("stages"))
                if isinstance(stage, list):
                    stage = ",".join(str(s) for s in stage)
                rss = med([e.get("peak_rss_bytes") for e in es])
                if sched == "gpipe":
                    gpipe_rss[(p, v, m, cfg, rank)] = rss
                rows.append((k, rank, NA if stage is None else stage, med([e.get("params_held") for e in es]), rss, step, len(rs)))
        name = "xccl train" if fw == "xccl" else "PyTorch"
        for (k, rank, stage, held, rss, step, n) in rows:
            (_, sched, p, v, m, cfg) = k
            base = gpipe_rss.get((p, v, m, cfg, rank))
            vs = format((rss - base) / 2**20, "+.1f") if rss is not None and base is not None else NA
            print(f"| {cfg} | {name} | {sched} | {p} | {m} | {rank} | {stage} | {NA if held is None else int(held)} "
                  f"| {mib(rss, '.1f')} | {vs} | {fmt(step)} | {n} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
