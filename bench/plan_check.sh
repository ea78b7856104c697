#!/usr/bin/env bash
# The planner against measurement: `xccl plan` on a model and a number of ranks, then each
# of its TOP (5) configurations trained for real with the exact command it printed, REPS (3)
# launches each, interleaved (configuration 1..TOP, then again), and the predicted order
# compared with the measured one (bench/summarize_plan.py): the planner's first within 10%
# of the fastest measured of the five, and every pair whose measured medians differ by more
# than 15% in the predicted order.
#
#   bash bench/plan_check.sh [REPS]
#   RANKS=4 MODEL="--width 128 --layers 4 --heads 4 --batch 32" bash bench/plan_check.sh 3
#   sudo HOSTS=2 RANKS=4 bash bench/plan_check.sh 3     (on the emulated cluster, below)
#
# MODEL: xccl train's model, data and batch flags (default a 128-wide, 4-layer GPT on the
# addition task, batch 32); RANKS (2); STEPS (20) per training run (its summary's
# step_seconds: the mean over each rank's steps after its first); PLAN_FLAGS: more flags
# for `xccl plan` (e.g. --mem-gib 0.05). With HOSTS=K (root): the ranks run on K emulated
# hosts of RANKS/K ranks (bench/cluster.sh, star, RATE 2gbit each way), and the planner is
# told the same network (`--hosts K --topology star:bw=RATE_GBIT,lat=0`; PLAN_NET
# overrides it). Every run goes under the peers' prio_run.sh when it is there. Outputs in
# $OUT: plan.txt, run_{i}_r{rep}/ (each run's summary.json and log), summary.md.
set -euo pipefail
REPS="${1:-3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
OUT="${OUT:-$REPO/target/bench/plan_check}"
RANKS="${RANKS:-2}"
TOP="${TOP:-5}"
STEPS="${STEPS:-20}"
MODEL="${MODEL:---width 128 --layers 4 --heads 4 --batch 32 --digits 3}"
HOSTS="${HOSTS:-}"
RATE="${RATE:-2gbit}"
XCCL="${XCCL_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/xccl}"
if [ -z "${NO_BUILD:-}" ]; then (cd "$REPO" && cargo build --release -q -p xccl-cli); fi
mkdir -p "$OUT"
RUN=()
if [ -x "$PEERS/prio_run.sh" ]; then RUN=("$PEERS/prio_run.sh"); fi
NET=()
if [ -n "$HOSTS" ]; then
  [ "$(id -u)" = 0 ] || { echo "plan_check.sh: HOSTS needs root (network namespaces)" >&2; exit 2; }
  gbit=$(awk -v r="$RATE" 'BEGIN{ if (r ~ /gbit$/) print r+0; else if (r ~ /mbit$/) print (r+0)/1000; else print 0 }')
  read -r -a NET <<< "${PLAN_NET:---hosts $HOSTS --topology star:bw=$gbit,lat=0}"
fi
read -r -a PLAN_EXTRA <<< "${PLAN_FLAGS:-}"
read -r -a MODEL_FLAGS <<< "$MODEL"
"${RUN[@]}" "$XCCL" plan "${MODEL_FLAGS[@]}" --ranks "$RANKS" --top "$TOP" "${NET[@]}" "${PLAN_EXTRA[@]}" \
  | tee "$OUT/plan.txt"
mapfile -t CMDS < <(grep '^xccl train ' "$OUT/plan.txt" | sed 's/^xccl //')
[ "${#CMDS[@]}" -gt 0 ] || { echo "plan_check.sh: the plan printed no command" >&2; exit 1; }
CLUSTER=""
cleanup() { if [ -n "$CLUSTER" ]; then bash "$HERE/cluster.sh" down "$CLUSTER" >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
if [ -n "$HOSTS" ]; then
  CLUSTER="pc$$"
  bash "$HERE/cluster.sh" up "$CLUSTER" --hosts "$HOSTS" --rate "$RATE" --owner $$ >/dev/null
fi
for rep in $(seq 1 "$REPS"); do
  for i in "${!CMDS[@]}"; do
    dir="$OUT/run_$((i + 1))_r$rep"
    rm -rf "$dir"
    read -r -a cmd <<< "${CMDS[$i]}"
    cmd+=(--steps "$STEPS" --out "$dir")
    echo "# rep $rep, configuration $((i + 1)): xccl ${cmd[*]}"
    if [ -n "$HOSTS" ]; then
      mkdir -p "$dir"
      "${RUN[@]}" bash "$HERE/cluster.sh" launch "$CLUSTER" --ranks-per-host $((RANKS / HOSTS)) -- \
        env XCCL_TIMEOUT=120 "$XCCL" "${cmd[@]}" > "$dir.log" 2>&1 || echo "  failed: see $dir.log"
    else
      "${RUN[@]}" "$XCCL" "${cmd[@]}" > "$dir.log" 2>&1 || echo "  failed: see $dir.log"
    fi
    rm -rf "$dir/checkpoint"
  done
done
python3 "$HERE/summarize_plan.py" "$OUT" | tee "$OUT/summary.md"
