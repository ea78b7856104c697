#!/usr/bin/env python3
"""Summarize bench/compare_shm.sh output: per implementation, rank count, collective and size,
the median over repetitions of time and bus bandwidth ([min..max] of busbw), the number of
wrong elements, and the issue's targets as ratios of medians of the same run.

Usage: summarize_shm.py OUT_DIR"""
import glob
import os
import re
import statistics
import sys
from collections import defaultdict

OUT = sys.argv[1]
CANON = {"all_reduce": "allreduce", "all_gather": "allgather", "broadcast": "bcast", "all_to_all": "alltoall"}
OPS = ["allreduce", "allgather", "reduce_scatter", "bcast", "alltoall"]
IMPLS = [("xccl", "xccl"), ("before", "xccl before"), ("xcclinplace", "xccl in place"),
         ("beforeinplace", "xccl before, in place"), ("xcclhuge", "xccl, 2 MiB pages"),
         ("beforehuge", "xccl before, 2 MiB pages"), ("xcclhugeinplace", "xccl in place, 2 MiB pages"),
         ("beforehugeinplace", "xccl before, in place, 2 MiB pages"), ("ompi", "Open MPI"),
         ("ompihuge", "Open MPI, THP always"), ("mpich", "MPICH"), ("gloo", "gloo (in place)")]

rows = defaultdict(list)  # (impl, n, op, size) -> [(time_us, busbw, wrong)]
algo = {}  # (n, op, size) -> xccl's algorithm
for path in glob.glob(os.path.join(OUT, "*_n*_r*.txt")):
    m = re.match(r"(.+)_n(\d+)_r(\d+)\.txt$", os.path.basename(path))
    impl, n = m.group(1), int(m.group(2))
    op = None
    for line in open(path, errors="replace"):
        mo = re.match(r"#\s*op=(\S+)", line)
        if mo:
            op = CANON.get(mo.group(1), mo.group(1))
            continue
        parts = line.split()
        if op and len(parts) >= 10 and parts[0].isdigit():
            key = (impl, n, op, int(parts[0]))
            rows[key].append((float(parts[4]), float(parts[6]), int(parts[7])))
            if impl == "xccl" and len(parts) >= 11:
                algo[(n, op, int(parts[0]))] = parts[10]

memcpy = []
for path in glob.glob(os.path.join(OUT, "memcpy_r*.txt")):
    for line in open(path):
        p = line.split()
        if len(p) >= 7 and p[0] == "memcpy" and p[2] == "1":
            memcpy.append(float(p[5]))
memcpy_gbs = statistics.median(memcpy) if memcpy else float("nan")


def med(impl, n, op, size, field):
    v = rows.get((impl, n, op, size))
    return statistics.median(x[field] for x in v) if v else None


def fmt_size(b):
    for unit, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m} {unit}"
    return f"{b} B"


def cell(impl, n, op, size):
    v = rows.get((impl, n, op, size))
    if not v:
        return "–"
    t = statistics.median(x[0] for x in v)
    bw = [x[1] for x in v]
    wrong = sum(x[2] for x in v)
    w = "" if wrong == 0 else f" **{wrong} wrong**"
    return f"{t:.2f} µs / {statistics.median(bw):.2f} [{min(bw):.2f}..{max(bw):.2f}]{w}"


ns = sorted({k[1] for k in rows})
reps = len(memcpy)
print(f"Medians of {reps} repetitions; each cell: time / busbw GB/s [min..max busbw]. "
      f"Single-thread memcpy (256 MiB): {memcpy_gbs:.2f} GB/s.\n")
for n in ns:
    for op in OPS:
        sizes = sorted({k[3] for k in rows if k[1] == n and k[2] == op})
        if not sizes:
            continue
        present = [(i, label) for i, label in IMPLS if any((i, n, op, s) in rows for s in sizes)]
        print(f"### {op}, {n} ranks\n")
        print("| size | " + " | ".join(label for _, label in present) + " | xccl algorithm |")
        print("|---" * (len(present) + 2) + "|")
        for s in sizes:
            cells = [cell(i, n, op, s) for i, _ in present]
            print(f"| {fmt_size(s)} | " + " | ".join(cells) + f" | {algo.get((n, op, s), '')} |")
        print()


def ratio(a, b):
    return a / b if a is not None and b else None


