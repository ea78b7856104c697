"""Per-step compute, communication and exposed waiting of a training run, from its trace.

    python3 bench/trace_steps.py out/train/trace.json [--steps 5] [--gaps]

A step of a rank spans from the end of its previous `optimizer` span to the end of the
next. In it: compute = the spans of the `compute` track except waits (forward: the `fwd`
spans; optimizer: the `optimizer` span); wait = the `wait` spans (the step blocked on
communication: exposed); outside = the time between the compute track's spans (ZeRO-3's
fetches of parameters lie there); comm = the collectives of f32 on the communicator tracks
(DDP's gradient all-reduces; ZeRO's gathers and reduce-scatters), and how much of their time
ran while that rank was computing backward (hidden by the overlap). Prints the mean per rank
and the first --steps steps; --gaps adds, per span name, the median time before it since the
compute track's previous span.
"""

import argparse
import json
import statistics
from collections import defaultdict


def overlap(a, b):
    """Total length of the intersection of two sorted lists of (start, end) intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=5, help="steps to show one by one")
    p.add_argument("--gaps", action="store_true", help="the median time before each span name")
    args = p.parse_args()
    events = json.load(open(args.trace))["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            spans[e["pid"]].append((names.get((e["pid"], e["tid"]), "?"), e["name"], e["cat"], e["ts"], e["ts"] + e["dur"]))
    print("| rank | steps | step (ms) | compute (ms) | forward (ms) | backward (ms) | optimizer (ms) | outside spans (ms) "
          "| f32 collectives (ms) | hidden by backward | exposed wait (ms) | exposed share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    detail, gaps = [], defaultdict(list)
    for rank in sorted(spans):
        s = sorted(spans[rank], key=lambda x: x[3])
        ends = [x[4] for x in s if x[0] == "compute" and x[1] == "optimizer"]
        rows = []
        for a, b in zip(ends, ends[1:]):
            inside = [x for x in s if a <= x[3] < b]
            track = [x for x in inside if x[0] == "compute"]
            compute = sum(x[4] - x[3] for x in track if x[2] == "compute")
            fwd = sum(x[4] - x[3] for x in track if x[1].startswith("fwd"))
            bwd = [(x[3], x[4]) for x in track if x[1].startswith("bwd")]
            opt = sum(x[4] - x[3] for x in track if x[1] == "optimizer")
            outside = (b - a) - sum(x[4] - x[3] for x in track)
            for prev, x in zip([(0, "", "", a, a)] + track, track):
                gaps[(rank, x[1])].append(x[3] - prev[4])
            wait = sum(x[4] - x[3] for x in inside if x[2] == "wait")
            comm = [(x[3], x[4]) for x in inside if x[2] == "comm" and "f32" in x[1]]
            comm_t = sum(e - b0 for b0, e in comm)
            rows.append((b - a, compute, fwd, sum(e - b0 for b0, e in bwd), opt, outside, comm_t,
                         overlap(bwd, comm), wait))
        if not rows:
            continue
        mean = [sum(r[i] for r in rows) / len(rows) / 1e3 for i in range(9)]
        hidden = f"{100 * mean[7] / mean[6]:.0f}%" if mean[6] > 0 else "-"
        print(f"| {rank} | {len(rows)} | " + " | ".join(f"{v:.2f}" for v in mean[:7]) + f" | {hidden} "
              f"| {mean[8]:.2f} | {100 * mean[8] / mean[0]:.1f}% |")
        detail += [(rank, i, r) for i, r in enumerate(rows[: args.steps])]
    print()
    print("| rank | step | step (ms) | compute (ms) | forward (ms) | backward (ms) | optimizer (ms) | outside spans (ms) "
          "| f32 collectives (ms) | overlapped with backward (ms) | wait (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for rank, i, r in detail:
        print(f"| {rank} | {i + 1} | " + " | ".join(f"{v / 1e3:.2f}" for v in r) + " |")
    if args.gaps:
        print()
        print("| rank | span | median time before it (ms) |")
        print("|---|---|---|")
        for (rank, name), v in sorted(gaps.items()):
            print(f"| {rank} | {name} | {statistics.median(v) / 1e3:.2f} |")


if __name__ == "__main__":
    main()
