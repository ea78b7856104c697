"""The planner against measurement, from bench/plan_check.sh's outputs.

    python3 bench/summarize_plan.py OUT

Reads OUT/plan.txt (the planner's table: rank, predicted step and its parts, memory,
configuration) and each launch's OUT/run_{i}_r{rep}/trace.json: its step is the median
interval between the ends of rank 0's consecutive `optimizer` spans (a step's mean, the
summary's step_seconds, is also shown: on shared cores a few stalled steps move a mean far
more than the step a run settles at). It prints predicted against measured (the median over
launches, and their range), then the two checks: the planner's first within 10% of the fastest measured, and every pair of
configurations whose measured medians differ by more than 15% in the predicted order.
"""

import glob
import json
import os
import re
import statistics
import sys


def median_step(path):
    """The median of a run's steps (ms) on rank 0, from its Chrome trace; None without one."""
    if not os.path.exists(path):
        return None
    ends = sorted(e["ts"] + e["dur"] for e in json.load(open(path))["traceEvents"]
                  if e.get("ph") == "X" and e.get("pid") == 0 and e.get("name") == "optimizer")
    steps = [(b - a) / 1e3 for a, b in zip(ends, ends[1:])]
    return statistics.median(steps) if steps else None


def main():
    out = sys.argv[1]
    rows = []
    for line in open(os.path.join(out, "plan.txt")):
        m = re.match(r"\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(--.*)$", line)
        if m:
            rows.append({"rank": int(m[1]), "pred": float(m[2]), "mem": float(m[7]) + float(m[8]), "config": m[9].strip()})
    for r in rows:
        times, means = [], []
        for d in sorted(glob.glob(os.path.join(out, f"run_{r['rank']}_r*"))):
            if not os.path.isdir(d):
                continue
            step = median_step(os.path.join(d, "trace.json"))
            if step is not None:
                times.append(step)
            f = os.path.join(d, "summary.json")
            if os.path.exists(f) and json.load(open(f)).get("step_seconds"):
                means.append(1e3 * json.load(open(f))["step_seconds"])
        r["times"], r["means"] = times, means
        r["meas"] = statistics.median(times) if times else None
    print("| plan's rank | configuration | predicted step (ms) | measured step (ms): median of launches [min..max], launches | predicted / measured | mean step (ms), median of launches | memory (MiB, planned) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["times"]
        meas = f"{r['meas']:.2f} [{min(t):.2f}..{max(t):.2f}], {len(t)}" if t else "failed"
        ratio = f"{r['pred'] / r['meas']:.2f}" if t else "-"
        mean = f"{statistics.median(r['means']):.2f}" if r["means"] else "-"
        print(f"| {r['rank']} | `{r['config']}` | {r['pred']:.3f} | {meas} | {ratio} | {mean} | {r['mem']:.1f} |")
    done = [r for r in rows if r["meas"] is not None]
    if not done:
        print("\nno configuration was measured")
        return
    best = min(done, key=lambda r: r["meas"])
    first = rows[0]
    if first["meas"] is None:
        print("\n**The planner's first did not run.**")
    else:
        ok = first["meas"] <= 1.10 * best["meas"]
        print(f"\nThe planner's first ({first['meas']:.2f} ms) against the fastest measured "
              f"(rank {best['rank']}, {best['meas']:.2f} ms): {first['meas'] / best['meas']:.3f}x: "
              f"**{'within 10%' if ok else 'NOT within 10%'}**.")
    pairs, wrong = 0, []
    for i, a in enumerate(done):
        for b in done[i + 1:]:
            lo, hi = sorted([a["meas"], b["meas"]])
            if hi > 1.15 * lo:
                pairs += 1
                # a is ranked before b by the planner: it must be measured faster.
                if a["meas"] > b["meas"]:
                    wrong.append((a["rank"], b["rank"]))
    print(f"Pairs measured more than 15% apart: {pairs}; in the planner's order: {pairs - len(wrong)}"
          + (f"; out of order: {', '.join(f'{x} before {y}' for x, y in wrong)}" if wrong else "") + ".")


if __name__ == "__main__":
    main()
