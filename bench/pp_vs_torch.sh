#!/usr/bin/env bash
# Pipeline parallelism on this machine, side by side: `xccl train --dp 1 --pp 2` and PyTorch's
# torch.distributed.pipelining on Gloo (bench/pp_vs_torch.py) training the same GPT (same
# layers, width, heads, context, batch, data and optimizer, untied head, the same blocks per
# stage), 2 ranks on 2 cores with 1 compute thread each. Also xccl's pipeline bubble against
# the closed form and its memory per stage.
#
#   bash bench/pp_vs_torch.sh [REPS]                   (default 3 repetitions)
#   CFG=128x4x4 STEPS=10 BUBBLE=0 MEM=0 OUT=/tmp/x bash bench/pp_vs_torch.sh 1
#   XCCL=0 bash bench/pp_vs_torch.sh 1                 (PyTorch only)
#   TORCH=0 bash bench/pp_vs_torch.sh 1                (xccl only)
#
# The model is CFG = WIDTHxLAYERSxHEADS (default 256x8x4: 6.3M parameters, blocks embed,
# h00..h07, head), 3-digit sums (context 11), AdamW. Per repetition:
#  1. comparison (CMP=1): P = 2, M = 8 micro-batches, batch BATCH (32), STEPS timed steps:
#     PyTorch ScheduleGPipe and Schedule1F1B against `xccl train --schedule gpipe|1f1b`, both
#     with the same split (SPLIT, blocks per stage, default embed + the first half of the
#     layers | the other half + head, i.e. 5,5; xccl gets it as --pp-balance). PyTorch runs
#     WARMUP untimed steps first; xccl leaves each rank's first step out of step_seconds.
#     SCHEDULES (default "gpipe 1f1b zb-h1 zb-v") picks the schedules (zb-h1: PyTorch's
#     ScheduleInterleavedZeroBubble with one stage per rank; zb-v: PyTorch's
#     ScheduleZBVZeroBubble against `xccl train --schedule zb-v --virtual-stages 2`, 2P = 4
#     chunks in a V, rank r holding stages r and 2P-1-r, both given the same cut (--split,
#     --pp-balance): LAYERS / 4 layers each, embed with the first, head with the last;
#     skipped with a note unless
#     M >= 2P - 1 and LAYERS is a multiple of 4); adding "interleaved" also compares
#     interleaved 1F1B with CMP_V (2) virtual stages per rank (default split).
#  2. bubble (BUBBLE=1), xccl only (traced; --trace is passed if the CLI has it): P in BUBBLE_PS ("2 4"), M in BUBBLE_MS
#     ("4 8 16 32"), schedules BUBBLE_SCHEDULES ("gpipe 1f1b zb-h1 interleaved zb-v";
#     interleaved with V = 2 where the P x V stages fit into the LAYERS + 2 blocks; zb-v with
#     V = 2 where LAYERS is a multiple of 2P and M >= 2P - 1, else skipped with a note, e.g.
#     P = 4, M = 4), BUBBLE_STEPS steps,
#     batch BATCH, xccl's default balance; reads summary.json's pipeline.bubble_measured and
#     .bubble_schedule, and compares each ZB-H1 and ZB-V bubble time with 1F1B's. P = 4
#     means 4 ranks x 1 thread on the 2 cores: oversubscribed, so a rank waiting in the
#     pipeline hands its core to another and the measured bubble is not that of 4 cores.
#  3. memory (MEM=1): P = 2, M = MEM_M (16), batch MEM_BATCH (128, so that activations
#     show against the runtime), MEM_STEPS steps: xccl 1f1b, gpipe and 1f1b --recompute
#     (peak RSS per rank, step time); with TORCH=1 also PyTorch 1F1B and GPipe.
# TORCH=0 / XCCL=0 skip the PyTorch / xccl runs (XCCL=0 needs no build and no --pp flag).
# Every command runs under the peers' prio_run.sh (own scheduler autogroup, nice -10), as
# the other comparisons; RUN="nice -n 19" runs politely instead. NO_BUILD=1 skips the cargo
# build; the binary is ${CARGO_TARGET_DIR:-target}/release/xccl (XCCL_BIN overrides it).
# Raw results go to $OUT: {torch,xccl}_{cmp,bubble,mem}_{schedule}_p{P}[_v{V}]_m{M}_{cfg}_r{rep}
# (PyTorch: .json and .log; xccl: a directory with summary.json, and .log), the summary
# (medians over repetitions) to $OUT/summary.md (bench/summarize_pp.py).
# Times on this machine (256x8x4, batch 32, M = 8): PyTorch ~0.33 s per step, ~25 s per run
# with start-up; xccl ~0.5 s per step. One repetition of everything (with SCHEDULES including
# interleaved, before zb-v was added) took 14 minutes, most of it the 24 bubble runs; zb-v
# adds a comparison pair and 7 bubble runs (P = 4, M = 4 is skipped).
set -euo pipefail
REPS="${1:-3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
PY="${PY:-/tmp/peers-venv/bin/python}"
OUT="${OUT:-$REPO/target/bench/pp_vs_torch}"
CFG="${CFG:-256x8x4}"
BATCH="${BATCH:-32}"
M="${M:-8}"
STEPS="${STEPS:-30}"
WARMUP="${WARMUP:-5}"
SCHEDULES="${SCHEDULES:-gpipe 1f1b zb-h1 zb-v}"
CMP_V="${CMP_V:-2}"
CMP="${CMP:-1}"
BUBBLE="${BUBBLE:-1}"
BUBBLE_PS="${BUBBLE_PS:-2 4}"
BUBBLE_MS="${BUBBLE_MS:-4 8 16 32}"
BUBBLE_STEPS="${BUBBLE_STEPS:-10}"
BUBBLE_SCHEDULES="${BUBBLE_SCHEDULES:-gpipe 1f1b zb-h1 interleaved zb-v}"
MEM="${MEM:-1}"
MEM_M="${MEM_M:-16}"
MEM_BATCH="${MEM_BATCH:-128}"
MEM_STEPS="${MEM_STEPS:-10}"
TORCH="${TORCH:-1}"
XCCL_ON="${XCCL:-1}"
INIT="${INIT:-xccl}"
RUN="${RUN:-$PEERS/prio_run.sh}"
XCCL="${XCCL_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/xccl}"

