#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer (clang, ASan+UBSan: .bazelrc's fuzz config) and
# runs each for SECONDS (default 60), FUZZ_JOBS at once (default: the CPUs), from its
# checked-in corpus, new inputs kept in a
# scratch folder. Ends with "N passed, N failed" (one case per target: failed when
# libFuzzer found a crash, a leak or a timeout; the reproducer is left in $OUT, default
# /tmp/gpumove-fuzz). Needs clang and libclang-rt (deploy/setup.sh installs them).
#   bash tests/fuzz/run.sh 60            # what CI runs
#   bash tests/fuzz/run.sh 3600 service_fuzz   # a long run of one target
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(ucx_wire_fuzz ucx_call_fuzz ref_fuzz descriptor_fuzz service_fuzz)
out=${OUT:-/tmp/gpumove-fuzz}
mkdir -p "$out"
if ! bazel build --config=fuzz "${targets[@]/#/\/\/tests\/fuzz:}"; then
  echo "fuzz: build failed"
  echo "0 passed, ${#targets[@]} failed"
  exit 1
fi
bin=$(bazel info --config=fuzz bazel-bin)/tests/fuzz
passed=0
failed=0
# Runs one target for `seconds`; its exit code lands in $out/$t.rc.
fuzz_one() {
  local t=$1 scratch="$out/$1.corpus" log="$out/$1.log"
  mkdir -p "$scratch"
  # -timeout: one input running longer than this is a hang; -rss_limit_mb: a leak.
  UCX_LOG_LEVEL=fatal LSAN_OPTIONS=suppressions=tests/fuzz/lsan.supp "$bin/$t" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$out/$t-" "$scratch" "tests/fuzz/corpus/$t" > "$log" 2>&1
  echo $? > "$out/$t.rc"
}
# As many targets at once as there are CPUs (FUZZ_JOBS): each libFuzzer is one thread.
jobs=${FUZZ_JOBS:-$(nproc)}
running=0
for t in "${targets[@]}"; do
  rm -f "$out/$t.rc"
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait
for t in "${targets[@]}"; do
  log="$out/$t.log"
  rc=$(cat "$out/$t.rc" 2>/dev/null || echo "missing")
  runs=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1))
    echo "fuzz $t: PASSED, ${runs:-?} inputs in ${seconds}s"
  else
    failed=$((failed + 1))
    echo "fuzz $t: FAILED (exit $rc); see $log and $out/$t-*"
    grep -a -m5 -E "ERROR|SUMMARY|==[0-9]+==" "$log"
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
