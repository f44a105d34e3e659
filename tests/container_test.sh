#!/usr/bin/env bash
# The OCI image (deploy/container/Containerfile) built and run with podman: a two-container
# cluster on a private, internal podman network (no route out) made and removed here.
# Checks: the image's defaults (non-root user, entrypoint, labels, health check, secure by
# default: without credentials it refuses to listen beyond loopback), node b joins node a
# by its DNS name, a checksummed move a -> b of random bytes arrives intact, the
# container's health check passes, and SIGTERM stops each daemon cleanly (exit 0, well
# before podman's kill). Needs podman and root (CI has both); otherwise SKIPPED.
# The image is built from this build's binaries (Containerfile's prebuilt stage);
# deploy/container/build.sh builds the same from source.
set -euo pipefail
# podman's network helpers (netavark) run iptables, in sbin, which Bazel's PATH lacks.
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
root=${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-}
D=$root/daemon/gpumoved
CTL=$root/client/cli/gpumovectl
C=$root/deploy/container
if ! command -v podman >/dev/null; then
  echo "SKIPPED: podman is not installed (apt-get install podman runc mmdebstrap)"; exit 0
fi
if [ "$(id -u)" != 0 ]; then echo "SKIPPED: needs root (podman networks, mmdebstrap)"; exit 0; fi
# netavark sets up podman's networks (builds' RUN steps included) with iptables; without it
# every build fails with a bare "netavark: No such file or directory".
command -v iptables >/dev/null ||
  { echo "FAIL: iptables is missing (netavark needs it): bash deploy/setup.sh installs it"; exit 1; }
BASE=localhost/debian-min:bookworm
if ! podman image exists "$BASE"; then
  if ! command -v mmdebstrap >/dev/null; then
    echo "SKIPPED: no $BASE image and no mmdebstrap to make it"; exit 0
  fi
fi
if [ -z "${CONTAINERS_CONF:-}" ]; then
  export CONTAINERS_CONF=$(readlink -f "$C/containers.conf")
fi
bash "$C/make-base.sh" "$BASE"
id=$$
IMAGE=localhost/gpumove:test-$id
NET=gpumove-test-$id
A=gm-a-$id
B=gm-b-$id
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/container.XXXXXX")
cleanup() {
  podman rm -f -t 0 "$A" "$B" >/dev/null 2>&1 || true
  podman network rm -f "$NET" >/dev/null 2>&1 || true
  podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for n in "$A" "$B"; do echo "--- logs of $n"; podman logs "$n" 2>&1 | tail -30 || true; done
  exit 1
}

echo "== build (prebuilt binaries)"
mkdir -p "$work/ctx/.container-bin"
cp "$C/Containerfile" "$work/ctx/"
cp -L "$D" "$CTL" "$work/ctx/.container-bin/"
chmod u+w "$work/ctx/.container-bin/"* && strip "$work/ctx/.container-bin/"*
start=$SECONDS
podman build -q --format docker --build-arg BASE="$BASE" --build-arg BINARIES=prebuilt \
  --build-arg VERSION=test --build-arg CUDA=no -t "$IMAGE" "$work/ctx" >/dev/null ||
  fail "podman build"
size=$(podman image inspect "$IMAGE" --format '{{.Size}}')
echo "built in $((SECONDS - start)) s, $((size / 1000000)) MB"

echo "== image defaults"
user=$(podman image inspect "$IMAGE" --format '{{.Config.User}}')
[ "$user" = 10001:10001 ] || fail "image user is '$user', want the non-root 10001:10001"
entry=$(podman image inspect "$IMAGE" --format '{{json .Config.Entrypoint}}')
[ "$entry" = '["/usr/bin/gpumoved"]' ] || fail "entrypoint is $entry"
podman image inspect "$IMAGE" --format '{{json .Config.Healthcheck}}' | grep -q 'health' ||
  fail "no HEALTHCHECK in the image"
