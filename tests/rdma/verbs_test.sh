#!/usr/bin/env bash
# The verbs suite (issue 52): gpumoved over real RDMA verbs, Soft-RoCE (rdma_rxe) in one
# emulated VM per node (tests/rdma/vm.sh). Nodes A and B (and C with --nodes 3), a daemon
# each with bearer tokens and the cluster secret, UCX on rc_verbs (tcp beside it, as UCP
# needs; never ud_verbs, whose endpoint timeouts abort UCX). A push A -> B, a pull B -> A
# and a vectored move, each --checksum and compared byte for byte on the host; rxe0's packet
# counters must rise by about bytes / MTU on the side that sent, and UCX's own log must
# name rc_verbs. With --nodes 3, a third-party move A -> B that C asks for. Last, node-b's
# daemon killed mid-move: the move fails UNAVAILABLE and node-a serves on.
# The emulator's pace (~10 MB/s) is no speed figure. Without QEMU and the packages it
# prints SKIPPED and the reason, and passes (`bash tests/rdma/vm.sh setup` installs them).
set -uo pipefail

NODES=2
[ "${1:-}" = "--nodes" ] && NODES=$2
RUNFILES="${TEST_SRCDIR:-$PWD/..}/gpumove"
HERE="$RUNFILES/tests/rdma"
[ -e "$HERE/vm.sh" ] || HERE="$(dirname "$0")"
# shellcheck source=tests/rdma/vm.sh
source "$HERE/vm.sh"
# The nodes see the host's root, so the binaries' real paths work inside them.
GPUMOVED=$(readlink -f "$RUNFILES/daemon/gpumoved")
CTL=$(readlink -f "$RUNFILES/client/cli/gpumovectl")
MTU=1024  # RoCE's MTU on a 1500-byte Ethernet MTU
MIB=$((1024 * 1024))

why=$(rdma_vm_missing)
if [ -n "$why" ]; then
  echo "SKIPPED: no Soft-RoCE nodes: $why"
  exit 0
fi
# With QEMU there, a kit that cannot be built is a failure, not a skip.
RDMA_KIT=$(rdma_kit) || { echo "FAIL: the VM kit could not be built (tests/rdma/vm.sh kit)"; exit 1; }
RDMA_VM_DIR=$(mktemp -d "${TEST_TMPDIR:-/tmp}/rdma.XXXXXX")
RDMA_VM_LIFETIME=${RDMA_VM_LIFETIME:-280}  # within the test size's 300 s
OUT=${TEST_UNDECLARED_OUTPUTS_DIR:-$RDMA_VM_DIR}
names=(a b c)
names=("${names[@]:0:$NODES}")
declare -A IP=([a]=198.18.0.1 [b]=198.18.0.2 [c]=198.18.0.3)

finish() {
  vm_stop_all
  for f in "$RDMA_VM_DIR"/gpumoved-*.log "$RDMA_VM_DIR"/guest-*.log "$RDMA_VM_DIR"/console-*.log; do
    [ -e "$f" ] && cp "$f" "$OUT/" 2>/dev/null
  done
}
trap finish EXIT
fail() {
  echo "FAIL: $*"
  for n in "${names[@]}"; do
    echo "--- node-$n"
    tail -15 "$RDMA_VM_DIR/gpumoved-$n.log" 2>/dev/null || tail -15 "$RDMA_VM_DIR/guest-$n.log"
    vm_diagnose "$n"
  done
  echo "--- the host's side of the links"
  ss -tn | grep -E "127.0.0.1:($(echo "${RDMA_VM_NETDEV[*]}" | grep -o '127.0.0.1:[0-9]*' | cut -d: -f2 | sort -u | paste -sd'|'))\b"
  exit 1
}
TOKEN=rdma-admin-token-0123456789
echo "$TOKEN,ops,ops,admin" >"$RDMA_VM_DIR/tokens"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$RDMA_VM_DIR/secret"

# ctl NODE ARGS...: gpumovectl on NODE against its own daemon (quoting: words, no spaces).
ctl() {
  local n=$1
  shift
  vm_exec "$n" 180 "GPUMOVE_TOKEN=$TOKEN $CTL --timeout 60s --addr ${IP[$n]}:7470 $*"
}
# counter NODE NAME: one of rxe0's hardware counters (sent_pkts, rcvd_pkts).
counter() {
  vm_exec "$1" 30 "cat /sys/class/infiniband/rxe0/ports/1/hw_counters/$2"
}
# expect_packets WHAT BYTES BEFORE AFTER: a rise of about BYTES / MTU (at most a quarter
# more, for the move's own control messages and heartbeats over UCX).
expect_packets() {
  local rise=$(($4 - $3)) want=$(($2 / MTU))
  echo "  $1 rose by $rise (bytes / MTU = $want)"
  [ "$rise" -ge "$want" ] && [ "$rise" -le $((want + want / 4)) ] ||
    fail "$1 rose by $rise, want about $want: the bytes did not go over verbs"
}
# timed_move NODE WHAT ARGS...: a move on NODE with its wall time and rate printed.
timed_move() {
  local n=$1 what=$2 t out
  shift 2
  t=$(date +%s%N)
  out=$(ctl "$n" move "$@" --checksum) || fail "$what: $out"
  [[ "$out" == *SUCCEEDED* ]] || fail "$what: $out"
  # The transfer names what carried it: verbs (the daemons also refuse anything else,
  # --ucx_require=rdma).
  [[ "$out" == *"via rc_verbs/rxe0:1"* ]] || fail "$what: not said to be over rc_verbs: $out"
  local ms=$((($(date +%s%N) - t) / 1000000))
  echo "ok: $what in $ms ms as the host saw it (the emulator's pace, no speed figure): $out"
}

