#!/usr/bin/env bash
# ZeRO on this machine, side by side: `xccl train --dp 2 [--zero 1|2|3]` and PyTorch DDP and
# FSDP2 (with and without activation checkpointing) on Gloo (bench/zero_vs_torch.py),
# training the same GPT (same width, layers, heads, context, untied head, AdamW f32) on
# the same byte-level text, 2 ranks on 2 cores with 1 compute thread each.
#
#   bash bench/zero_vs_torch.sh [REPS]                 (default 1 repetition, ~7-8 minutes)
#   CFG=512x4x8 STEPS=4 OUT=/tmp/x bash bench/zero_vs_torch.sh 1
#   XCCL=0 bash bench/zero_vs_torch.sh 1               (PyTorch only)
#   TORCH=0 ZERO_STAGES=3 bash bench/zero_vs_torch.sh  (xccl DDP and stage 3 only)
#
# The model is CFG = WIDTHxLAYERSxHEADS (default 1024x8x16: 101 M parameters with the
# vocabulary of 256 bytes and context 64), rows of CONTEXT (64) bytes, a global batch of
# BATCH (8) rows (4 per rank), STEPS (6) steps of which the first is left out of the step
# time (xccl: its summary's step_seconds, the mean over each rank's steps after its first;
# PyTorch: WARMUP = 1). Per repetition:
#  1. baselines (BASE=1): the same runs with the tiny model BASE_CFG (16x1x1): the peak RSS of
#     a process that has its runtime, Gloo / xccl's communicator and the data, and a model of
#     a few thousand parameters. bench/summarize_zero.py subtracts it, per framework and rank,
#     from the real runs' peaks to compare the rest with the ZeRO paper's model states.
#  2. PyTorch (TORCH=1): TORCH_MODES ("ddp fsdp fsdp-ac").
#  3. xccl (XCCL=1): DDP (no --zero), then `--zero K` for K in ZERO_STAGES ("1 2 3") with
#     otherwise identical flags. A stage whose flag `xccl train` refuses (no --zero in its
#     --help, or the run exits with an error) is skipped with the reason printed.
# The data: DATA, or else $OUT/data.txt, the first DATA_BYTES (8192) bytes of README.md and
# docs/*.md cut at a UTF-8 character boundary. xccl evaluates the final model on up to 64
# held-out windows (10% of the file) after the last step; 8 KiB keeps that to 12 windows.
# Every command runs under the peers' prio_run.sh (own scheduler autogroup, nice -10), as
# the other comparisons; RUN="nice -n 19" runs politely instead. NO_BUILD=1 skips the cargo
# build; the binary is ${CARGO_TARGET_DIR:-target}/release/xccl (XCCL_BIN overrides it).
# xccl's final checkpoint (3.4 GB of slices at the default size) is deleted after each run unless
# KEEP_CHECKPOINTS=1. Raw results go to $OUT: torch_{mode}_{CFG}_r{rep}.json and .log,
# xccl_{ddp,zero1,zero2,zero3}_{CFG}_r{rep}/summary.json and .log, the baselines as
# torch_base_{CFG}_r{rep} and xccl_base_{CFG}_r{rep}; the summary (medians over
# repetitions) to $OUT/summary.md (bench/summarize_zero.py), which also reads $OUT/config.json
# (the settings) and $OUT/skipped.txt (the runs skipped or failed, and why).
# Times on this machine (2026-11-23, default settings, other builds running beside it): PyTorch
# baseline 9 s, DDP 37 s (~3.9 s a step), FSDP2 61 s (~8.1 s), FSDP2 + checkpointing 68 s
# (~9.1 s); xccl baseline 2 s, DDP 53 s (~4.6 s a step; the rest is start-up, the first step,
# the evaluation and the checkpoint). Without ZeRO 4 minutes; each ZeRO stage adds about a minute.
set -euo pipefail
REPS="${1:-1}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
PY="${PY:-/tmp/peers-venv/bin/python}"
OUT="${OUT:-$REPO/target/bench/zero_vs_torch}"
CFG="${CFG:-1024x8x16}"
BASE_CFG="${BASE_CFG:-16x1x1}"
CONTEXT="${CONTEXT:-64}"
BATCH="${BATCH:-8}"
STEPS="${STEPS:-6}"
WARMUP="${WARMUP:-1}"
DP=2
TORCH_MODES="${TORCH_MODES-ddp fsdp fsdp-ac}"
ZERO_STAGES="${ZERO_STAGES-1 2 3}"
BASE="${BASE:-1}"
TORCH="${TORCH:-1}"
XCCL_ON="${XCCL:-1}"
DATA_BYTES="${DATA_BYTES:-8192}"
RUN="${RUN:-$PEERS/prio_run.sh}"
XCCL="${XCCL_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/xccl}"
T0=$(date +%s)

split() {  # CFG -> width layers heads
  IFS=x read -r width layers heads <<<"$1"
  heads="${heads:-4}"
}

if [ "$TORCH" = 1 ]; then
  [ -e "$PY" ] || { echo "missing $PY: run $PEERS/install_peers.sh first (a venv with torch)" >&2; exit 1; }
