#!/usr/bin/env bash
# The README's main command: sets itself up, builds, starts a local cluster of three
# gpumoved nodes on their embedded defaults (host memory when there is no GPU), moves
# real data between them end to end and shows what happened and how fast. Leaves
# nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${GPUMOVE_DEMO_SIZE:-256MiB}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "setting up (Debian packages, offline Bazel build)"
bash deploy/setup.sh
bazel build //daemon:gpumoved //client/cli:gpumovectl 2>&1 | tail -1
BIN=$(bazel info bazel-bin 2>/dev/null)
CTL="$BIN/client/cli/gpumovectl"

WORK=$(mktemp -d /tmp/gpumove-quickstart.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
start_node() {  # start_node NAME [PEER] -> prints the node's address
  local name=$1 peer=${2:-}
  "$BIN/daemon/gpumoved" --node="$name" --listen=127.0.0.1:0 --port_file="$WORK/$name.addr" \
    ${peer:+--peers=$peer} 2>"$WORK/$name.log" &
  PIDS+=($!)
  for _ in $(seq 300); do [ -s "$WORK/$name.addr" ] && break; sleep 0.05; done
  [ -s "$WORK/$name.addr" ] || { cat "$WORK/$name.log" >&2; exit 1; }
}

step "starting a local cluster of three gpumoved nodes (logs in $WORK)"
start_node node-a
A=$(cat "$WORK/node-a.addr")
start_node node-b "$A"
start_node node-c "$A"
B=$(cat "$WORK/node-b.addr")
C=$(cat "$WORK/node-c.addr")
echo "node-a $A   node-b $B   node-c $C"
for _ in $(seq 100); do
  [ "$("$CTL" --addr "$C" peers | grep -c ' up')" = 2 ] && break
  sleep 0.1
done
"$CTL" --addr "$C" peers
"$CTL" --addr "$A" info

step "allocating $SIZE on each node: node-a host, node-b pinned, node-c host"
SRC=$("$CTL" --addr "$A" alloc "$SIZE" --label demo-source)
MID=$("$CTL" --addr "$B" alloc "$SIZE" --kind pinned --label demo-middle)
DST=$("$CTL" --addr "$C" alloc "$SIZE" --label demo-destination)
echo "node-a/$SRC  node-b/$MID  node-c/$DST"

step "writing $SIZE of random bytes into node-a/$SRC"
head -c "$(( $(numfmt --from=iec "${SIZE%iB}") ))" /dev/urandom >"$WORK/data"
"$CTL" --addr "$A" write "$SRC" "$WORK/data"

step "third-party move: a client of node-c moves node-a -> node-b (UCX, xxh3 checked)"
"$CTL" --addr "$C" move "node-a/$SRC" "node-b/$MID" --checksum
step "pull: node-c pulls node-b -> node-c"
"$CTL" --addr "$C" move "node-b/$MID" "$DST" --checksum

if "$CTL" --addr "$C" info | grep -q '^  gpu0 '; then
  step "GPU found on node-c: through its device memory and back (LOCAL)"
  DEV=$("$CTL" --addr "$C" alloc "$SIZE" --kind device --gpu 0 --label demo-gpu)
  "$CTL" --addr "$C" move "$DST" "$DEV" --checksum
  "$CTL" --addr "$C" move "$DEV" "$DST" --checksum
fi

step "reading node-c/$DST back and comparing with what was written on node-a"
"$CTL" --addr "$C" read "$DST" "$WORK/back"
if cmp -s "$WORK/data" "$WORK/back"; then
  echo "OK: all $(stat -c %s "$WORK/back") bytes match (sha256 $(sha256sum <"$WORK/back" | cut -c1-16)...)"
else
  echo "MISMATCH: the bytes read back differ" >&2
  exit 1
fi

step "node-a -> node-b at a few sizes, timed by the daemon that ran them"
for len in 4KiB 1MiB 64MiB "$SIZE"; do
  "$CTL" --addr "$A" move "$SRC" "node-b/$MID" --length "$len"
done

step "transfers, asked of node-b (any node answers for any transfer)"
"$CTL" --addr "$A" transfers | tail -n +2 | head -3 | awk '{print $1}' | while read -r id; do
  "$CTL" --addr "$B" transfer "$id"
done
step "stopping the cluster (SIGTERM drains each node)"
for p in "${PIDS[@]}"; do kill -TERM "$p"; done
for p in "${PIDS[@]}"; do wait "$p"; done
PIDS=()
echo "all nodes exited cleanly"
