#!/usr/bin/env bash
# Side by side on this machine: `xccl train` (DDP over xccl, candle kernels) and PyTorch DDP
# on Gloo (CPU) training the same GPT: same layers, width, heads, context, global batch,
# data and optimizer, 2 ranks on 2 cores with 1 compute thread each.
#
#   bash bench/train_vs_torch.sh [REPS]                    (default 3 repetitions)
#   CONFIGS="128x2 256x4" STEPS=300 OUT=/tmp/x bash bench/train_vs_torch.sh 1
#   BEFORE=/path/to/old/xccl bash bench/train_vs_torch.sh 5   (also an older build, in turn
#                                        with this one: the summary gives after / before)
#
# CONFIGS lists WIDTHxLAYERS (4 heads, 3-digit sums, batch 64, AdamW); the first is the
# default model of `xccl train`. Every command runs under the peers' prio_run.sh (own
# scheduler autogroup, nice -10), as the other comparisons; RUN="nice -n 19" runs politely
# instead. Raw results go to $OUT (torch_*.json, xccl_*/summary.json and trace.json), the
# summary (medians over repetitions) to $OUT/summary.md. A repetition takes about a minute.
set -euo pipefail
REPS="${1:-3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
PY="${PY:-/tmp/peers-venv/bin/python}"
OUT="${OUT:-$REPO/target/bench/train_vs_torch}"
CONFIGS="${CONFIGS:-128x2 256x4}"
STEPS="${STEPS:-300}"
RUN="${RUN:-$PEERS/prio_run.sh}"
XCCL="$REPO/target/release/xccl"

[ -e "$PY" ] || { echo "missing $PY: run $PEERS/install_peers.sh first (a venv with torch)" >&2; exit 1; }
cargo build --release --manifest-path "$REPO/Cargo.toml" -p xccl-cli >/dev/null
mkdir -p "$OUT"
{
  echo "date: $(date -Is)"; uname -a; nproc; "$XCCL" --version
  "$PY" -c 'import torch; print("torch", torch.__version__)'
} > "$OUT/env.txt" 2>&1

for rep in $(seq 1 "$REPS"); do
  for cfg in $CONFIGS; do
    width="${cfg%x*}"; layers="${cfg#*x}"
    # shellcheck disable=SC2086
    $RUN "$PY" "$HERE/train_vs_torch.py" --dp 2 --width "$width" --layers "$layers" --heads 4 \
      --batch 64 --steps "$STEPS" --out "$OUT/torch_${cfg}_r$rep.json" > "$OUT/torch_${cfg}_r$rep.log" 2>&1
    # This build and, with BEFORE, the older one, first one then the other in turn.
    builds="xccl:$XCCL"
    if [ -n "${BEFORE:-}" ]; then
      if [ $((rep % 2)) -eq 1 ]; then builds="before:$BEFORE $builds"; else builds="$builds before:$BEFORE"; fi
    fi
    for b in $builds; do
      name="${b%%:*}"; bin="${b#*:}"
      rm -rf "$OUT/${name}_${cfg}_r$rep"
      # shellcheck disable=SC2086
      $RUN "$bin" train --dp 2 --width "$width" --layers "$layers" --heads 4 --batch 64 --steps "$STEPS" \
        --out "$OUT/${name}_${cfg}_r$rep" > "$OUT/${name}_${cfg}_r$rep.log" 2>&1
      # The final checkpoint is not measured (KEEP_CHECKPOINTS=1 keeps it).
      if [ "${KEEP_CHECKPOINTS:-0}" != 1 ]; then rm -rf "$OUT/${name}_${cfg}_r$rep/checkpoint"; fi
    done
  done
done
"$PY" "$HERE/summarize_train.py" "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
