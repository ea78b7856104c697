#!/usr/bin/env bash
# PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test,
# as test/distributed/test_distributed_spawn.py runs it) against gloo and against xccl under
# its suite alias ($XCCL_SUITE_BACKEND, default xccl_cpu), at WORLD_SIZE 2 and 3, then the
# comparison (bench/torch_suite.py does the work; see its docstring).
#
# Results: out/torch_suite/{gloo,xccl_cpu}_ws{2,3}.json (per test: pass/fail/skip, reason,
# seconds), *.log, JUnit XML, compare_xccl_cpu_ws{2,3}.md/.json (what passes on gloo and
# not on xccl, grouped by reason; tests kept for gloo alone; counts; wall times).
#
#   bench/torch_suite.sh                      # full: ~30-40 min per run on 2 cores, 4 runs
#   SIZES=2 bench/torch_suite.sh              # one world size
#   bench/torch_suite.sh --subset bench/torch_suite_ci.txt   # the CI subset (extra args pass on)
#
# Environment: PY (default ~/.cache/xccl-ci-venv/bin/python: torch (CPU use), numpy, pytest);
# the xccl package is installed into it (pip install ./python) when it cannot be imported,
# and expecttest (which torch.testing needs) when missing. TIMEOUT: seconds per test (120).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-$HOME/.cache/xccl-ci-venv/bin/python}"
SIZES="${SIZES:-2,3}"
TIMEOUT="${TIMEOUT:-120}"
OUT="${OUT:-out/torch_suite}"
export XCCL_SUITE_BACKEND="${XCCL_SUITE_BACKEND:-xccl_cpu}"

"$PY" -c "import torch, pytest" || { echo "$PY lacks torch or pytest" >&2; exit 2; }
"$PY" -c "import expecttest" 2>/dev/null || "$PY" -m pip install --quiet expecttest
"$PY" -c "import xccl.torch" 2>/dev/null || "$PY" -m pip install --quiet ./python
mkdir -p "$OUT"
"$PY" -c "import torch, xccl; print('torch', torch.__version__, '| xccl from', xccl.__file__)" | tee "$OUT/env.txt"

"$PY" bench/torch_suite.py --backend "gloo,$XCCL_SUITE_BACKEND" --world-size "$SIZES" \
    --timeout "$TIMEOUT" --out-dir "$OUT" "$@"
