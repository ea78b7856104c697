"""Summarises bench/launches.sh: per implementation, load, rank count, collective and size, the
launches' median, best and worst time, the spread between the 10th and 90th percentiles, and
how many launches lie beyond 2x the median (the target: none).

Where the launches were probed (columns lat_before_ns and lat_after_ns: a cache line's round
trip between two cores just before and just after the launch, bench/native/core_latency.c),
each launch is also put in the machine's state: *slow* when both probes read at least
`SLOW` times the file's 10th percentile of probes, *fast* when both read less, *changed*
otherwise. The last columns count the launches made in the slow state and, among the fast
and slow ones, those beyond 2x the median of the launches of their own state: a launch slow
for the job's own reasons rather than the machine's.

Where xccl and Open MPI ran the same row, a second table sets them against each other launch
by launch: launch i of one beside launch i of the other (made one right after the other),
the ratio of their times, per machine state (both launches fast, both slow, or all pairs),
with its median and the 90% confidence interval of that median (the noise band: a row is
slower than Open MPI's only where the whole interval lies above 1).

    python3 bench/summarize_launches.py target/bench/launches/raw.tsv
"""
import collections
import csv
import math
import statistics
import sys

# A state is slow from this multiple of the usual round trip (this project's AMD EPYC guest:
# about 70 ns and 350 ns; on a machine that keeps its cores, every probe is fast).
SLOW = 2.5

# Fewer pairs than this give no confidence interval of their median (a 90% one needs six).
FEWEST = 6


def size(b):
    b = int(b)
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}iB"
    return f"{b} B"


def beyond(ts):
    """Launches beyond 2x the median of `ts`."""
    if not ts:
        return 0
    med = statistics.median(ts)
    return sum(t > 2 * med for t in ts)


def probes(row):
    """The launch's two probes in ns, or None where it was not probed."""
    try:
        return float(row["lat_before_ns"]), float(row["lat_after_ns"])
    except (KeyError, TypeError, ValueError):
        return None


def median_band(xs):
    """The median of `xs` and the 90% confidence interval of it (order statistics)."""
    xs = sorted(xs)
    n = len(xs)
    half = 1.645 * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    return statistics.median(xs), xs[lo], xs[hi]


def state_of(row, limit):
    p = probes(row)
    if not p or not limit:
        return None
    return "slow" if min(p) >= limit else "fast" if max(p) < limit else "changed"


def main(path):
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    lats = sorted(x for r in rows if probes(r) for x in probes(r))
    limit = SLOW * statistics.quantiles(lats, n=10)[0] if len(lats) >= 2 else None
    runs = collections.defaultdict(list)
    by_launch = collections.defaultdict(dict)
    for row in rows:
        state = state_of(row, limit)
        row_key = (row["load"], int(row["np"]), row.get("coll", "all_reduce"), int(row["bytes"]))
        runs[row_key + (row["impl"],)].append((float(row["time_us"]), state))
        by_launch[row_key][(row["impl"], row["launch"])] = (float(row["time_us"]), state)
    if limit:
        print(f"Machine state from the probes: slow from {limit:.0f} ns "
              f"({SLOW}x the 10th percentile, {len(lats)} probes, median {statistics.median(lats):.0f} ns).\n")
    print("| load | ranks | collective | size | impl | launches | median µs | best | worst | p10–p90 "
          "| beyond 2× median | slow state / changed | beyond 2× its state's median |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    order = lambda k: (k[0] != "quiet",) + tuple(k[1:])  # noqa: E731
    for key in sorted(runs, key=order):
        load, np, coll, b, impl = key
        launches = runs[key]
        ts = sorted(t for t, _ in launches)
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=10, method="inclusive") if len(ts) >= 2 else [ts[0]] * 9
        states = collections.defaultdict(list)
        for t, s in launches:
            states[s].append(t)
        if None in states:
            state_cols = "– | –"
        else:
            fast, slow = states["fast"], states["slow"]
            slow_med = f" (median {statistics.median(slow):.2f})" if slow else ""
            state_cols = (f"{len(slow)}{slow_med} / {len(states['changed'])} "
                          f"| **{beyond(fast) + beyond(slow)}** of {len(fast) + len(slow)}")
        print(f"| {load} | {np} | {coll} | {size(b)} | {impl} | {len(ts)} | {med:.2f} | {ts[0]:.2f} | {ts[-1]:.2f} "
              f"| {q[0]:.2f}–{q[-1]:.2f} | **{beyond(ts)}** | {state_cols} |")
    pairs_table(by_launch)


def pairs_table(by_launch):
    """xccl against Open MPI, launch by launch, per machine state."""
    lines = []
    for key in sorted(by_launch, key=lambda k: (k[0] != "quiet",) + tuple(k[1:])):
        got = by_launch[key]
        pairs = collections.defaultdict(list)
        for (impl, i), (t, s) in got.items():
            if impl != "xccl" or ("ompi", i) not in got:
                continue
            t2, s2 = got[("ompi", i)]
            ratio = t / t2
            pairs["all"].append(ratio)
            if s is not None and s == s2 and s != "changed":
                pairs[s].append(ratio)
        if not pairs["all"]:
            continue
        cells = []
        for state in ("fast", "slow", "all"):
            xs = pairs[state]
            if not xs:
                cells.append("–")
                continue
            if len(xs) < FEWEST:
                cells.append(f"{statistics.median(xs):.2f} (range {min(xs):.2f}–{max(xs):.2f}, {len(xs)})")
                continue
            m, lo, hi = median_band(xs)
            mark = "**" if hi <= 1.0 else ""
            slower = " ✗" if lo > 1.0 else ""
            cells.append(f"{mark}{m:.2f}{mark} ({lo:.2f}–{hi:.2f}, {len(xs)}){slower}")
        load, np, coll, b = key
        lines.append(f"| {load} | {np} | {coll} | {size(b)} | " + " | ".join(cells) + " |")
    if lines:
        print("\nxccl's time over Open MPI's, launch by launch: median (90% confidence interval of the "
              "median, pairs); bold where the interval lies at or below 1, ✗ where it lies above 1 (xccl "
              "slower beyond the noise).\n")
        print("| load | ranks | collective | size | both fast | both slow | all pairs |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
