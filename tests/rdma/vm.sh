#!/usr/bin/env bash
# Soft-RoCE nodes for tests on machines without an RDMA card (docs/operations.md, "The
# verbs suite"): one emulated QEMU VM per node, booted from Debian's kernel package, the
# host's root read-only over 9p, rdma_rxe on its virtio NIC. Sourced by the tests;
# `bash tests/rdma/vm.sh kit` builds the kit alone, `bash tests/rdma/vm.sh check` says
# whether VMs can run here (exit 0) or why not, `bash tests/rdma/vm.sh setup` installs the
# Debian packages (RDMA_VM_PACKAGES) and builds the kit.
#
# The kit (kernel, modules, busybox initrd) is built once into $GPUMOVE_RDMA_KIT (default
# ~/.cache/gpumove/rdma-vm/VERSION of the real home, which Bazel's test HOME is not).
# Functions: rdma_kit, rdma_vm_net N, vm_start NAME INDEX IP, vm_wait_ready, vm_exec,
# vm_diagnose, vm_stop_all. Every wait is bounded; vm_stop_all is the caller's EXIT trap.

# The modules an rxe node needs, in load order (each after what it depends on).
RDMA_VM_MODULES="crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe configfs
  ib_cm iw_cm rdma_cm rdma_ucm ib_umad virtio_ring virtio 9pnet 9pnet_virtio netfs fscache 9p
  overlay virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover
  virtio_net"
RDMA_VM_PACKAGES="qemu-system-x86 busybox-static cpio ibverbs-providers iproute2"
RDMA_VM_MEMORY=${RDMA_VM_MEMORY:-1G}
RDMA_VM_DIR=${RDMA_VM_DIR:-}  # the folder every node shares with the host (/vmout); the caller makes it
declare -A RDMA_VM_PID=()
RDMA_VM_HUB_PID=""

rdma_real_home() { getent passwd "$(id -u)" | cut -d: -f6; }

# rdma_vm_missing: prints why VMs cannot run here (nothing when they can).
rdma_vm_missing() {
  local c
  for c in qemu-system-x86_64 busybox cpio dpkg-deb apt-get gzip ss timeout; do
    command -v "$c" >/dev/null || { echo "$c is not installed (tests/rdma/vm.sh: apt packages)"; return; }
  done
  [ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] ||
    ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-* >/dev/null 2>&1 ||
    { echo "no rxe verbs provider (package ibverbs-providers)"; return; }
  file -L "$(command -v busybox)" 2>/dev/null | grep -q static ||
    ldd "$(command -v busybox)" 2>&1 | grep -q "not a dynamic" ||
    { echo "busybox is not static (package busybox-static)"; return; }
}

