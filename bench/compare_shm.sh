#!/usr/bin/env bash
# Side by side on one host: xccl (shared memory) against Open MPI, MPICH and PyTorch gloo, for
# all-reduce, all-gather, reduce-scatter, broadcast and all-to-all, interleaved, plus the
# single-thread memcpy anchor; then the tables and the issue's targets as ratios.
#
#   bash bench/compare_shm.sh [REPS]                    (default 3 repetitions)
#   OUT=/tmp/x NPS="2" SIZES=8,1M,64M bash bench/compare_shm.sh 1
#   BEFORE=/path/to/old/xccl bash bench/compare_shm.sh 5  (also an older build, interleaved:
#                                                       the summary compares the two row by row
#                                                       against the noise band measured, the
#                                                       all-reduce also in place and on 2 MiB
#                                                       pages)
#
# The 64 MiB all-reduce is also run on 2 MiB pages (HUGE_SIZES, empty for none): xccl on its HostBuffers
# (`--huge-pages`), and, where this script may set the system's transparent-huge-page mode
# (root), Open MPI with THP=always, so that both copy out of huge pages; the mode is put back.
# xccl's other rows ("heap") run under `xccl run`, whose ranks allocate with glibc's
# `glibc.malloc.hugetlb=1` (README, XCCL_MALLOC_HUGE_PAGES): large `Vec`s lie on transparent
# huge pages there too, as NumPy arrays do. XCCL_MALLOC_HUGE_PAGES=0 in the environment of
# this script measures glibc's default malloc instead; an older build (BEFORE) started by its
# own launcher keeps the malloc that launcher gave.
#
# TUNE_PULL=1: before the first repetition of each rank count, `xccl tune pull` measures
# from which message length this machine should pull (written to $OUT/pull_nN.tune), and
# this build's rows run with XCCL_TUNE_FILE set to it; BEFORE rows run without any
# XCCL_TUNE_FILE (BEFORE may be this same build, to compare tuned against built-in).
#
# Needs the peers (../shared/bench/peers/install_peers.sh: Open MPI, MPICH, a venv with torch
# in /tmp/peers-venv). Every command runs under the peers' prio_run.sh (own scheduler
# autogroup, nice -10), as the peer baselines were measured. Raw outputs go to $OUT (one file
# per implementation, rank count and repetition, in the peers' row format), the summary to
# $OUT/summary.md.
set -euo pipefail
REPS="${1:-3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
PY="${PY:-/tmp/peers-venv/bin/python}"
OUT="${OUT:-$REPO/target/bench/compare_shm}"
NPS="${NPS:-2 4}"
SIZES="${SIZES:-8,1K,64K,1M,16M,64M}"
TARGET_SEC="${TARGET_SEC:-0.3}"
# The most timed runs of a row, for every implementation: enough that the small sizes are
# timed for TARGET_SEC too (at 20000, the harnesses' default, an 8-byte row lasts 10-20 ms).
MAX_ITERS="${MAX_ITERS:-2000000}"
PRIO="$PEERS/prio_run.sh"
XCCL="$REPO/target/release/xccl"
COLLS="all_reduce all_gather reduce_scatter broadcast all_to_all"
HUGE_SIZES="${HUGE_SIZES-64M}"  # HUGE_SIZES= (empty): no rows on 2 MiB pages
THP=/sys/kernel/mm/transparent_hugepage/enabled
THP_WAS="$(sed 's/.*\[\(.*\)\].*/\1/' "$THP" 2>/dev/null || true)"
restore_thp() { if [ -w "$THP" ] && [ -n "$THP_WAS" ]; then echo "$THP_WAS" > "$THP"; fi; }
trap restore_thp EXIT

for need in "$PRIO" "$PY" "$(command -v mpicc || true)" "$(command -v mpicc.mpich || true)"; do
  [ -n "$need" ] && [ -e "$need" ] || { echo "missing $need: run $PEERS/install_peers.sh first" >&2; exit 1; }
done
cargo build --release --manifest-path "$REPO/Cargo.toml" -p xccl-cli >/dev/null
BIN="$OUT/bin"
mkdir -p "$OUT" "$BIN"
gcc -O3 -march=native -pthread -o "$BIN/memcpy_bw" "$PEERS/memcpy_bw.c"
mpicc -O2 -o "$BIN/mpi_coll_ompi" "$PEERS/mpi_coll.c"
mpicc.mpich -O2 -o "$BIN/mpi_coll_mpich" "$PEERS/mpi_coll.c"
{
  echo "date: $(date -Is)"; uname -a; lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"
  "$XCCL" --version; mpirun --version | head -1; mpirun.mpich --version | grep -i "version" | head -1
  "$PY" -c 'import torch; print("torch", torch.__version__)'
} > "$OUT/env.txt" 2>&1