version=$(podman image inspect "$IMAGE" --format '{{index .Config.Labels "org.opencontainers.image.version"}}')
[ "$version" = test ] || fail "version label is '$version'"
podman run --rm --health-interval disable --entrypoint /usr/bin/id "$IMAGE" -u | grep -qx 10001 || fail "runs as root"
# Listening on every interface with no credentials: refused, on purpose.
set +e
out=$(timeout 20 podman run --rm --health-interval disable "$IMAGE" 2>&1); rc=$?
set -e
[ "$rc" != 0 ] || fail "the default command started without credentials"
[[ "$out" == *allow_insecure* ]] || fail "the refusal does not say why: $out"
echo "no credentials: refused ($rc)"

echo "== two-node cluster on an internal network"
podman network create --internal "$NET" >/dev/null
# Names resolve only on a network with DNS: netavark with aardvark-dns (CNI without the
# dnsname plugin makes networks without it).
[ "$(podman network inspect "$NET" --format '{{.DNSEnabled}}')" = true ] ||
  fail "podman network $NET has no DNS: backend $(podman info --format '{{.Host.NetworkBackend}}'); install netavark and aardvark-dns (deploy/setup.sh) and use deploy/container/containers.conf"
# Callers need a token; the nodes prove themselves to each other with the cluster secret.
echo "container-test-token-$id,ops,team-a,admin" >"$work/tokens"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
chmod 0644 "$work/tokens" "$work/secret"
run_node() {  # name node extra flags...
  local name=$1 node=$2
  shift 2
  podman run -d --name "$name" --hostname "$name" --network "$NET" \
    -v "$work/tokens:/etc/gpumove/tokens:ro,Z" -v "$work/secret:/etc/gpumove/secret:ro,Z" \
    --health-interval disable --stop-timeout 60 "$IMAGE" \
    --listen=0.0.0.0:7470 --metrics_listen=0.0.0.0:9470 --node="$node" \
    --auth_tokens=/etc/gpumove/tokens --cluster_secret_file=/etc/gpumove/secret \
    --host_pool_size=64MiB --pinned_pool_size=16MiB --heartbeat=200ms --drain_grace=10s "$@" \
    >/dev/null
}
ctl() {  # node-container args...
  local name=$1
  shift
  podman exec -i -e GPUMOVE_TOKEN="container-test-token-$id" "$name" /usr/bin/gpumovectl "$@"
}
run_node "$A" a
run_node "$B" b --peers="$A:7470"  # By DNS name.
up=0
for _ in $(seq 150); do
  if ctl "$B" peers 2>/dev/null | grep -qE '^a .*up|\ba\b.*up'; then up=1; break; fi
  sleep 0.2
done
[ "$up" = 1 ] || fail "node b did not see node a up: $(ctl "$B" peers 2>&1)"
ctl "$A" health | grep -qx SERVING || fail "health on a"
echo "b joined a by name"

head -c 8388608 /dev/urandom >"$work/in"
src=$(ctl "$A" alloc 8MiB) || fail "alloc on a"
dst=$(ctl "$B" alloc 8MiB) || fail "alloc on b"
ctl "$A" write "$src" - <"$work/in" 2>/dev/null || fail "write"
ctl "$A" move "$src" "b/$dst" --checksum | tee "$work/move" | grep -q SUCCEEDED ||
  fail "move a -> b: $(cat "$work/move")"
ctl "$B" read "$dst" - >"$work/out" || fail "read"
cmp -s "$work/in" "$work/out" || fail "bytes on b differ from those written on a"
echo "8 MiB a -> b, bytes intact: $(cat "$work/move")"
# Without a token: UNAUTHENTICATED, from inside the network too.
if podman exec "$A" /usr/bin/gpumovectl ls >/dev/null 2>&1; then fail "a call without a token was served"; fi

podman healthcheck run "$A" >/dev/null || fail "the image's health check failed on a"

echo "== clean stop on SIGTERM"
for n in "$B" "$A"; do
  start=$SECONDS
  podman stop -t 60 "$n" >/dev/null
  took=$((SECONDS - start))
  code=$(podman inspect "$n" --format '{{.State.ExitCode}}')
  [ "$code" = 0 ] || fail "$n exited $code on SIGTERM"
  [ "$took" -lt 30 ] || fail "$n took $took s to stop"
  logs=$(podman logs "$n" 2>&1)
  [[ "$logs" == *draining* && "$logs" == *stopped* ]] || fail "$n's log says nothing of stopping"
  echo "$n: exit 0 in $took s"
done
echo "PASS"
