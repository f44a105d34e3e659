#!/usr/bin/env bash
# gpumove-bench cannot rot: every subcommand at a tiny size against a daemon it starts,
# each run's JSON checked against the schema (result.proto, parsed strictly by protobuf's
# JSON parser: an unknown or mistyped field fails), its figures above zero, and the plots
# drawn from the runs (matplotlib; a missing one fails here, since CI installs it).
# Usage: smoke_test.sh [mpi]: with mpi, the subcommands that start MPI jobs (mpi,
# mpi_datatype; the test tagged mpi), else all the others.
set -euo pipefail
mode=${1:-main}
BENCH=client/bench/tool/gpumove-bench
export GPUMOVED=${GPUMOVED:-$PWD/daemon/gpumoved}
out=${TEST_TMPDIR:-$(mktemp -d)}/bench
mkdir -p "$out/py"
protoc -Iclient/bench/tool --python_out="$out/py" client/bench/tool/result.proto
# run NAME SUBCOMMAND FLAGS...: a run that must measure (a ratio printed).
run() {
  local name=$1 sub=$2
  shift 2
  timeout 300 "$BENCH" "$sub" --rounds=2 --seconds=0.1 --json="$out/$name.json" "$@" \
    >"$out/$name.txt" 2>&1 || { cat "$out/$name.txt"; echo "FAIL: $name"; exit 1; }
  grep -q "vs " "$out/$name.txt" || { cat "$out/$name.txt"; echo "FAIL: $name printed no ratio"; exit 1; }
}
# may_skip NAME SUBCOMMAND FLAGS...: a run that needs what this machine may lack (a GPU,
# the CUDA-aware UCX, the Python client's stubs): it measures, or says SKIPPED with a
# reason and exits 0; where there is no GPU, GPU runs must skip.
may_skip() {
  local name=$1 sub=$2 gpu=$3
  shift 3
  timeout 300 "$BENCH" "$sub" --rounds=2 --seconds=0.1 --json="$out/$name.json" "$@" \
    >"$out/$name.txt" 2>&1 || { cat "$out/$name.txt"; echo "FAIL: $name"; exit 1; }
  if grep -qE "^SKIPPED: .{10,}" "$out/$name.txt"; then
    echo "$name: $(grep -m1 '^SKIPPED' "$out/$name.txt")"
  elif [ "$gpu" = gpu ] && ! ls /dev/nvidia0 >/dev/null 2>&1; then
    cat "$out/$name.txt"; echo "FAIL: $name measured without a GPU, or skipped without a reason"; exit 1
  else
    grep -q "vs " "$out/$name.txt" || { cat "$out/$name.txt"; echo "FAIL: $name printed no ratio"; exit 1; }
  fi
}
if [ "$mode" = mpi ]; then
  # Path MPI against raw MPI (and NetPIPE where it is installed), then vectored MPI
  # without a daemon (the ranks check every way's bytes: a wrong block fails the run).
  run mpi mpi --mpi_min_size=256KiB --mpi_max_size=1MiB
  run mpi_datatype mpi_datatype --vec_shapes=512x4KiB,512x64KiB --mpi_chunk=256KiB
  may_skip mpi_device mpi gpu --mpi_device --mpi_min_size=256KiB --mpi_max_size=1MiB
  may_skip mpi_datatype_device mpi_datatype gpu --mpi_device --vec_shapes=512x4KiB --mpi_chunk=256KiB
  plotted="mpi mpi_datatype"
