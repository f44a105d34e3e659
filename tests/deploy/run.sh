#!/usr/bin/env bash
# Checks deploy/ as CI runs them (tests/run.sh calls this after the Bazel tests); ends with
# "N passed, N failed". Each check says SKIPPED with the reason where a tool is missing.
#  - Kubernetes: every overlay renders (kubectl kustomize); every rendered object validates
#    against the Kubernetes schemas (kubernetes-models, and the Prometheus Operator's for
#    its objects) and type-checks against their TypeScript types (unknown fields caught);
#    the least-privilege defaults and wiring hold (check_k8s.py), and a doctored manifest
#    fails that check; the flags files parse with this build's gpumoved.
#  - Prometheus: the rules check and pass their unit tests (promtool), the PrometheusRule
#    carries the same groups; a live two-node cluster's /metrics passes `promtool check
#    metrics`.
#  - Grafana: the dashboard type-checks against @grafana/schema, its queries parse
#    (promtool), and every metric it and the rules read is one the live daemon exports.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/tests/deploy
work=$(mktemp -d /tmp/gpumove-deploy.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
passed=0 failed=0
check() {  # check NAME command...
  local name=$1
  shift
  if "$@" >"$work/out" 2>&1; then
    echo "PASS $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    sed 's/^/    /' "$work/out" | tail -40
    failed=$((failed + 1))
  fi
}
skip() { echo "SKIPPED $1: $2"; }

BIN=$(bazel info bazel-bin 2>/dev/null)
bazel build //daemon:gpumoved //client/cli:gpumovectl >/dev/null 2>&1 ||
  { echo "FAIL build of gpumoved"; echo "0 passed, 1 failed"; exit 1; }
D=$BIN/daemon/gpumoved
CTL=$BIN/client/cli/gpumovectl

node_ok=0
if command -v node >/dev/null && command -v npm >/dev/null; then
  if [ -d "$HERE/node_modules/kubernetes-models" ] ||
     (cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error >"$work/npm.log" 2>&1); then
    node_ok=1
  else
    skip "schema checks" "npm ci failed (no npm registry?): $(tail -2 "$work/npm.log")"
  fi
else
  skip "schema checks" "no node/npm on this machine"
fi

echo "== Kubernetes"
OVERLAYS=(base overlays/dev overlays/rdma overlays/tls)
if command -v kubectl >/dev/null; then
  renders=()
  for o in "${OVERLAYS[@]}"; do
    name=$(basename "$o")
    check "kustomize $o renders" sh -c "kubectl kustomize '$ROOT/deploy/k8s/$o' > '$work/$name.yaml'"
    renders+=(--k8s "$name" "$work/$name.yaml")
    if [ "$node_ok" = 1 ]; then
      check "$o validates against the Kubernetes schemas" sh -c "node '$HERE/validate_k8s.mjs' '$name' < '$work/$name.yaml'"
    fi
  done
  if [ "$node_ok" = 1 ]; then
    check "every overlay's objects and the dashboard type-check" \
      node "$HERE/typecheck.mjs" "${renders[@]}" --dashboard "$ROOT/deploy/grafana/gpumove.json"
  fi
  check "base: least privilege" python3 "$HERE/check_k8s.py" "$work/base.yaml"
  check "dev: least privilege" python3 "$HERE/check_k8s.py" "$work/dev.yaml"
  check "tls: least privilege" python3 "$HERE/check_k8s.py" "$work/tls.yaml"
  check "rdma: least privilege (host IPC and the stack's hostPath allowed)" \
    python3 "$HERE/check_k8s.py" "$work/rdma.yaml" --allow-host-ipc --allow-rdma
  # The check can fail: a privileged container, and a grace shorter than the drain.
  sed 's/privileged: false/privileged: true/' "$work/base.yaml" >"$work/doctored1.yaml"
  sed 's/terminationGracePeriodSeconds: 45/terminationGracePeriodSeconds: 20/' "$work/base.yaml" >"$work/doctored2.yaml"
  check "a privileged container fails the check" sh -c "! python3 '$HERE/check_k8s.py' '$work/doctored1.yaml'"
  check "a grace shorter than --drain_grace fails the check" sh -c "! python3 '$HERE/check_k8s.py' '$work/doctored2.yaml'"
else
  skip "Kubernetes checks" "no kubectl (kustomize) on this machine"
fi
for f in deploy/k8s/base/gpumoved.flags deploy/k8s/overlays/*/gpumoved.flags; do
  check "$f parses" "$D" --flagfile="$ROOT/$f" --version
done

echo "== Prometheus"
if command -v promtool >/dev/null; then
  check "rules check" promtool check rules deploy/prometheus/gpumove-rules.yaml
  check "rules unit tests" promtool test rules deploy/prometheus/gpumove-rules.test.yaml
else
  skip "rule checks" "no promtool (apt-get install prometheus)"
fi
check "the PrometheusRule carries the rule file's groups" python3 "$HERE/sync_rules.py" --check

echo "== a live cluster's /metrics"
"$D" --node=a --listen=127.0.0.1:0 --port_file="$work/a.addr" --metrics_listen=127.0.0.1:0 \
  --host_pool_size=64MiB --pinned_pool_size=16MiB --heartbeat=100ms >"$work/a.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/a.addr" ] && break; sleep 0.1; done
"$D" --node=b --listen=127.0.0.1:0 --port_file="$work/b.addr" --peers="$(cat "$work/a.addr")" \
  --host_pool_size=64MiB --pinned_pool_size=16MiB --heartbeat=100ms >"$work/b.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/b.addr" ] && break; sleep 0.1; done
A=(--addr "$(cat "$work/a.addr")")
for _ in $(seq 100); do "$CTL" "${A[@]}" peers 2>/dev/null | grep -q 'b.*up' && break; sleep 0.1; done
src=$("$CTL" "${A[@]}" alloc 1MiB)
dst=$("$CTL" "${A[@]}" alloc 1MiB --node b)
"$CTL" "${A[@]}" move "$src" "b/$dst" --checksum >/dev/null  # Peer calls, a UCX move.
# Node b killed: the next move's peer calls fail (UNAVAILABLE), counted.
{ kill -9 "${pids[1]}"; wait "${pids[1]}"; } 2>/dev/null
"$CTL" "${A[@]}" move "$src" "b/$dst" >/dev/null 2>&1 || true
sleep 1.2  # Totals refresh every second.
metrics=$("$CTL" "${A[@]}" --json info | python3 -c 'import json,sys; i = json.load(sys.stdin); print(i.get("metrics_address") or i.get("metricsAddress"))')
python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://$metrics/metrics', timeout=5).read().decode())" >"$work/metrics.txt"
check "node a exports the peer-call and latency histograms" \
  grep -q '^gpumoved_peer_call_seconds_count{channel="ucx",method="prepare_remote_batch"}' "$work/metrics.txt"
if command -v promtool >/dev/null; then
  check "promtool check metrics on a live daemon" sh -c "promtool check metrics < '$work/metrics.txt'"
fi

echo "== Grafana"
check "dashboard queries name exported metrics" python3 "$HERE/check_dashboard.py" \
  deploy/grafana/gpumove.json "$work/dashboard-rules.yaml" "$work/metrics.txt" \
  deploy/prometheus/gpumove-rules.yaml
if command -v promtool >/dev/null; then
  check "dashboard queries parse (promtool)" promtool check rules "$work/dashboard-rules.yaml"
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
