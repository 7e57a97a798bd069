#!/usr/bin/env python3
"""Plots gpu_gather_bench results: GB/s of each way to gather scattered pinned host ranges into
device memory, per range size, against the contiguous pinned copy of the same run.

    python benchmarks/plot_gather.py DIR   # reads DIR/gather.jsonl, writes DIR/gather.png
"""
from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = pathlib.Path(argv[0])
    recs = [json.loads(line) for line in (out_dir / "gather.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r.get("what") == "gather"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for method in sorted({r["method"] for r in recs}):
        rs = sorted((r for r in recs if r["method"] == method), key=lambda r: r["range_bytes"])
        ax.plot([r["range_bytes"] / 1024 for r in rs], [r["gbps"] for r in rs], marker="o",
                label=method)
    ceiling = recs[0]["ceiling_gbps"]
    ax.axhline(ceiling, color="#999999", linestyle="--", label=f"one contiguous copy ({ceiling:.1f})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("range size (KiB)")
    ax.set_ylabel("GB/s")
    ax.set_title(f"scattered pinned ranges into device memory ({recs[0]['bytes'] / 2**20:.0f} MiB)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "gather.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
