"""Issue 27's table: device -> device moves between two daemons on this host over path UCX
(direct: device pointers to a CUDA-aware UCX) and path CUDA_IPC, against ucx_perftest
put_bw -m cuda,cuda of the same sizes, medians of ROUNDS moves per size.

    python3 direct_bench.py --a ADDR_A --b-node b [--rounds 5] [--perftest results.txt]
                            [--b-device 1]

Each move's own time is the daemon's (start -> end of the transfer, holds and the
acknowledgement included); "end to end" adds the client's Submit and wait. The 4 KiB row
prints latencies (us) instead of GB/s. "stream": STREAM moves of distinct buffer pairs in
one Submit (as ucx_perftest keeps puts in flight), bytes over first start -> last end.
--perftest: "SIZE MB/s" lines from ucx_perftest put_bw (puts in flight, the stream's
baseline); --perftest_single: the same for one flushed put (-n 1), a single move's
like-for-like baseline ("1put" ratios). --b-device: the GPU of node b's buffers (1 with a
daemon per GPU on a two-GPU machine)."""
import argparse
import statistics
import time

import gpumove

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]


def fmt(n):
    for unit, s in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << s:
            return f"{n >> s} {unit}"
    return f"{n} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b-node", default="b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--perftest", default="")
    ap.add_argument("--perftest_single", default="")
    ap.add_argument("--paths", default="ucx,cuda_ipc")
    ap.add_argument("--stream", type=int, default=4)
    ap.add_argument("--kind", default="device")
    ap.add_argument("--b-device", type=int, default=0)
    args = ap.parse_args()
    def read(path):
        out = {}
        for line in open(path) if path else []:
            parts = line.split()
            if len(parts) == 2 and parts[1] != "nan":
                out[int(parts[0])] = float(parts[1]) * (1 << 20) / 1e9  # MB/s -> GB/s
        return out

    base, single = read(args.perftest), read(args.perftest_single)
    paths = args.paths.split(",")
    print(f"{'size':>8} " + " ".join(f"{p + ' GB/s':>14} {p + ' e2e':>12} {p + ' strm':>12}"
                                     for p in paths) +
          f" {'perftest GB/s':>14} {'1 put GB/s':>11} " +
          " ".join(f"{p + '/raw':>12} {p + ' strm/raw':>14} {p + '/1put':>12}" for p in paths))
    with gpumove.Client(args.a) as c:
        for size in SIZES:
            k = args.stream if size >= (1 << 20) else 1
            srcs = [c.allocate(size, kind=args.kind) for _ in range(k)]
            dsts = [c.allocate(size, kind=args.kind, device=args.b_device, node=args.b_node)
                    for _ in range(k)]
            src, dst = srcs[0], dsts[0]
            row, strm = {}, {}
            for path in paths:
                own, e2e = [], []
                for i in range(args.rounds + 1):
                    t0 = time.perf_counter()
                    t = c.move(src, dst, path=path)
                    wall = time.perf_counter() - t0
                    took = (t.end_time - t.start_time).total_seconds()
                    if i:  # The first move of a size warms caches (rkeys, IPC handles).
                        own.append(took)
                        e2e.append(wall)
                row[path] = (statistics.median(own), statistics.median(e2e))
                rates = []
                for i in range(args.rounds + 1 if k > 1 else 0):
                    ts = c.submit([gpumove.spec(s, d, path=path) for s, d in zip(srcs, dsts)],
                                  wait=True)
                    span = (max(t.end_time for t in ts) - min(t.start_time for t in ts))
                    if i:
                        rates.append(k * size / span.total_seconds() / 1e9)
                strm[path] = statistics.median(rates) if rates else None
            for b in srcs + dsts:
                c.release(b)
            cells = []
            for path in paths:
                own, e2e = row[path]
                if size <= 4096:
                    cells.append(f"{own * 1e6:>11.1f} us {e2e * 1e6:>9.1f} us")
                    cells[-1] += f" {'':>12}"
                else:
                    s = f"{strm[path]:>12.1f}" if strm[path] else f"{'':>12}"
                    cells.append(f"{size / own / 1e9:>14.1f} {size / e2e / 1e9:>12.1f} {s}")
            raw, raw1 = base.get(size), single.get(size)
            ratios = []
            for p in paths:
                rate = size / row[p][0] / 1e9
                one = f"{rate / raw:>12.2f}" if raw and size > 4096 else f"{'':>12}"
                many = f"{strm[p] / raw:>14.2f}" if raw and strm.get(p) else f"{'':>14}"
                fair = f"{rate / raw1:>12.2f}" if raw1 and size > 4096 else f"{'':>12}"
                ratios.append(f"{one} {many} {fair}")
            print(f"{fmt(size):>8} " + " ".join(cells) +
                  f" {raw if raw else float('nan'):>14.1f} {raw1 if raw1 else float('nan'):>11.1f} " +
                  " ".join(ratios), flush=True)


if __name__ == "__main__":
    main()
