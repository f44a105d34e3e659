#!/usr/bin/env bash
# deploy/systemd/gpumoved.service passes `systemd-analyze verify` with nothing said (any
# warning fails), and gpumoved speaks systemd's notify protocol: with a NOTIFY_SOCKET this
# test owns, READY=1 comes only once the daemon answers calls (with a STATUS naming where
# it serves), WATCHDOG=1 pings come every half of WATCHDOG_USEC, and SIGTERM sends
# STOPPING=1 before the daemon exits cleanly.
set -euo pipefail
root=${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-}
D=$root/daemon/gpumoved
CTL=$root/client/cli/gpumovectl
UNIT=$root/deploy/systemd/gpumoved.service
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/systemd.XXXXXX")
trap 'rm -rf "$work"' EXIT

if command -v systemd-analyze >/dev/null; then
  # The unit as installed, with ExecStart pointing at this build's binary.
  sed "s|/usr/local/bin/gpumoved|$(readlink -f "$D")|" "$UNIT" > "$work/gpumoved.service"
  if ! systemd-analyze verify "$work/gpumoved.service" > "$work/verify.out" 2>&1 ||
     [ -s "$work/verify.out" ]; then
    echo "FAIL: systemd-analyze verify:"; cat "$work/verify.out"; exit 1
  fi
  echo "systemd-analyze verify: clean"
else
  echo "SKIPPED (the verify half): no systemd-analyze on this machine"
fi

python3 - "$D" "$CTL" "$work" <<'PY'
import os, signal, socket, subprocess, sys, time
daemon, ctl, work = sys.argv[1:4]
import tempfile
sock_dir = tempfile.mkdtemp(prefix="sd", dir="/tmp")  # Unix socket paths are short.
sock_path = os.path.join(sock_dir, "n")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sock_path)
s.settimeout(30)
env = dict(os.environ, NOTIFY_SOCKET=sock_path, WATCHDOG_USEC="400000")
port_file = os.path.join(work, "port")
p = subprocess.Popen([daemon, "--node=sd", "--listen=127.0.0.1:0", f"--port_file={port_file}",
                      "--host_pool_size=64MiB", "--pinned_pool_size=0"], env=env,
                     stdout=open(os.path.join(work, "log"), "wb"), stderr=subprocess.STDOUT)
def fail(why):
    p.kill()
    print("FAIL:", why)
    print(open(os.path.join(work, "log")).read()[-3000:])
    sys.exit(1)
messages = []
def receive(until, seconds=30):
    end = time.time() + seconds
    while time.time() < end:
        try:
            m = s.recv(4096).decode()
        except socket.timeout:
            break
        messages.append(m)
        if until in m.split("\n"):
            return m
    fail(f"no {until} within {seconds} s; got {messages}")
ready = receive("READY=1")
addr = open(port_file).read().strip()
# Ready means answered: a call made the moment READY=1 arrives succeeds.
info = subprocess.run([ctl, "--addr", addr, "info"], capture_output=True, text=True, timeout=30)
if info.returncode != 0:
    fail(f"READY=1 came but the daemon did not answer: {info.stderr}")
if "STATUS=node sd serving on " + addr not in ready:
    fail(f"READY=1 without a STATUS naming the address: {ready!r}")
if not any(m.startswith("STATUS=starting") for m in messages):
    fail(f"no STATUS=starting before READY=1: {messages}")
start = time.time()
pings = 0
while time.time() - start < 1.5:
    m = s.recv(4096).decode()
    pings += m == "WATCHDOG=1"
if pings < 3:
    fail(f"{pings} WATCHDOG=1 pings in 1.5 s at WATCHDOG_USEC=400000 (every 200 ms expected)")
p.send_signal(signal.SIGTERM)
receive("STOPPING=1")
if p.wait(timeout=30) != 0:
    fail(f"exit status {p.returncode} after SIGTERM")
print(f"notify protocol: STATUS, READY=1 once serving, {pings} watchdog pings, STOPPING=1, "
      "clean exit")
os.unlink(sock_path)
os.rmdir(sock_dir)
PY
echo PASS
