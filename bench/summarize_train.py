"""Summarises bench/train_vs_torch.sh's results: medians over repetitions, per config."""

import glob
import json
import os
import re
import statistics
import sys


def main(out):
    rows = {}
    for path in glob.glob(os.path.join(out, "torch_*_r*.json")):
        cfg = re.match(r"torch_(.+)_r\d+\.json", os.path.basename(path)).group(1)
        r = json.load(open(path))
        rows.setdefault(cfg, {"torch": [], "xccl": []})["torch"].append(
            (r["params"], r["step_ms"], r["exposed_ms"], r["exposed_ab_ms"], r["tokens_per_second"])
        )
    for build in ("xccl", "before"):
        for path in glob.glob(os.path.join(out, f"{build}_*_r*", "summary.json")):
            cfg = re.match(rf"{build}_(.+)_r\d+", os.path.basename(os.path.dirname(path))).group(1)
            r = json.load(open(path))
            rows.setdefault(cfg, {"torch": [], "xccl": []}).setdefault(build, []).append(
                (r["params"], 1e3 * r["step_seconds"], 1e3 * r["exposed_seconds"], None, r["tokens_per_second"])
            )
    med = lambda xs: statistics.median(xs) if xs else float("nan")
    print("| model (width x layers) | params | framework | step (ms) | exposed comm. (ms) | exposed share | tokens/s | runs |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for cfg in sorted(rows, key=lambda c: int(c.split("x")[0])):
        steps = {}
        for fw in ("torch", "xccl", "before"):
            rs = rows[cfg].get(fw, [])
            if not rs:
                continue
            step, exposed = med([r[1] for r in rs]), med([r[2] for r in rs])
            steps[fw] = step
            name = {"torch": "PyTorch DDP, Gloo", "xccl": "xccl train (DDP)", "before": "xccl train, BEFORE build"}[fw]
            extra = f" (A/B: {med([r[3] for r in rs]):.2f})" if fw == "torch" else ""
            print(f"| {cfg} | {rs[0][0]} | {name} | {step:.2f} | {exposed:.2f}{extra} | {100 * exposed / step:.1f}% "
                  f"| {med([r[4] for r in rs]):.0f} | {len(rs)} |")
        if "xccl" in steps and "torch" in steps:
            ratios.append(f"{cfg}: xccl step / torch step = {steps['xccl'] / steps['torch']:.2f}")
        if "xccl" in steps and "before" in steps:
            spread = lambda fw: f"{min(r[1] for r in rows[cfg][fw]):.2f}..{max(r[1] for r in rows[cfg][fw]):.2f}"
            ratios.append(
                f"{cfg}: xccl step / BEFORE step = {steps['xccl'] / steps['before']:.3f} "
                f"(steps in ms, xccl {spread('xccl')}, before {spread('before')})"
            )
    print()
    for r in ratios:
        print(f"- {r}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