IFS=x read -r width layers heads <<<"$CFG"
heads="${heads:-4}"
half=$(( layers / 2 ))
SPLIT="${SPLIT:-$(( half + 1 )),$(( layers - half + 1 ))}"  # embed + h00.. | .. + head

if [ "$TORCH" = 1 ]; then
  [ -e "$PY" ] || { echo "missing $PY: run $PEERS/install_peers.sh first (a venv with torch)" >&2; exit 1; }
  "$PY" -c 'import torch.distributed.pipelining' || { echo "error: $PY has no torch.distributed.pipelining" >&2; exit 1; }
fi
UNTIED=()
TRACE=()
if [ "$XCCL_ON" = 1 ]; then
  if [ "${NO_BUILD:-0}" != 1 ]; then
    cargo build --release --manifest-path "$REPO/Cargo.toml" -p xccl-cli >/dev/null
  fi
  [ -x "$XCCL" ] || { echo "missing $XCCL: build it (cargo build --release -p xccl-cli)" >&2; exit 1; }
  HELP="$("$XCCL" train --help 2>&1 || true)"
  for flag in --pp micro-batches --schedule --pp-balance --virtual-stages --recompute; do
    if ! grep -q -- "$flag" <<<"$HELP"; then
      echo "error: $XCCL train has no $flag flag (pipeline parallelism not built in yet); run with XCCL=0 for PyTorch alone" >&2
      exit 2
    fi
  done
  # The head is untied by default (--tied ties it); pass --untied where the CLI has it.
  if grep -q -- '--untied' <<<"$HELP"; then UNTIED=(--untied); fi
  # xccl train traces every run (trace.json, the pipeline's timeline); pass --trace where the
  # CLI has it as a flag.
  if grep -q -- '--trace' <<<"$HELP"; then TRACE=(--trace); fi
