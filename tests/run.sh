#!/usr/bin/env bash
# Runs every test that needs no GPU (the README's test command) and ends with one line:
# "N passed, N failed", counting test cases (gtest cases, one per shell test).
# Extra arguments go to `bazel test`, e.g. --config=gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
filters=()
if [ "$(id -u)" != 0 ]; then
  # Network-namespace tests need root (CI runs as root); say so rather than fail.
  echo "tests/run.sh: not root, leaving out the netns- and container-tagged tests"
  filters=(--test_tag_filters=-gpu,-manual,-netns,-container)
fi
log=$(mktemp)
bazel test //... --test_summary=short "${filters[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
first=$(python3 tests/summarize.py "$log" bazel-testlogs)
# deploy/: Kubernetes manifests, Prometheus rules, the Grafana dashboard (tests/deploy),
# while the plain build's binaries are the ones in bazel-bin (the sanitizer builds below
# replace them).
bash tests/deploy/run.sh 2>&1 | tee "$log"
deploy=$(tail -1 "$log")
case "$deploy" in *" passed, 0 failed") ;; *) rc=1 ;; esac
echo "deploy pass: $deploy"
# The MPI suite again against MPICH (the daemon rebuilt with --config=mpich).
bazel test --config=mpich --test_env=GPUMOVE_MPI=mpich //tests:mpi_test --test_summary=short \
    "$@" 2>&1 | tee "$log"
mrc=${PIPESTATUS[0]}
[ "$mrc" = 0 ] || rc=$mrc
mpich=$(python3 tests/summarize.py "$log" bazel-testlogs)
echo "MPICH pass: $mpich"
# The unit, integration, hostile-peer and cluster tests again under AddressSanitizer and
# UndefinedBehaviorSanitizer (.bazelrc's asan config).
bazel test --config=asan //daemon/... //tests:integration_test //tests:hostile_peer_test \
    //tests:cluster_test //tests:tls_test //tests:auth_test //tests:peer_auth_test \
    --test_summary=short "$@" 2>&1 | tee "$log"
arc=${PIPESTATUS[0]}
[ "$arc" = 0 ] || rc=$arc
asan=$(python3 tests/summarize.py "$log" bazel-testlogs)
echo "ASan+UBSan pass: $asan"
# The unit tests (scheduler, registry, holds, staging, transports, cluster) under
# ThreadSanitizer: .bazelrc's tsan config, with the system's absl annotated for it
# (tests/tsan/absl_sync_annotations.cc, proven by tests/tsan:annotations_test).
bazel test --config=tsan //daemon/... //tests/tsan:all --test_summary=short "$@" 2>&1 | tee "$log"
trc=${PIPESTATUS[0]}
[ "$trc" = 0 ] || rc=$trc
tsan=$(python3 tests/summarize.py "$log" bazel-testlogs)
echo "TSan pass: $tsan"
# The fuzz targets with libFuzzer, 60 s each (FUZZ_SECONDS), from their corpora.
bash tests/fuzz/run.sh "${FUZZ_SECONDS:-60}" 2>&1 | tee "$log"
fuzz=$(tail -1 "$log")
case "$fuzz" in *" passed, 0 failed") ;; *) rc=1 ;; esac
echo "fuzz pass: $fuzz"
rm -f "$log"
echo "$first; $mpich; $asan; $tsan; $fuzz; $deploy" | tr ';' '\n' |
  awk '{p += $1; f += $3} END {print p " passed, " f " failed"}'
exit "$rc"
