"""The vectored GPU rows against the same-process gather kernel (baseline (b)): each of
vectored_bench --device's rows whose direction raw_gather printed, end to end and in the
daemon, over the kernel's median.

    python3 gather_ratios.py RAW_GATHER_OUTPUT VECTORED_BENCH_OUTPUT"""
import re
import sys


def main():
    raw = {}
    for line in open(sys.argv[1]):
        m = re.match(r"raw_gather (\S+) (\d+) x (\d+) KiB: ([\d.]+) GB/s median", line)
        if m:
            raw[(m[1], m[2], m[3])] = float(m[4])
    for line in open(sys.argv[2]):
        m = re.match(r"(\S+), (\d+) x (\d+) KiB\s+([\d.]+)\s+([\d.]+)", line)
        key = (m[1].removeprefix("ipc:"), m[2], m[3]) if m else None
        if key in raw:
            k = raw[key]
            print(f"{m[1]}, {m[2]} x {m[3]} KiB: end to end {float(m[4]) / k:.2f} of the kernel, "
                  f"in daemon {float(m[5]) / k:.2f} (kernel {k:.1f} GB/s)")


if __name__ == "__main__":
    main()
