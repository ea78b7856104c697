#!/usr/bin/env python3
"""Summarize bench/compare_tcp.sh output: medians over repetitions, and xccl's ratios to gloo
and to iperf3. Usage: summarize_tcp.py OUT_DIR"""
import glob
import os
import re
import statistics
import sys
from collections import defaultdict

out = sys.argv[1]
rows = defaultdict(list)  # (impl, n, size) -> [(time_us, busbw, wrong)]
for path in glob.glob(os.path.join(out, "*_n*_r*.txt")):
    m = re.match(r"(.+)_n(\d+)_r(\d+)\.txt$", os.path.basename(path))
    impl, n = m.group(1), int(m.group(2))
    for line in open(path, errors="replace"):
        parts = line.replace("[0]", "").split()
        if len(parts) >= 10 and parts[0].isdigit():
            rows[(impl, n, int(parts[0]))].append((float(parts[4]), float(parts[6]), int(parts[7])))
iperf = []
for path in glob.glob(os.path.join(out, "iperf3_r*.txt")):
    for line in open(path):
        if "receiver" in line:
            m = re.search(r"([\d.]+) Gbits/sec", line)
            if m:
                iperf.append(float(m.group(1)) / 8)
iperf_gbs = statistics.median(iperf) if iperf else float("nan")
bidir = []  # both directions together, per repetition
for path in glob.glob(os.path.join(out, "iperf3bidir_r*.txt")):
    rates = [float(m.group(1)) / 8 for line in open(path) if "receiver" in line
             for m in [re.search(r"([\d.]+) Gbits/sec", line)] if m]
    if rates:
        bidir.append(sum(rates))
bidir_gbs = statistics.median(bidir) if bidir else float("nan")

labels = {"gloo": "PyTorch gloo (in-place)", "xccl": "xccl (out-of-place)", "xcclinplace": "xccl (in-place)"}
impls = [i for i in ("gloo", "xccl", "xcclinplace") if any(k[0] == i for k in rows)]
ns = sorted({k[1] for k in rows})
sizes = sorted({k[2] for k in rows})
med = lambda k, i: statistics.median(x[i] for x in rows[k]) if rows.get(k) else float("nan")

print(f"loopback TCP, iperf3 1 stream: {iperf_gbs:.2f} GB/s (median of {len(iperf)}); "
      f"both directions at once (--bidir), sum: {bidir_gbs:.2f} GB/s (median of {len(bidir)})\n")
for n in ns:
    print(f"### all_reduce, {n} ranks: time (us) / busbw (GB/s), median of repetitions\n")
    print("| size | " + " | ".join(labels[i] for i in impls) + " | xccl in-place / gloo busbw | xccl in-place busbw / iperf3 |")
    print("|---|" + "---|" * (len(impls) + 2))
    for s in sizes:
        cells = [f"{med((i, n, s), 0):.1f} / {med((i, n, s), 1):.3f}" for i in impls]
        g, x = med(("gloo", n, s), 1), med(("xcclinplace", n, s), 1)
        ratio = f"{x / g:.2f}x" if g and g == g and g > 0 else "-"
        print(f"| {s} | " + " | ".join(cells) + f" | {ratio} | {x / iperf_gbs:.0%} |")
    wrong = sum(x[2] for k, v in rows.items() if k[1] == n for x in v)
    print(f"\n#wrong over all xccl and gloo rows: {wrong}\n")
