#!/usr/bin/env bash
# PyTorch's process-group backend "xccl" against "gloo" on this machine (2 ranks):
#   1. torch.distributed.all_reduce through each backend, in the same processes, interleaved
#      (8 B latency, 64 MiB bus bandwidth), and xccl's native figure (`xccl bench`) for the
#      same sizes in the same run;
#   2. DDP training (bench/train_vs_torch.py's model) with each backend, interleaved runs,
#      step time and exposed communication.
# Results and a table: target/bench/torch_backend/. Uses the peers' environment
# (../shared/bench/peers/install_peers.sh): PY=/tmp/peers-venv/bin/python by default.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-/tmp/peers-venv/bin/python}"
RUNS="${RUNS:-3}"
OUT=target/bench/torch_backend
mkdir -p "$OUT"
cargo build --release -p xccl-cli -p xccl-python
pkg="$OUT/pkg/xccl"
mkdir -p "$pkg"
cp python/xccl/*.py "$pkg/"
cp target/release/libxccl_python.so "$pkg/_xccl.abi3.so"
export PYTHONPATH="$PWD/$OUT/pkg"
for run in $(seq 1 "$RUNS"); do
    "$PY" bench/torch_backend.py --ranks 2 --sizes 8,1K,64M --out "$OUT/collectives_$run.json"
    XCCL_TIMEOUT=120 target/release/xccl run -n 2 -- target/release/xccl bench all_reduce --sizes 8,1K,64M \
        --inplace > "$OUT/native_$run.txt"
    for backend in gloo xccl; do
        "$PY" bench/train_vs_torch.py --backend "$backend" --dp 2 --steps 200 --out "$OUT/ddp_${backend}_$run.json"
    done
done
python3 bench/summarize_torch_backend.py "$OUT"
