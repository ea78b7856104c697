#!/usr/bin/env python3
"""Pivot the table of `xccl tune fit --check` into one table per rank count, transport and
collective: a row per size, a column per algorithm (measured µs), the tuner's pick in bold,
the fastest measured marked with *, and the pick's time over the fastest.

With --oracle DIR, it ends with how the best one could do from measurements alone: for each
case, the algorithm fastest in set a (DIR/a_*.tsv) timed in set b (DIR/b_*.tsv), over the
fastest in set b. That is the noise floor the tuner's picks are judged against.

Usage: tune_table.py CHECK.md [--oracle DIR]"""
import glob
import math
import os
import sys
from collections import defaultdict

tables = defaultdict(list)  # (group, collective) -> [(bytes, {algo: us}, fastest, pick, ratio)]
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) < 7 or not cells[2].isdigit():
        continue
    group, coll, size = cells[0], cells[1], int(cells[2])
    times = {}
    for item in cells[3].split(", "):
        algo, us = item.rsplit(" ", 1)
        times[algo] = float(us)
    pick = cells[5].strip("*")
    tables[(group, coll)].append((size, times, cells[4], pick, float(cells[6].split()[0])))


def size_name(b):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


for (group, coll), rows in sorted(tables.items()):
    algos = list(rows[0][1])
    print(f"**{coll}, {group}** (µs; bold: the tuner's pick, *: fastest measured)\n")
    print("| size | " + " | ".join(algos) + " | pick / fastest |")
    print("|---|" + "---|" * (len(algos) + 1))
    for size, times, fastest, pick, ratio in sorted(rows):
        cells = []
        for a in algos:
            t = f"{times[a]:.1f}" + ("*" if a == fastest else "")
            cells.append(f"**{t}**" if a == pick else t)
        print(f"| {size_name(size)} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    print()


def load(pattern):
    d = defaultdict(dict)  # (file's group, collective, bytes) -> {algo: seconds}
    for path in glob.glob(pattern):
        group = os.path.basename(path)[2:-4]
        for line in open(path):
            if line.startswith("#"):
                continue
            c = line.rstrip("\n").split("\t")
            d[(group, c[4], int(c[6]))][c[5]] = float(c[10])
    return d


if len(sys.argv) == 4 and sys.argv[2] == "--oracle":
    a = load(os.path.join(sys.argv[3], "a_*.tsv"))
    b = load(os.path.join(sys.argv[3], "b_*.tsv"))
    ratios = []
    for k, times in b.items():
        if k in a:
            best_a = min(a[k], key=a[k].get)
            ratios.append(times[best_a] / min(times.values()))
    within = sum(r <= 1.1 for r in ratios)
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"# the fastest of set a, timed in set b: {within} of {len(ratios)} within 10% of the fastest; "
          f"worst {max(ratios):.2f}x, geometric mean {geo:.3f}")
