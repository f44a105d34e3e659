"""Soak of the abuse cases an outside tester found (issue 48): many open streams, blocked
waits given up by their callers, oversized strings, listings of many objects. Each round
abuses one daemon, ends the abuse, and reads the daemon's threads, open files and resident
memory from /proc once they settle. A daemon that keeps what its callers left behind grows
round after round; one that lets go comes back to the same figures.

    python3 abuse_soak.py [--rounds N] [--streams N] [--waits N] [--json]

test_soak.py runs a short soak and checks the figures stay flat; docs/reliability.md has
a long one's numbers.
"""
import argparse
import json
import os
import sys
import threading
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from daemons import Daemon  # noqa: E402
from gpumove.v1 import gpumove_pb2 as pb  # noqa: E402
from gpumove.v1 import gpumove_pb2_grpc as rpc  # noqa: E402

MiB = 1 << 20


def usage(pid: int) -> dict:
    """The daemon's threads, open files and resident memory (KiB)."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return {"threads": len(os.listdir(f"/proc/{pid}/task")),
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "rss_kib": rss}


def settled(pid: int, baseline: dict, seconds: float = 10.0) -> dict:
    """Usage once threads and files are back to the baseline, or have not changed for 2 s
    (at most `seconds`)."""
    deadline = time.monotonic() + seconds
    last, same_since = usage(pid), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = usage(pid)
        if now["threads"] <= baseline["threads"] and now["fds"] <= baseline["fds"]:
            return now
        if (now["threads"], now["fds"]) != (last["threads"], last["fds"]):
            same_since = time.monotonic()
        elif time.monotonic() - same_since >= 2.0:
            return now
        last = now
    return last


def open_streams(transfers, n: int, pid: int) -> dict:
    """n Notifications streams at once (past the daemon's caps some are refused), then all
    cancelled by their callers."""
    calls = [transfers.Notifications(pb.NotificationsRequest(), timeout=60) for _ in range(n)]
    refused = 0
    # A call the daemon refused ends at once; one it serves is still open.
    time.sleep(1.0)
    for c in calls:
        if c.done() and c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            refused += 1
    during = usage(pid)
    for c in calls:
        c.cancel()
    return {"streams": n, "refused": refused, "threads_while_open": during["threads"]}


def given_up_waits(buffers, transfers, n: int) -> dict:
    """n callers wait on a slow move and give up (a short deadline), as careless clients do."""
    src = buffers.Allocate(pb.AllocateRequest(size=8 * MiB))
    dst = buffers.Allocate(pb.AllocateRequest(size=8 * MiB))
    spec = pb.TransferSpec(source=pb.BufferRef(buffer_id=src.id),
                           destination=pb.BufferRef(buffer_id=dst.id))
    t = transfers.Submit(pb.SubmitRequest(transfers=[spec])).transfers[0]
    gone = [0]
    lock = threading.Lock()

    def wait_briefly():
        try:
            transfers.Wait(pb.WaitRequest(id=t.id), timeout=0.3)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED):
                with lock:
                    gone[0] += 1
    threads = [threading.Thread(target=wait_briefly) for _ in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    transfers.Cancel(pb.CancelRequest(id=t.id, wait=True))
    buffers.Release(pb.ReleaseRequest(buffer_id=src.id))
    buffers.Release(pb.ReleaseRequest(buffer_id=dst.id))
    return {"waits": n, "gave_up": gone[0]}


def oversized(buffers, n: int) -> dict:
    """Labels past the bound (refused INVALID_ARGUMENT, nothing kept), and buffers listed
    page by page."""
    refused = 0
    for _ in range(n):
        try:
            buffers.Allocate(pb.AllocateRequest(size=4096, label="x" * (64 << 10)))
        except grpc.RpcError as e:
            refused += e.code() == grpc.StatusCode.INVALID_ARGUMENT
    made = [buffers.Allocate(pb.AllocateRequest(size=4096, label="soak")).id for _ in range(n)]
    listed, token = 0, ""
    for _ in range(n):
        r = buffers.List(pb.ListBuffersRequest(page_size=100, page_token=token))
        listed += len(r.buffers)
        token = r.next_page_token
        if not token:
            break
    for bid in made:
        buffers.Release(pb.ReleaseRequest(buffer_id=bid))
    return {"labels_refused": refused, "listed": listed}


def soak(rounds: int, streams: int, waits: int, strings: int, log=print,
         arena_max: int = 0) -> dict:
    """`arena_max` (0: glibc's default) caps the daemon's malloc arenas: with the default,
    the first rounds' 500 serving threads grow up to 8 arenas a CPU, which hides a slow
    leak in a short run; with one or two arenas, what a round leaks shows."""
    saved = os.environ.get("MALLOC_ARENA_MAX")
    if arena_max:
        os.environ["MALLOC_ARENA_MAX"] = str(arena_max)
    try:
        d = Daemon("soak", "--max_move_rate=1MiB", "--max_open_calls=1024",
                   "--max_open_calls_per_principal=512")
    finally:
        if saved is None:
            os.environ.pop("MALLOC_ARENA_MAX", None)
        else:
            os.environ["MALLOC_ARENA_MAX"] = saved
    try:
        channel = grpc.insecure_channel(d.address)
        buffers = rpc.BufferServiceStub(channel)
        transfers = rpc.TransferServiceStub(channel)
        pid = d.proc.pid
        # Warm-up: one small round, so that what a daemon makes once (thread pools, gRPC's
        # buffers) is in the baseline.
        open_streams(transfers, 8, pid)
        given_up_waits(buffers, transfers, 4)
        oversized(buffers, 4)
        baseline = settled(pid, usage(pid))
        log(f"baseline: {baseline}")
        out = {"baseline": baseline, "rounds": []}
        for i in range(rounds):
            r = open_streams(transfers, streams, pid)
            r.update(given_up_waits(buffers, transfers, waits))
            r.update(oversized(buffers, strings))
            r["settled"] = settled(pid, baseline)
            out["rounds"].append(r)
            log(f"round {i + 1}: {r}")
        channel.close()
        return out
    finally:
        d.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--streams", type=int, default=600)
    p.add_argument("--waits", type=int, default=200)
    p.add_argument("--strings", type=int, default=300)
    p.add_argument("--arena_max", type=int, default=0,
                   help="MALLOC_ARENA_MAX for the daemon (0: glibc's default)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    out = soak(a.rounds, a.streams, a.waits, a.strings,
               log=(lambda *_: None) if a.json else print, arena_max=a.arena_max)
    if a.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
