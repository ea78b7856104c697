#!/usr/bin/env bash
# The tuner against measurement: every algorithm of every collective timed on this machine,
# shared memory and TCP, 2 and 4 ranks, twice (sets a and b); the cost model fitted on set a
# and checked on set b, which it has not seen; and the built-in constants checked on set b.
#
#   bash bench/tune_table.sh                      (about 20 minutes on 2 cores)
#   OUT=/tmp/t NPS="2" SIZES=8,1M,64M bash bench/tune_table.sh
#
# Every command runs under the peers' prio_run.sh when it is there. Writes the records, the
# fitted tuning file ($OUT/fitted.tune, usable as XCCL_TUNE_FILE) and the tables to $OUT
# (table_b.md: size x algorithm on set b, the built-in tuner's pick marked).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PEERS="${PEERS:-$REPO/../shared/bench/peers}"
OUT="${OUT:-$REPO/target/bench/tune}"
NPS="${NPS:-2 4}"
SIZES="${SIZES:-8,1K,4K,64K,256K,1M,4M,16M,64M}"
XCCL="$REPO/target/release/xccl"
PRIO=()
[ -x "$PEERS/prio_run.sh" ] && PRIO=("$PEERS/prio_run.sh")
cargo build --release --manifest-path "$REPO/Cargo.toml" -p xccl-cli >/dev/null
mkdir -p "$OUT"
for set in a b; do
  for np in $NPS; do
    "${PRIO[@]}" "$XCCL" run -n "$np" -- "$XCCL" tune measure --sizes "$SIZES" -o "$OUT/${set}_shm_n$np.tsv"
    XCCL_SHM=0 "${PRIO[@]}" "$XCCL" run -n "$np" -- "$XCCL" tune measure --sizes "$SIZES" -o "$OUT/${set}_tcp_n$np.tsv"
  done
done
"$XCCL" tune fit "$OUT"/a_*.tsv -o "$OUT/fitted.tune" > "$OUT/fit_a.md"
XCCL_TUNE_FILE="$OUT/fitted.tune" "$XCCL" tune fit --check "$OUT"/b_*.tsv > "$OUT/check_b_fitted.md"
"$XCCL" tune fit --check "$OUT"/b_*.tsv > "$OUT/check_b_builtin.md"
python3 "$HERE/tune_table.py" "$OUT/check_b_builtin.md" --oracle "$OUT" > "$OUT/table_b.md"
for f in fit_a check_b_fitted check_b_builtin; do
  echo "== $f"; grep -E "^# " "$OUT/$f.md"
done
tail -1 "$OUT/table_b.md"
