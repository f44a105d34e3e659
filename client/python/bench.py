"""The Python client against the C++ client, in one run, on one daemon (started here, or
--addr): 4 KiB Submit+wait latency (median; aim <= 1.2x the C++ client's), a 256 MiB move
(aim >= 0.98x), 256 MiB written and read through the client, and the Python time to build
and submit a 65536-block vectored move from numpy arrays (aim <= 10 ms, without the wait).

    python3 client/python/bench.py [--addr ADDR] [--probe bazel-bin/client/bench/client_probe]
        [--kind host|pinned|device] [--rounds 3]

Needs gpumove importable (the wheel, or PYTHONPATH with generated stubs) and, to start a
daemon, GPUMOVED or bazel-bin/daemon/gpumoved."""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "tests"))

import gpumove  # noqa: E402
from daemons import REPO, Daemon  # noqa: E402


def p50_us(fn, n, warmup=50):
    """The median time of `n` calls of fn (after `warmup` more), in microseconds."""
    us = []
    for i in range(n + warmup):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            us.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(us)


def grpcio_floor_us(c, src, dst, n):
    """The floor grpcio itself sets: a 4 KiB Submit (wait) through the generated stub,
    the request built once, no client code around it (p50, us)."""
    from gpumove import _requests as req
    raw_request = req.submit([gpumove.spec(src[0:4096], dst)], True, "", None)
    return p50_us(lambda: c._transfers.Submit(raw_request), n)


def python_figures(addr, kind, small, big, big_moves):
    with gpumove.Client(addr) as c:
        src = c.allocate(big, kind=kind)
        dst = c.allocate(big, kind=kind)
        small_p50 = p50_us(lambda: c.move(src[0:4096], dst), small)
        floor_p50 = grpcio_floor_us(c, src, dst, small)
        rates = []
        for i in range(big_moves + 1):
            t0 = time.perf_counter()
            c.move(src, dst)
            if i:
                rates.append(big / (time.perf_counter() - t0) / 1e9)
        data = np.full(big, 120, dtype=np.uint8)
        out = np.empty(big, dtype=np.uint8)
        wr, rd = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            c.write(src, data)
            wr.append(big / (time.perf_counter() - t0) / 1e9)
            t0 = time.perf_counter()
            c.read(src, out=out)
            rd.append(big / (time.perf_counter() - t0) / 1e9)
        # A 65536-block vectored move: Python's time to build and submit (not waited for).
        n = 65536
        blocks = c.allocate(n * 4096, kind=kind)
        other = c.allocate(n * 4096, kind=kind)
        rng = np.random.default_rng(1)
        si, di = rng.permutation(n), rng.permutation(n)
        build = []
        for _ in range(5):
            t0 = time.perf_counter()
            spec = gpumove.spec(blocks, other, blocks=(si, di), block_size=4096)
            t1 = time.perf_counter()
            t = c.submit([spec])[0]
            t2 = time.perf_counter()
            build.append(((t1 - t0) * 1e3, (t2 - t0) * 1e3))
            c.wait(t, timeout=60).raise_for_state()
        for b in (src, dst, blocks, other):
            c.release(b)
    return {"small_p50_us": small_p50, "grpcio_p50_us": floor_p50,
            "big_gbps": statistics.median(rates),
            "write_gbps": statistics.median(wr), "read_gbps": statistics.median(rd),
            "build_ms": statistics.median(x[0] for x in build),
            "submit_ms": statistics.median(x[1] for x in build)}


def cpp_figures(probe, addr, kind, small, big, big_moves):
    out = subprocess.run([probe, f"--addr={addr}", f"--kind={kind}", f"--small_moves={small}",
                          f"--big_size={big}", f"--big_moves={big_moves}"],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    return {k: float(v) for k, v in (line.split() for line in out.splitlines() if line)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr")
    p.add_argument("--probe", default=os.path.join(REPO, "bazel-bin", "client", "bench",
                                                   "client_probe"))
    p.add_argument("--kind", default="host")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--small", type=int, default=2000)
    p.add_argument("--big", type=int, default=256 << 20)
    p.add_argument("--grpcio_only", action="store_true",
                   help="with --addr: print the grpcio floor alone (p50 of 4 KiB Submits), "
                        "e.g. to compare GRPC_* settings")
    args = p.parse_args()
    if args.grpcio_only:
        import grpc
        with gpumove.Client(args.addr) as c:
            src, dst = c.allocate(1 << 20), c.allocate(1 << 20)
            print(f"grpcio {grpc.__version__}: 4 KiB Submit+wait through the stub, p50 "
                  f"{grpcio_floor_us(c, src, dst, args.small):.1f} us")
        return
    daemon = None
    addr = args.addr
    if addr is None:
        flags = ["--host_pool_size=2GiB", "--pinned_pool_size=64MiB"]
        if args.kind != "host":
            flags += [f"--{'pinned' if args.kind == 'pinned' else 'device'}_pool_size=2GiB"]
        daemon = Daemon("bench", *flags)
        addr = daemon.address
    try:
        py, cc = [], []
        for _ in range(args.rounds):  # Taking turns.
            cc.append(cpp_figures(args.probe, addr, args.kind, args.small, args.big, 5))
            py.append(python_figures(addr, args.kind, args.small, args.big, 5))
        med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
        print(f"Python client vs C++ client, {args.kind} memory, medians of {args.rounds} rounds")
        print(f"{'':28s} {'Python':>10s} {'C++':>10s} {'ratio':>7s}")
        for key, label, unit in (("small_p50_us", "4 KiB move, p50", "us"),
                                 ("big_gbps", f"{args.big >> 20} MiB move", "GB/s"),
                                 ("write_gbps", f"{args.big >> 20} MiB write", "GB/s"),
                                 ("read_gbps", f"{args.big >> 20} MiB read", "GB/s")):
            a, b = med(py, key), med(cc, key)
            print(f"{label + ' (' + unit + ')':28s} {a:10.2f} {b:10.2f} {a / b:7.2f}")
        floor = med(py, "grpcio_p50_us")
        print(f"{'4 KiB, grpcio stub alone (us)':28s} {floor:10.2f} {med(cc, 'small_p50_us'):10.2f} "
              f"{floor / med(cc, 'small_p50_us'):7.2f}   (the floor of any grpcio client; "
              f"the Python client adds {med(py, 'small_p50_us') - floor:.1f} us to it)")
        print(f"65536-block spec from numpy: build {med(py, 'build_ms'):.2f} ms, "
              f"build + submit {med(py, 'submit_ms'):.2f} ms")
    finally:
        if daemon:
            daemon.stop()


if __name__ == "__main__":
    main()
