#!/usr/bin/env python3
"""Plot of the H200 run of CUDA tensor calls over the pinned quota (every byte in pageable store
memory), single tensors and batches, embedded and through the node daemon, against the pageable
copy ceilings of the same run (cudaMemcpy D2H into resident pageable memory for puts, pageable
H2D for get_into) and the pinned PCIe ceiling.

    python benchmarks/plot_pageable_batches.py benchmarks/results/2026-12-01-h200-batch
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def size(r: dict) -> str:
    b = r["tensor_bytes"]
    s = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    return f"{r['count']}x{s}" if r["count"] > 1 else s


def main(folder: str) -> None:
    d = Path(folder)
    rows = [json.loads(line) for line in (d / "tensor_pageable_batches.jsonl").read_text().splitlines()
            if line.strip()]
    fig, axes = plt.subplots(1, 2, figsize=(16, 5))
    for ax, calls, ceiling_key, title in (
        (axes[0], ("tensor_put", "tensor_batch_put"), "pageable_resident_gbps", "put (D2H)"),
        (axes[1], ("tensor_get_into", "tensor_batch_get_into"), "pageable_gbps", "get_into (H2D)"),
    ):
        pts = [r for r in rows if r.get("what") in calls]
        labels = [f"{r['backend']}\n{size(r)}" for r in pts]
        x = range(len(pts))
        ax.bar(x, [r["gbps"] for r in pts], color=["C0" if r["backend"] == "node" else "C1"
                                                  for r in pts])
        ax.plot(x, [r[ceiling_key] for r in pts], "k_", markersize=22,
                label="pageable cudaMemcpy ceiling")
        ax.plot(x, [r["ceiling_gbps"] for r in pts], "r_", markersize=22,
                label="pinned cudaMemcpy ceiling")
        for i, r in enumerate(pts):
            ax.text(i, r["gbps"] + 0.8, f"{r['gbps'] / r[ceiling_key]:.2f}x", ha="center",
                    fontsize=8)
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_ylabel("GB/s")
        ax.set_title(f"{title}, CUDA tensors, no pinned quota (ratio: / pageable ceiling)")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out = d / "pageable_batches.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/2026-12-01-h200-batch")
