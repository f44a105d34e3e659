#!/usr/bin/env bash
# Runs on the GPU machine from a carried .gpu/ (see pack.sh): benchmarks with two gpumoved
# binaries in turns, for the before/after figures of a change. .gpu/bin/gpumoved is
# "after"; put the other build's binary at .gpu/bin/gpumoved.before. Each round runs every
# benchmark with both, the order swapped every round so that drift does not favour one;
# outputs go to $OUT/<bench>.<label>.<round>.txt (compare the medians over rounds).
# BENCHES: benchmarks with their flags, separated by ';'. ROUNDS: rounds (default 2).
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PWD/.gpu/tools:$PATH"
OUT=${OUT:-/tmp/gpumove-ab}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
[ -x .gpu/bin/gpumoved.before ] || { echo "no .gpu/bin/gpumoved.before" >&2; exit 2; }
IFS=';' read -r -a BENCHES <<< "${BENCHES:-gpu_local_bench --reps=10}"
for r in $(seq 1 "$ROUNDS"); do
  labels=(after before)
  (( r % 2 == 0 )) && labels=(before after)
  for label in "${labels[@]}"; do
    bin="$PWD/.gpu/bin/gpumoved"
    [ "$label" = before ] && bin="$PWD/.gpu/bin/gpumoved.before"
    for b in "${BENCHES[@]}"; do
      read -r -a cmd <<< "$b"
      name=${cmd[0]}
      echo "== $name ($label, round $r) at ${SECONDS}s"
      GPUMOVED="$bin" timeout 300 ".gpu/bin/${cmd[0]}" "${cmd[@]:1}" > "$OUT/$name.$label.$r.txt" 2>&1 ||
        echo "$name exited $?"
    done
  done
done
echo "done at ${SECONDS}s"
