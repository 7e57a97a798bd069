"""Plots node_scale_bench JSON lines: each phase's seconds next to the memcpy floors of its bytes.

Usage: python benchmarks/plot_node_scale.py RESULTS.jsonl OUT.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path: str, out: str) -> None:
    lines = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                lines[d["what"]] = d
    read = lines["node_scale_read"]
    phases = [
        ("commit\n(PutSparseObjects)", lines["node_scale_commit"]),
        ("plan", lines["node_scale_plan"]),
        ("range reads", lines["node_scale_range_read"]),
        ("materialize", lines["node_scale_materialize"]),
        ("read\n(whole call)", read),
    ]
    labels = [p[0] for p in phases]
    seconds = [p[1]["seconds"] for p in phases]
    floors = [p[1]["floor_seconds"] for p in phases]
    x = range(len(phases))
    fig, ax = plt.subplots(figsize=(9, 4.8))
    ax.bar([i - 0.2 for i in x], seconds, width=0.4, label="measured (one thread)")
    ax.bar([i + 0.2 for i in x], floors, width=0.4,
           label="memcpy floor of its bytes (1 thread, warm buffers)")
    ax.bar(4.6, read["floor_seconds_fresh"], width=0.4, color="tab:gray",
           label="floor with fresh memory (this VM's first touches)")
    ax.axhline(read["goal_seconds"], color="tab:red", linestyle="--", linewidth=1,
               label=f"goal: read <= {read['goal_seconds']:g} s")
    for i, s in enumerate(seconds):
        ax.text(i - 0.2, s, f"{s:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels)
    ax.set_ylabel("seconds")
    ax.set_title(
        f"Kimi-K2 {read['layers']} layers, node {read['layout']}: {read['num_sources']:,} sources, "
        f"{read['num_targets']:,} targets, density {read['density']:g}\n"
        f"read moves {read['bytes'] / 1e9:.2f} GB (range reads + target objects); "
        f"floor {read['ceiling_gbps']:.1f} GB/s warm, {read['fresh_memcpy_gbps']:.2f} GB/s fresh",
        fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
