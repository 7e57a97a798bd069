#!/usr/bin/env python3
"""Plots ipc_copy_bench.py results: GB/s of device-to-host copies from this process's own GPU
memory and from memory another process exported by CUDA IPC, by the number of pieces.

    python benchmarks/plot_ipc_copy.py OUT.png FILE.jsonl...
"""
from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = {}
    for path in sys.argv[2:]:
        for line in open(path):
            r = json.loads(line)
            if r.get("what") == "ipc_copy":
                rows[(r["pieces"], r["source"])] = r["gbps"]
    pieces = sorted({p for p, _ in rows})
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, source in enumerate(("own", "ipc")):
        xs = [i + (k - 0.5) * 0.35 for i in range(len(pieces))]
        ys = [rows.get((p, source), 0) for p in pieces]
        ax.bar(xs, ys, 0.35, label={"own": "own memory (ceiling)", "ipc": "CUDA IPC mapping"}[source])
        for x, y in zip(xs, ys):
            ax.text(x, y + 0.5, f"{y:.1f}", ha="center", fontsize=8)
    ax.set_xticks(range(len(pieces)))
    ax.set_xticklabels([f"{p} piece{'s' if p > 1 else ''}" for p in pieces])
    ax.set_ylabel("GB/s, device to pinned host")
    ax.set_title("250 MiB device-to-host, cudaMemcpyAsync per piece")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
