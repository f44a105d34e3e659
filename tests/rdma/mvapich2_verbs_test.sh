#!/usr/bin/env bash
# MVAPICH2's own verbs device between two Soft-RoCE nodes (issue 58; tests/rdma/vm.sh):
# MVAPICH2 2.3.7 (ch3:mrail, third_party/mpi/mvapich2) over rxe0 as RoCE v2, launched
# without ssh: Hydra's mpiexec runs in node A with `-launcher manual` and prints one proxy
# command per host, which the test then runs in each node. First a plain MPI round trip
# (mpi_pingpong.c, 2 MiB each way, checked by both ranks), then two gpumoved ranks
# (--mpi=on, UCX off, so MPI is the only path between them) and one 8 MiB move rank0 ->
# rank1 over path MPI, --checksum, compared byte for byte on the host. Verbs carried both:
# rxe0's packet counters rise by about bytes / MTU (MVAPICH2 is the only verbs user in the
# nodes). The emulator's pace is no speed figure. Needs `--config=mvapich2` (else SKIPPED,
# as without QEMU: `bash tests/rdma/vm.sh setup` installs it).
# shellcheck disable=SC2154  # a_sent0 and the like: set by sample's printf -v
set -uo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD/..}/gpumove"
HERE="$RUNFILES/tests/rdma"
[ -e "$HERE/vm.sh" ] || HERE="$(dirname "$0")"
# shellcheck source=tests/rdma/vm.sh
source "$HERE/vm.sh"
GPUMOVED=$(readlink -f "$RUNFILES/daemon/gpumoved")
CTL=$(readlink -f "$RUNFILES/client/cli/gpumovectl")
PINGPONG=$(readlink -f "$HERE/mpi_pingpong")
MPIEXEC=$(readlink -f "${TEST_SRCDIR:-$PWD/..}/mvapich2/mv2/bin/mpiexec")
MTU=1024  # RoCE's MTU on a 1500-byte Ethernet MTU
MIB=$((1024 * 1024))

# Both programs must run with the archive's libmpi (MVAPICH2's soname is the MPICH ABI's).
for b in "$GPUMOVED" "$PINGPONG"; do
  # (ldd's output whole first: grep -q would end the pipe early, and pipefail fail it.)
  libs=$(ldd "$b" 2>&1)
  if ! grep -q 'libmpi.so.12 => .*/mvapich2/mv2/lib/' <<<"$libs"; then
    echo "SKIPPED: $(basename "$b") is not linked against MVAPICH2 (bazel test --config=mvapich2)"
    exit 0
  fi
done
[ -x "$MPIEXEC" ] || { echo "FAIL: no MVAPICH2 mpiexec in the runfiles"; exit 1; }
why=$(rdma_vm_missing)
if [ -n "$why" ]; then
  echo "SKIPPED: no Soft-RoCE nodes: $why"
  exit 0
fi
RDMA_KIT=$(rdma_kit) || { echo "FAIL: the VM kit could not be built (tests/rdma/vm.sh kit)"; exit 1; }
RDMA_VM_DIR=$(mktemp -d "${TEST_TMPDIR:-/tmp}/mv2.XXXXXX")
RDMA_VM_LIFETIME=${RDMA_VM_LIFETIME:-280}  # within the test size's 300 s
OUT=${TEST_UNDECLARED_OUTPUTS_DIR:-$RDMA_VM_DIR}
names=(a b)
declare -A IP=([a]=198.18.0.1 [b]=198.18.0.2)

# MVAPICH2 on Soft-RoCE: the HCA by name, RoCE (without it MPI_Init fails in its UD
# connection manager: "sizeof cm_msg (1296) >= rdma_default_mtu (1024)"), the GID that
# holds the IPv4 address (RoCE v2), affinity off (else MPI_THREAD_SINGLE, which the daemon
# refuses) and librdmacm by its runtime name when the -dev package's .so is missing.
MV2_ENV="MV2_IBA_HCA=rxe0 MV2_USE_RoCE=1 MV2_DEFAULT_GID_INDEX=1 MV2_ENABLE_AFFINITY=0"
MV2_ENV+=" MV2_USE_THREAD_WARNING=0 MV2_SUPPRESS_JOB_STARTUP_PERFORMANCE_WARNING=1"
rdmacm=/usr/lib/x86_64-linux-gnu/librdmacm.so
[ -e "$rdmacm" ] || MV2_ENV+=" MV2_LIBRDMACM_PATH=$rdmacm.1"

