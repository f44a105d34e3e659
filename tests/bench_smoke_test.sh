#!/usr/bin/env bash
# The benchmarks that prove our speed claims still run: small sizes, two rounds, with the
# baselines the machine has; every gpumove figure and ratio printed and non-zero, the
# memcpy reference under them, and no baseline process left behind.
# Usage: bench_smoke_test.sh node|mpi|datatype
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$PWD/..}/gpumove"
export GPUMOVED="$RUNFILES/daemon/gpumoved"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/bench.XXXXXX")"
fail() { echo "FAIL: $*"; cat "$WORK/out" 2>/dev/null; exit 1; }
# check_rows FILE COLUMNS...: a row for 256 KiB and 1 MiB whose named columns (1-based,
# counting the size's two fields as 1 and 2) are all above zero.
check_rows() {
  local file=$1; shift
  for size in "256 KiB" "1 MiB"; do
    row=$(grep -m1 -E "^ +${size} " "$file") || fail "no row for $size in $file"
    for col in "$@"; do
      awk -v c="$col" '{ exit !($c > 0) }' <<<"$row" || fail "column $col of '$row' is not above 0"
    done
  done
}
# split: the figures' table into $WORK/main, the memcpy table under it into $WORK/memcpy.
split() {
  awk -v m="$WORK/main" -v c="$WORK/memcpy" '/^memcpy, one thread/ {t = 1} { print > (t ? c : m) }' \
    "$WORK/out"
  [ -s "$WORK/memcpy" ] || fail "no memcpy table"
  check_rows "$WORK/memcpy" 3 4 6  # hot, cold, stream/cold
}
# run BENCH BASELINE_TOOL ROUNDS_TEXT "COLUMNS WITH BASELINES" "COLUMNS WITHOUT": runs the
# bench with the baselines when their tool is here, then checks the rounds line and both
# tables.
run() {
  local bench=$1 tool=$2 rounds=$3 with=$4 without=$5 baselines=false
  command -v "$tool" >/dev/null && baselines=true
  "$RUNFILES/client/bench/$bench" --min_size=256KiB --max_size=1MiB --seconds_per_size=0.05 \
    --rounds=2 --baselines=$baselines >"$WORK/out" 2>&1 || fail "$bench exited $?"
  grep -q "$rounds" "$WORK/out" || fail "rounds not reported"
  split
  # shellcheck disable=SC2086  # Column lists split on purpose.
  if $baselines; then check_rows "$WORK/main" $with; else check_rows "$WORK/main" $without; fi
}
case "$1" in
  node)
    # size(2) single(3) stream(4) perftest(5) single/pt(6) stream/pt(7)
    run node_bench ucx_perftest "2 round(s) per size" "3 4 5 6 7" "3 4"
    # Every ucx_perftest server was stopped once its client ended.
    sleep 0.5
    ! pgrep -f "ucx_perftest -t ucp_put_bw" >/dev/null || fail "a ucx_perftest was left running"
    ;;
  mpi)
    # size(2) single(3) stream(4) NetPIPE(5) raw(6) raw cold(7) single/NP(8) stream/NP(9)
    # .../raw(10,11) stream/rawc(12)
    run mpi_bench NPopenmpi "medians of 2 round(s)" "3 4 5 6 7 8 9 10 11 12" "3 4 6 7 10 11 12"
    ;;
  datatype)
    # Vectored MPI without a daemon (mpi_datatype_bench): every way's bytes are checked by
    # the bench itself (it exits non-zero on a wrong block); each row's figures above 0.
    "$RUNFILES/client/bench/mpi_datatype_bench" --rounds=1 --max_blocks=512 --chunk=256KiB \
      >"$WORK/out" 2>&1 || fail "mpi_datatype_bench exited $?"
    for shape in "512 x 4 KiB" "512 x 64 KiB"; do
      row=$(grep -m1 -E "^${shape} " "$WORK/out") || fail "no row for $shape"
      # blocks(1-4) contiguous(5) datatype(6) dt/chunk(7) packed(8) and their ratios (9-11)
      for col in 5 6 7 8 9 10 11; do
        awk -v c="$col" '{ exit !($c > 0) }' <<<"$row" || fail "column $col of '$row' is not above 0"
      done
    done
    ;;
  *) fail "usage: $0 node|mpi|datatype" ;;
esac
cat "$WORK/out"
echo PASS
