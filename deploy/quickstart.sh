#!/usr/bin/env bash
# The README's main command: sets itself up, builds, starts gpumoved on its embedded
# defaults (host memory when there is no GPU), moves real data through it end to end and
# shows what happened and how fast. Leaves nothing running.
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
step "starting gpumoved (node demo-node, log in $WORK/gpumoved.log)"
"$BIN/daemon/gpumoved" --node=demo-node --listen=127.0.0.1:0 --port_file="$WORK/addr" \
  2>"$WORK/gpumoved.log" &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 300); do [ -s "$WORK/addr" ] && break; sleep 0.05; done
[ -s "$WORK/addr" ] || { cat "$WORK/gpumoved.log"; exit 1; }
export GPUMOVE_ADDR=$(cat "$WORK/addr")
echo "listening on $GPUMOVE_ADDR"
"$CTL" info

step "allocating two $SIZE buffers: pageable host and pinned host"
SRC=$("$CTL" alloc "$SIZE" --label demo-source)
DST=$("$CTL" alloc "$SIZE" --kind pinned --label demo-destination)
"$CTL" ls

step "writing $SIZE of random bytes into $SRC"
head -c "$(( $(numfmt --from=iec "${SIZE%iB}") ))" /dev/urandom >"$WORK/data"
"$CTL" write "$SRC" "$WORK/data"

if "$CTL" --json info | grep -q '"gpus"'; then
  step "GPU found: moving through device memory (host -> GPU 0 -> pinned)"
  DEV=$("$CTL" alloc "$SIZE" --kind device --gpu 0 --label demo-gpu)
  "$CTL" move "$SRC" "$DEV" --checksum
  "$CTL" move "$DEV" "$DST" --checksum
else
  step "moving $SRC -> $DST with an end-to-end xxh3 checksum"
  "$CTL" move "$SRC" "$DST" --checksum
fi

step "reading $DST back and comparing with what was written"
"$CTL" read "$DST" "$WORK/back"
if cmp -s "$WORK/data" "$WORK/back"; then
  echo "OK: all $(stat -c %s "$WORK/back") bytes match (sha256 $(sha256sum <"$WORK/back" | cut -c1-16)...)"
else
  echo "MISMATCH: the bytes read back differ" >&2
  exit 1
fi

step "a few more moves (4 KiB .. $SIZE), timed by the daemon"
for len in 4KiB 1MiB 64MiB "$SIZE"; do "$CTL" move "$SRC" "$DST" --length "$len"; done

step "transfers"
"$CTL" transfers
step "stopping gpumoved (SIGTERM drains)"
kill -TERM $DAEMON
wait $DAEMON && echo "gpumoved exited cleanly"
