#!/usr/bin/env bash
# An emulated cluster on one machine: "hosts" are network namespaces joined by veth pairs
# and bridges into a shape, every link rate-limited with tbf; ranks are placed in the
# namespaces with XCCL_HOST_KEY per namespace, so ranks of one "host" use shared memory and
# the others TCP over the limited links. Needs root (or CAP_NET_ADMIN), iproute2 and tc.
#
#   bench/cluster.sh up NAME --hosts K [--shape star|fat-tree] [--rate 2gbit]
#                    [--per-leaf 2] [--over 2] [--owner PID]
#       Builds cluster NAME. star: K hosts behind one switch, each host's link at --rate
#       each way. fat-tree: leaves of --per-leaf hosts under one spine; a leaf's uplink runs
#       at per-leaf × rate / over (oversubscription --over). Host h is the namespace
#       xc-NAME-h<h> with address 10.77.0.<h+1>; the switches live in xc-NAME-fab.
#       --owner: the process the cluster belongs to (default: the caller's parent); `gc`
#       removes clusters whose owner has exited.
#   bench/cluster.sh launch NAME --ranks-per-host R [--port P] [--secret S] -- CMD ARGS...
#       Starts K×R ranks of CMD, rank r in host r/R, with XCCL_RANK, XCCL_WORLD_SIZE,
#       XCCL_LOCAL_RANK, XCCL_MASTER_ADDR (host 0), XCCL_MASTER_PORT, XCCL_SECRET and
#       XCCL_HOST_KEY=NAME-h<h>; rank r's output goes to stdout prefixed "[r] " unless
#       LOGDIR is set (then LOGDIR/rank<r>.log). Waits for all; exits with the first failing
#       rank's status. Interrupted, it kills every rank.
#   bench/cluster.sh exec NAME H -- CMD ARGS...    runs CMD in host H's namespace
#   bench/cluster.sh link NAME H down|up|RATE      cuts, restores or re-limits host H's link
#   bench/cluster.sh down NAME                     removes the cluster and kills what runs in it (idempotent)
#   bench/cluster.sh gc                            removes clusters whose owner is gone
#   bench/cluster.sh ls                            lists clusters and owners
#   bench/cluster.sh run [up options] -- CMD...    up, CMD (with CLUSTER=NAME), down; the
#       cluster is removed however CMD ends (also on Ctrl-C or kill).
set -euo pipefail
STATE=/run/xccl-cluster
# Jumbo frames, as on cluster fabrics: with 1500-byte frames TCP's headers alone cost 4% of
# the link, and a rate-limited link tops out near 90% (measured: 1.79 of 2 Gbit/s against
# 1.93 with 9000).
MTU=${MTU:-9000}
mkdir -p "$STATE"

die() { echo "cluster.sh: $*" >&2; exit 2; }
ns_host() { echo "xc-$1-h$2"; }
ns_fab() { echo "xc-$1-fab"; }

# tbf on DEV (in namespace NS) at RATE: a burst of at least one 64 KiB GSO packet, and a
# queue of 5 ms at the rate so TCP sees the limit rather than losses.
limit() {
  local ns=$1 dev=$2 rate=$3
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst 256kb latency 5ms
}

# A tc rate (2gbit, 500mbit, 800kbit) in mbit.
to_mbit() {
  local r=$1
  case $r in
    *gbit) awk -v n="${r%gbit}" 'BEGIN{print n*1000}' ;;
    *mbit) echo "${r%mbit}" ;;
    *kbit) awk -v n="${r%kbit}" 'BEGIN{print n/1000}' ;;
    *) die "rates are NUMBER followed by gbit, mbit or kbit, not '$r'" ;;
  esac
}

cmd_down() {
  local name=$1
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^xc-$name-(h[0-9]+|fab)$" || true); do
    # Processes keep a namespace alive after its name is gone: stop them first.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "${STATE:?}/$name"
}

