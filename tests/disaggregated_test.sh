#!/usr/bin/env bash
# examples/python/disaggregated.py against this build's gpumoved (tests/disaggregated_test.py,
# pytest, CPU): a Llama-style decoder's KV cache moved layer by layer from a prefill process
# to a decode process, the decode side's tokens equal to one process's. The Python client
# from its sources, stubs generated here. SKIPPED (passing) without Debian's python3-torch
# or the other Python packages, saying which.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-gpumove}"
PY=${PYTHON:-/usr/bin/python3}
missing=$("$PY" - <<'PYEOF'
import importlib.util
need = {"torch": "python3-torch", "numpy": "python3-numpy", "grpc": "python3-grpcio",
        "google.protobuf": "python3-protobuf", "pytest": "python3-pytest"}
def found(m):
    try:
        return importlib.util.find_spec(m) is not None
    except ImportError:  # Its parent package is missing.
        return False
print(" ".join(f"{m} ({p})" for m, p in need.items() if not found(m)))
PYEOF
)
if [ -n "$missing" ]; then
  echo "SKIPPED: $PY lacks $missing (deploy/setup.sh installs them)"
  exit 0
fi
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/disaggregated.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/py"
cp -rL "$RUNFILES/client/python/gpumove" "$WORK/py/"
rm -rf "$WORK/py/gpumove/v1"
if ! GPUMOVE_PROTO_DIR="$RUNFILES/proto" "$PY" "$RUNFILES/client/python/gen_stubs.py" "$WORK/py" \
    >"$WORK/stubs.log" 2>&1; then
  cat "$WORK/stubs.log"
  echo "SKIPPED: no protoc / grpc_python_plugin to generate the client's stubs"
  exit 0
fi
export PYTHONPATH="$WORK/py"
export GPUMOVED="$RUNFILES/daemon/gpumoved"
export GPUMOVE_EXAMPLES="$RUNFILES/examples/python"
export GPUMOVE_DAEMONS="$RUNFILES/client/python/tests"
# One thread per process: the model is tiny, and the machine is shared.
export OMP_NUM_THREADS=1
cd "$WORK"
cp "$RUNFILES/tests/disaggregated_test.py" .
"$PY" -m pytest -q -s -p no:cacheprovider --durations=0 \
  --junitxml="${XML_OUTPUT_FILE:-$WORK/pytest.xml}" disaggregated_test.py
