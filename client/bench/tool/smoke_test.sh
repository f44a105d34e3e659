#!/usr/bin/env bash
# gpumove-bench cannot rot: every subcommand at a tiny size against a daemon it starts,
# each run's JSON checked against the schema (result.proto, parsed strictly by protobuf's
# JSON parser: an unknown or mistyped field fails), its figures above zero, and the plots
# drawn from the runs (matplotlib; a missing one fails here, since CI installs it).
set -euo pipefail
BENCH=client/bench/tool/gpumove-bench
export GPUMOVED=${GPUMOVED:-$PWD/daemon/gpumoved}
out=${TEST_TMPDIR:-$(mktemp -d)}/bench
mkdir -p "$out/py"
protoc -Iclient/bench/tool --python_out="$out/py" client/bench/tool/result.proto
run() {
  local sub=$1
  shift
  timeout 300 "$BENCH" "$sub" --rounds=2 --seconds=0.1 --json="$out/$sub.json" "$@" \
    >"$out/$sub.txt" 2>&1 || { cat "$out/$sub.txt"; echo "FAIL: $sub"; exit 1; }
  grep -q "vs " "$out/$sub.txt" || { cat "$out/$sub.txt"; echo "FAIL: $sub printed no ratio"; exit 1; }
}
run local --min_size=4KiB --max_size=64KiB
run small --max_clients=2
run node --node_min_size=64KiB --node_max_size=256KiB
PYTHONPATH="$out/py" python3 - "$out"/*.json <<'PY'
import sys
from google.protobuf import json_format
import result_pb2
for path in sys.argv[1:]:
    with open(path) as f:
        run = json_format.Parse(f.read(), result_pb2.BenchRun())  # Strict: unknown fields fail.
    assert run.schema == "gpumove-bench/1", path
    names = {s.name for s in run.series}
    assert any(not s.baseline for s in run.series) and any(s.baseline for s in run.series), path
    assert run.points, path
    for p in run.points:
        assert p.series in names, (path, p.series)
        assert len(p.samples) == 2, (path, p)
        assert min(p.samples) > 0 and p.min <= p.median <= p.max, (path, p)
    print(f"{path}: {run.subcommand}, {len(run.points)} points, schema ok")
PY
"$BENCH" plot "$out"/*.json -o "$out/plots"
for sub in local small node; do
  test -s "$out/plots/$sub.png" || { echo "FAIL: no $sub.png"; exit 1; }
done
echo "PASS: gpumove-bench local, small, node: JSON valid, plots drawn"
