#!/usr/bin/env bash
# `xccl sim train` against `xccl train`: for each mesh of issue 26's list (dp 2, pp 2, tp 2,
# ZeRO-1, dp 2 x pp 2), the predicted step beside the measured one, REPS (3) launches each,
# interleaved (mesh 1..5, then again), and predicted / measured against the ±15% target.
#
#   bash bench/sim_train_check.sh [REPS]
#   MESHES="--dp 2;--dp 1 --tp 2" MODEL="--width 256 --layers 4 --heads 4 --batch 32" bash bench/sim_train_check.sh 3
#
# MODEL: xccl train's model, data and batch flags (default plan_check.sh's: a 128-wide,
# 4-layer GPT on the addition task, batch 32); MESHES: mesh and strategy flags separated by
# ';'; STEPS (20) per training run. A run's step is the median interval between the ends of
# rank 0's consecutive `optimizer` spans in its trace (bench/summarize_plan.py's measure);
# the measured step of a mesh is the median over its launches. Before each launch the mesh
# is predicted afresh (`xccl sim train` measures the model's blocks here, the host's ranks
# at once, so a prediction too is a sample of the machine's state): the predicted step is
# the median of those. Every command runs under the peers' prio_run.sh when it is there.
# Outputs in $OUT: pred_{i}_r{rep}.txt, run_{i}_r{rep}/ and their logs, summary.md.
set -euo pipefail
REPS="${1:-3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
OUT="${OUT:-$REPO/target/bench/sim_train_check}"
STEPS="${STEPS:-20}"
MODEL="${MODEL:---width 128 --layers 4 --heads 4 --batch 32 --digits 3}"
MESHES="${MESHES:---dp 2;--dp 1 --pp 2 --micro-batches 4;--dp 1 --tp 2;--dp 2 --zero 1;--dp 2 --pp 2 --micro-batches 2}"
XCCL="${XCCL_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/xccl}"
if [ -z "${NO_BUILD:-}" ]; then (cd "$REPO" && cargo build --release -q -p xccl-cli); fi
mkdir -p "$OUT"
RUN=()
if [ -x "$PEERS/prio_run.sh" ]; then RUN=("$PEERS/prio_run.sh"); fi
read -r -a MODEL_FLAGS <<< "$MODEL"
IFS=';' read -r -a MESH_LIST <<< "$MESHES"
: > "$OUT/meshes.txt"
printf '%s\n' "${MESH_LIST[@]}" > "$OUT/meshes.txt"
for rep in $(seq 1 "$REPS"); do
  for i in "${!MESH_LIST[@]}"; do
    dir="$OUT/run_$((i + 1))_r$rep"
    rm -rf "$dir"
    read -r -a mesh <<< "${MESH_LIST[$i]}"
    echo "# rep $rep, mesh $((i + 1)): xccl sim train, then xccl train $MODEL ${MESH_LIST[$i]}"
    "${RUN[@]}" "$XCCL" sim train "${MODEL_FLAGS[@]}" "${mesh[@]}" > "$OUT/pred_$((i + 1))_r$rep.txt"
    "${RUN[@]}" "$XCCL" train "${MODEL_FLAGS[@]}" "${mesh[@]}" --steps "$STEPS" --out "$dir" > "$dir.log" 2>&1 \
      || echo "  failed: see $dir.log"
    rm -rf "$dir/checkpoint"
  done
done
python3 "$HERE/summarize_sim_train.py" "$OUT" | tee "$OUT/summary.md"
