"""`xccl sim train` against `xccl train`, from bench/sim_train_check.sh's outputs.

    python3 bench/summarize_sim_train.py OUT

Reads OUT/meshes.txt (one mesh per line), each mesh's predictions OUT/pred_{i}_r{rep}.txt
and its launches OUT/run_{i}_r{rep}/trace.json (a launch's step: the median interval between
the ends of rank 0's consecutive `optimizer` spans, as bench/summarize_plan.py measures it),
and prints predicted (the median over predictions, their range, and the parts of the median
one) against measured (the median over launches, their range), then how many meshes are
within ±15%.
"""

import glob
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summarize_plan import median_step  # noqa: E402


def prediction(path):
    """The prediction's lines `name  value ms` as a dict of milliseconds."""
    parts = {}
    for line in open(path):
        m = re.match(r"\s*(predicted step|compute|tp communication|bubble|exposed comm\.)\s+([\d.]+) ms", line)
        if m:
            parts[m[1]] = float(m[2])
    return parts


def main():
    out = sys.argv[1]
    meshes = [l.strip() for l in open(os.path.join(out, "meshes.txt")) if l.strip()]
    print("| mesh | predicted step (ms): median [min..max]; its compute, tp, bubble, exposed | measured step (ms): median of launches [min..max], launches | predicted / measured |")
    print("|---|---|---|---|")
    within = 0
    for i, mesh in enumerate(meshes, 1):
        preds = sorted((p["predicted step"], p) for p in map(prediction, sorted(glob.glob(os.path.join(out, f"pred_{i}_r*.txt"))))
                       if "predicted step" in p)
        times = [t for t in (median_step(os.path.join(d, "trace.json"))
                             for d in sorted(glob.glob(os.path.join(out, f"run_{i}_r*"))) if os.path.isdir(d))
                 if t is not None]
        if not times or not preds:
            print(f"| `{mesh}` | {len(preds)} predictions | {len(times)} launches | - |")
            continue
        pred, p = preds[(len(preds) - 1) // 2]
        parts = ", ".join(f"{p.get(k, 0):.2f}" for k in ("compute", "tp communication", "bubble", "exposed comm."))
        meas = statistics.median(times)
        ratio = pred / meas
        within += abs(ratio - 1) <= 0.15
        print(f"| `{mesh}` | {pred:.2f} [{preds[0][0]:.2f}..{preds[-1][0]:.2f}]; {parts} | {meas:.2f} [{min(times):.2f}..{max(times):.2f}], {len(times)} | {ratio:.2f} |")
    print(f"\n{within} of {len(meshes)} meshes predicted within ±15% of the measured median step.")


if __name__ == "__main__":
    main()