checks = []  # (target, measured, ratio text, met)
M64, M1 = 64 << 20, 1 << 20
for n in ns:
    peers = {i: med(i, n, "allreduce", M64, 1) for i in ("ompi", "mpich", "gloo")}
    peers = {k: v for k, v in peers.items() if v is not None}
    if peers:
        best = max(peers, key=peers.get)
        for impl in ("xccl", "xcclinplace"):
            x = med(impl, n, "allreduce", M64, 1)
            r = ratio(x, peers[best])
            if r is not None:
                checks.append((f"64 MiB all-reduce, {n} ranks, {impl}: busbw ≥ 2× best peer ({best} {peers[best]:.2f})",
                               f"{x:.2f} GB/s", f"{r:.2f}×", r >= 2))
    x, o = med("xccl", n, "allreduce", M1, 1), med("ompi", n, "allreduce", M1, 1)
    if x is not None and o is not None:
        checks.append((f"1 MiB all-reduce, {n} ranks: busbw ≥ Open MPI ({o:.2f})", f"{x:.2f} GB/s",
                       f"{x / o:.2f}×", x >= o))
    if n == 2:
        for size in (8, 1 << 10):
            x, o = med("xccl", n, "allreduce", size, 0), med("ompi", n, "allreduce", size, 0)
            if None not in (x, o):
                checks.append((f"{fmt_size(size)} all-reduce, 2 ranks: time ≤ Open MPI ({o:.2f} µs)", f"{x:.2f} µs",
                               f"{x / o:.2f}×", x <= o))
        for impl, label in IMPLS:
            x = med(impl, n, "allreduce", M64, 1) if impl.startswith("xccl") else None
            if x is not None:
                m = ratio(x, memcpy_gbs)
                checks.append((f"64 MiB all-reduce, 2 ranks, {label}: busbw ≥ 50% of memcpy ({memcpy_gbs:.2f})",
                               f"{x:.2f} GB/s", f"{100 * m:.0f}%", m >= 0.5))
        x, o = med("xcclhuge", n, "allreduce", M64, 1), med("ompihuge", n, "allreduce", M64, 1)
        if None not in (x, o):
            checks.append((f"64 MiB all-reduce, 2 ranks, both on huge pages: busbw ≥ Open MPI ({o:.2f})",
                           f"{x:.2f} GB/s", f"{x / o:.2f}×", x >= o))
        x, o, mp = (med(i, n, "allreduce", 8, 0) for i in ("xccl", "ompi", "mpich"))
        if None not in (x, o, mp):
            checks.append((f"8 B all-reduce, 2 ranks: time ≤ MPICH ({mp:.2f} µs)", f"{x:.2f} µs", f"{x / mp:.2f}×",
                           x <= mp))
            checks.append((f"8 B all-reduce, 2 ranks: time ≤ 2× Open MPI ({o:.2f} µs)", f"{x:.2f} µs",
                           f"{x / o:.2f}×", x <= 2 * o))
    for op in ("allgather", "reduce_scatter", "bcast", "alltoall"):
        for size in (M1, M64):
            x, o = med("xccl", n, op, size, 1), med("ompi", n, op, size, 1)
            if x is not None and o is not None:
                checks.append((f"{op} {fmt_size(size)}, {n} ranks: busbw ≥ Open MPI ({o:.2f})", f"{x:.2f} GB/s",
                               f"{x / o:.2f}×", x >= o))

print("### Targets\n")
print("| target | xccl | ratio | met |")
print("|---|---|---|---|")
for t, m, r, ok in checks:
    print(f"| {t} | {m} | {r} | {'yes' if ok else '**no**'} |")

# Before and after: each row's median time against the older build's, and the noise band, the
# larger spread (max-min over median) of the two builds' repetitions of that row; the
# all-reduce's other forms (in place, 2 MiB pages) beside the plain rows.
# "heap": ordinary `Vec`s, under `xccl run`'s malloc setting (compare_shm.sh's header).
FORMS = [("", "heap"), ("inplace", "in place"), ("huge", "2 MiB pages"), ("hugeinplace", "in place, 2 MiB pages")]
pairs = sorted((f, label) + k[1:] for f, label in FORMS for k in rows
               if k[0] == "xccl" + f and ("before" + f,) + k[1:] in rows)
if pairs:
    print("\n### Before and after\n")
    print("| ranks | collective | size | form | before µs | after µs | after/before | noise band | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    bands = []
    worse = 0
    for f, label, n, op, size in pairs:
        a = [x[0] for x in rows[("xccl" + f, n, op, size)]]
        b = [x[0] for x in rows[("before" + f, n, op, size)]]
        ma, mb = statistics.median(a), statistics.median(b)
        band = max((max(v) - min(v)) / statistics.median(v) for v in (a, b))
        bands.append(band)
        r = ma / mb
        verdict = "within noise" if abs(r - 1) <= band else ("faster" if r < 1 else "**slower**")
        worse += verdict == "**slower**"
        print(f"| {n} | {op} | {fmt_size(size)} | {label} | {mb:.2f} | {ma:.2f} | {r:.3f} | ±{100 * band:.0f}% "
              f"| {verdict} |")
    print(f"\nNoise band (median over rows): ±{100 * statistics.median(bands):.0f}%; rows slower beyond it: {worse}.")
