"""gpumoved daemons for the Python client's tests and checks (no pytest needed here):
GPUMOVED names the binary (else bazel-bin's), each daemon on 127.0.0.1 with a port of its
own, stopped with SIGTERM."""
import os
import signal
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


class Missing(Exception):
    """No gpumoved binary to start."""


def gpumoved() -> str:
    path = os.environ.get("GPUMOVED") or os.path.join(REPO, "bazel-bin", "daemon", "gpumoved")
    if not os.path.exists(path):
        raise Missing(f"no gpumoved at {path} (build //daemon:gpumoved or set GPUMOVED)")
    return path


class Daemon:
    def __init__(self, name, *flags, join=None):
        self.dir = tempfile.mkdtemp(prefix=f"gpumove-py-{name}-")
        port_file = os.path.join(self.dir, "address")
        args = [gpumoved(), f"--node={name}", "--listen=127.0.0.1:0", f"--port_file={port_file}",
                "--heartbeat=100ms", "--peer_timeout=1500ms", *flags]
        if not any(f.startswith("--host_pool_size") for f in flags):
            args += ["--host_pool_size=256MiB", "--pinned_pool_size=16MiB"]
        if join:
            args.append(f"--peers={join}")
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(port_file) or not open(port_file).read().strip():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"gpumoved {name} did not start: "
                                   f"{open(os.path.join(self.dir, 'log')).read()[-2000:]}")
            time.sleep(0.02)
        self.address = open(port_file).read().strip()
        self.name = name

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def await_peers(client, n, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if sum(p.up for p in client.peers()) >= n:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{client.addr} did not see {n} peers up")
