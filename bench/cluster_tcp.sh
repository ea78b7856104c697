#!/usr/bin/env bash
# TCP on the emulated cluster (bench/cluster.sh): all-reduce on rate-limited links, every
# algorithm, against the link's rate and iperf3 --bidir between two hosts of the same
# cluster, with the tuner's pick against the best measured; then the simulator's prediction
# for the same cluster (a star of the same rate, the latency the bootstrap probe measured).
#
#   sudo bash bench/cluster_tcp.sh               (4 hosts x 1 rank and 2 hosts x 2 ranks, 2 Gbit/s)
#   RATE=1gbit SIZES=64K,1M,64M bash bench/cluster_tcp.sh
#   CALIBRATE=1 sudo bash bench/cluster_tcp.sh   (first `xccl tune measure` + `fit` on each
#                                                cluster shape, then the bench with that file)
#
# Raw outputs and summary.md go to $OUT (default target/bench/cluster_tcp).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
OUT="${OUT:-$REPO/target/bench/cluster_tcp}"
RATE="${RATE:-2gbit}"
SIZES="${SIZES:-1K,64K,1M,16M,64M}"
SHAPES="${SHAPES:-4x1 2x2 8x1}"
XCCL="$REPO/target/release/xccl"
CLUSTER="$HERE/cluster.sh"
cargo build --release --manifest-path "$REPO/Cargo.toml" -p xccl-cli >/dev/null
mkdir -p "$OUT"
NAME="ct$$"
trap 'bash "$CLUSTER" down "$NAME"' EXIT
for shape in $SHAPES; do
  hosts=${shape%x*}; rph=${shape#*x}
  bash "$CLUSTER" down "$NAME"
  bash "$CLUSTER" up "$NAME" --hosts "$hosts" --rate "$RATE" --owner $$
  bash "$CLUSTER" exec "$NAME" 0 -- iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
  sleep 1
  bash "$CLUSTER" exec "$NAME" 1 -- iperf3 -c 10.77.0.1 -p 5299 -t 3 -f g --bidir > "$OUT/iperf3_$shape.txt" 2>&1 || true
  wait || true
  tune=()
  if [ "${CALIBRATE:-0}" = 1 ]; then
    # The tuner calibrated on this very cluster: every all-reduce algorithm timed, then fitted.
    bash "$CLUSTER" launch "$NAME" --ranks-per-host "$rph" -- \
      "$XCCL" tune measure --colls all_reduce --sizes "$SIZES" -o "$OUT/tune_$shape.rec" > "$OUT/tune_$shape.log" 2>&1
    "$XCCL" tune fit "$OUT/tune_$shape.rec" -o "$OUT/cluster_$shape.tune" >> "$OUT/tune_$shape.log" 2>&1
    tune=(env "XCCL_TUNE_FILE=$OUT/cluster_$shape.tune")
  fi
  XCCL_DEBUG=xccl::comm=info bash "$CLUSTER" launch "$NAME" --ranks-per-host "$rph" -- \
    "${tune[@]}" "$XCCL" bench all_reduce --sizes "$SIZES" --every-algo --target-sec 0.5 > "$OUT/xccl_$shape.txt" 2>&1
  # The latency per message for the simulator: the bootstrap probe's, or in a calibrated
  # run (which has no probe: the tuning file gives the links) the tuning file's TCP class.
  if [ "${CALIBRATE:-0}" = 1 ]; then
    alpha=$(awk '$1 == "link" && $2 == "tcp" {print $3}' "$OUT/cluster_$shape.tune")
  else
    alpha=$(grep -o "measured: [0-9.]* µs" "$OUT/xccl_$shape.txt" | head -1 | awk '{print $2}' || true)
  fi
  gbit=${RATE%gbit}
  # Calls back to back, as the bench's loop runs them (a root's or tree's tail overlaps
  # the next call).
  "${tune[@]}" "$XCCL" sim --topology "star:bw=$gbit,lat=0" --hosts "$hosts" --ranks-per-host "$rph" \
    --sizes "$SIZES" --alpha-us "${alpha:-50}" --calls 4 > "$OUT/sim_$shape.txt" 2>&1
done
python3 "$HERE/summarize_cluster_tcp.py" "$OUT" "$RATE" > "$OUT/summary.md"
cat "$OUT/summary.md"
