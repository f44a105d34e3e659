"""How long one 4 KiB Submit+wait takes through grpcio's generated stub against a daemon,
under the grpc environment given (GRPC_EXPERIMENTS, GRPC_POLL_STRATEGY, ...): p50 in us.
    python3 grpcio_latency.py ADDR [N]"""
import statistics
import sys
import time

import grpc

import gpumove
from gpumove import _requests as req

addr = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
with gpumove.Client(addr) as c:
    a, b = c.allocate(1 << 20), c.allocate(1 << 20)
    r = req.submit([gpumove.spec(a[0:4096], b)], True, "", None)
    us = []
    for i in range(n + 100):
        t0 = time.perf_counter()
        c._transfers.Submit(r)
        if i >= 100:
            us.append((time.perf_counter() - t0) * 1e6)
    info = c._node.GetInfo
    g = []
    for i in range(n + 100):
        t0 = time.perf_counter()
        info(gpumove.v1.gpumove_pb2.GetInfoRequest())
        if i >= 100:
            g.append((time.perf_counter() - t0) * 1e6)
print(f"grpcio {grpc.__version__}: Submit+wait p50 {statistics.median(us):.1f} us, "
      f"GetInfo p50 {statistics.median(g):.1f} us")
