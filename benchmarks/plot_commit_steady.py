#!/usr/bin/env python3
"""Plots commit_steady_bench results: commit and seal per object, step after step, per path and
per run (e.g. glibc malloc against jemalloc preloaded), with the memcpy ceiling of the run.

    python benchmarks/plot_commit_steady.py DIR NAME...   # DIR/NAME.jsonl -> DIR/commit_steady.png
"""
from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = pathlib.Path(argv[0])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    styles = ["-", "--", ":", "-."]
    ceiling = None
    for k, name in enumerate(argv[1:]):
        rows = [json.loads(line) for line in (out_dir / f"{name}.jsonl").read_text().splitlines()]
        rows = [r for r in rows if r.get("what") == "commit_steady"]
        for path, color in (("batch", "#4c72b0"), ("indexed", "#c44e52")):
            mine = [r for r in rows if r["path"] == path]
            if not mine:
                continue
            steps = [r["step"] for r in mine]
            axes[0].plot(steps, [r["commit_us_per_object"] for r in mine], styles[k % 4],
                         color=color, label=f"{path}, {name}")
            axes[1].plot(steps, [r["seal_us_per_object"] for r in mine], styles[k % 4],
                         color=color, label=f"{path}, {name}")
            ceiling = mine[0]["memcpy_us_per_object"]
    for ax, what in zip(axes, ("commit", "seal")):
        ax.set_xlabel("step")
        ax.set_ylabel(f"{what}, µs per object")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    n = rows[0]["objects"] if rows else 0
    axes[0].set_title(f"{n} objects per step, retention 2 (memcpy of the entries: "
                      f"{ceiling:.3f} µs per object)", fontsize=9)
    axes[1].set_title("each step's seal (frees the step before last)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "commit_steady.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