rdma_vm_net "$NODES"
t=$SECONDS
for i in "${!names[@]}"; do vm_start "${names[i]}" "$i" "${IP[${names[i]}]}"; done
for n in "${names[@]}"; do vm_wait_ready "$n" 150 || fail "node-$n did not boot"; done
echo "ok: $NODES nodes booted with rxe0 ACTIVE in $((SECONDS - t)) s"

t=$SECONDS
# stdbuf: UCX logs to stdout, which is a file here; line by line, the log is read live.
for n in "${names[@]}"; do
  vm_exec "$n" 30 "UCX_TLS=rc_verbs,tcp,self UCX_NET_DEVICES=rxe0:1,eth0 UCX_LOG_LEVEL=info \
    nohup stdbuf -oL $GPUMOVED --node=node-$n --listen=${IP[$n]}:7470 --peers=${IP[a]}:7470 \
    --heartbeat=1s --peer_timeout=60s --forward_timeout=120s --handshake_timeout=60s \
    --auth_tokens=/vmout/tokens --cluster_secret_file=/vmout/secret \
    --ucx_net_devices=rxe0:1,eth0 --ucx_lanes=1 --host_pool_size=128MiB --pinned_pool_size=16MiB \
    --ucx_require=rdma \
    >/vmout/gpumoved-$n.log 2>&1 & echo \$! >/run/gpumoved.pid" || fail "node-$n: gpumoved did not start"
done
for n in "${names[@]}"; do
  up=""
  for _ in $(seq 60); do
    up=$(ctl "$n" peers 2>&1 | grep -c ' up$')
    [ "$up" = $((NODES - 1)) ] && break
    sleep 1
  done
  [ "$up" = $((NODES - 1)) ] || fail "node-$n sees $up peers up: $(ctl "$n" peers 2>&1)"
done
echo "ok: daemons up and joined in $((SECONDS - t)) s"
info=$(ctl a info) || fail "info: $info"
[[ "$info" == *UCX_TLS=rc_verbs* ]] || fail "UCX is not on rc_verbs: $info"
vm_exec a 10 "env -u GPUMOVE_TOKEN $CTL --addr ${IP[a]}:7470 --timeout 60s ls" >/dev/null 2>&1 &&
  fail "a caller without a token was served"

# A push A -> B and a pull B -> A of 8 MiB, verified.
SIZE=$((8 * MIB))
head -c "$SIZE" /dev/urandom >"$RDMA_VM_DIR/data"
SRC=$(ctl a alloc 8MiB) || fail "alloc: $SRC"
DST=$(ctl b alloc 8MiB --kind pinned) || fail "alloc: $DST"
BACK=$(ctl a alloc 8MiB) || fail "alloc: $BACK"
ctl a write "$SRC" /vmout/data >/dev/null || fail "write"

sent0=$(counter a sent_pkts) && rcvd0=$(counter b rcvd_pkts) || fail "no rxe0 counters"
timed_move a "push A -> B, 8 MiB" "$SRC" "node-b/$DST"
sent1=$(counter a sent_pkts) && rcvd1=$(counter b rcvd_pkts) || fail "no rxe0 counters"
expect_packets "node-a's sent_pkts" "$SIZE" "$sent0" "$sent1"
expect_packets "node-b's rcvd_pkts" "$SIZE" "$rcvd0" "$rcvd1"
ctl b read "$DST" /vmout/pushed >/dev/null || fail "read on node-b"
cmp -s "$RDMA_VM_DIR/data" "$RDMA_VM_DIR/pushed" || fail "bytes read on node-b differ from those written on node-a"
echo "ok: push A -> B, bytes compared"

