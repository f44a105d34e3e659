#!/usr/bin/env bash
# Builds the gpumove wheel offline, installs it into a fresh venv with the system's site
# packages (Debian's python3-grpcio, -protobuf, -numpy, -pytest, -pytest-asyncio), and runs
# the package's tests with that venv against real daemons. Bazel keeps pytest's JUnit XML
# (every case counted by tests/summarize.py). Without those packages: SKIPPED, saying which.
set -euo pipefail
PY=${PYTHON:-/usr/bin/python3}
missing=$("$PY" - <<'PYEOF'
import importlib.util
need = ["grpc", "google.protobuf", "numpy", "pytest", "pytest_asyncio", "build", "setuptools"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PYEOF
)
if [ -n "$missing" ]; then
  echo "SKIPPED: $PY lacks $missing (deploy/setup.sh installs them)"
  exit 0
fi
root=${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}
[ -d "$root/client/python" ] || root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpumove-python.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -rL "$root/client/python" "$work/pkg"
rm -rf "$work/pkg/gpumove/v1" "$work/pkg/build" "$work/pkg/dist"
export GPUMOVE_PROTO_DIR="$root/proto"
(cd "$work/pkg" && "$PY" -m build --no-isolation --wheel --outdir "$work/dist" >"$work/build.log" 2>&1) ||
  { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/gpumove-*.whl)
echo "built $(basename "$wheel")"
"$PY" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --no-index --no-deps --quiet "$wheel"
export GPUMOVED="$root/daemon/gpumoved"
export GPUMOVE_EXAMPLES="$root/examples/python"
cd "$work/pkg/tests"
rm -rf "$work/pkg/gpumove"  # The tests import the installed wheel, not the sources.
xml=${XML_OUTPUT_FILE:-$work/pytest.xml}
"$work/venv/bin/python" -c "import gpumove, gpumove.v1.gpumove_pb2_grpc; print('installed', gpumove.__file__)"
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$xml" .
