#!/usr/bin/env bash
# Runs every ```sh block of docs/first-hour.md, in order, in one shell (set -euo pipefail),
# with this build's gpumoved and gpumovectl on PATH and the Python client importable: the
# walk-through cannot drift from the programs. The page's ports (7470, 7471) become free
# ones, so the test runs beside others.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$PWD/..}/gpumove"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/first-hour.XXXXXX")"
mkdir -p "$WORK/bin"
ln -s "$RUNFILES/daemon/gpumoved" "$WORK/bin/gpumoved"
ln -s "$RUNFILES/client/cli/gpumovectl" "$WORK/bin/gpumovectl"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
A=$(free_port); B=$(free_port)
while [ "$B" = "$A" ]; do B=$(free_port); done
# The Python client from its sources, with stubs generated here.
PY="$WORK/py"
mkdir -p "$PY"
cp -rL "$RUNFILES/client/python/gpumove" "$PY/"
rm -rf "$PY/gpumove/v1"
if ! GPUMOVE_PROTO_DIR="$RUNFILES/proto" /usr/bin/python3 "$RUNFILES/client/python/gen_stubs.py" "$PY" \
    >/dev/null 2>&1; then
  echo "SKIPPED: the Python block (no protoc / grpc_python_plugin to generate stubs)"
  SKIP_PY=1
fi
script="$WORK/walk.sh"
{
  echo 'set -euo pipefail'
  echo "export PATH=\"$WORK/bin:/usr/bin:/bin\" PYTHONPATH=\"$PY\""
  echo 'alias python3=/usr/bin/python3'
  echo 'shopt -s expand_aliases'
  /usr/bin/python3 - "$RUNFILES/docs/first-hour.md" "${SKIP_PY:-0}" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
assert len(blocks) >= 5, f"only {len(blocks)} sh blocks"
for b in blocks:
    if sys.argv[2] == "1" and "python3 -" in b:
        continue
    print(b)
PYEOF
} | sed -e "s/127\.0\.0\.1:7470/127.0.0.1:$A/g" -e "s/127\.0\.0\.1:7471/127.0.0.1:$B/g" >"$script"
cd "$WORK"
set +e
timeout 120 bash "$script" >"$WORK/out" 2>&1
rc=$?
set -e
cat "$WORK/out"
pkill -f "port_file=a.addr" 2>/dev/null || true
pkill -f "port_file=b.addr" 2>/dev/null || true
[ "$rc" = 0 ] || { echo "FAIL: the walk-through exited $rc"; cat "$WORK"/*.log; exit 1; }
grep -q "the bytes came back equal" "$WORK/out" || { echo "FAIL: no equal bytes"; exit 1; }
grep -q "did you mean --length" "$WORK/out" || { echo "FAIL: no usage hint"; exit 1; }
if [ -z "${SKIP_PY:-}" ]; then
  grep -q "succeeded b'hello from the first hour'" "$WORK/out" || { echo "FAIL: python block"; exit 1; }
fi
echo PASS
