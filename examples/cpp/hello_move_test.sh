#!/usr/bin/env bash
# Runs examples/cpp/hello_move against a fresh daemon: the C++ page of the docs works.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$PWD/..}/gpumove"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/hello.XXXXXX")"
"$RUNFILES/daemon/gpumoved" --listen=127.0.0.1:0 --port_file="$WORK/addr" --node=hello \
  --host_pool_size=64MiB --pinned_pool_size=16MiB 2>"$WORK/log" &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null || true; wait $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -s "$WORK/addr" ] && break; sleep 0.05; done
out=$("$RUNFILES/examples/cpp/hello_move" "$(cat "$WORK/addr")")
echo "$out"
[[ "$out" == "moved 1048576 bytes "*" read back equal" ]] || { cat "$WORK/log"; exit 1; }
echo PASS