sent0=$(counter b sent_pkts) && rcvd0=$(counter a rcvd_pkts) || fail "no rxe0 counters"
timed_move a "pull B -> A, 8 MiB" "node-b/$DST" "$BACK"
sent1=$(counter b sent_pkts) && rcvd1=$(counter a rcvd_pkts) || fail "no rxe0 counters"
expect_packets "node-b's sent_pkts" "$SIZE" "$sent0" "$sent1"
expect_packets "node-a's rcvd_pkts" "$SIZE" "$rcvd0" "$rcvd1"
ctl a read "$BACK" /vmout/pulled >/dev/null || fail "read on node-a"
cmp -s "$RDMA_VM_DIR/data" "$RDMA_VM_DIR/pulled" || fail "bytes pulled back differ"
echo "ok: pull B -> A, bytes compared"

# A vectored move A -> B: 64 KiB blocks of SRC to shuffled places in a fresh buffer.
BLOCK=65536
VEC=$(ctl b alloc 8MiB) || fail "alloc: $VEC"
/usr/bin/python3 - "$RDMA_VM_DIR/blocks" <<'EOF'
import random, sys
pairs = list(zip(random.sample(range(128), 48), random.sample(range(128), 48)))
with open(sys.argv[1], "w") as f:
    f.writelines(f"{s} {d}\n" for s, d in pairs)
EOF
sent0=$(counter a sent_pkts)
timed_move a "vectored A -> B, 48 blocks of 64 KiB" "$SRC" "node-b/$VEC" \
  --blocks /vmout/blocks --block_size 64KiB
sent1=$(counter a sent_pkts)
expect_packets "node-a's sent_pkts" $((48 * BLOCK)) "$sent0" "$sent1"
ctl b read "$VEC" /vmout/vectored >/dev/null || fail "read on node-b"
/usr/bin/python3 - "$RDMA_VM_DIR" "$BLOCK" <<'EOF' || fail "vectored blocks differ"
import sys
d, b = sys.argv[1], int(sys.argv[2])
src, dst = open(f"{d}/data", "rb").read(), open(f"{d}/vectored", "rb").read()
for line in open(f"{d}/blocks"):
    s, t = map(int, line.split())
    if src[s * b:(s + 1) * b] != dst[t * b:(t + 1) * b]:
        sys.exit(f"block {s} -> {t} differs")
EOF
echo "ok: vectored move A -> B, every block compared"

if [ "$NODES" = 3 ]; then
  THIRD=$(ctl b alloc 8MiB) || fail "alloc: $THIRD"
  sent0=$(counter a sent_pkts) && csent0=$(counter c sent_pkts)
  timed_move c "third-party A -> B asked by C, 8 MiB" "node-a/$SRC" "node-b/$THIRD"
  sent1=$(counter a sent_pkts) && csent1=$(counter c sent_pkts)
  expect_packets "node-a's sent_pkts" "$SIZE" "$sent0" "$sent1"
  [ $((csent1 - csent0)) -lt $((SIZE / MTU / 10)) ] ||
    fail "node-c sent $((csent1 - csent0)) packets: the bytes went through it"
  ctl b read "$THIRD" /vmout/third >/dev/null || fail "read on node-b"
  cmp -s "$RDMA_VM_DIR/data" "$RDMA_VM_DIR/third" || fail "third-party bytes differ"
  echo "ok: third-party move A -> B asked by C, bytes compared"
fi

# UCX itself says the endpoints' data lanes are rc_verbs on rxe0.
for n in a b; do
  grep -q 'rma(rc_verbs/rxe0:1)' "$RDMA_VM_DIR/gpumoved-$n.log" ||
    fail "node-$n's UCX log names no rc_verbs endpoint: $(grep -m3 ep_cfg "$RDMA_VM_DIR/gpumoved-$n.log")"
done
grep -h -m1 'ep_cfg' "$RDMA_VM_DIR/gpumoved-a.log" | sed 's/^/ucx: /'
grep -q 'ud_verbs' "$RDMA_VM_DIR"/gpumoved-*.log && fail "a UCX endpoint uses ud_verbs"

# node-b's daemon killed mid-move: over rc_verbs the move fails UNAVAILABLE in bounded
# time and node-a serves on (UCX's UD endpoints aborted the daemon in this case).
BIG=$(ctl a alloc 64MiB) || fail "alloc: $BIG"
BIGB=$(ctl b alloc 64MiB) || fail "alloc: $BIGB"
ID=$(ctl a move "$BIG" "node-b/$BIGB" --no-wait) || fail "move --no-wait: $ID"
sleep 1
vm_exec b 20 'kill -9 "$(cat /run/gpumoved.pid)"' || fail "could not kill node-b's daemon"
t=$SECONDS
out=$(ctl a wait "$ID")
[[ "$out" == *FAILED*UNAVAILABLE* ]] || fail "after node-b's daemon died: $out"
ctl a info >/dev/null || fail "node-a stopped serving after its peer died"
echo "ok: node-b killed mid-move -> FAILED UNAVAILABLE within $((SECONDS - t)) s, node-a serves on (UNAVAILABLE${out##*UNAVAILABLE})"
echo PASS