fi
mkdir -p "$OUT"
{
  echo "date: $(date -Is)"; uname -a; nproc
  if [ "$XCCL_ON" = 1 ]; then "$XCCL" --version; git -C "$REPO" log --oneline -1; fi
  if [ "$TORCH" = 1 ]; then "$PY" -c 'import torch; print("torch", torch.__version__)'; fi
  echo "CFG=$CFG BATCH=$BATCH M=$M STEPS=$STEPS WARMUP=$WARMUP SPLIT=$SPLIT SCHEDULES=$SCHEDULES CMP_V=$CMP_V INIT=$INIT"
  echo "CMP=$CMP BUBBLE=$BUBBLE BUBBLE_PS=$BUBBLE_PS BUBBLE_MS=$BUBBLE_MS BUBBLE_STEPS=$BUBBLE_STEPS BUBBLE_SCHEDULES=$BUBBLE_SCHEDULES"
  echo "MEM=$MEM MEM_M=$MEM_M MEM_BATCH=$MEM_BATCH MEM_STEPS=$MEM_STEPS TORCH=$TORCH XCCL=$XCCL_ON"
} > "$OUT/env.txt" 2>&1

vtag() { if [ "$1" -gt 1 ]; then echo "_v$1"; fi; }

# ZB-V (2 chunks per rank in a V) needs M >= 2P - 1, and here LAYERS a multiple of 2P (the
# comparison cuts equal layers per chunk on both sides): prints why not and fails otherwise.
zbv_fits() {  # p m what
  if [ "$2" -lt $(( 2 * $1 - 1 )) ]; then
    echo "note: skip $3 zb-v P=$1 M=$2: ZB-V needs M >= 2P - 1 = $(( 2 * $1 - 1 ))" >&2; return 1
  fi
  if [ $(( layers % (2 * $1) )) != 0 ]; then
    echo "note: skip $3 zb-v P=$1: $layers layers do not cut into 2P = $(( 2 * $1 )) equal chunks" >&2; return 1
  fi
}

torch_pp() {  # kind schedule p v m batch steps warmup split rep
  local name="torch_$1_$2_p$3$(vtag "$4")_m$5_${CFG}_r${10}" extra=()
  if [ -n "$9" ]; then extra=(--split "$9"); fi
  if [ "$2" = interleaved ] || [ "$2" = zb-v ]; then extra+=(--virtual-stages "$4"); fi
  # shellcheck disable=SC2086
  $RUN "$PY" "$HERE/pp_vs_torch.py" --pp "$3" --schedule "$2" --micro-batches "$5" "${extra[@]}" \
    --width "$width" --layers "$layers" --heads "$heads" --batch "$6" --steps "$7" --warmup "$8" \
    --init "$INIT" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
    || echo "warning: PyTorch $name failed, see $OUT/$name.log" >&2
}

