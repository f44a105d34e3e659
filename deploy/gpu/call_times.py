#!/usr/bin/env python3
"""Sums up the timing lines of daemon logs written with --v=1 or --v=2.

  call_times.py LOG...   (e.g. $TEST_TMPDIR/gpumoved.*/gpumoved.log after a benchmark run
                          with GPUMOVED_EXTRA_FLAGS=--v=2 and TEST_TMPDIR set)

Per log, medians and 90th percentiles (microseconds) of:
  - each move's copy and acknowledgement, by path and size (--v=1: "transfer ... on PATH:
    move X us, acknowledgement Y us");
  - peer calls made (--v=2): when the progress thread sent the request, when the reply
    came, when the calling thread was back;
  - peer calls served (--v=2): from arrival to answer (queueing and handler), and from
    answer to the reply on the wire.
Benchmark logs run to tens of MB: summing them where they were written keeps them there.
"""
import collections
import re
import sys

MOVE = re.compile(r"transfer \S+ (\d+) bytes on (\w+): move ([\d.]+) us, "
                  r"acknowledgement ([\d.]+) us")
CALL = re.compile(r"peer call (\d+) to \S+: sent ([\d.]+) us, answered ([\d.]+) us, "
                  r"caller back ([\d.]+) us")
SERVED = re.compile(r"peer call (\d+) served: answered ([\d.-]+) us after it came, "
                    r"reply sent ([\d.-]+) us later")
METHODS = {1: "hold", 2: "ack", 3: "ack1", 4: "stage", 5: "mpi-start", 6: "mpi-stop"}


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def row(label, samples, names):
    def both(i):
        values = [s[i] for s in samples]
        return f"{pct(values, 0.5):8.1f}/{pct(values, 0.9):<8.1f}"
    cols = " ".join(f"{n} {both(i)}" for i, n in enumerate(names))
    return f"  {label:<28} n={len(samples):<6} {cols}"


def size_name(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def main(paths):
    for path in paths:
        moves = collections.defaultdict(list)
        calls = collections.defaultdict(list)
        served = collections.defaultdict(list)
        with open(path, errors="replace") as f:
            for line in f:
                if m := MOVE.search(line):
                    moves[(m[2], int(m[1]))].append((float(m[3]), float(m[4])))
                elif m := CALL.search(line):
                    calls[int(m[1])].append(tuple(float(x) for x in m.groups()[1:]))
                elif m := SERVED.search(line):
                    served[int(m[1])].append((float(m[2]), float(m[3])))
        if not (moves or calls or served):
            continue
        print(f"{path}  (p50/p90, us)")
        for (kind, size), s in sorted(moves.items()):
            print(row(f"move {kind} {size_name(size)}", s, ["copy", "ack"]))
        for method, s in sorted(calls.items()):
            print(row(f"call {METHODS.get(method, method)}", s, ["sent", "answered", "back"]))
        for method, s in sorted(served.items()):
            print(row(f"served {METHODS.get(method, method)}", s, ["answered", "reply"]))


if __name__ == "__main__":
    main(sys.argv[1:])
