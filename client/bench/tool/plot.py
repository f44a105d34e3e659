#!/usr/bin/env python3
"""gpumove-bench plot: PNG plots of gpumove-bench JSON runs (result.proto's JSON form).

    gpumove-bench plot run.json [more.json ...] -o DIR

One figure per subcommand found in the files: the value of each series (bandwidth, rate or
latency) against size, or against concurrency where a run sweeps clients at one size;
gpumove solid, baselines dashed, context (a stage alone) dotted, several files overlaid (labelled by file name), medians
with min-max bars."""
import argparse
import collections
import json
import os
import sys


def load(path):
    with open(path) as f:
        run = json.load(f)
    if run.get("schema") != "gpumove-bench/1":
        sys.exit(f"{path}: not a gpumove-bench/1 run")
    return run


def main(argv):
    ap = argparse.ArgumentParser(prog="gpumove-bench plot")
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out", required=True, help="folder for the PNG files")
    args = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("gpumove-bench plot needs matplotlib (Debian: python3-matplotlib)")
    runs = [(os.path.splitext(os.path.basename(p))[0], load(p)) for p in args.files]
    by_sub = collections.defaultdict(list)
    for label, run in runs:
        if run.get("skipped"):
            print(f"{label}: skipped ({run['skipped']}), not drawn")
            continue
        by_sub[run["subcommand"]].append((label, run))
    os.makedirs(args.out, exist_ok=True)
    for sub, group in sorted(by_sub.items()):
        fig, ax = plt.subplots(figsize=(8, 5))
        # gpumove's unit on the left; another (a latency beside bandwidth) on the right.
        first = group[0][1]["series"]
        main = next((x["unit"] for x in first if not x.get("baseline") and not x.get("context")),
                    first[0]["unit"] if first else "")
        ax.set_ylabel(main)
        axes = {main: ax}
        drawn = 0  # One colour cycle over both axes.
        for label, run in group:
            series = {s["name"]: s for s in run["series"]}
            sizes = {int(p["size"]) for p in run["points"]}
            by_conc = len(sizes) == 1  # One size: the sweep is over clients.
            lines = collections.defaultdict(list)
            for p in run["points"]:
                x = int(p["concurrency"]) if by_conc else int(p["size"])
                lines[p["series"]].append((x, p["median"], p["min"], p["max"]))
            for name, pts in sorted(lines.items()):
                pts.sort()
                s = series.get(name, {})
                xs = [q[0] for q in pts]
                ys = [q[1] for q in pts]
                err = [[q[1] - q[2] for q in pts], [q[3] - q[1] for q in pts]]
                su = s.get("unit", main)
                if su not in axes:
                    axes[su] = ax.twinx()
                    axes[su].set_ylabel(su)
                drawn += 1
                axes[su].errorbar(xs, ys, yerr=err, capsize=3, color=f"C{(drawn - 1) % 10}",
                            linestyle="--" if s.get("baseline") else
                            ":" if s.get("context") else "-", marker="o",
                            label=f"{name} ({label})" if len(group) > 1 else name)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("clients" if by_conc else "bytes per move")
        handles, labels = [], []
        for a in axes.values():
            h, l = a.get_legend_handles_labels()
            handles += h
            labels += l
        ax.set_title(f"gpumove-bench {sub}: {group[0][1].get('title', '')}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(handles, labels, fontsize=8)
        out = os.path.join(args.out, f"{sub}.png")
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        plt.close(fig)
        print(f"written: {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
