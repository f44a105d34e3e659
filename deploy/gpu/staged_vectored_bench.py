"""Issue 26's staged row: vectored device moves over path UCX between two daemons on this host
whose UCX is not CUDA-aware (the GPU machine's Debian UCX), so device memory is staged:
65536 shuffled blocks of 4 KiB and 8192 of 64 KiB, against the same bytes as one contiguous
move through gpumove (the aim: >= 0.7 of it). Medians of ROUNDS moves' own times (the
daemon's start -> end). Cases: device -> device (staged on both sides: gathered here,
scattered there) pushed and pulled, and device -> host memory of the other node (staged by
the runner alone).

    python3 staged_vectored_bench.py --a ADDR_A [--b-node b] [--rounds 5] [--b-device 1]

--b-device: the GPU of node b's device buffers (1 with a daemon per GPU on a two-GPU
machine)."""
import argparse
import statistics

import numpy as np

import gpumove


def timed(c, rounds, src, dst, **kw):
    own = []
    for i in range(rounds + 1):
        t = c.move(src, dst, path="ucx", **kw)  # Raises for a move that did not succeed.
        if i:
            own.append((t.end_time - t.start_time).total_seconds())
    return statistics.median(own)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b-node", default="b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--b-device", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(26)
    print(f"{'case':>34} {'blocks':>14} {'vectored GB/s':>14} {'contiguous GB/s':>16} {'ratio':>6}")
    with gpumove.Client(args.a) as c:
        for n, bs in ((65536, 4096), (8192, 65536)):
            size = n * bs
            cases = (("device -> device, push", "device", "device", False),
                     ("device -> device, pull", "device", "device", True),
                     ("device -> other node's host, push", "device", "host", False))
            for name, here, there, pull in cases:
                a = c.allocate(size, kind=here)
                b = c.allocate(size, kind=there, device=args.b_device if there == "device" else 0,
                               node=args.b_node)
                src, dst = (b, a) if pull else (a, b)
                blocks = (rng.permutation(n).astype(np.uint64), rng.permutation(n).astype(np.uint64))
                vec = timed(c, args.rounds, src, dst, blocks=blocks, block_size=bs)
                whole = timed(c, args.rounds, src, dst)
                print(f"{name:>34} {f'{n} x {bs >> 10} KiB':>14} {size / vec / 1e9:>14.2f} "
                      f"{size / whole / 1e9:>16.2f} {whole / vec:>6.2f}", flush=True)
                c.release(a)
                c.release(b)


if __name__ == "__main__":
    main()
