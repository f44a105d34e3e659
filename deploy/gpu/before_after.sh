#!/usr/bin/env bash
# Runs on the GPU machine from a carried .gpu/ (see pack.sh): benchmarks with two gpumoved
# binaries in turns, for the before/after figures of a change. .gpu/bin/gpumoved is
# "after"; put the other build's binary at .gpu/bin/gpumoved.before.
# BENCHES: benchmarks with their flags, separated by ';'. An entry that starts with a
# gpumove-bench subcommand (local, small, node, vectored, direct, staged, gpu_local, python,
# mpi, mpi_datatype, tls) runs as
#   gpumove-bench compare --before=.gpu/bin/gpumoved.before --after=.gpu/bin/gpumoved \
#     --compare_rounds=$ROUNDS --out=$OUT/<subcommand>.<n> ENTRY
# (both builds in turns, the order swapped every round; both tables, the pooled runs as
# before.json / after.json, and after/before per point, in $OUT/<subcommand>.<n>.txt).
# Another entry names a binary of .gpu/bin (e.g. gpu_local_test):
# it runs ROUNDS times with each build in turns, outputs in $OUT/<bench>.<label>.<round>.txt
# (compare the medians over rounds). ROUNDS: rounds (default 2).
#   BENCHES="local --max_size=1GiB; vectored --vec_case=device" bash deploy/gpu/before_after.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PWD/.gpu/tools:$PATH"
OUT=${OUT:-/tmp/gpumove-ab}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
[ -x .gpu/bin/gpumoved.before ] || { echo "no .gpu/bin/gpumoved.before" >&2; exit 2; }
SUBCOMMANDS=" local small node vectored direct staged gpu_local python mpi mpi_datatype tls "
IFS=';' read -r -a BENCHES <<< "${BENCHES:-gpu_local --gl_case=pinned_to_device}"
n=0
for b in "${BENCHES[@]}"; do
  read -r -a cmd <<< "$b"
  [ "${#cmd[@]}" -gt 0 ] || continue
  name=${cmd[0]}
  n=$((n + 1))
  if [[ "$SUBCOMMANDS" == *" $name "* ]]; then
    echo "== gpumove-bench $b at ${SECONDS}s"
    timeout 590 .gpu/bin/gpumove-bench compare --before="$PWD/.gpu/bin/gpumoved.before" \
      --after="$PWD/.gpu/bin/gpumoved" --compare_rounds="$ROUNDS" --out="$OUT/$name.$n" \
      "${cmd[@]}" 2>&1 | tee "$OUT/$name.$n.txt" || echo "gpumove-bench $name exited $?"
    continue
  fi
  for r in $(seq 1 "$ROUNDS"); do
    labels=(after before)
    (( r % 2 == 0 )) && labels=(before after)
    for label in "${labels[@]}"; do
      bin="$PWD/.gpu/bin/gpumoved"
      [ "$label" = before ] && bin="$PWD/.gpu/bin/gpumoved.before"
      echo "== $name ($label, round $r) at ${SECONDS}s"
      GPUMOVED="$bin" timeout 300 ".gpu/bin/$name" "${cmd[@]:1}" > "$OUT/$name.$label.$r.txt" 2>&1 ||
        echo "$name exited $?"
    done
  done
done
echo "done at ${SECONDS}s"
