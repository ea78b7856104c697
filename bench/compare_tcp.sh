#!/usr/bin/env bash
# Side-by-side all-reduce over loopback TCP: iperf3, PyTorch gloo and xccl, interleaved.
# xccl runs with XCCL_SHM=0: without it, ranks of one host talk through shared memory and
# this would not measure TCP at all.
#
#   bash bench/compare_tcp.sh [REPS]          (default 3 repetitions)
#   OUT=/tmp/x NPS="2 4" SIZES=8,1K,1M,64M bash bench/compare_tcp.sh 3
#
# Needs the peers installed (../shared/bench/peers/install_peers.sh: iperf3, a venv with
# torch in /tmp/peers-venv). Every command runs under the peers' prio_run.sh (own scheduler
# autogroup, nice -10), as the peer baselines were measured. Raw outputs go to $OUT, the
# summary (medians over repetitions, and ratios) to $OUT/summary.md.
set -euo pipefail
REPS="${1:-3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
PY="${PY:-/tmp/peers-venv/bin/python}"
OUT="${OUT:-$REPO/target/bench/compare_tcp}"
NPS="${NPS:-2 4}"
SIZES="${SIZES:-8,1K,64K,1M,16M,64M}"
TARGET_SEC="${TARGET_SEC:-0.3}"
PRIO="$PEERS/prio_run.sh"
XCCL="$REPO/target/release/xccl"

for need in "$PRIO" "$PY" "$(command -v iperf3 || true)"; do
  [ -n "$need" ] && [ -e "$need" ] || { echo "missing $need: run $PEERS/install_peers.sh first" >&2; exit 1; }
done
cargo build --release --manifest-path "$REPO/Cargo.toml" -p xccl-cli >/dev/null
mkdir -p "$OUT"
{
  echo "date: $(date -Is)"; uname -a; nproc; "$XCCL" --version
  "$PY" -c 'import torch; print("torch", torch.__version__)'; iperf3 --version | head -1
} > "$OUT/env.txt" 2>&1

for rep in $(seq 1 "$REPS"); do
  "$PRIO" bash -c 'iperf3 -s -1 -B 127.0.0.1 -p 5299 >/dev/null 2>&1 & s=$!; sleep 1; iperf3 -c 127.0.0.1 -p 5299 -t 5 -f g; wait $s' \
    > "$OUT/iperf3_r$rep.txt" 2>&1
  # Both directions at once: what an all-reduce needs (each rank sends and receives).
  "$PRIO" bash -c 'iperf3 -s -1 -B 127.0.0.1 -p 5299 >/dev/null 2>&1 & s=$!; sleep 1; iperf3 -c 127.0.0.1 -p 5299 -t 5 -f g --bidir; wait $s' \
    > "$OUT/iperf3bidir_r$rep.txt" 2>&1
  for np in $NPS; do
    "$PRIO" "$PY" "$PEERS/gloo_allreduce.py" -n "$np" --ops all_reduce --sizes "$SIZES" --target-sec "$TARGET_SEC" \
      > "$OUT/gloo_n${np}_r$rep.txt" 2>&1
    XCCL_SHM=0 "$PRIO" "$XCCL" run -n "$np" -- "$XCCL" bench all_reduce --sizes "$SIZES" --target-sec "$TARGET_SEC" --peer-format \
      > "$OUT/xccl_n${np}_r$rep.txt" 2>&1
    XCCL_SHM=0 "$PRIO" "$XCCL" run -n "$np" -- "$XCCL" bench all_reduce --sizes "$SIZES" --target-sec "$TARGET_SEC" --peer-format --inplace \
      > "$OUT/xcclinplace_n${np}_r$rep.txt" 2>&1
  done
done
# Every xccl row must have run over TCP.
if grep -L "transport=tcp " "$OUT"/xccl*_n*_r*.txt | grep -q .; then
  echo "some xccl runs did not use TCP: $(grep -L "transport=tcp " "$OUT"/xccl*_n*_r*.txt)" >&2; exit 1
fi
"$PY" "$HERE/summarize_tcp.py" "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