finish() {
  vm_stop_all
  for f in "$RDMA_VM_DIR"/*.log; do [ -e "$f" ] && cp "$f" "$OUT/" 2>/dev/null; done
}
trap finish EXIT
# logs JOB: what the job's launcher and proxies said (MVAPICH2's own warnings about the
# unknown HCA type left out).
logs() {
  local f
  for f in "$RDMA_VM_DIR/$1"-*.log; do
    [ -e "$f" ] || continue
    echo "--- $(basename "$f")"
    grep -v -e 'hca_type\]' "$f" | tail -25
  done
}
fail() {
  echo "FAIL: $*"
  logs pingpong
  logs gpumoved
  for n in "${names[@]}"; do
    echo "--- node-$n"
    vm_diagnose "$n"
  done
  exit 1
}
TOKEN=rdma-admin-token-0123456789
echo "$TOKEN,ops,ops,admin" >"$RDMA_VM_DIR/tokens"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$RDMA_VM_DIR/secret"

# counters NODE: rxe0's sent_pkts, rcvd_pkts and its retransmission events (requester
# retries, out-of-sequence and duplicate packets seen).
counters() {
  vm_exec "$1" 30 "cd /sys/class/infiniband/rxe0/ports/1/hw_counters &&
    echo \$(cat sent_pkts rcvd_pkts) \$((\$(cat completer_retry_err) + \$(cat rcvd_seq_err) + \$(cat duplicate_request)))"
}
# expect_packets WHAT BYTES RISE RETRIES: a rise of at least BYTES / MTU; without
# retransmissions (RETRIES, both nodes' events) at most a quarter more, for MVAPICH2's and
# the move's own control messages. rxe retransmits from the lost packet on (go-back-N): one
# retry in the loaded emulator sent 1.7 times the packets (seen), so with retries at most 4x.
expect_packets() {
  local want=$(($2 / MTU)) most
  most=$((want + want / 4))
  [ "$4" = 0 ] || most=$((4 * want))
  echo "  $1 rose by $3 (bytes / MTU = $want; retransmission events: $4)"
  [ "$3" -ge "$want" ] && [ "$3" -le "$most" ] ||
    fail "$1 rose by $3, want $want to $most: the bytes did not go over verbs"
}
# sample WHEN: both nodes' counters into a_sentWHEN, a_rcvdWHEN, a_retryWHEN, b_...
sample() {
  local n sent rcvd retry
  for n in a b; do
    read -r sent rcvd retry <<<"$(counters "$n")"
    [[ "$sent $rcvd $retry" =~ ^[0-9]+\ [0-9]+\ [0-9]+$ ]] || fail "node-$n's rxe0 counters: $sent $rcvd $retry"
    printf -v "${n}_sent$1" %s "$sent"
    printf -v "${n}_rcvd$1" %s "$rcvd"
    printf -v "${n}_retry$1" %s "$retry"
  done
}

# mv2_launch JOB SECONDS MPIEXEC-ARGS...: Hydra's mpiexec in node A with -launcher manual
# (its status, when it ends, in /vmout/JOB.rc), then the proxy command it prints for each
# host run in that host's node. Everything ends within SECONDS.
mv2_launch() {
  local job=$1 limit=$2 i cmd
  shift 2
  vm_exec a 20 "( env $MV2_ENV timeout -k 5 $limit $MPIEXEC -launcher manual -iface eth0 \
    -hosts ${IP[a]},${IP[b]} $* >/vmout/$job-mpiexec.log 2>&1; echo \$? >/vmout/$job.rc ) \
    </dev/null >/dev/null 2>&1 &" || fail "$job: mpiexec did not start"
  for _ in $(seq 100); do
    grep -q '^HYDRA_LAUNCH_END' "$RDMA_VM_DIR/$job-mpiexec.log" 2>/dev/null && break
    [ -s "$RDMA_VM_DIR/$job.rc" ] && break
    sleep 0.2
  done
  grep -q '^HYDRA_LAUNCH_END' "$RDMA_VM_DIR/$job-mpiexec.log" 2>/dev/null ||
    fail "$job: mpiexec printed no proxy commands (status $(cat "$RDMA_VM_DIR/$job.rc" 2>/dev/null ||
      echo "none in 20 s")): $(cat "$RDMA_VM_DIR/$job-mpiexec.log")"
  for i in 0 1; do
    cmd=$(sed -n "s/^HYDRA_LAUNCH: \\(.*--proxy-id $i\\) *\$/\\1/p" "$RDMA_VM_DIR/$job-mpiexec.log")
    [[ "$cmd" == "$(dirname "$MPIEXEC")/hydra_pmi_proxy "* ]] ||
      fail "$job: no proxy command for host $i: $(cat "$RDMA_VM_DIR/$job-mpiexec.log")"
    vm_exec "${names[i]}" 20 "timeout -k 5 $limit $cmd </dev/null >/vmout/$job-proxy-${names[i]}.log 2>&1 &" ||
      fail "$job: the proxy did not start in node-${names[i]}"
  done
}
# mv2_wait JOB SECONDS: until the job's mpiexec has ended; prints its status.
mv2_wait() {
  local end=$((SECONDS + $2))
  while [ ! -s "$RDMA_VM_DIR/$1.rc" ] && [ $SECONDS -lt "$end" ]; do sleep 0.5; done
  cat "$RDMA_VM_DIR/$1.rc" 2>/dev/null || echo "not ended in $2 s"
}

rdma_vm_net 2
t=$SECONDS
for i in 0 1; do vm_start "${names[i]}" "$i" "${IP[${names[i]}]}"; done
for n in "${names[@]}"; do vm_wait_ready "$n" 150 || fail "node-$n did not boot"; done
for n in "${names[@]}"; do
  # Hydra and MVAPICH2 name hosts by hostname; each node knows the other's.
  vm_exec "$n" 20 "printf '%s a\n%s b\n' ${IP[a]} ${IP[b]} >>/etc/hosts" || fail "hosts on node-$n"
done
echo "ok: 2 nodes booted with rxe0 ACTIVE in $((SECONDS - t)) s"

# 1. A plain MPI round trip, 2 MiB each way.
SIZE=$((2 * MIB))
t=$SECONDS
sample 0
mv2_launch pingpong 120 -n 2 "$PINGPONG" "$SIZE"
rc=$(mv2_wait pingpong 130)
[ "$rc" = 0 ] || fail "the MPI round trip's mpiexec: $rc"
sample 1
retries=$((a_retry1 - a_retry0 + b_retry1 - b_retry0))
grep '^rank' "$RDMA_VM_DIR/pingpong-mpiexec.log" | sed 's/^/  /'
[ "$(grep -c "^rank [01] of 2 on [ab]: $SIZE bytes .*, 0 differ .*MVAPICH2 Version" \
  "$RDMA_VM_DIR/pingpong-mpiexec.log")" = 2 ] || fail "the ranks did not both report their bytes intact"
grep -q '^rank 0 of 2 on a:' "$RDMA_VM_DIR/pingpong-mpiexec.log" &&
  grep -q '^rank 1 of 2 on b:' "$RDMA_VM_DIR/pingpong-mpiexec.log" || fail "the ranks are not one per node"
expect_packets "node-a's sent_pkts" "$SIZE" $((a_sent1 - a_sent0)) "$retries"
expect_packets "node-b's sent_pkts" "$SIZE" $((b_sent1 - b_sent0)) "$retries"
expect_packets "node-b's rcvd_pkts" "$SIZE" $((b_rcvd1 - b_rcvd0)) "$retries"
echo "ok: MPI round trip of 2 MiB between the nodes over MVAPICH2's verbs device in $((SECONDS - t)) s"

# 2. Two gpumoved ranks, one per node, MPI their only path (--noucx); one move between them.
t=$SECONDS
rank_flags="--mpi=on --noucx --heartbeat=1s --peer_timeout=60s --forward_timeout=120s
  --handshake_timeout=60s --auth_tokens=/vmout/tokens --cluster_secret_file=/vmout/secret
  --host_pool_size=64MiB --pinned_pool_size=16MiB --mpi_chunk=1MiB --port_file=/vmout/port.%r"
# One slot per host of -hosts: rank 0 in node A, rank 1 in node B (Hydra takes no -host per
# segment beside a host list: "duplicate host file or host list setting").
mv2_launch gpumoved 200 -n 1 "$GPUMOVED" --listen="${IP[a]}:7470" $rank_flags \
  : -n 1 "$GPUMOVED" --listen="${IP[b]}:7470" $rank_flags
for r in 0 1; do
  for _ in $(seq 120); do
    [ -s "$RDMA_VM_DIR/port.$r" ] || [ -s "$RDMA_VM_DIR/gpumoved.rc" ] && break
    sleep 0.5
  done
  [ -s "$RDMA_VM_DIR/port.$r" ] || fail "rank $r did not serve in 60 s"
done
[ "$(cat "$RDMA_VM_DIR/port.0")" = "${IP[a]}:7470" ] && [ "$(cat "$RDMA_VM_DIR/port.1")" = "${IP[b]}:7470" ] ||
  fail "rank 0 is not node-a's or rank 1 not node-b's: $(cat "$RDMA_VM_DIR"/port.*)"
# ctl NODE ARGS...: gpumovectl on NODE against its own rank.
ctl() {
  local n=$1
  shift
  vm_exec "$n" 180 "GPUMOVE_TOKEN=$TOKEN $CTL --timeout 60s --addr ${IP[$n]}:7470 $*"
}
for _ in $(seq 60); do
  [ "$(ctl a peers 2>&1 | grep -c ' up$')" = 1 ] && break
  sleep 1
done
info=$(ctl a info) || fail "info: $info"
mpi_line=$(grep -E '^ +MPI ' <<<"$info")
echo "  $(sed 's/^ *//' <<<"$mpi_line")"
[[ "$mpi_line" == *" yes "*"rank 0 of 2 (MVAPICH2 Version"* ]] || fail "rank 0's MPI path: $info"
[[ "$info" == *"UCX      no"* ]] || fail "UCX is not off: $info"
echo "ok: two gpumoved ranks up and joined over MVAPICH2 in $((SECONDS - t)) s"

SIZE=$((8 * MIB))
head -c "$SIZE" /dev/urandom >"$RDMA_VM_DIR/data"
SRC=$(ctl a alloc 8MiB) || fail "alloc: $SRC"
DST=$(ctl b alloc 8MiB) || fail "alloc: $DST"
ctl a write "$SRC" /vmout/data >/dev/null || fail "write"
sample 0
t=$SECONDS
out=$(ctl a move "$SRC" "rank1/$DST" --path mpi --checksum) || fail "move: $out"
[[ "$out" == *SUCCEEDED*MPI* ]] || fail "move: $out"
echo "  $(tail -1 <<<"$out")"
sample 1
retries=$((a_retry1 - a_retry0 + b_retry1 - b_retry0))
expect_packets "node-a's sent_pkts" "$SIZE" $((a_sent1 - a_sent0)) "$retries"
expect_packets "node-b's rcvd_pkts" "$SIZE" $((b_rcvd1 - b_rcvd0)) "$retries"
ctl b read "$DST" /vmout/moved >/dev/null || fail "read on node-b"
cmp -s "$RDMA_VM_DIR/data" "$RDMA_VM_DIR/moved" || fail "bytes read on node-b differ from those written on node-a"
echo "ok: 8 MiB rank0 -> rank1 over path MPI (MVAPICH2 on rxe0) in $((SECONDS - t)) s as the host saw it, bytes compared"
echo PASS
