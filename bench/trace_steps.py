"""Per-step compute, communication and exposed waiting of a DDP run, from its trace.

    python3 bench/trace_steps.py out/train/trace.json [--steps 5]

A step of a rank spans from the end of its previous `optimizer` span to the end of the
next. In it: compute = the spans of the `compute` track except waits; wait = the `wait`
spans (the step blocked on communication: exposed); comm = the gradient all-reduces (f32)
on the communicator tracks, and how much of their time ran while that rank was computing
backward (hidden by the overlap). Prints the mean per rank and the first --steps steps.
"""

import argparse
import json
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
    args = p.parse_args()
    events = json.load(open(args.trace))["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            spans[e["pid"]].append((names.get((e["pid"], e["tid"]), "?"), e["name"], e["cat"], e["ts"], e["ts"] + e["dur"]))
    print("| rank | steps | step (ms) | compute (ms) | backward (ms) | gradient all-reduce (ms) | hidden by backward | exposed wait (ms) | exposed share |")
    print("|---|---|---|---|---|---|---|---|---|")
    detail = []
    for rank in sorted(spans):
        s = sorted(spans[rank], key=lambda x: x[3])
        ends = [x[4] for x in s if x[0] == "compute" and x[1] == "optimizer"]
        rows = []
        for a, b in zip(ends, ends[1:]):
            inside = [x for x in s if a <= x[3] < b]
            compute = sum(x[4] - x[3] for x in inside if x[0] == "compute" and x[2] == "compute")
            bwd = [(x[3], x[4]) for x in inside if x[0] == "compute" and x[1].startswith("bwd")]
            wait = sum(x[4] - x[3] for x in inside if x[2] == "wait")
            comm = [(x[3], x[4]) for x in inside if x[2] == "comm" and "f32" in x[1]]
            comm_t = sum(e - b0 for b0, e in comm)
            rows.append((b - a, compute, sum(e - b0 for b0, e in bwd), comm_t, overlap(bwd, comm), wait))
        if not rows:
            continue
        mean = [sum(r[i] for r in rows) / len(rows) / 1e3 for i in range(6)]
        hidden = f"{100 * mean[4] / mean[3]:.0f}%" if mean[3] > 0 else "-"
        print(f"| {rank} | {len(rows)} | {mean[0]:.2f} | {mean[1]:.2f} | {mean[2]:.2f} | {mean[3]:.2f} | {hidden} "
              f"| {mean[5]:.2f} | {100 * mean[5] / mean[0]:.1f}% |")
        detail += [(rank, i, r) for i, r in enumerate(rows[: args.steps])]
    print()
    print("| rank | step | step (ms) | compute (ms) | backward (ms) | all-reduce (ms) | overlapped with backward (ms) | wait (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for rank, i, r in detail:
        print(f"| {rank} | {i + 1} | " + " | ".join(f"{v / 1e3:.2f}" for v in r) + " |")


if __name__ == "__main__":
    main()