xccl_pp() {  # kind schedule p v m batch steps split rep [extra flags...]
  local schedule="$2"
  local name="xccl_$1_${schedule}_p$3$(vtag "$4")_m$5_${CFG}_r$9"
  local extra=("${@:10}")
  if [ -n "$8" ]; then extra+=(--pp-balance "$8"); fi
  if [ "$schedule" = interleaved ] || [ "$schedule" = zb-v ]; then extra+=(--virtual-stages "$4"); fi
  case " ${extra[*]} " in *" --recompute "*) name="${name/_${schedule}_/_${schedule}-recompute_}";; esac
  local dir="$OUT/$name"
  rm -rf "$dir"
  # shellcheck disable=SC2086
  RAYON_NUM_THREADS=1 $RUN "$XCCL" train --model gpt --dp 1 --tp 1 --pp "$3" --schedule "$schedule" \
    --micro-batches "$5" "${extra[@]}" "${UNTIED[@]}" --width "$width" --layers "$layers" --heads "$heads" \
    --batch "$6" --steps "$7" --out "$dir" > "$dir.log" 2>&1 \
    || echo "warning: xccl $name failed, see $dir.log" >&2
  # The final checkpoint is not measured (KEEP_CHECKPOINTS=1 keeps it).
  if [ "${KEEP_CHECKPOINTS:-0}" != 1 ]; then rm -rf "$dir/checkpoint"; fi
}

for rep in $(seq 1 "$REPS"); do
  if [ "$CMP" = 1 ]; then
    for s in $SCHEDULES; do
      if [ "$s" = interleaved ]; then v="$CMP_V"; split=""; else v=1; split="$SPLIT"; fi
      if [ "$s" = zb-v ]; then
        v=2
        zbv_fits 2 "$M" comparison || continue
        # Both sides get the same list: 4 chunks of equal layers, embed with the first, head
        # with the last.
        q=$(( layers / 4 ))
        split="$(( q + 1 )),$q,$q,$(( q + 1 ))"
      fi
      if [ "$TORCH" = 1 ]; then torch_pp cmp "$s" 2 "$v" "$M" "$BATCH" "$STEPS" "$WARMUP" "$split" "$rep"; fi
      if [ "$XCCL_ON" = 1 ]; then xccl_pp cmp "$s" 2 "$v" "$M" "$BATCH" "$STEPS" "$split" "$rep"; fi
    done
  fi
  if [ "$BUBBLE" = 1 ] && [ "$XCCL_ON" = 1 ]; then
    for p in $BUBBLE_PS; do
      for m in $BUBBLE_MS; do
        [ $(( BATCH % m )) = 0 ] || { echo "skip bubble M=$m: batch $BATCH not a multiple" >&2; continue; }
        for s in $BUBBLE_SCHEDULES; do
          v=1
          if [ "$s" = interleaved ]; then
            v=2
            [ $(( p * v )) -le $(( layers + 2 )) ] || continue
          fi
          if [ "$s" = zb-v ]; then
            v=2
            zbv_fits "$p" "$m" bubble || continue
          fi
          if [ "$s" != gpipe ] && [ "$m" -lt "$p" ]; then continue; fi
          xccl_pp bubble "$s" "$p" "$v" "$m" "$BATCH" "$BUBBLE_STEPS" "" "$rep" "${TRACE[@]}"
        done
      done
    done
  fi
  if [ "$MEM" = 1 ]; then
    if [ "$XCCL_ON" = 1 ]; then
      xccl_pp mem gpipe 2 1 "$MEM_M" "$MEM_BATCH" "$MEM_STEPS" "$SPLIT" "$rep"
      xccl_pp mem 1f1b 2 1 "$MEM_M" "$MEM_BATCH" "$MEM_STEPS" "$SPLIT" "$rep"
      xccl_pp mem 1f1b 2 1 "$MEM_M" "$MEM_BATCH" "$MEM_STEPS" "$SPLIT" "$rep" --recompute
    fi
    if [ "$TORCH" = 1 ]; then
      torch_pp mem gpipe 2 1 "$MEM_M" "$MEM_BATCH" "$MEM_STEPS" 2 "$SPLIT" "$rep"
      torch_pp mem 1f1b 2 1 "$MEM_M" "$MEM_BATCH" "$MEM_STEPS" 2 "$SPLIT" "$rep"
    fi
  fi
done
SUMPY="$PY"; [ -e "$SUMPY" ] || SUMPY=python3
"$SUMPY" "$HERE/summarize_pp.py" "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
