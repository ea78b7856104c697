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
#   COLLS="all_reduce broadcast" SIZES=8,64K WINDOW=0.1 bash bench/launches.sh 20
#                                                  (other collectives: every row against Open
#                                                   MPI's, launch by launch, in the same state)
#   XFLAGS="--page-offsets 16" bash bench/launches.sh 20
#                                                  (more flags for xccl's bench: here its buffers
#                                                   placed as Open MPI's harness places its own)
#   WINDOW=0.1 bash bench/launches.sh 50           (each size's runs fixed for the series so that
#                                                       a launch times it for about 0.1 s: its state,
#                                                       which a burst of another thread does not
#                                                       change)
#
# Each launch is `xccl run -n NP -- xccl bench COLL --sizes SIZES -n ITERS -w WARMUP` (COLLS:
# all_reduce unless set), its figure the time column of rank 0. At 8 bytes, 100 runs last 30-700 µs: one burst of another
# thread (a kernel thread, a daemon) of a millisecond doubles such a launch's figure without the
# job being in a slow state. With WINDOW, each size gets launches of its own, every one with the
# same number of runs, set per implementation, load and rank count before its series by three
# calibration launches (`--target-sec WINDOW` for xccl, `-t WINDOW` for Open MPI's harness):
# WINDOW over the median of their times. Launch figures are then averages over the same work,
# and a job that stays slow doubles its figure while a start-up transient of a few milliseconds
# does not. (A count each launch sets for itself from its first runs gave windows of 1-5 ms to
# launches whose first runs were slow, and then counted a start-up transient as a slow launch:
# Open MPI's harness sets its count that way.) LOADS: "quiet" (nothing else runs) and "busy"
# (one CPU-bound process runs beside the job for the whole series). With the peers installed
# (../shared/bench/peers/install_peers.sh) Open MPI's benchmark is launched the same way, for
# reference. Raw rows go to $OUT/raw.tsv, the counts to $OUT/iters.tsv, the summary to
# $OUT/summary.md.
#
# The machine's state: around every launch, bench/native/core_latency.c times a cache line's
# round trip between cores 0 and 1 for 30 ms (columns lat_before_ns and lat_after_ns). On a
# virtual machine whose host moves its vCPUs this round trip changes for seconds at a time
# (about 70 ns, then 350 ns, on this project's AMD EPYC guest), and every implementation's
# shared-memory time with it. The summary then also counts, per state, the launches beyond
# 2x the median of the launches made in that state: a launch that is slow while the machine
# is not is the job's own slow start.
set -euo pipefail
LAUNCHES="${1:-50}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
OUT="${OUT:-$REPO/target/bench/launches}"
NPS="${NPS:-2 4}"
SIZES="${SIZES:-8,1K,1M}"
COLLS="${COLLS:-all_reduce}"
read -r -a XFLAGS <<<"${XFLAGS:-}"
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
  echo "launches=$LAUNCHES nps=$NPS colls=$COLLS xflags=${XFLAGS[*]} sizes=$SIZES iters=$ITERS window=$WINDOW warmup=$WARMUP loads=$LOADS before=${BEFORE:-}"
} > "$OUT/env.txt" 2>&1

RAW="$OUT/raw.tsv"
ITERS_TSV="$OUT/iters.tsv"
printf "impl\tload\tnp\tcoll\tlaunch\tbytes\ttime_us\tlat_before_ns\tlat_after_ns\n" > "$RAW"
# The machine's state before and after each launch (empty where it cannot be probed).
PROBE=""
if [ "$(nproc)" -ge 2 ] && command -v cc >/dev/null; then
  PROBE="$OUT/core_latency"
  cc -O2 -pthread -o "$PROBE" "$HERE/native/core_latency.c"
