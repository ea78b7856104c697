"""Table of bench/torch_backend.sh's results: torch.distributed.all_reduce through "xccl" and
"gloo" (same processes) and xccl's native `xccl bench`; ProcessGroupXCCL from C++; the C API
against the Rust call; DDP training on each backend.

    python3 bench/summarize_torch_backend.py target/bench/torch_backend

Medians over the runs; ratios are of medians measured in the same runs.
"""

import glob
import json
import os
import statistics
import sys


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def native_rows(path):
    rows = {}
    for line in open(path):
        f = line.split()
        if f and f[0].startswith("["):  # `xccl run` prefixes each line with its rank
            f = f[1:]
        if len(f) >= 8 and f[0].isdigit():
            rows[int(f[0])] = {"us": float(f[5]), "busbw": float(f[7])}
    return rows


def spread(xs, fmt="{:.3f}"):
    """median (min-max, n) of xs."""
    if not xs:
        return "-"
    return f"{fmt.format(median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))}, n={len(xs)})"


def latencies(out):
    """The 8 B figures: the Rust call (`xccl bench`), the C API, c10d from C++, one per launch."""
    rust, capi, c10d = [], [], {}
    for path in sorted(glob.glob(os.path.join(out, "rust_8B_*.txt"))):
        rust += [r["us"] for r in [native_rows_one(line) for line in open(path)] if r]
    for path in sorted(glob.glob(os.path.join(out, "capi_8B_*.txt"))):
        capi += [float(line.split()[-2]) for line in open(path) if "capi all_reduce" in line]
    for path in sorted(glob.glob(os.path.join(out, "c10d_*.txt"))):
        for line in open(path):
            if line.split()[1:2] and "c10d" in line:
                f = line.split()
                f = f[1:] if f[0].startswith("[") else f
                c10d.setdefault(f[1], []).append(float(f[-2]))
    floor = {}
    for path in sorted(glob.glob(os.path.join(out, "floor_*.txt"))):
        for line in open(path):
            if line.startswith("floor "):
                what, rest = line[len("floor ") :].split(":", 1)
                floor.setdefault(what, []).append(float(rest.split()[0]))
    if not (rust or capi or c10d):
        return
    print("| 8 B all-reduce, 2 ranks | µs: median (min-max, launches) |")
    print("|---|---|")
    print(f"| Rust `Communicator::all_reduce_into` (`xccl bench`) | {spread(rust)} |")
    print(f"| C API `xcclAllReduce` | {spread(capi)} |")
    for mode, xs in sorted(c10d.items()):
        print(f"| c10d `ProcessGroupXCCL::allreduce` from C++ ({mode}) | {spread(xs)} |")
    for what, xs in sorted(floor.items()):
        print(f"| 1 rank (no communication): `{what}` | {spread(xs)} |")
    if rust and capi:
        print(f"\nC API / Rust (medians): {median(capi) / median(rust):.3f}")
    print()


def native_rows_one(line):
    f = line.split()
    if f and f[0].startswith("["):
        f = f[1:]
    if len(f) >= 8 and f[0].isdigit():
        return {"bytes": int(f[0]), "us": float(f[5])}
    return None


def main(out):
    latencies(out)
    coll = {}
    for path in sorted(glob.glob(os.path.join(out, "collectives_*.json"))):
        for r in json.load(open(path))["rows"]:
            coll.setdefault((r["bytes"], r["backend"]), []).append(r)
    native = {}
    for path in sorted(glob.glob(os.path.join(out, "native_*.txt"))):
        for size, r in native_rows(path).items():
            native.setdefault(size, []).append(r)
    sizes = sorted({b for b, _ in coll})
    print("| size | gloo µs | xccl µs | gloo busbw GB/s | xccl busbw GB/s | xccl / gloo | native xccl bench busbw | torch-xccl / native |")
    print("|---|---|---|---|---|---|---|---|")
    for size in sizes:
        g = coll.get((size, "gloo"), [])
        x = coll.get((size, "xccl"), [])
        gus, xus = median([r["us"] for r in g]), median([r["us"] for r in x])
        gbw, xbw = median([r["busbw_GBps"] for r in g]), median([r["busbw_GBps"] for r in x])
        nbw = median([r["busbw"] for r in native.get(size, [])])
        def ratio(a, b, fmt):
            return fmt.format(a / b) if b else "-"

        print(
            f"| {size} B | {gus:.1f} | {xus:.1f} | {gbw:.3f} | {xbw:.3f} | {ratio(gus, xus, '{:.1f}x faster')} "
            f"| {nbw:.3f} | {ratio(xbw, nbw, '{:.0%}')} |"
        )
    ddp = {}
    for path in sorted(glob.glob(os.path.join(out, "ddp_*.json"))):
        r = json.load(open(path))
        ddp.setdefault(r["framework"].split()[-1], []).append(r)
    if ddp:
        print()
        print("| DDP backend | step ms | no_sync step ms | exposed comm ms | exposed share | runs |")
        print("|---|---|---|---|---|---|")
        for backend, rs in sorted(ddp.items()):
            print(
                f"| {backend} | {median([r['step_ms'] for r in rs]):.2f} | {median([r['step_no_sync_ms'] for r in rs]):.2f} "
                f"| {median([r['exposed_ms'] for r in rs]):.2f} | {median([r['exposed_share'] for r in rs]):.1%} | {len(rs)} |"
            )
        if "gloo" in ddp and "xccl" in ddp:
            ratio = median([r["step_ms"] for r in ddp["xccl"]]) / median([r["step_ms"] for r in ddp["gloo"]])
            print(f"\nDDP step time xccl / gloo: {ratio:.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/bench/torch_backend")