# rdma_kit: builds the kit if missing and prints its folder. The kernel is the one Debian's
# linux-image-amd64 names now; with no archive reachable, the newest kit already built.
rdma_kit() {
  local base=${GPUMOVE_RDMA_KIT:-$(rdma_real_home)/.cache/gpumove/rdma-vm}
  local pkg ver
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
  ver=${pkg#linux-image-}
  if [ -z "$ver" ]; then
    ver=$(ls -t "$base" 2>/dev/null | head -1)
    ver=${ver%-k1}
    [ -n "$ver" ] && [ -s "$base/$ver-k1/initrd.gz" ] || { echo "rdma_kit: no kernel package known" >&2; return 1; }
  fi
  local kit="$base/$ver-k1"  # -kN: the initrd's own version
  if [ -s "$kit/initrd.gz" ] && [ -s "$kit/vmlinuz" ]; then echo "$kit"; return 0; fi
  # Built aside (a hidden folder of this process) and renamed: builders at once don't clash.
  local tmp stage="$base/.$ver-k1.$$"
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/rdma-kit.XXXXXX") || return 1
  (
    set -e
    cd "$tmp"
    timeout 300 apt-get download -q "$pkg" >&2
    dpkg-deb -x ./*.deb k
    mkdir -p i/bin i/mods i/proc i/sys i/dev i/host i/mnt i/newroot
    cp "$(command -v busybox)" i/bin/busybox
    : >i/modorder
    for m in $RDMA_VM_MODULES; do
      f=$(find "k/lib/modules/$ver/kernel" -name "$m.ko*" -o -name "${m//_/-}.ko*" | head -1)
      [ -n "$f" ] || { echo "rdma_kit: module $m not in $pkg" >&2; exit 1; }
      cp "$f" i/mods/
      basename "$f" >>i/modorder
    done
    cat >i/init <<'EOF'
#!/bin/busybox sh
# The node's init: modules, the host's root read-only with a tmpfs on top, /vmout shared
# read-write with the host; then the guest agent (tests/rdma/guest.sh), which powers off.
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modorder); do insmod /mods/$m || echo "insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose hostroot /host
mount -t tmpfs -o size=512m tmpfs /mnt; mkdir -p /mnt/u /mnt/w
mount -t overlay overlay -o lowerdir=/host,upperdir=/mnt/u,workdir=/mnt/w /newroot
mkdir -p /newroot/vmout
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 vmout /newroot/vmout
for d in proc sys dev; do mount --move /$d /newroot/$d; done
exec chroot /newroot /bin/sh /vmout/guest.sh
EOF
    chmod +x i/init
    [ "$(id -u)" != 0 ] || mknod -m 600 i/dev/console c 5 1
    mkdir -p "$stage"
    cp "k/boot/vmlinuz-$ver" "$stage/vmlinuz"
    (cd i && find . | cpio -o -H newc --quiet | gzip -1) >"$stage/initrd.gz"
  ) || { rm -rf "$tmp" "$stage"; return 1; }
  rm -rf "$tmp"
  mv -T "$stage" "$kit" 2>/dev/null || rm -rf "$stage"  # another builder's kit is as good
  # Kits of kernels Debian no longer names go (11 MB each).
  find "$base" -mindepth 1 -maxdepth 1 ! -name "$ver-k1" ! -name ".*" -exec rm -rf {} + 2>/dev/null
  echo "$kit"
}

rdma_free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# rdma_vm_net N: the links of N nodes, lossless (over UDP links frames were dropped under
# load and rxe's go-back-N retries made an 8 MiB pull take 29 s instead of 2). Two: one
# QEMU listens on a TCP port, the other connects; more: hub.py on the host. Sets
# RDMA_VM_NETDEV[i] for node i (0-based).
declare -a RDMA_VM_NETDEV=()
rdma_vm_net() {
  local n=$1 i port
  port=$(rdma_free_port)
  if [ "$n" = 2 ]; then
    RDMA_VM_NETDEV=("socket,id=n0,listen=127.0.0.1:$port" "socket,id=n0,connect=127.0.0.1:$port")
    return
  fi
  /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/hub.py" "$port" &
  RDMA_VM_HUB_PID=$!
  rdma_await_listen "$port" || return 1
  RDMA_VM_NETDEV=()
  for ((i = 0; i < n; i++)); do RDMA_VM_NETDEV+=("socket,id=n0,connect=127.0.0.1:$port"); done
}

# rdma_vm_net2: a second link between two nodes (their eth1, for a second rail), as
# rdma_vm_net 2 makes the first. Sets RDMA_VM_NETDEV2[i].
declare -a RDMA_VM_NETDEV2=()
rdma_vm_net2() {
  local port
  port=$(rdma_free_port)
  RDMA_VM_NETDEV2=("socket,id=n1,listen=127.0.0.1:$port" "socket,id=n1,connect=127.0.0.1:$port")
}

# rdma_await_listen PORT: until something listens on the host's TCP PORT (10 s at most).
rdma_await_listen() {
  local _
  for _ in $(seq 100); do
    [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}

# vm_start NAME INDEX IP [IP2]: boots node NAME (its guest agent runs commands vm_exec
# leaves in the shared folder). INDEX picks its link from rdma_vm_net and its MAC; with
# IP2, a second NIC (eth1, rxe1) on its link from rdma_vm_net2.
vm_start() {
  local name=$1 index=$2 ip=$3 ip2=${4:-}
  local second=()
  if [ -n "$ip2" ]; then
    [ -n "${RDMA_VM_NETDEV2[index]:-}" ] || { echo "vm_start: no second link $index (rdma_vm_net2)" >&2; return 1; }
    second=(-netdev "${RDMA_VM_NETDEV2[index]}"
      -device "virtio-net-pci,netdev=n1,mac=52:54:00:00:01:0$((index + 1))")
  fi
  [ -n "$RDMA_VM_DIR" ] || { echo "vm_start: RDMA_VM_DIR is not set" >&2; return 1; }
  cp "$(dirname "${BASH_SOURCE[0]}")/guest.sh" "$RDMA_VM_DIR/guest.sh"
  [ -n "${RDMA_VM_NETDEV[index]:-}" ] || { echo "vm_start: no link $index (rdma_vm_net)" >&2; return 1; }
  timeout -k 5 "${RDMA_VM_LIFETIME:-590}" qemu-system-x86_64 -accel tcg,thread=multi -cpu max \
    -pidfile "$RDMA_VM_DIR/qemu-$name.pid" \
    -m "$RDMA_VM_MEMORY" -smp 1 -display none -monitor none -no-reboot \
    -serial "file:$RDMA_VM_DIR/console-$name.log" \
    -kernel "$RDMA_KIT/vmlinuz" -initrd "$RDMA_KIT/initrd.gz" \
    -append "console=ttyS0 quiet panic=-1 hostname=$name ip4=$ip${ip2:+ ip4b=$ip2}" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$RDMA_VM_DIR,mount_tag=vmout,security_model=none" \
    -netdev "${RDMA_VM_NETDEV[index]}" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:0$((index + 1))" "${second[@]}" \
    </dev/null >"$RDMA_VM_DIR/qemu-$name.log" 2>&1 &
  RDMA_VM_PID[$name]=$!
  # The next node may connect to this one's port: it must be listening first.
  case "${RDMA_VM_NETDEV[index]}" in
    *listen=*) rdma_await_listen "${RDMA_VM_NETDEV[index]##*:}" ;;
  esac
  case "${ip2:+${RDMA_VM_NETDEV2[index]}}" in
    *listen=*) rdma_await_listen "${RDMA_VM_NETDEV2[index]##*:}" ;;
  esac
}

# vm_wait_ready NAME SECONDS: until the node's agent has its rxe0 up.
vm_wait_ready() {
  local name=$1 end=$((SECONDS + $2))
  while [ $SECONDS -lt "$end" ]; do
    [ -e "$RDMA_VM_DIR/$name.ready" ] && return 0
    kill -0 "${RDMA_VM_PID[$name]}" 2>/dev/null || { echo "vm $name exited while booting" >&2; return 1; }
    sleep 0.5
  done
  echo "vm $name not ready after $2 s" >&2
  return 1
}

# vm_exec NAME SECONDS COMMAND: runs COMMAND (sh) on node NAME, prints its output and
# returns its status; 124 when it has not ended in SECONDS. One at a time per node.
vm_exec() {
  local name=$1 limit=$2 cmd=$3 n
  # The sequence is kept in a file: callers run vm_exec in subshells ($(...)).
  n=$(cat "$RDMA_VM_DIR/$name.seq" 2>/dev/null || echo 0)
  echo $((n + 1)) >"$RDMA_VM_DIR/$name.seq"
  printf '%s\n' "$cmd" >"$RDMA_VM_DIR/$name.cmd.$n.tmp"
  mv "$RDMA_VM_DIR/$name.cmd.$n.tmp" "$RDMA_VM_DIR/$name.cmd.$n"
  local end=$((SECONDS + limit))
  while [ ! -e "$RDMA_VM_DIR/$name.rc.$n" ]; do
    if [ $SECONDS -ge "$end" ] || ! kill -0 "${RDMA_VM_PID[$name]}" 2>/dev/null; then
      cat "$RDMA_VM_DIR/$name.out.$n" 2>/dev/null
      echo "vm_exec $name: '$cmd' did not end in $limit s" >&2
      return 124
    fi
    sleep 0.1
  done
  cat "$RDMA_VM_DIR/$name.out.$n"
  return "$(cat "$RDMA_VM_DIR/$name.rc.$n")"
}

# vm_stop_all: asks every node to power off, waits up to 20 s, then stops what is left
# (QEMU itself by its pid file: a SIGKILL to its `timeout` would leave it running).
vm_stop_all() {
  local name end qemu
  [ -z "$RDMA_VM_DIR" ] || touch "$RDMA_VM_DIR/stop"
  end=$((SECONDS + 20))
  for name in "${!RDMA_VM_PID[@]}"; do
    while kill -0 "${RDMA_VM_PID[$name]}" 2>/dev/null && [ $SECONDS -lt "$end" ]; do sleep 0.2; done
    if kill -0 "${RDMA_VM_PID[$name]}" 2>/dev/null; then
      qemu=$(cat "$RDMA_VM_DIR/qemu-$name.pid" 2>/dev/null)
      [ -z "$qemu" ] || kill -9 "$qemu" 2>/dev/null
      kill -9 "${RDMA_VM_PID[$name]}" 2>/dev/null
    fi
    wait "${RDMA_VM_PID[$name]}" 2>/dev/null
  done
  if [ -n "$RDMA_VM_HUB_PID" ]; then
    kill "$RDMA_VM_HUB_PID" 2>/dev/null
    wait "$RDMA_VM_HUB_PID" 2>/dev/null
  fi
  RDMA_VM_PID=()
  RDMA_VM_HUB_PID=""
  return 0
}

# vm_diagnose NAME: what a failure report needs from a node: kernel messages, eth0's
# counters, rxe0's counters, sockets (each bounded).
vm_diagnose() {
  vm_exec "$1" 20 'dmesg | tail -15; ip -s link show eth0; cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -v "^0$" -H ./* | tr "\n" " "; echo; ss -tn | head -20' 2>&1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-}" in
    kit) why=$(rdma_vm_missing); [ -z "$why" ] || { echo "$why" >&2; exit 1; }; rdma_kit ;;
    check) why=$(rdma_vm_missing); [ -z "$why" ] || { echo "$why"; exit 1; } ;;
    setup)
      set -e
      missing=()
      for p in $RDMA_VM_PACKAGES; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
      done
      if [ ${#missing[@]} -gt 0 ]; then
        echo "vm.sh: installing ${missing[*]}"
        SUDO=""
        [ "$(id -u)" = 0 ] || SUDO=sudo
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
          "${missing[@]}" >/dev/null
      fi
      why=$(rdma_vm_missing)
      [ -z "$why" ] || { echo "vm.sh: $why" >&2; exit 1; }
      echo "vm.sh: kit in $(rdma_kit)"
      ;;
    *) echo "usage: vm.sh kit|check|setup" >&2; exit 2 ;;
  esac
fi
