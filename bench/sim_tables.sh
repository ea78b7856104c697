#!/usr/bin/env bash
# Simulator tables (docs/PERFORMANCE.md, "The simulator itself"): for each topology and
# rank count, which all-reduce algorithm the simulator finds fastest at 1 KiB, 1 MiB and
# 1 GiB per rank, its bus bandwidth, and the wall time of the simulations.
#
#   bash bench/sim_tables.sh                  # 64, 256, 1024, 4096 ranks, every algorithm
#   RANKS="64 256" bash bench/sim_tables.sh
#   ALGOS_4096=rabenseifner,recursive_doubling,dbtree,reduce_broadcast bash bench/sim_tables.sh
#
# One rank per host; every algorithm runs on its own, stopped after LIMIT seconds (then the
# table says so; `xccl sim` itself skips algorithms beyond its fluid budget: `direct` from 256
# ranks, whose n(n-1) flows are in flight at once). The wall time is the sum over the
# algorithms. Uses the release binary (cargo build --release -p xccl-cli).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/xccl}
RANKS=${RANKS:-"64 256 1024 4096"}
SIZES=${SIZES:-1K,1M,1G}
ALGOS=${ALGOS:-all}
ALGOS_4096=${ALGOS_4096:-$ALGOS}
TOPOS=${TOPOS:-"ring torus2d torus3d hypercube fat-tree dragonfly dragonfly+"}
LIMIT=${LIMIT:-60}   # seconds per simulation (one algorithm, all sizes)
OUT=${OUT:-$(mktemp -d)}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p xccl-cli" >&2; exit 1; }

spec() { # topology name, ranks -> spec
  local t=$1 n=$2
  case $t in
    torus2d) echo torus ;;
    torus3d) case $n in 64) echo torus:dims=4x4x4 ;; 256) echo torus:dims=4x8x8 ;;
               1024) echo torus:dims=8x8x16 ;; 4096) echo torus:dims=16x16x16 ;;
               *) echo "no 3-d torus for $n" >&2; return 1 ;; esac ;;
    fat-tree) echo fat-tree:over=2 ;;
    dragonfly) if [ "$n" -le 1024 ]; then echo dragonfly:a=8,p=4,h=4; else echo dragonfly:a=16,p=8,h=8; fi ;;
    dragonfly+) if [ "$n" -le 1024 ]; then echo dragonfly+:leaves=8,spines=8,p=8,h=4; else echo dragonfly+:leaves=16,spines=16,p=16,h=8; fi ;;
    *) echo "$t" ;;
  esac
}

echo "| topology | ranks | 1 KiB: best (busbw GB/s) | 1 MiB: best (busbw GB/s) | 1 GiB: best (busbw GB/s) | slowest simulation | wall time (s) | not simulated |"
echo "|---|---|---|---|---|---|---|---|"
for t in $TOPOS; do
  for n in $RANKS; do
    s=$(spec "$t" "$n")
    algos=$ALGOS; [ "$n" -ge 4096 ] && algos=$ALGOS_4096
    log="$OUT/$t-$n.txt"
    start=$(date +%s.%N)
    if [ "$algos" = all ]; then
      algos=ring,rabenseifner,recursive_doubling,direct,hierarchical,dbtree,reduce_broadcast
    fi
    : >"$log"
    for a in ${algos//,/ }; do
      timeout "$LIMIT" "$BIN" sim --topology "$s" --hosts "$n" --sizes "$SIZES" --algo "$a" --pick never \
        >>"$log" 2>&1 || echo "  - $a over ${LIMIT} s (stopped)" >>"$log"
    done
    end=$(date +%s.%N)
    python3 - "$log" "$t" "$n" "$start" "$end" <<'PY'
import sys
log, topo, n, start, end = sys.argv[1:]
rows, skipped, name = [], set(), topo
for line in open(log):
    if line.startswith("# xccl sim:"):
        name = line.split(" on ", 1)[1].split(" (")[0]
    if not line.startswith("  "):
        continue
    f = line.split()
    if f[0] == "-":
        skipped.add(" ".join(f[1:]))
    elif len(f) >= 6 and f[2].replace(".", "").isdigit():
        rows.append((int(f[0]), f[1], float(f[2]), float(f[4]), float(f[5])))
    else:
        skipped.add(f[1] + " skipped (fluid budget)")
cells = []
for size in sorted({r[0] for r in rows}):
    here = [r for r in rows if r[0] == size]
    b = min(here, key=lambda r: r[2])
    cells.append(f"{b[1]} ({b[3]:.3g})")
slow = max(rows, key=lambda r: r[4]) if rows else None
slowest = f"{slow[1]} at {slow[0] >> 10} KiB: {slow[4]:.2f} s" if slow else "-"
missing = ", ".join(sorted(skipped)) or "-"
while len(cells) < 3:
    cells.append("-")
print(f"| {name} | {n} | {' | '.join(cells)} | {slowest} | {float(end) - float(start):.1f} | {missing} |")
PY
  done
done
echo "logs: $OUT" >&2
