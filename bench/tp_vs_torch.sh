#!/usr/bin/env bash
# Tensor parallelism on this machine, side by side: `xccl train --dp 1 --tp 2` and PyTorch
# DTensor tensor parallelism on Gloo (bench/tp_vs_torch.py) training the same GPT (same
# layers, width, heads, context, batch, data and optimizer), 2 ranks on 2 cores with 1
# compute thread each. Also xccl's TP overhead and memory per rank on a wide model.
#
#   bash bench/tp_vs_torch.sh [REPS]                   (default 3 repetitions)
#   CONFIGS="128x2x4" WIDE="" STEPS=100 OUT=/tmp/x bash bench/tp_vs_torch.sh 1
#
# Per repetition:
#  1. for each of CONFIGS (WIDTHxLAYERS or WIDTHxLAYERSxHEADS, 4 heads by default), STEPS
#     steps: PyTorch TP=2 vs `xccl train --dp 1 --tp 2` (RAYON_NUM_THREADS=1).
#  2. for each of WIDE (default 1024x8x16), WIDE_STEPS steps: xccl tp=2 (2 ranks x 1 thread)
#     and tp=1 (`--dp 1 --tp 1`, 1 rank, RAYON_NUM_THREADS=2): the TP overhead ratio
#     step(tp=2)/step(tp=1), target <= 1.15; xccl tp=4 (4 ranks x 1 thread, oversubscribing
#     the 2 cores) with TP4_STEPS steps (0: skip) for the memory table; PyTorch TP=2 on the
#     same model with WIDE_STEPS steps unless TORCH_WIDE=0.
# SP=1 adds --sp (sequence parallelism) to xccl's tp >= 2 runs (PyTorch stays without).
# Every command runs under the peers' prio_run.sh (own scheduler autogroup, nice -10), as
# the other comparisons; RUN="nice -n 19" runs politely instead. NO_BUILD=1 skips the cargo
# build. Raw results go to $OUT (torch_tp{N}_{cfg}_r{rep}.json and .log,
# xccl_tp{N}_{cfg}_r{rep}/summary.json and .log), the summary (medians over repetitions) to
# $OUT/summary.md (bench/summarize_tp.py).
# An empty CONFIGS or WIDE skips that part. PyTorch's time per repetition, measured on a busy
# machine: 128x2x4 and 256x4x4 with 100 steps about 45 s with start-up; the wide model
# (101M parameters, ~4 s per step at TP=2) about 2 minutes; xccl's runs come on top.
set -euo pipefail
REPS="${1:-3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
PY="${PY:-/tmp/peers-venv/bin/python}"
OUT="${OUT:-$REPO/target/bench/tp_vs_torch}"
CONFIGS="${CONFIGS-128x2x4 256x4x4}"
STEPS="${STEPS:-100}"
WARMUP="${WARMUP:-10}"
WIDE="${WIDE-1024x8x16}"
WIDE_STEPS="${WIDE_STEPS:-20}"
WIDE_WARMUP="${WIDE_WARMUP:-3}"
TP4_STEPS="${TP4_STEPS:-5}"
TORCH_WIDE="${TORCH_WIDE:-1}"
SP="${SP:-0}"
RUN="${RUN:-$PEERS/prio_run.sh}"
XCCL="$REPO/target/release/xccl"

[ -e "$PY" ] || { echo "missing $PY: run $PEERS/install_peers.sh first (a venv with torch)" >&2; exit 1; }
if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --release --manifest-path "$REPO/Cargo.toml" -p xccl-cli >/dev/null
fi
[ -x "$XCCL" ] || { echo "missing $XCCL: build it (cargo build --release -p xccl-cli)" >&2; exit 1; }
HELP="$("$XCCL" train --help 2>&1 || true)"
if ! grep -q -- '--tp' <<<"$HELP"; then
  echo "error: $XCCL train has no --tp flag (tensor parallelism not built in yet); nothing to compare" >&2
  exit 2
fi
SPFLAG=()
if [ "$SP" = 1 ]; then
  grep -q -- '--sp' <<<"$HELP" || { echo "error: SP=1 but $XCCL train has no --sp flag" >&2; exit 2; }
  SPFLAG=(--sp)
fi
mkdir -p "$OUT"
{
  echo "date: $(date -Is)"; uname -a; nproc; "$XCCL" --version
  "$PY" -c 'import torch; print("torch", torch.__version__)'
  echo "CONFIGS=$CONFIGS STEPS=$STEPS WARMUP=$WARMUP WIDE=$WIDE WIDE_STEPS=$WIDE_STEPS TP4_STEPS=$TP4_STEPS TORCH_WIDE=$TORCH_WIDE SP=$SP"
} > "$OUT/env.txt" 2>&1

# parse CFG -> width layers heads
split() {
  IFS=x read -r width layers heads <<<"$1"
  heads="${heads:-4}"
}

torch_tp() {  # cfg rep steps warmup
  split "$1"
  # shellcheck disable=SC2086
  $RUN "$PY" "$HERE/tp_vs_torch.py" --tp 2 --width "$width" --layers "$layers" --heads "$heads" \
    --batch 64 --steps "$3" --warmup "$4" --out "$OUT/torch_tp2_$1_r$2.json" > "$OUT/torch_tp2_$1_r$2.log" 2>&1 \
    || echo "warning: PyTorch TP $1 rep $2 failed, see $OUT/torch_tp2_$1_r$2.log" >&2
}

xccl_tp() {  # tp threads cfg rep steps
  local tp="$1" threads="$2" extra=()
  split "$3"
  if [ "$tp" -gt 1 ]; then extra=("${SPFLAG[@]}"); fi
  local dir="$OUT/xccl_tp${tp}_$3_r$4"
  rm -rf "$dir"
  # shellcheck disable=SC2086
  RAYON_NUM_THREADS="$threads" $RUN "$XCCL" train --dp 1 --tp "$tp" "${extra[@]}" --width "$width" \
    --layers "$layers" --heads "$heads" --batch 64 --steps "$5" --out "$dir" > "$dir.log" 2>&1 \
    || echo "warning: xccl tp=$tp $3 rep $4 failed, see $dir.log" >&2
  # The final checkpoint (1.2 GB for the wide model) is not measured (KEEP_CHECKPOINTS=1 keeps it).
  if [ "${KEEP_CHECKPOINTS:-0}" != 1 ]; then rm -rf "$dir/checkpoint"; fi
}

for rep in $(seq 1 "$REPS"); do
  for cfg in $CONFIGS; do
    torch_tp "$cfg" "$rep" "$STEPS" "$WARMUP"
    xccl_tp 2 1 "$cfg" "$rep" "$STEPS"
  done
  for cfg in $WIDE; do
    xccl_tp 2 1 "$cfg" "$rep" "$WIDE_STEPS"
    xccl_tp 1 2 "$cfg" "$rep" "$WIDE_STEPS"
    if [ "$TP4_STEPS" -gt 0 ]; then xccl_tp 4 1 "$cfg" "$rep" "$TP4_STEPS"; fi
    if [ "$TORCH_WIDE" = 1 ]; then torch_tp "$cfg" "$rep" "$WIDE_STEPS" "$WIDE_WARMUP"; fi
  done
done
"$PY" "$HERE/summarize_tp.py" "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
