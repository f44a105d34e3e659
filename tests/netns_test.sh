#!/usr/bin/env bash
# Three hosts as network namespaces on a bridge (its own namespace; 198.18.0.0/24, no
# route out), one gpumoved each, UCX over TCP between them: a third-party move across
# hosts; a link cut mid-move and a daemon killed mid-move both fail their moves
# UNAVAILABLE in bounded time; the link restored and the killed node restarted, moves
# work again. The cluster is a secured one: callers need a token, peers the cluster
# secret. Needs root (CI runs as root). Everything is removed at the end.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD/..}/gpumove"
GPUMOVED="$RUNFILES/daemon/gpumoved"
CTL="$RUNFILES/client/cli/gpumovectl"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/netns.XXXXXX")"
TAG="gm$(( $$ % 100000 ))"
BR="${TAG}br"
declare -A IP=([a]=198.18.0.1 [b]=198.18.0.2 [c]=198.18.0.3 [d]=198.18.0.4)
declare -A PID=()

fail() { echo "FAIL: $*"; for h in a b c; do echo "--- host-$h"; tail -20 "$WORK/$h.log" 2>/dev/null; done; exit 1; }
cleanup() {
  for h in "${!PID[@]}"; do kill -9 "${PID[$h]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in "${TAG}a" "${TAG}b" "${TAG}c" "${TAG}d" "$BR"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] || fail "needs root to create network namespaces"

ip netns add "$BR"
ip -n "$BR" link add br0 type bridge
ip -n "$BR" link set br0 up
for h in a b c d; do
  ip netns add "$TAG$h"
  ip link add "eth0" netns "$TAG$h" type veth peer name "p$h" netns "$BR"
  ip -n "$BR" link set "p$h" master br0 up
  ip -n "$TAG$h" addr add "${IP[$h]}/24" dev eth0
  ip -n "$TAG$h" link set eth0 up
  ip -n "$TAG$h" link set lo up
done
ip netns exec "${TAG}a" ip route | grep -q default && fail "a host has a route out"

# Tokens for callers, a secret for peers.
echo "netns-admin-token-0123456789,ops,ops,admin" >"$WORK/tokens"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/secret"
export GPUMOVE_TOKEN=netns-admin-token-0123456789

in_host() { local h=$1; shift; ip netns exec "$TAG$h" "$@"; }
ctl() { local h=$1; shift; in_host "$h" "$CTL" --addr "${IP[$h]}:7470" "$@"; }
start() {  # start HOST [extra flags...]
  local h=$1; shift
  ip netns exec "$TAG$h" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 "$GPUMOVED" --node="host-$h" \
    --listen="${IP[$h]}:7470" --peers="${IP[a]}:7470" --heartbeat=200ms --peer_timeout=2s \
    --auth_tokens="$WORK/tokens" --cluster_secret_file="$WORK/secret" \
    --host_pool_size=384MiB --pinned_pool_size=128MiB --ucx_lanes=2 "$@" 2>>"$WORK/$h.log" &
  PID[$h]=$!
}
await_peers() {  # await_peers HOST N
  for _ in $(seq 200); do
    [ "$(ctl "$1" peers 2>/dev/null | grep -c ' up$' || true)" = "$2" ] && return 0
    sleep 0.1
  done
  fail "host-$1 does not see $2 peers up: $(ctl "$1" peers 2>&1)"
}
await_end() {  # await_end HOST ID MAX_SECONDS -> prints the final line
  local out
  for _ in $(seq $(( $3 * 10 ))); do
    out=$(ctl "$1" transfer "$2" 2>&1)
    [[ "$out" == *RUNNING* || "$out" == *QUEUED* ]] || { echo "$out"; return 0; }
    sleep 0.1
  done
  fail "transfer $2 still running after $3 s: $out"
}

start a --max_move_rate=32MiB
start b
start c
for h in a b c; do await_peers "$h" 2; done
ctl a info | grep -q "UCX_TLS=tcp" || fail "UCX is not on TCP"
ctl a info | grep -q "^peers *cluster secret" || fail "peer calls are not authenticated"
in_host a env -u GPUMOVE_TOKEN "$CTL" --addr "${IP[a]}:7470" info >/dev/null 2>&1 &&
  fail "a caller without a token was served"
ctl b info | grep -q "2 lanes over the network" || fail "host-b has no second UCX lane"

# A third-party move across hosts, verified.
SRC=$(ctl a alloc 96MiB)
DST=$(ctl b alloc 96MiB --kind pinned)
head -c 33554432 /dev/urandom >"$WORK/data"
ctl a write "$SRC" "$WORK/data" 2>/dev/null
out=$(ctl c move "host-a/$SRC" "host-b/$DST" --length 32MiB --checksum) || fail "move: $out"
[[ "$out" == *SUCCEEDED*UCX* ]] || fail "third-party move: $out"
ctl b read "$DST" "$WORK/back" --length 32MiB
cmp -s "$WORK/data" "$WORK/back" || fail "bytes on host-b differ from those written on host-a"
echo "ok: third-party move host-a -> host-b through host-c"

# host-b is not throttled: its moves are split over both lanes (two TCP connections and
# progress threads per side). A push to host-c and a pull back, verified.
B1=$(ctl b alloc 32MiB)
B2=$(ctl b alloc 32MiB)
C1=$(ctl c alloc 32MiB)
ctl b write "$B1" "$WORK/data" 2>/dev/null
out=$(ctl b move "$B1" "host-c/$C1" --checksum) || fail "push over lanes: $out"
[[ "$out" == *SUCCEEDED*UCX* ]] || fail "push over lanes: $out"
out=$(ctl b move "host-c/$C1" "$B2" --checksum) || fail "pull over lanes: $out"
[[ "$out" == *SUCCEEDED*UCX* ]] || fail "pull over lanes: $out"
ctl b read "$B2" "$WORK/back_b"
cmp -s "$WORK/data" "$WORK/back_b" || fail "bytes pulled back over lanes differ"
echo "ok: push and pull over two UCX lanes between host-b and host-c"

# Cut host-b's link mid-move: the move fails UNAVAILABLE in bounded time.
ID=$(ctl a move "$SRC" "host-b/$DST" --no-wait)
sleep 0.5
ip -n "$BR" link set pb down
start_cut=$(date +%s)
out=$(await_end a "$ID" 20) || fail "$out"
[[ "$out" == *FAILED*UNAVAILABLE* ]] || fail "after the link cut: $out"
echo "ok: link cut -> FAILED UNAVAILABLE after $(( $(date +%s) - start_cut )) s"
ip -n "$BR" link set pb up
await_peers a 2
out=$(ctl a move "$SRC" "host-b/$DST" --length 1MiB --checksum) || fail "after the link came back: $out"
echo "ok: link restored, moves work again"

# Kill host-c's daemon mid-move: the move fails UNAVAILABLE; restarted, it rejoins.
DST_C=$(ctl c alloc 96MiB)
ID=$(ctl a move "$SRC" "host-c/$DST_C" --no-wait)
sleep 0.5
kill -9 "${PID[c]}"
wait "${PID[c]}" 2>/dev/null || true
start_kill=$(date +%s)
out=$(await_end a "$ID" 20) || fail "$out"
[[ "$out" == *FAILED*UNAVAILABLE* ]] || fail "after the kill: $out"
echo "ok: daemon killed -> FAILED UNAVAILABLE after $(( $(date +%s) - start_kill )) s"
start c
for h in a b c; do await_peers "$h" 2; done
DST_C=$(ctl c alloc 32MiB)
out=$(ctl b move "host-a/$SRC" "host-c/$DST_C" --length 32MiB --checksum) || fail "after restart: $out"
ctl c read "$DST_C" "$WORK/back2"
cmp -s "$WORK/data" "$WORK/back2" || fail "bytes on the restarted host-c differ"
echo "ok: restarted host-c rejoined and took a verified move"

# Which transport carried a move (issue 52): host-d is another machine as gpumove sees it
# (its own hostname, in a UTS namespace), so UCX reaches it with peer error handling and
# no shared memory: over TCP here. A move host-b runs shows it; host-d requires RDMA
# (--ucx_require=rdma), so its own moves to the others fail FAILED_PRECONDITION naming
# what UCX chose instead of running over TCP.
ip netns exec "${TAG}d" unshare --uts sh -c "hostname host-d-machine && exec env UCX_TLS=tcp \
  UCX_NET_DEVICES=eth0 $GPUMOVED --node=host-d --listen=${IP[d]}:7470 --peers=${IP[a]}:7470 \
  --heartbeat=200ms --peer_timeout=2s --auth_tokens=$WORK/tokens \
  --cluster_secret_file=$WORK/secret --host_pool_size=128MiB --pinned_pool_size=0 \
  --ucx_require=rdma" 2>>"$WORK/d.log" &
PID[d]=$!
await_peers d 3
D1=$(ctl d alloc 8MiB)
head -c 8388608 "$WORK/data" >"$WORK/data8"
ctl d write "$D1" "$WORK/data8" 2>/dev/null
B3=$(ctl b alloc 8MiB)
out=$(ctl b move "host-d/$D1" "$B3" --checksum) || fail "pull from host-d: $out"
[[ "$out" == *SUCCEEDED*"via tcp/eth0"* ]] || fail "a move over TCP does not say so: $out"
out=$(ctl d move "$D1" "host-b/$B3" 2>&1) && fail "host-d moved without RDMA: $out"
[[ "$out" == *FAILED_PRECONDITION*"ucx_require"* && "$out" == *"tcp/eth0"* ]] ||
  fail "the refusal does not say why: $out"
# The same held per move (TransferSpec.require_transport) on host-b, which requires nothing.
out=$(ctl b move "host-d/$D1" "$B3" --require=rdma 2>&1) && fail "a move requiring rdma ran: $out"
[[ "$out" == *FAILED_PRECONDITION*"require_transport"* && "$out" == *"tcp/eth0"* ]] ||
  fail "the per-move refusal does not say why: $out"
out=$(ctl b move "host-d/$D1" "$B3" --require=tcp --checksum) || fail "require tcp: $out"
[[ "$out" == *SUCCEEDED*"via tcp/eth0"* ]] || fail "a move requiring tcp: $out"
echo "ok: transfers name their transport (tcp/eth0); --ucx_require=rdma and a move's require_transport=rdma refuse TCP"
echo PASS
