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
    for path in glob.glob(os.path.join(out, "xccl_*_r*", "summary.json")):
        cfg = re.match(r"xccl_(.+)_r\d+", os.path.basename(os.path.dirname(path))).group(1)
        r = json.load(open(path))
        rows.setdefault(cfg, {"torch": [], "xccl": []})["xccl"].append(
            (r["params"], 1e3 * r["step_seconds"], 1e3 * r["exposed_seconds"], None, r["tokens_per_second"])
        )
    med = lambda xs: statistics.median(xs) if xs else float("nan")
    print("| model (width x layers) | params | framework | step (ms) | exposed comm. (ms) | exposed share | tokens/s | runs |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for cfg in sorted(rows, key=lambda c: int(c.split("x")[0])):
        steps = {}
        for fw in ("torch", "xccl"):
            rs = rows[cfg][fw]
            if not rs:
                continue
            step, exposed = med([r[1] for r in rs]), med([r[2] for r in rs])
            steps[fw] = step
            name = "PyTorch DDP, Gloo" if fw == "torch" else "xccl train (DDP)"
            extra = f" (A/B: {med([r[3] for r in rs]):.2f})" if fw == "torch" else ""
            print(f"| {cfg} | {rs[0][0]} | {name} | {step:.2f} | {exposed:.2f}{extra} | {100 * exposed / step:.1f}% "
                  f"| {med([r[4] for r in rs]):.0f} | {len(rs)} |")
        if len(steps) == 2:
            ratios.append(f"{cfg}: xccl step / torch step = {steps['xccl'] / steps['torch']:.2f}")
    print()
    for r in ratios:
        print(f"- {r}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