# One file per xccl run, in the peers' format: rank 0's lines without the launcher's prefix.
# XENV: the environment of the run (set per build below).
XENV=(env)
xccl_all() { # FILE NP [BENCH FLAGS...]
  local file="$1" np="$2" most=(); shift 2
  # Builds from before `--max-iters` stop at 20000 runs.
  if "$XCCL" bench --help 2>/dev/null | grep -q -- --max-iters; then most=(--max-iters "$MAX_ITERS"); fi
  : > "$file"
  for c in $COLLS; do
    "${XENV[@]}" "$PRIO" "$XCCL" run -n "$np" -- "$XCCL" bench "$c" --sizes "$SIZES" --target-sec "$TARGET_SEC" --peer-format "${most[@]}" "$@" \
      2>&1 | sed -n 's/^\[0\] //p' >> "$file"
  done
}
# This build's environment for NP ranks: its measured pull thresholds with TUNE_PULL=1.
tuned() { # NP
  if [ "${TUNE_PULL:-0}" = 1 ]; then
    if [ ! -s "$OUT/pull_n$1.tune" ]; then
      "$PRIO" "$XCCL" run -n "$1" -- "$XCCL" tune pull -o "$OUT/pull_n$1.tune" > "$OUT/pull_n$1.txt" 2>&1
    fi
    XENV=(env "XCCL_TUNE_FILE=$OUT/pull_n$1.tune")
  else
    XENV=(env)
  fi
}
# Runs "$@" as the older build: BEFORE, without any tuning file.
before() {
  XENV=(env -u XCCL_TUNE_FILE); XCCL="$BEFORE" "$@"
}
rm -f "$OUT"/pull_n*.tune

for rep in $(seq 1 "$REPS"); do
  echo "== repetition $rep  $(date +%T)"
  "$PRIO" "$BIN/memcpy_bw" 256M 1.0 > "$OUT/memcpy_r$rep.txt" 2>&1
  for np in $NPS; do
    "$PRIO" "$PY" "$PEERS/gloo_allreduce.py" -n "$np" --sizes "$SIZES" --target-sec "$TARGET_SEC" \
      > "$OUT/gloo_n${np}_r$rep.txt" 2>&1
    "$PRIO" mpirun --allow-run-as-root --oversubscribe -np "$np" "$BIN/mpi_coll_ompi" -s "$SIZES" -t "$TARGET_SEC" -M "$MAX_ITERS" \
      > "$OUT/ompi_n${np}_r$rep.txt" 2>&1
    "$PRIO" mpirun.mpich -np "$np" "$BIN/mpi_coll_mpich" -s "$SIZES" -t "$TARGET_SEC" -M "$MAX_ITERS" \
      > "$OUT/mpich_n${np}_r$rep.txt" 2>&1
    # With an older build, the two take turns going first.
    if [ -n "${BEFORE:-}" ] && [ $((rep % 2)) -eq 1 ]; then
      before xccl_all "$OUT/before_n${np}_r$rep.txt" "$np"
    fi
    tuned "$np"
    xccl_all "$OUT/xccl_n${np}_r$rep.txt" "$np"
    if [ -n "${BEFORE:-}" ] && [ $((rep % 2)) -eq 0 ]; then
      before xccl_all "$OUT/before_n${np}_r$rep.txt" "$np"
    fi
    # The all-reduce's other forms, each of both builds in turn (the older first in odd
    # repetitions).
    forms() { # PREFIX
      COLLS=all_reduce xccl_all "$OUT/${1}inplace_n${np}_r$rep.txt" "$np" --inplace
      if [ -n "$HUGE_SIZES" ]; then
        SIZES="$HUGE_SIZES" COLLS=all_reduce xccl_all "$OUT/${1}huge_n${np}_r$rep.txt" "$np" --huge-pages
        SIZES="$HUGE_SIZES" COLLS=all_reduce xccl_all "$OUT/${1}hugeinplace_n${np}_r$rep.txt" "$np" --huge-pages --inplace
      fi
    }
    if [ -n "${BEFORE:-}" ] && [ $((rep % 2)) -eq 1 ]; then before forms before; fi
    tuned "$np"
    forms xccl
    if [ -n "${BEFORE:-}" ] && [ $((rep % 2)) -eq 0 ]; then before forms before; fi
    if [ -n "$HUGE_SIZES" ]; then
      if [ -w "$THP" ]; then
        echo always > "$THP"
        "$PRIO" mpirun --allow-run-as-root --oversubscribe -np "$np" "$BIN/mpi_coll_ompi" -s "$HUGE_SIZES" \
          -o allreduce -t "$TARGET_SEC" > "$OUT/ompihuge_n${np}_r$rep.txt" 2>&1
        restore_thp
      fi
    fi
  done
done
python3 "$HERE/summarize_shm.py" "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
