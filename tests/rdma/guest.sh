#!/bin/sh
# The agent inside each Soft-RoCE node (tests/rdma/vm.sh): sets the node's address and
# rxe0 (and with ip4b= a second NIC, eth1 with rxe1, on 198.18.0.128/25), then runs the commands the host leaves in the shared folder (/vmout/NAME.cmd.N,
# answered by NAME.out.N and NAME.rc.N) until /vmout/stop appears; then powers off.
arg() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" /proc/cmdline; }
name=$(arg hostname)
ip=$(arg ip4)
exec >"/vmout/guest-$name.log" 2>&1
set -x
hostname "$name"
mount -t tmpfs tmpfs /run
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
ip link set lo up
# rxe_up NETDEV ADDRESS/PREFIX RXE: the NIC up with its address, and a Soft-RoCE device on
# it, waited for (10 s at most) until its port is ACTIVE.
rxe_up() {
  ip addr add "$2" dev "$1"
  ip link set "$1" up
  rdma link add "$3" type rxe netdev "$1"
  for _ in $(seq 100); do
    grep -q ACTIVE "/sys/class/infiniband/$3/ports/1/state" 2>/dev/null && break
    sleep 0.1
  done
  cat "/sys/class/infiniband/$3/ports/1/state"
}
rxe_up eth0 "$ip/24" rxe0
ip2=$(arg ip4b)
# A second link's subnet is the upper half of the first's /24: the longer prefix routes
# rxe1's RoCE packets (UDP to the peer's eth1 address) out through eth1.
[ -z "$ip2" ] || rxe_up eth1 "$ip2/25" rxe1
set +x
touch "/vmout/$name.ready"

n=0
while [ ! -e /vmout/stop ]; do
  if [ -e "/vmout/$name.cmd.$n" ]; then
    (cd /vmout && sh "/vmout/$name.cmd.$n") >"/vmout/$name.out.$n" 2>&1 </dev/null
    echo $? >"/vmout/$name.rc.$n.tmp"
    mv "/vmout/$name.rc.$n.tmp" "/vmout/$name.rc.$n"
    n=$((n + 1))
  else
    sleep 0.1
  fi
done
# Daemons the commands started (each writes /run/NAME.pid) end cleanly before the power goes.
for f in /run/*.pid; do [ -e "$f" ] && kill -TERM "$(cat "$f")"; done
for _ in $(seq 50); do
  alive=0
  for f in /run/*.pid; do [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break
  sleep 0.1
done
sync
echo o >/proc/sysrq-trigger
sleep 10