fi
HELP=""
ZERO_OK=0
EXTRA=()
if [ "$XCCL_ON" = 1 ]; then
  if [ "${NO_BUILD:-0}" != 1 ]; then
    cargo build --release --manifest-path "$REPO/Cargo.toml" -p xccl-cli >/dev/null
  fi
  [ -x "$XCCL" ] || { echo "missing $XCCL: build it (cargo build --release -p xccl-cli)" >&2; exit 1; }
  HELP="$("$XCCL" train --help 2>&1 || true)"
  if grep -q -- '--zero' <<<"$HELP"; then ZERO_OK=1; fi
  # The comm. bytes per step are recorded from the trace, which xccl train always writes;
  # pass --trace where the CLI has it as a flag, and skip the final evaluation where it can.
  # (A boolean --trace only: a --no-trace or --trace-off flag is left alone, tracing being on.)
  if grep -qE -- '^ *--trace( {2,}.*)?$' <<<"$HELP"; then EXTRA+=(--trace); fi
  if grep -qE -- '^ *--no-evaluate( {2,}.*)?$' <<<"$HELP"; then EXTRA+=(--no-evaluate); fi
fi
mkdir -p "$OUT"
if [ -z "${DATA:-}" ]; then
  DATA="$OUT/data.txt"
  python3 -c 'import sys
raw = b"".join(open(p, "rb").read() for p in sys.argv[2:])[: int(sys.argv[1])]
sys.stdout.write(raw.decode("utf-8", "ignore"))' "$DATA_BYTES" "$REPO/README.md" "$REPO"/docs/*.md > "$DATA"
fi
{
  echo "date: $(date -Is)"; uname -a; nproc; free -m | sed -n 2p
  if [ "$XCCL_ON" = 1 ]; then "$XCCL" --version; git -C "$REPO" log --oneline -1; fi
  if [ "$TORCH" = 1 ]; then "$PY" -c 'import torch; print("torch", torch.__version__)'; fi
  echo "CFG=$CFG BASE_CFG=$BASE_CFG CONTEXT=$CONTEXT BATCH=$BATCH STEPS=$STEPS WARMUP=$WARMUP DP=$DP"
  echo "TORCH=$TORCH TORCH_MODES=$TORCH_MODES XCCL=$XCCL_ON ZERO_STAGES=$ZERO_STAGES zero_flag=$ZERO_OK extra=${EXTRA[*]-}"
  echo "DATA=$DATA ($(wc -c < "$DATA") bytes)"
} > "$OUT/env.txt" 2>&1
printf '{"cfg": "%s", "base_cfg": "%s", "context": %s, "batch": %s, "steps": %s, "warmup": %s, "dp": %s}\n' \
  "$CFG" "$BASE_CFG" "$CONTEXT" "$BATCH" "$STEPS" "$WARMUP" "$DP" > "$OUT/config.json"
: > "$OUT/skipped.txt"
skip() {  # reason
  echo "$1" >&2
  echo "$1" >> "$OUT/skipped.txt"
}

torch_run() {  # mode cfg name rep
  split "$2"
  local name="torch_$3_${CFG}_r$4"
  # shellcheck disable=SC2086
  $RUN "$PY" "$HERE/zero_vs_torch.py" --mode "$1" --dp "$DP" --data "$DATA" --context "$CONTEXT" \
    --width "$width" --layers "$layers" --heads "$heads" --batch "$BATCH" --steps "$STEPS" \
    --warmup "$WARMUP" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
    || skip "warning: PyTorch $name failed, see $OUT/$name.log"
}

xccl_run() {  # variant cfg rep [flags...]
  split "$2"
  local name="xccl_$1_${CFG}_r$3" flags=("${@:4}")
  local dir="$OUT/$name"
  rm -rf "$dir"
  # shellcheck disable=SC2086
  if ! RAYON_NUM_THREADS=1 $RUN "$XCCL" train --dp "$DP" "${flags[@]}" "${EXTRA[@]}" --data "$DATA" --byte-level \
      --context "$CONTEXT" --width "$width" --layers "$layers" --heads "$heads" --batch "$BATCH" \
      --steps "$STEPS" --out "$dir" > "$dir.log" 2>&1; then
    skip "skip xccl $name (${flags[*]:-DDP}): it failed or was refused: $(grep -m1 'xccl train:' "$dir.log" || tail -n 1 "$dir.log")"
  fi
  if [ "${KEEP_CHECKPOINTS:-0}" != 1 ]; then rm -rf "$dir/checkpoint" "$dir/checkpoint.safetensors"; fi
}

for rep in $(seq 1 "$REPS"); do
  if [ "$TORCH" = 1 ]; then
    if [ "$BASE" = 1 ]; then torch_run ddp "$BASE_CFG" base "$rep"; fi
    for mode in $TORCH_MODES; do torch_run "$mode" "$CFG" "$mode" "$rep"; done
  fi
  if [ "$XCCL_ON" = 1 ]; then
    if [ "$BASE" = 1 ]; then xccl_run base "$BASE_CFG" "$rep"; fi
    xccl_run ddp "$CFG" "$rep"
    for k in $ZERO_STAGES; do
      if [ "$ZERO_OK" != 1 ]; then
        skip "skip xccl zero$k: $XCCL train has no --zero flag (ZeRO not built in yet)"
        continue
      fi
      xccl_run "zero$k" "$CFG" "$rep" --zero "$k"
    done
  fi
done
echo "wall: $(( $(date +%s) - T0 )) s for $REPS repetition(s)" >> "$OUT/env.txt"
SUMPY="$PY"; [ -e "$SUMPY" ] || SUMPY=python3
"$SUMPY" "$HERE/summarize_zero.py" "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
echo "wall: $(( $(date +%s) - T0 )) s (raw results and summary.md in $OUT)"
