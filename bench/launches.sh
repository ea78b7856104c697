#!/usr/bin/env bash
# Launch to launch: starts the same small job many times and reports, per rank count, size and
# setting, the distribution of its figure across launches (median, worst, and how many launches
# lie beyond 2x the median). A job that can start in a slow state shows up here and nowhere
# else: every launch of `xccl bench` averages over its own iterations.
#
#   bash bench/launches.sh [LAUNCHES]              (default 50)
#   NPS="2" SIZES=8 LOADS=quiet bash bench/launches.sh 20
#   BEFORE=/path/to/old/xccl bash bench/launches.sh 50   (an older build too, launch for launch
#                                                       interleaved with this one)
#   WINDOW=0.1 bash bench/launches.sh 50           (each launch times each size for about 0.1 s
#                                                       instead of ITERS runs: its state, which a
#                                                       burst of another thread does not change)
#
# Each launch is `xccl run -n NP -- xccl bench all_reduce --sizes SIZES -n ITERS -w WARMUP`, its
# figure the time column of rank 0 (with WINDOW, `--target-sec WINDOW` instead of `-n ITERS`,
# at most 20000 runs, and `-t WINDOW` for Open MPI's harness). At 8 bytes, 100 runs last
# 30-700 µs: one burst of another thread (a kernel thread, a daemon) of a millisecond doubles
# such a launch's figure without the job being in a slow state. LOADS: "quiet" (nothing else runs) and "busy" (one
# CPU-bound process runs beside the job for the whole series). With the peers installed
# (../shared/bench/peers/install_peers.sh) Open MPI's benchmark is launched the same way, for
# reference. Raw rows go to $OUT/raw.tsv, the summary to $OUT/summary.md.
set -euo pipefail
LAUNCHES="${1:-50}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
OUT="${OUT:-$REPO/target/bench/launches}"
NPS="${NPS:-2 4}"
SIZES="${SIZES:-8,1K,1M}"
ITERS="${ITERS:-100}"
WARMUP="${WARMUP:-10}"
WINDOW="${WINDOW:-}"
LOADS="${LOADS:-quiet busy}"
XCCL="$REPO/target/release/xccl"

cargo build --release --manifest-path "$REPO/Cargo.toml" -p xccl-cli >/dev/null
mkdir -p "$OUT"
OMPI=""
if command -v mpicc >/dev/null && [ -e "$PEERS/mpi_coll.c" ]; then
  OMPI="$OUT/mpi_coll_ompi"
  mpicc -O2 -o "$OMPI" "$PEERS/mpi_coll.c"
fi
{
  echo "date: $(date -Is)"; uname -a; lscpu | grep -E "Model name|^CPU\(s\)"
  "$XCCL" --version; [ -n "$OMPI" ] && mpirun --version | head -1
  echo "launches=$LAUNCHES nps=$NPS sizes=$SIZES iters=$ITERS window=$WINDOW warmup=$WARMUP loads=$LOADS before=${BEFORE:-}"
} > "$OUT/env.txt" 2>&1

RAW="$OUT/raw.tsv"
printf "impl\tload\tnp\tlaunch\tbytes\ttime_us\n" > "$RAW"
# Rows "bytes time" of rank 0, from a run in the peers' row format.
rows() { sed -n 's/^\[0\] //p' | awk '$1 ~ /^[0-9]+$/ {print $1, $5}'; }
if [ -n "$WINDOW" ]; then
  XCCL_RUNS=(--target-sec "$WINDOW"); OMPI_RUNS=(-t "$WINDOW" -m 3 -M 20000)
else
  XCCL_RUNS=(-n "$ITERS"); OMPI_RUNS=(-m "$ITERS" -M "$ITERS")
fi
one() { # IMPL LOAD NP LAUNCH
  local impl="$1" load="$2" np="$3" i="$4" bin
  case "$impl" in
    xccl) bin="$XCCL" ;;
    before) bin="$BEFORE" ;;
  esac
  if [ "$impl" = ompi ]; then
    mpirun --allow-run-as-root --oversubscribe -np "$np" "$OMPI" -s "$SIZES" -o allreduce "${OMPI_RUNS[@]}" -w "$WARMUP" -W 0 2>/dev/null \
      | awk '$1 ~ /^[0-9]+$/ {print $1, $5}'
  else
    "$bin" run -n "$np" -- "$bin" bench all_reduce --sizes "$SIZES" "${XCCL_RUNS[@]}" -w "$WARMUP" --peer-format 2>&1 | rows
  fi | while read -r bytes t; do printf "%s\t%s\t%s\t%s\t%s\t%s\n" "$impl" "$load" "$np" "$i" "$bytes" "$t"; done >> "$RAW"
}

IMPLS="xccl"
[ -n "${BEFORE:-}" ] && IMPLS="$IMPLS before"
[ -n "$OMPI" ] && IMPLS="$IMPLS ompi"
for load in $LOADS; do
  hog=""
  if [ "$load" = busy ]; then
    sh -c 'while :; do :; done' & hog=$!
  fi
  for np in $NPS; do
    echo "== $load, $np ranks  $(date +%T)"
    for i in $(seq 1 "$LAUNCHES"); do
      for impl in $IMPLS; do one "$impl" "$load" "$np" "$i"; done
    done
  done
  [ -n "$hog" ] && kill "$hog"
done
python3 "$HERE/summarize_launches.py" "$RAW" > "$OUT/summary.md"
cat "$OUT/summary.md"
