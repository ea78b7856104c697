#!/usr/bin/env bash
# DDP on the native backend "xccl" against "gloo" across two emulated hosts (bench/cluster.sh:
# network namespaces, each host's link limited to RATE), started by torchrun with the c10d
# rendezvous on each host, NPROC ranks per host: bench/train_vs_torch.py's model, RUNS
# interleaved runs of each backend, each a fresh launch. Needs root.
#   RUNS=3 RATE=2gbit NPROC=1 bench/torch_cluster.sh
# Results and a table: target/bench/torch_cluster/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-$HOME/.cache/xccl-ci-venv/bin/python}"
RUNS="${RUNS:-3}"
RATE="${RATE:-2gbit}"
NPROC="${NPROC:-1}"
STEPS="${STEPS:-200}"
OUT=target/bench/torch_cluster
rm -rf "$OUT"
mkdir -p "$OUT"
cargo build --release -p xccl-python
pkg="$OUT/pkg/xccl"
mkdir -p "$pkg"
cp python/xccl/*.py "$pkg/"
cp -r python/xccl/csrc "$pkg/"
cp target/release/libxccl_python.so "$pkg/_xccl.abi3.so"
export PYTHONPATH="$PWD/$OUT/pkg"
"$PY" -m xccl.torch
name="tc$$"
trap 'bash bench/cluster.sh down "$name" >/dev/null 2>&1 || true' EXIT
bash bench/cluster.sh up "$name" --hosts 2 --rate "$RATE" --owner $$ >/dev/null
dp=$((2 * NPROC))
port=29400
for run in $(seq 1 "$RUNS"); do
    for backend in gloo xccl; do
        port=$((port + 1))
        pids=()
        for h in 0 1; do
            # The namespaces share the machine's host name, which no namespace reaches: torchrun
            # is told its own address and which host serves the rendezvous, gloo its interface.
            is_host=$([ "$h" = 0 ] && echo 1 || echo 0)
            bash bench/cluster.sh exec "$name" "$h" -- env PYTHONPATH="$PYTHONPATH" XCCL_HOST_KEY="$name-h$h" \
                GLOO_SOCKET_IFNAME=eth0 \
                "$PY" -m torch.distributed.run --nnodes 2 --nproc_per_node "$NPROC" --rdzv-backend c10d \
                --rdzv-endpoint "10.77.0.1:$port" --rdzv-id "bench$run$backend" --max-restarts 0 \
                --local-addr "10.77.0.$((h + 1))" --rdzv-conf "is_host=$is_host" \
                bench/train_vs_torch.py --backend "$backend" --dp "$dp" --steps "$STEPS" \
                --out "$OUT/ddp_${backend}_$run.json" > "$OUT/log_${backend}_${run}_h$h.txt" 2>&1 &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p"; done
    done
done
python3 bench/summarize_torch_backend.py "$OUT"