fi
# A probe that cannot run (cores 0 and 1 not this job's to use) leaves the columns empty.
probe() { if [ -n "$PROBE" ]; then "$PROBE" 30 2>/dev/null || true; fi; }
printf "impl\tload\tnp\tcoll\tbytes\titers\n" > "$ITERS_TSV"
# Rows "bytes time iters" of rank 0, from a run in the peers' row format.
rows() { sed -n 's/^\[0\] //p' | awk '$1 ~ /^[0-9]+$/ {print $1, $5, $10}'; }
# Open MPI's harness's name of collective COLL.
ompi_op() {
  case "$1" in
    all_reduce) echo allreduce ;; all_gather) echo allgather ;; broadcast) echo bcast ;;
    all_to_all) echo alltoall ;; *) echo "$1" ;;
  esac
}
# One launch: IMPL NP COLL SIZES RUNS... (RUNS: the flags that set the number of runs); prints
# rows.
launch() {
  local impl="$1" np="$2" coll="$3" sizes="$4" bin; shift 4
  case "$impl" in
    xccl) bin="$XCCL" ;;
    before) bin="$BEFORE" ;;
  esac
  if [ "$impl" = ompi ]; then
    # -W: Open MPI's harness runs its -w warm-up runs only within -W seconds.
    mpirun --allow-run-as-root --oversubscribe -np "$np" "$OMPI" -s "$sizes" -o "$(ompi_op "$coll")" "$@" -w "$WARMUP" -W 10 2>/dev/null \
      | awk '$1 ~ /^[0-9]+$/ {print $1, $5, $10}'
  else
    "$bin" run -n "$np" -- "$bin" bench "$coll" --sizes "$sizes" "$@" "${XFLAGS[@]}" -w "$WARMUP" --peer-format 2>&1 | rows
  fi
}
record() { # IMPL LOAD NP COLL LAUNCH LAT_BEFORE LAT_AFTER < rows
  while read -r bytes t _; do
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$1" "$2" "$3" "$4" "$5" "$bytes" "$t" "$6" "$7"
  done >> "$RAW"
}
# One launch (IMPL NP COLL SIZES RUNS...) recorded with the machine's state around it (LOAD
# and LAUNCH for the record come first).
probed() {
  local load="$1" i="$2" impl="$3" np="$4" coll="$5" before rows; shift 2
  before="$(probe)"
  rows="$(launch "$@")"
  if [ -n "$rows" ]; then record "$impl" "$load" "$np" "$coll" "$i" "$before" "$(probe)" <<<"$rows"; fi
}
# The number of runs that lasts about WINDOW seconds: WINDOW over the median time of three
# launches that set their own count (at most 20000 runs each). IMPL NP COLL SIZE
calibrated() {
  local impl="$1" np="$2" coll="$3" size="$4" runs
  if [ "$impl" = ompi ]; then runs=(-t "$WINDOW" -m 3 -M 20000); else runs=(--target-sec "$WINDOW"); fi
  for _ in 1 2 3; do launch "$impl" "$np" "$coll" "$size" "${runs[@]}"; done | awk '{print $2}' | sort -g | sed -n 2p \
    | awk -v w="$WINDOW" '{n = int(w * 1e6 / $1); print (n < 3 ? 3 : n)}'
}

IMPLS="xccl"
[ -n "${BEFORE:-}" ] && IMPLS="$IMPLS before"
[ -n "$OMPI" ] && IMPLS="$IMPLS ompi"
# The implementations in launch I's order: the first goes last in every other launch, so that
# none always runs right after another's.
turns() {
  if [ $(($1 % 2)) -eq 1 ]; then echo "$IMPLS"; else
    local first rest; read -r first rest <<<"$IMPLS"; echo "$rest $first"
  fi
}
for load in $LOADS; do
  hog=""
  if [ "$load" = busy ]; then
    sh -c 'while :; do :; done' & hog=$!
  fi
  for np in $NPS; do
    echo "== $load, $np ranks  $(date +%T)"
    if [ -z "$WINDOW" ]; then
      for i in $(seq 1 "$LAUNCHES"); do
        for coll in $COLLS; do
          for impl in $(turns "$i"); do
            probed "$load" "$i" "$impl" "$np" "$coll" "$SIZES" -n "$ITERS"
          done
        done
      done
      continue
    fi
    declare -A count=()
    for impl in $IMPLS; do
      for coll in $COLLS; do
        for size in ${SIZES//,/ }; do
          count[$impl,$coll,$size]=$(calibrated "$impl" "$np" "$coll" "$size")
          printf "%s\t%s\t%s\t%s\t%s\t%s\n" "$impl" "$load" "$np" "$coll" "$size" \
            "${count[$impl,$coll,$size]}" >> "$ITERS_TSV"
        done
      done
    done
    for i in $(seq 1 "$LAUNCHES"); do
      for coll in $COLLS; do
        for size in ${SIZES//,/ }; do
          for impl in $(turns "$i"); do
            n="${count[$impl,$coll,$size]}"
            if [ "$impl" = ompi ]; then runs=(-m "$n" -M "$n"); else runs=(-n "$n"); fi
            probed "$load" "$i" "$impl" "$np" "$coll" "$size" "${runs[@]}"
          done
        done
      done
    done
  done
  [ -n "$hog" ] && kill "$hog"
done
python3 "$HERE/summarize_launches.py" "$RAW" > "$OUT/summary.md"
cat "$OUT/summary.md"
