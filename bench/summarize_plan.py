"""The planner against measurement, from bench/plan_check.sh's outputs.

    python3 bench/summarize_plan.py OUT

Reads OUT/plan.txt (the planner's table: rank, predicted step and its parts, memory,
configuration) and OUT/run_{i}_r{rep}/summary.json (step_seconds of each launch), prints a
table of predicted against measured (median and range over the launches), then the two
checks: the planner's first within 10% of the fastest measured, and every pair of
configurations whose measured medians differ by more than 15% in the predicted order.
"""

import glob
import json
import os
import re
import statistics
import sys


def main():
    out = sys.argv[1]
    rows = []
    for line in open(os.path.join(out, "plan.txt")):
        m = re.match(r"\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(--.*)$", line)
        if m:
            rows.append({"rank": int(m[1]), "pred": float(m[2]), "mem": float(m[7]) + float(m[8]), "config": m[9].strip()})
    for r in rows:
        times = []
        for d in sorted(glob.glob(os.path.join(out, f"run_{r['rank']}_r*"))):
            f = os.path.join(d, "summary.json")
            if os.path.isdir(d) and os.path.exists(f):
                s = json.load(open(f))
                if s.get("step_seconds"):
                    times.append(1e3 * s["step_seconds"])
        r["times"] = times
        r["meas"] = statistics.median(times) if times else None
    print("| plan's rank | configuration | predicted step (ms) | measured median (ms) [min..max], launches | predicted / measured | memory (MiB, planned) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        t = r["times"]
        meas = f"{r['meas']:.2f} [{min(t):.2f}..{max(t):.2f}], {len(t)}" if t else "failed"
        ratio = f"{r['pred'] / r['meas']:.2f}" if t else "-"
        print(f"| {r['rank']} | `{r['config']}` | {r['pred']:.3f} | {meas} | {ratio} | {r['mem']:.1f} |")
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
