"""Summarises bench/launches.sh: per implementation, load, rank count and size, the launches'
median, best and worst time, the spread between the 10th and 90th percentiles, and how many
launches lie beyond 2x the median (the target: none).

    python3 bench/summarize_launches.py target/bench/launches/raw.tsv
"""
import collections
import csv
import statistics
import sys


def size(b):
    b = int(b)
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}iB"
    return f"{b} B"


def main(path):
    runs = collections.defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f, delimiter="\t"):
            runs[(row["load"], int(row["np"]), int(row["bytes"]), row["impl"])].append(float(row["time_us"]))
    print("| load | ranks | size | impl | launches | median µs | best | worst | p10–p90 | beyond 2× median |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (load, np, b, impl), ts in sorted(runs.items(), key=lambda kv: (kv[0][0] != "quiet", kv[0][1], kv[0][2], kv[0][3])):
        ts.sort()
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=10) if len(ts) >= 2 else [ts[0]] * 9
        beyond = sum(t > 2 * med for t in ts)
        print(f"| {load} | {np} | {size(b)} | {impl} | {len(ts)} | {med:.2f} | {ts[0]:.2f} | {ts[-1]:.2f} "
              f"| {q[0]:.2f}–{q[-1]:.2f} | **{beyond}** |")


if __name__ == "__main__":
    main(sys.argv[1])
