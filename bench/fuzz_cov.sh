#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, through cargo-fuzz) of everything a peer can send: builds
# the targets of fuzz/ and runs each from its committed corpus (fuzz/corpus/<target>, left as
# it is: new finds go to fuzz/target/corpus/<target>), one summary line per target. A crash,
# a hang (-timeout), an allocation larger than MALLOC_MB (-malloc_limit_mb: no length a peer
# claims may be allocated) or RSS over 2 GiB fails the run; the input is kept in
# fuzz/artifacts/<target>/.
#
#   bash bench/fuzz_cov.sh                          10^7 inputs per target, every target
#   RUNS=300000 bash bench/fuzz_cov.sh store ll     some targets
#   SECONDS_PER_TARGET=10 bash bench/fuzz_cov.sh    a time limit per target (as CI runs it)
#   MERGE=1 bash bench/fuzz_cov.sh                  then merge what was found into
#                                                   fuzz/corpus: the fewest inputs that reach
#                                                   every edge reached (-set_cover_merge=1
#                                                   -use_counters=0), to keep it small
#   SEEDS=1 bash bench/fuzz_cov.sh                  start from the generated seeds as well
#                                                   (cargo run --example seeds)
#
# Toolchain: nightly with AddressSanitizer when rustup has a nightly; else the default (stable)
# toolchain without a sanitizer, which needs no unstable flag (coverage still guides; debug
# assertions and overflow checks stay on; -malloc_limit_mb needs the sanitizer's allocator,
# so only RSS is watched). TOOLCHAIN=stable|nightly and SANITIZER=none|address choose (stable
# with a sanitizer: RUSTC_BOOTSTRAP=1 is set so that it takes -Zsanitizer, which works where
# the toolchain ships the sanitizer's runtime). Needs cargo-fuzz
# (`cargo install cargo-fuzz --locked`) and a C++ compiler (libFuzzer is built from source).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
FUZZ="$REPO/fuzz"
ALL=(frame_header frame_stream handshake_server handshake_client store store_c10d ll)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL[@]}")
RUNS="${RUNS:-10000000}"
MALLOC_MB="${MALLOC_MB:-2}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz_cov: cargo-fuzz is not installed (cargo install cargo-fuzz --locked)" >&2
    exit 2
fi
if [ -z "${TOOLCHAIN:-}" ]; then
    if command -v rustup >/dev/null 2>&1 && rustup run nightly rustc --version >/dev/null 2>&1; then
        TOOLCHAIN=nightly
    else
        TOOLCHAIN=stable
    fi
fi
if [ "$TOOLCHAIN" = nightly ]; then
    SANITIZER="${SANITIZER:-address}"
    build=(cargo +nightly fuzz build)
else
    SANITIZER="${SANITIZER:-none}"
    # A sanitizer is an unstable flag (-Zsanitizer): a stable compiler takes it with
    # RUSTC_BOOTSTRAP=1. Without one, cargo-fuzz passes stable flags only.
    build=(cargo fuzz build)
    [ "$SANITIZER" != none ] && build=(env RUSTC_BOOTSTRAP=1 cargo fuzz build)
fi
TARGET_DIR="$FUZZ/target/$TOOLCHAIN-$SANITIZER"
echo "fuzz_cov: $TOOLCHAIN, sanitizer $SANITIZER; building ${TARGETS[*]}"
cd "$REPO"
mkdir -p "$FUZZ/target"
for t in "${TARGETS[@]}"; do
    if ! "${build[@]}" -s "$SANITIZER" --target-dir "$TARGET_DIR" "$t" >"$FUZZ/target/build-$t.log" 2>&1; then
        echo "fuzz_cov: building $t failed:" >&2
        tail -20 "$FUZZ/target/build-$t.log" >&2
        exit 1
    fi
done
BIN="$TARGET_DIR/x86_64-unknown-linux-gnu/release"

if [ "${SEEDS:-0}" = 1 ]; then
    cargo run -q --manifest-path "$FUZZ/Cargo.toml" --example seeds -- "$FUZZ/target/seeds" >/dev/null
fi

failed=0
for t in "${TARGETS[@]}"; do
    scratch="$FUZZ/target/corpus/$t"
    mkdir -p "$scratch" "$FUZZ/artifacts/$t" "$FUZZ/corpus/$t"
    dirs=("$scratch" "$FUZZ/corpus/$t")
    [ -d "$FUZZ/target/seeds/$t" ] && [ "${SEEDS:-0}" = 1 ] && dirs+=("$FUZZ/target/seeds/$t")
    limit=()
    [ -n "${SECONDS_PER_TARGET:-}" ] && limit=(-max_total_time="$SECONDS_PER_TARGET")
    log="$FUZZ/target/fuzz-$t.log"
    start=$(date +%s.%N)
    nice -n "${NICE:-19}" "$BIN/$t" "${dirs[@]}" -runs="$RUNS" "${limit[@]}" -rss_limit_mb=2048 \
        -malloc_limit_mb="$MALLOC_MB" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$FUZZ/artifacts/$t/" >"$log" 2>&1
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
    rss=$(grep -oE 'stat::peak_rss_mb: *[0-9]+' "$log" | grep -oE '[0-9]+$')
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(echo "$last" | grep -oE 'cov: [0-9]+' | grep -oE '[0-9]+')
    ft=$(echo "$last" | grep -oE 'ft: [0-9]+' | grep -oE '[0-9]+')
    corp=$(echo "$last" | grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' | cut -d' ' -f2)
    if [ "$rc" -eq 0 ]; then verdict="ok"; else verdict="FAILED (exit $rc; see $log and fuzz/artifacts/$t/)"; failed=1; fi
    printf '%-17s %10s inputs in %7.1f s (%6.0f/s)  cov %5s  ft %6s  corpus %-12s rss %4s MB  %s\n' \
        "$t" "${runs:-0}" "$secs" "$(awk -v n="${runs:-0}" -v s="$secs" 'BEGIN { print n / (s > 0 ? s : 1) }')" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
        "${rss:-?}" "$verdict"
    if [ "$rc" -ne 0 ]; then
        grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written' "$log" | head -5 | sed 's/^/    /'
    fi
    if [ "${MERGE:-0}" = 1 ] && [ "$rc" -eq 0 ]; then
        merged="$FUZZ/target/merged/$t"
        rm -rf "$merged" && mkdir -p "$merged"
        "$BIN/$t" -set_cover_merge=1 -use_counters=0 "$merged" "${dirs[@]}" >"$FUZZ/target/merge-$t.log" 2>&1 \
            && rm -rf "$FUZZ/corpus/$t" && mv "$merged" "$FUZZ/corpus/$t" \
            && echo "    merged: $(ls "$FUZZ/corpus/$t" | wc -l) inputs, $(du -sk --apparent-size "$FUZZ/corpus/$t" | cut -f1) KB"
    fi
done
exit $failed