cmd_up() {
  local name=$1; shift
  local hosts="" shape=star rate=2gbit per_leaf=2 over=2 owner=$PPID
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) hosts=$2; shift 2 ;;
      --shape) shape=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --per-leaf) per_leaf=$2; shift 2 ;;
      --over) over=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  [[ "$name" =~ ^[a-z0-9]{1,8}$ ]] || die "cluster names are 1-8 lowercase letters or digits, not '$name'"
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || die "--hosts must be 1..200"
  [ -e "$STATE/$name" ] && die "cluster $name exists (bench/cluster.sh down $name)"
  mkdir -p "$STATE/$name"
  echo "$owner" > "$STATE/$name/owner"
  echo "$hosts" > "$STATE/$name/hosts"
  echo "$rate" > "$STATE/$name/rate"
  trap 'cmd_down "$name"' ERR
  local fab; fab=$(ns_fab "$name")
  ip netns add "$fab"
  ip -n "$fab" link set lo up
  case $shape in
    star)
      ip -n "$fab" link add sw type bridge
      ip -n "$fab" link set sw up
      ;;
    fat-tree)
      [[ "$per_leaf" =~ ^[0-9]+$ ]] && [ "$per_leaf" -ge 1 ] || die "--per-leaf must be a positive integer"
      local leaves=$(( (hosts + per_leaf - 1) / per_leaf ))
      local up_rate
      up_rate="$(awk -v r="$(to_mbit "$rate")" -v p="$per_leaf" -v o="$over" 'BEGIN{printf "%.0f", r*p/o}')mbit"
      echo "$up_rate" > "$STATE/$name/uplink"
      ip -n "$fab" link add spine type bridge
      ip -n "$fab" link set spine up
      for l in $(seq 0 $((leaves - 1))); do
        ip -n "$fab" link add "leaf$l" type bridge
        ip -n "$fab" link set "leaf$l" up
        ip -n "$fab" link add "up$l" type veth peer name "dn$l"
        ip -n "$fab" link set "up$l" mtu "$MTU" master "leaf$l" up
        ip -n "$fab" link set "dn$l" mtu "$MTU" master spine up
        limit "$fab" "up$l" "$up_rate"
        limit "$fab" "dn$l" "$up_rate"
      done
      ;;
    *) die "unknown shape '$shape' (star, fat-tree)" ;;
  esac
  echo "$shape" > "$STATE/$name/shape"
  for h in $(seq 0 $((hosts - 1))); do
    local ns; ns=$(ns_host "$name" "$h")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$fab" link add "h$h" type veth peer name eth0 netns "$ns"
    local sw=sw
    [ "$shape" = fat-tree ] && sw="leaf$((h / per_leaf))"
    ip -n "$fab" link set "h$h" mtu "$MTU" master "$sw" up
    ip -n "$ns" addr add "10.77.$((h / 250)).$((h % 250 + 1))/16" dev eth0
    ip -n "$ns" link set eth0 mtu "$MTU" up
    limit "$ns" eth0 "$rate"
    limit "$fab" "h$h" "$rate"
  done
  trap - ERR
}

host_addr() { echo "10.77.$(($1 / 250)).$(($1 % 250 + 1))"; }

