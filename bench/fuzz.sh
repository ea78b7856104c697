#!/usr/bin/env bash
# The fuzzing harness (crates/xccl/src/fuzz.rs) run long: frame headers in process, the
# handshake (both sides) and the store over real loopback sockets.
#
#   bash bench/fuzz.sh                    (10^7 frame headers, 20 000 handshakes, 20 000 store connections)
#   CASES=100000000 SEED=7 bash bench/fuzz.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
SEED="${SEED:-$RANDOM}"
run() {
  XCCL_FUZZ_CASES="$2" XCCL_FUZZ_SEED="$SEED" cargo test --release --manifest-path "$REPO/Cargo.toml" \
    -p xccl --lib "$1" -- --nocapture --test-threads 1 2>&1 | grep -oE "fuzz [a-z ]+: [0-9]+ inputs in [0-9.]+ s \([0-9]+/s\)|panicked.*|test result.*"
}
echo "seed $SEED"
run fuzz::frame_headers "${CASES:-10000000}"
run fuzz::handshakes "${SOCKET_CASES:-10000}"
run fuzz::the_store "${SOCKET_CASES:-20000}"