else
run local local --min_size=4KiB --max_size=64KiB
run small small --max_clients=2 --small_node --batch=2
run node node --node_min_size=64KiB --node_max_size=256KiB
# Every ucx_perftest server was stopped once its client ended.
sleep 0.5
! pgrep -f "ucx_perftest -t ucp_put_bw" >/dev/null || { echo "FAIL: a ucx_perftest was left running"; exit 1; }
run vectored vectored --vec_case=local --vec_shapes=64x4KiB,16x64KiB --separate_blocks=32
run vectored_ucx vectored --vec_case=ucx --vec_shapes=64x4KiB --separate_blocks=32
run storage storage --storage_min_size=64KiB --storage_max_size=1MiB --storage_dir="${TEST_TMPDIR:-/tmp}"
run qos qos --qos_bulk_size=1MiB --qos_bulk_streams=2 --qos_window=200ms
may_skip tls tls cpu --tls_small_moves=50 --tls_big=4MiB --tls_big_moves=2
may_skip python python cpu --py_min_size=4KiB --py_max_size=64KiB
may_skip vectored_device vectored gpu --vec_case=device --vec_shapes=64x4KiB
may_skip direct direct gpu --gpu_min_size=64KiB --gpu_max_size=256KiB
may_skip staged staged gpu --gpu_min_size=64KiB --gpu_max_size=256KiB
may_skip gpu_local gpu_local gpu --gl_case=pinned_to_device --gpu_min_size=64KiB --gpu_max_size=256KiB
# Before/after: the same gpumoved twice, one round each; both pooled runs and the ratios.
timeout 300 "$BENCH" compare --before="$GPUMOVED" --after="$(dirname "$GPUMOVED")" \
  --compare_rounds=1 --out="$out/compare" local --rounds=2 --seconds=0.1 --min_size=4KiB \
  --max_size=16KiB >"$out/compare.txt" 2>&1 || { cat "$out/compare.txt"; echo "FAIL: compare"; exit 1; }
grep -q "^after / before" "$out/compare.txt" || { cat "$out/compare.txt"; echo "FAIL: no ratios"; exit 1; }
cp "$out/compare/before.json" "$out/compare_before.json"
cp "$out/compare/after.json" "$out/compare_after.json"
if "$BENCH" compare --before=/nonexistent --after="$GPUMOVED" local >"$out/bad.txt" 2>&1; then
  echo "FAIL: compare accepted a missing gpumoved"; exit 1
fi
grep -q "no /nonexistent" "$out/bad.txt" || { cat "$out/bad.txt"; echo "FAIL: compare's error"; exit 1; }
plotted="local small node vectored qos storage"
fi
PYTHONPATH="$out/py" python3 - "$out"/*.json <<'PY'
import sys
from google.protobuf import json_format
import result_pb2
for path in sys.argv[1:]:
    with open(path) as f:
        run = json_format.Parse(f.read(), result_pb2.BenchRun())  # Strict: unknown fields fail.
    assert run.schema == "gpumove-bench/1", path
    if run.skipped:
        assert not run.points and len(run.skipped) >= 10, path
        print(f"{path}: {run.subcommand} skipped: {run.skipped}")
        continue
    names = {s.name for s in run.series}
    assert any(not s.baseline for s in run.series) and any(s.baseline for s in run.series), path
    assert run.points, path
    # What each of these subcommands measures wherever it runs at all.
    required = {
        "small": {"gpumove", "gpumove node", "grpc echo"},
        "mpi": {"gpumove single", "gpumove stream", "raw MPI", "raw MPI cold", "memcpy cold"},
        "mpi_datatype": {"contiguous", "datatype", "dt/chunk", "packed"},
        "storage": {"gpumove write", "gpumove read", "pwrite", "pread"},
        "qos": {"b p99 under bulk", "b p99 idle", "b p99 under bulk, normal class",
                "a:c bytes", "a+c GB/s, weighted bulk", "a+c GB/s, plain normal",
                "a bulk GB/s under a latency flood"},
        "tls": {f"{w}{m}" for w in ("secured", "open") for m in (" 4K", " 4K p99", " a->b 4K", " a->b")},
    }.get(run.subcommand, set())
    measured = {p.series for p in run.points}
    assert required <= measured, (path, required - measured)
    for p in run.points:
        assert p.series in names, (path, p.series)
        assert len(p.samples) == 2, (path, p)
        assert min(p.samples) > 0 and p.min <= p.median <= p.max, (path, p)
    print(f"{path}: {run.subcommand}, {len(run.points)} points, schema ok")
PY
"$BENCH" plot "$out"/*.json -o "$out/plots"
for sub in $plotted; do
  test -s "$out/plots/$sub.png" || { echo "FAIL: no $sub.png"; exit 1; }
done
echo "PASS ($mode): gpumove-bench $(cd "$out" && ls -- *.json | sed 's/\.json$//' | tr '\n' ' '): JSON valid, plots drawn"
