#!/bin/bash
# Many ranks on one host (meant for a machine with as many cores as ranks):
#   1. correctness: every collective, every algorithm (and, over shared memory, every
#      protocol) at 8 B, 5 KiB, 1 MiB and 9 MiB, over shared memory and over TCP
#      (XCCL_SHM=0); every row checks every element after every run (#wrong);
#   2. faults: kill -9, then SIGSTOP, one rank in the middle of a 16 MiB collective; every
#      survivor must exit on its own, naming the victim, and leave nothing behind.
# Usage: OUT=dir [XCCL=target/release/xccl] [N=16] [M=7] bash bench/many_ranks.sh
set -u
X=$(realpath "${XCCL:-target/release/xccl}")
N=${N:-16}; M=${M:-7}
mkdir -p "$OUT"
{ uname -a; nproc; } > "$OUT/env.txt"

run() { # label, then the command with its environment
  local label=$1; shift
  local start end rc
  start=$(date +%s.%N)
  timeout 120 env "$@" >> "$OUT/sweep.log" 2>&1; rc=$?
  end=$(date +%s.%N)
  awk -v l="$label" -v r="$rc" -v s="$start" -v e="$end" 'BEGIN{printf "%s rc=%s %.1fs\n", l, r, e-s}' | tee -a "$OUT/summary.txt"
}
for n in $N $M; do
  for c in all_reduce all_gather reduce_scatter broadcast reduce all_to_all; do
    run "shm n=$n $c" XCCL_SHM=1 "$X" run -n "$n" -- "$X" bench "$c" --sizes 8,5K,1M,9M --every-algo --every-proto -n 4 -w 1 --check-every
    run "tcp n=$n $c" XCCL_SHM=0 "$X" run -n "$n" -- "$X" bench "$c" --sizes 8,5K,1M,9M --every-algo -n 3 -w 1 --check-every
  done
done
sed -E 's/^\[ *[0-9]+\] //' "$OUT/sweep.log" |
  awk '$1 ~ /^[0-9]+$/ && NF >= 12 {rows++; if ($9 != 0) {wrong++; print}} END {print rows " rows, " wrong+0 " with wrong elements"}' |
  tee "$OUT/wrong.txt" | tail -1 | tee -a "$OUT/summary.txt"

fault() { # trial, signal, collective, victim, transport, XCCL_TIMEOUT
  local t=$1 sig=$2 c=$3 v=$4 shm=$5 timeout=$6 log="$OUT/fault$1.log"
  XCCL_SHM=$shm XCCL_TIMEOUT=$timeout "$X" run -n "$N" -- "$X" bench "$c" --sizes 16M --target-sec 60 -w 1 --check-every > "$log" 2>&1 &
  local job=$! victim="" p
  sleep 3
  for p in $(pgrep -f "$X bench"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "XCCL_RANK=$v" && victim=$p
  done
  local t0 t1 hung=no
  t0=$(date +%s.%N)
  kill "-$sig" "$victim"
  for _ in $(seq 1 400); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  t1=$(date +%s.%N)
  if kill -0 "$job" 2>/dev/null; then hung=yes; pkill -9 -f "$X bench"; kill -9 "$job"; fi
  pkill -9 -f "$X bench" 2>/dev/null
  local errs named left shm_left
  errs=$(grep -cE "^\[ *[0-9]+\] xccl bench:" "$log")
  named=$(grep -E "^\[ *[0-9]+\] xccl bench:" "$log" | grep -cE "rank $v([^0-9]|$)")
  left=$(pgrep -f "$X bench" | wc -l); shm_left=$(find /dev/shm -name 'xccl*' | wc -l)
  awk -v t="$t" -v g="$sig" -v c="$c" -v sh="$shm" -v v="$v" -v s="$t0" -v e="$t1" -v h="$hung" -v er="$errs" -v n="$named" -v l="$left" -v sl="$shm_left" \
    'BEGIN{printf "fault %s SIG%s %s XCCL_SHM=%s victim %s: job ended %.2fs after, hung=%s, survivors that said why %s, naming the victim %s, processes left %s, segments left %s\n", t,g,c,sh,v,e-s,h,er,n,l,sl}' |
    tee -a "$OUT/summary.txt"
}
colls=(all_reduce all_gather reduce_scatter broadcast all_to_all all_reduce all_gather all_to_all)
victims=(5 11 1 15 7 13 3 9)
for t in 0 1 2 3 4 5 6 7; do
  fault "$t" KILL "${colls[$t]}" $(( victims[t] % N )) $(( 1 - t % 2 )) 10
done
for t in 0 1 2 3; do
  fault "stop$t" STOP "${colls[$t]}" $(( victims[t] % N )) $(( 1 - t % 2 )) 5
done
