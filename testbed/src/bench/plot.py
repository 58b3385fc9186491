# Draws the benchmark's PNG plots from its CSV files (run by `testbed bench`, see
# testbed/src/bench/plot.rs). Usage: python plot.py <dir with the CSVs> <output dir>
# Prints one line per written PNG: "<file>\t<caption>".
import csv
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # no display
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"ours": "#1f77b4", "upstream": "#ff7f0e"}
data_dir, out_dir = sys.argv[1], sys.argv[2]


def read(name):
    with open(f"{data_dir}/{name}", newline="") as f:
        return list(csv.DictReader(f))


curves = defaultdict(lambda: defaultdict(list))  # curve -> (impl, round) -> [(t, v)]
for row in read("curves.csv"):
    curves[row["curve"]][(row["impl"], row["round"])].append(
        (float(row["t"]), float(row["value"]))
    )


def finish(fig, ax, file, caption, xlabel, ylabel):
    """Labels, grid and legend; writes the PNG and names it on stdout for the report."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(caption)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out_dir}/{file}")
    plt.close(fig)
    print(f"{file}\t{caption}")


def line_plot(curve, file, caption, xlabel, ylabel, step=False):
    series = curves.get(curve)
    if not series:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    seen = set()
    for (impl, rnd), points in sorted(series.items()):
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        label = impl if impl not in seen else None
        seen.add(impl)
        draw = ax.step if step else ax.plot
        kwargs = {"where": "post"} if step else {}
        draw(xs, ys, color=COLORS.get(impl, "gray"), alpha=0.8, linewidth=1.4,
             label=label, **kwargs)
    finish(fig, ax, file, caption, xlabel, ylabel)


line_plot("a_bound", "a-time-to-bound.png",
          "(a) claims Bound over time, default QPS (one line per run)",
          "seconds since the first claim was created", "claims Bound", step=True)
line_plot("b_bound", "b-time-to-bound.png",
          "(b) claims Bound over time, --kube-api-qps 500 --kube-api-burst 1000",
          "seconds since the first claim was created", "claims Bound", step=True)
line_plot("c_remaining", "c-deletion.png",
          "(c) PVs left after all claims were deleted, default QPS",
          "seconds since the first claim was deleted", "PVs left", step=True)
line_plot("c_remaining_fast", "c-deletion-fast.png",
          "(c) PVs left after all claims were deleted, QPS 500",
          "seconds since the first claim was deleted", "PVs left", step=True)
line_plot("d_rss", "d-rss.png",
          "(d) resident memory with the most claims and PVs present",
          "seconds since start", "RSS (MiB)")
line_plot("a_rss", "a-rss.png",
          "(a) resident memory while provisioning and deleting, default QPS",
          "seconds since start", "RSS (MiB)")
line_plot("b_rss", "b-rss.png",
          "(b) resident memory while provisioning and deleting, QPS 500",
          "seconds since start", "RSS (MiB)")
line_plot("j_rss", "j-rss.png",
          "(j) node mode: resident memory of all sidecars together",
          "seconds since the sidecars started", "summed RSS (MiB)")
line_plot("j_bound", "j-time-to-bound.png",
          "(j) node mode: claims Bound over time (one line per run)",
          "seconds since the first pod was created", "claims Bound", step=True)


def scale_plot(file, caption):
    """(d): steady RSS against the pairs present, every round a dot, medians joined."""
    try:
        rows = read("d-scale.csv")
    except FileNotFoundError:
        return
    values = defaultdict(lambda: defaultdict(list))  # impl -> pairs -> [MiB]
    for row in rows:
        if row["steady_rss_mib"]:
            values[row["sidecar"]][int(row["pairs"])].append(float(row["steady_rss_mib"]))
    if not values:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for impl, by_size in sorted(values.items()):
        color = COLORS.get(impl, "gray")
        for pairs, mib in by_size.items():
            ax.scatter([pairs] * len(mib), mib, color=color, alpha=0.6, s=18)
        sizes = sorted(by_size)
        medians = [statistics.median(by_size[p]) for p in sizes]
        ax.plot(sizes, medians, color=color, linewidth=1.6, marker="o", label=f"{impl} (median)")
    ax.set_ylim(bottom=0)
    finish(fig, ax, file, caption, "claim + PV pairs present", "steady RSS (MiB)")


scale_plot("d-rss-growth.png",
           "(d) steady RSS by claim + PV pairs present (dots: rounds, lines: medians)")
