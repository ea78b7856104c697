#!/usr/bin/env python3
"""Summarizes bench/cluster_tcp.sh: per shape, every algorithm's measured bus bandwidth
against the link rate, the simulator's prediction beside it, and the tuner's pick against
the best measured."""
import glob
import os
import re
import sys

out, rate = sys.argv[1], sys.argv[2]
link = float(re.match(r"([0-9.]+)", rate).group(1)) * (1e9 if rate.endswith("gbit") else 1e6) / 8 / 1e9  # GB/s


def rows(path, first_col_prefix=""):
    got = {}
    for line in open(path, errors="replace"):
        line = re.sub(r"^\[\d+\] ", "", line)
        f = line.split()
        if len(f) >= 12 and f[0].isdigit() and not line.startswith("#"):
            # xccl bench: size count type redop root time algbw busbw wrong tmax iters algo [pred]
            got[(int(f[0]), f[11].rstrip("*"))] = (float(f[5]), float(f[7]))
    return got


def sim_rows(path):
    got = {}
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) == 6 and f[0].isdigit():
            got[(int(f[0]), f[1])] = (float(f[2]), float(f[4]))
    return got


print(f"Link rate {rate} = {link:.3f} GB/s each way.\n")
for path in sorted(glob.glob(os.path.join(out, "xccl_*.txt"))):
    shape = path.rsplit("_", 1)[1][:-4]
    meas = rows(path)
    simp = os.path.join(out, f"sim_{shape}.txt")
    sim = sim_rows(simp) if os.path.exists(simp) else {}
    ip = open(os.path.join(out, f"iperf3_{shape}.txt"), errors="replace").read()
    bidir = re.findall(r"\[(?:TX|RX)-C\].*?([0-9.]+) Gbits/sec.*receiver", ip)
    print(f"## {shape} (hosts x ranks per host)\n")
    if bidir:
        print(f"iperf3 --bidir between two hosts: {' / '.join(bidir)} Gbit/s\n")
    print("| size | algo | measured time (µs) | busbw (GB/s) | % of link | simulated time (µs) | sim / measured |")
    print("|---|---|---|---|---|---|---|")
    for (size, algo), (t, bus) in sorted(meas.items()):
        s = sim.get((size, algo))
        ratio = f"{s[0] / t:.2f}" if s else "-"
        print(f"| {size} | {algo} | {t:.1f} | {bus:.3f} | {100 * bus / link:.0f}% | {s[0] if s else '-'} | {ratio} |")
    print()
    for line in open(path, errors="replace"):
        if "# tuner at" in line:
            print("- " + re.sub(r"^\[\d+\] # ", "", line.strip()))
    print()