cmd_launch() {
  local name=$1; shift
  local rph=1 port=29400 secret="${XCCL_SECRET:-cluster-$name-$$}"
  while [ $# -gt 0 ]; do
    case $1 in
      --ranks-per-host) rph=$2; shift 2 ;;
      --port) port=$2; shift 2 ;;
      --secret) secret=$2; shift 2 ;;
      --) shift; break ;;
      *) die "launch: unknown option $1" ;;
    esac
  done
  [ $# -gt 0 ] || die "launch: no command after --"
  [ -e "$STATE/$name/hosts" ] || die "no cluster $name (bench/cluster.sh up $name --hosts K)"
  local hosts; hosts=$(cat "$STATE/$name/hosts")
  local world=$((hosts * rph)) pids=() r
  trap 'kill -9 "${pids[@]}" 2>/dev/null; exit 130' INT TERM
  for r in $(seq 0 $((world - 1))); do
    local h=$((r / rph))
    local env=(env XCCL_RANK="$r" XCCL_WORLD_SIZE="$world" XCCL_LOCAL_RANK="$((r % rph))"
      XCCL_MASTER_ADDR="$(host_addr 0)" XCCL_MASTER_PORT="$port" XCCL_SECRET="$secret"
      XCCL_JOB_ID="cluster-$name-$port" XCCL_HOST_KEY="$name-h$h")
    if [ -n "${LOGDIR:-}" ]; then
      ip netns exec "$(ns_host "$name" "$h")" "${env[@]}" "$@" > "$LOGDIR/rank$r.log" 2>&1 &
    else
      ip netns exec "$(ns_host "$name" "$h")" "${env[@]}" "$@" 2>&1 | sed -u "s/^/[$r] /" &
    fi
    pids+=($!)
  done
  local rc=0 st
  for p in "${pids[@]}"; do
    st=0; wait "$p" || st=$?
    [ "$rc" -eq 0 ] && rc=$st
  done
  exit "$rc"
}

cmd_link() {
  local name=$1 h=$2 what=$3 fab; fab=$(ns_fab "$name")
  case $what in
    down) ip -n "$fab" link set "h$h" down ;;
    up) ip -n "$fab" link set "h$h" up ;;
    *) limit "$fab" "h$h" "$what"; limit "$(ns_host "$name" "$h")" eth0 "$what" ;;
  esac
}

cmd_gc() {
  for d in "$STATE"/*/; do
    [ -d "$d" ] || continue
    local name; name=$(basename "$d")
    local owner; owner=$(cat "$d/owner" 2>/dev/null || echo 0)
    kill -0 "$owner" 2>/dev/null || cmd_down "$name"
  done
  # Namespaces without state (a crash between `ip netns add` and writing the state).
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^xc-[a-z0-9]+-(h[0-9]+|fab)$' || true); do
    local name=${ns#xc-}; name=${name%-*}
    [ -e "$STATE/$name" ] || ip netns del "$ns" 2>/dev/null || true
  done
}

cmd_run() {
  local name="r$$" args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  [ $# -gt 0 ] || die "run: no command after --"
  cmd_gc
  local child=""
  trap 'cmd_down "$name"' EXIT
  # The command runs in the background so that a signal is handled at once, not after it.
  trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; exit 130' INT TERM
  cmd_up "$name" "${args[@]}" --owner $$
  CLUSTER=$name "$@" &
  child=$!
  local st=0
  wait "$child" || st=$?
  exit "$st"
}

[ $# -ge 1 ] || die "usage: bench/cluster.sh up|launch|exec|link|down|gc|ls|run ... (see the header)"
[ "$(id -u)" -eq 0 ] || die "needs root for network namespaces"
sub=$1; shift
case $sub in
  up) [ $# -ge 1 ] || die "up NAME --hosts K"; cmd_up "$@" ;;
  down) [ $# -eq 1 ] || die "down NAME"; cmd_down "$1" ;;
  launch) [ $# -ge 1 ] || die "launch NAME ..."; cmd_launch "$@" ;;
  exec) [ $# -ge 3 ] && [ "$3" = "--" ] || die "exec NAME H -- CMD"; ns=$(ns_host "$1" "$2"); shift 3; exec ip netns exec "$ns" "$@" ;;
  link) [ $# -eq 3 ] || die "link NAME H down|up|RATE"; cmd_link "$@" ;;
  gc) cmd_gc ;;
  ls) for d in "$STATE"/*/; do [ -d "$d" ] && echo "$(basename "$d") hosts=$(cat "$d/hosts") owner=$(cat "$d/owner")"; done; true ;;
  run) cmd_run "$@" ;;
  *) die "unknown command '$sub'" ;;
esac
