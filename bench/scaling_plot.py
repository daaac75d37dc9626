#!/usr/bin/env python3
"""Plots the scaling table (bench/scaling_bench.sh): predicted samples/s against workers for each
model's CSV from scaling_bench, beside N independent workers (the ideal), and, when given, the
netns points (bench/scaling_netns.sh's CSV: measured against predicted over tbf-limited links).

Usage: scaling_plot.py OUT.svg LABEL=SCALING_CSV [LABEL=SCALING_CSV ...] [--netns NETNS_CSV]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def plot_scaling(ax, series):
    for label, rows in series:
        n = [int(r["workers"]) for r in rows]
        sps = [float(r["samples_per_second"]) for r in rows]
        ideal = [float(r["samples_per_second"]) / float(r["efficiency"]) for r in rows]
        line, = ax.plot(n, sps, marker="o", label=f"{label}: best plan (R x S)")
        ax.plot(n, ideal, linestyle=":", color=line.get_color(),
                label=f"{label}: N independent workers")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers N = R x S")
    ax.set_ylabel("predicted samples/s")
    ax.set_title("Predicted throughput (links as in the table's header)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot_netns(ax, rows):
    labels = [f"{r['model']}\n{r['rate']}" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [float(r["predicted"]) for r in rows], width=0.4,
           label="predicted")
    ax.bar([i + 0.2 for i in x], [float(r["measured"]) for r in rows], width=0.4,
           label="measured")
    for i, r in enumerate(rows):
        ratio = float(r["measured"]) / float(r["predicted"])
        ax.text(i, max(float(r["predicted"]), float(r["measured"])), f"{ratio:.2f}",
                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("samples/s")
    ax.set_title("netns hosts, tc tbf links: measured / predicted")
    ax.legend(fontsize=7)


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    out = argv[1]
    series, netns = [], None
    args = argv[2:]
    while args:
        a = args.pop(0)
        if a == "--netns":
            netns = read_rows(args.pop(0))
        else:
            label, _, path = a.partition("=")
            if not path:
                sys.exit(f"scaling_plot: '{a}' is not LABEL=CSV")
            series.append((label, read_rows(path)))
    panels = 2 if netns else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5))
    axes = axes if panels > 1 else [axes]
    plot_scaling(axes[0], series)
    if netns:
        plot_netns(axes[1], netns)
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main(sys.argv)
