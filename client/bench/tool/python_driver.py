"""The Python side of `gpumove-bench python` (run by the tool, not by hand): for each size,
in turns (the order rotated by --round), the median GB/s of

    gpumove python     c.move(src[0:size], dst) with the Python client (Submit and wait)
    numpy copy         np.copyto of the same size between two arrays of this process
    grpc echo python   a unary gRPC call to the tool's echo server carrying `size` bytes
                       each way through grpcio (sizes up to 1 MiB), bytes over round trip

one "SERIES<TAB>SIZE<TAB>GB/s" line each. Exit status 3 with a line "SKIPPED: why" on
stdout when grpcio, numpy or the client cannot be imported."""
import argparse
import statistics
import sys
import time


def median_seconds(fn, seconds):
    fn()  # Warm.
    times = []
    end = time.perf_counter() + seconds
    while (len(times) < 3 or time.perf_counter() < end) and len(times) < 100000:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def echo_call(channel, size):
    # EchoMessage{payload = 1 (bytes)} written by hand: no generated stubs needed.
    n, header = size, bytearray([0x0A])
    while True:
        b = n & 0x7F
        n >>= 7
        header.append(b | (0x80 if n else 0))
        if not n:
            break
    request = bytes(header) + b"x" * size
    call = channel.unary_unary("/gpumove.bench.Echo/Echo")
    expected = len(request)

    def fn():
        reply = call(request, timeout=30)
        if len(reply) != expected:
            raise RuntimeError(f"echo returned {len(reply)} bytes, sent {expected}")
    return fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--echo", required=True)
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--kind", default="host")
    ap.add_argument("--round", type=int, default=0)
    args = ap.parse_args()
    try:
        import grpc
        import numpy as np
        import gpumove
    except ImportError as e:
        print(f"SKIPPED: python3 cannot import what the Python client needs: {e}")
        return 3
    sizes = [int(s) for s in args.sizes.split(",")]
    if not sizes or min(sizes) <= 0 or max(sizes) > (4 << 30) or not 0 < args.seconds <= 600:
        sys.exit("--sizes must be 1 B to 4 GiB, --seconds above 0 (at most 600)")
    big = max(sizes)
    a = np.full(big, 1, dtype=np.uint8)
    b = np.zeros(big, dtype=np.uint8)
    with gpumove.Client(args.addr) as c, grpc.insecure_channel(args.echo) as channel:
        src = c.allocate(big, kind=args.kind)
        dst = c.allocate(big, kind=args.kind)
        try:
            for size in sizes:
                sides = [
                    ("gpumove python", lambda: c.move(src[0:size], dst)),
                    ("numpy copy", lambda: np.copyto(b[:size], a[:size])),
                ]
                if size <= (1 << 20):
                    sides.append(("grpc echo python", echo_call(channel, size)))
                k = args.round % len(sides)
                for name, fn in sides[k:] + sides[:k]:
                    s = median_seconds(fn, args.seconds)
                    print(f"{name}\t{size}\t{size / s / 1e9:.6g}", flush=True)
        finally:
            c.release(src)
            c.release(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
