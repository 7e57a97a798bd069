#!/usr/bin/env python3
"""Plots planned_read_bench results of several trees side by side: each call's median time
(the daemon's handler beside the whole call where there is one), every run of every tree.

    python benchmarks/plot_planned_read.py DIR TREE...   # DIR/TREE_*.jsonl -> DIR/planned_read.png
"""
from __future__ import annotations

import collections
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = pathlib.Path(sys.argv[1])
    trees = sys.argv[2:]
    calls: list[str] = []
    data: dict[str, dict[str, list[tuple[float, float]]]] = {t: collections.defaultdict(list) for t in trees}
    for tree in trees:
        for path in sorted(out_dir.glob(f"{tree}_*.jsonl")):
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if row.get("what") != "planned_read":
                    continue
                call = f"{row['backend']}\n{row['call']}"
                if call not in calls:
                    calls.append(call)
                data[tree][call].append((row["median_s"] * 1e3,
                                         row.get("daemon_handler_mean_s", 0.0) * 1e3))
    fig, ax = plt.subplots(figsize=(2.2 * len(calls) + 2, 4.5))
    width = 0.8 / len(trees)
    handler_labeled = False
    for k, tree in enumerate(trees):
        for j, call in enumerate(calls):
            runs = data[tree].get(call, [])
            for r, (total, handler) in enumerate(runs):
                x = j + (k - (len(trees) - 1) / 2) * width + (r - (len(runs) - 1) / 2) * width / (len(runs) + 1)
                ax.bar(x, total, width / (len(runs) + 1), color=f"C{k}",
                       label=tree if j == 0 and r == 0 else None)
                if handler > 0:
                    ax.bar(x, handler, width / (len(runs) + 1), color="black", alpha=0.35,
                           label=None if handler_labeled else "daemon handler")
                    handler_labeled = True
    ax.set_xticks(range(len(calls)))
    ax.set_xticklabels(calls, fontsize=8)
    ax.set_ylabel("ms per read (median)")
    ax.set_title("planned reads of one rank (shaded: the daemon's handler)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "planned_read.png", dpi=120)
    print(out_dir / "planned_read.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
