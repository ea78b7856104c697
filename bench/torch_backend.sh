#!/usr/bin/env bash
# The native PyTorch backend and the C API against their references on this machine (2 ranks),
# every figure of issue 22's targets, each run a fresh launch (RUNS of each, interleaved):
#   1. torch.distributed.all_reduce through "xccl" and "gloo" in the same processes (8 B
#      latency, 64 MiB bus bandwidth), and `xccl bench all_reduce --inplace` (the Rust call,
#      same placement) for the same sizes in the same run;
#   2. ProcessGroupXCCL from C++ (libtorch, c10d directly): 8 B all-reduce, sync and async;
#      and what a call costs before communicating (a 1-rank group, bench/native/torch_floor.py);
#   3. the C API's 8 B all-reduce (bench/native/capi_latency.c) against the Rust call's
#      (`xccl bench all_reduce --sizes 8`), launches alternating;
#   4. DDP training (bench/train_vs_torch.py's model) on each backend, interleaved runs.
# Results and a table: target/bench/torch_backend/. PY: a Python with torch and ninja
# (default: the CI environment ~/.cache/xccl-ci-venv, else the peers' /tmp/peers-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-$HOME/.cache/xccl-ci-venv/bin/python}"
[ -x "$PY" ] || PY=/tmp/peers-venv/bin/python
RUNS="${RUNS:-3}"
ITERS="${ITERS:-20000}"
OUT=target/bench/torch_backend
rm -rf "$OUT"
mkdir -p "$OUT/bin"
cargo build --release -p xccl-cli -p xccl-python
bash crates/xccl-c/install.sh "$PWD/$OUT/prefix" >/dev/null
XCCL=target/release/xccl
pkg="$OUT/pkg/xccl"
mkdir -p "$pkg"
cp python/xccl/*.py "$pkg/"
cp -r python/xccl/csrc "$pkg/"
cp target/release/libxccl_python.so "$pkg/_xccl.abi3.so"
export PYTHONPATH="$PWD/$OUT/pkg"
"$PY" -m xccl.torch
# The C API benchmark, and the C++ one against libtorch.
cc -O2 -std=c11 bench/native/capi_latency.c -I"$OUT/prefix/include" -L"$OUT/prefix/lib" -lxccl \
    -Wl,-rpath,"$PWD/$OUT/prefix/lib" -o "$OUT/bin/capi_latency"
torch_dir=$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
c++ -O2 -std=c++20 bench/native/c10d_latency.cpp python/xccl/csrc/ProcessGroupXCCL.cpp \
    python/xccl/csrc/WorkXCCL.cpp -Ipython/xccl/csrc \
    -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include" \
    -L"$torch_dir/lib" -ltorch -ltorch_cpu -lc10 -Wl,-rpath,"$torch_dir/lib" \
    -L"$OUT/prefix/lib" -lxccl -Wl,-rpath,"$PWD/$OUT/prefix/lib" -o "$OUT/bin/c10d_latency"
launch() { XCCL_TIMEOUT=120 "$XCCL" run -n 2 -- "$@"; }
for run in $(seq 1 "$RUNS"); do
    for rep in 1 2 3; do
        launch "$XCCL" bench all_reduce --sizes 8 -n "$ITERS" -w 100 >> "$OUT/rust_8B_$run.txt"
        launch "$OUT/bin/capi_latency" 8 "$ITERS" >> "$OUT/capi_8B_$run.txt"
    done
    launch "$OUT/bin/c10d_latency" 8 "$ITERS" > "$OUT/c10d_$run.txt"
    "$PY" bench/native/torch_floor.py > "$OUT/floor_$run.txt"
    "$PY" bench/torch_backend.py --ranks 2 --sizes 8,64M --out "$OUT/collectives_$run.json"
    launch "$XCCL" bench all_reduce --sizes 8,64M --inplace > "$OUT/native_$run.txt"
    for backend in gloo xccl; do
        "$PY" bench/train_vs_torch.py --backend "$backend" --dp 2 --steps 200 --out "$OUT/ddp_${backend}_$run.json"
    done
done
python3 bench/summarize_torch_backend.py "$OUT"
