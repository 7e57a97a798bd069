#!/usr/bin/env python3
# Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
"""Plots the cross-node tensor benchmark of a results folder (xnode_tensor.jsonl, written by
benchmarks/xnode_tensor_bench.py) into xnode_tensor.png:

  left:   GB/s of a get on node B of tensors put through node A's daemon, per case: through
          node B's daemon, through upstream's own client on node B, and the raw TransferEngine
          read of the same replica bytes (the ceiling of the same run)
  middle: the same as fractions of that ceiling
  right:  node A's daemon reading A's own replicas (no transfer), as a fraction of the same
          run's pinned host-to-device copy (CUDA) or host memcpy (CPU)

Usage: python3 benchmarks/plot_xnode_tensor.py RESULTS_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PATHS = (("daemon", "node B's daemon (this library)"), ("upstream", "upstream's own client"),
         ("te_ceiling", "raw TransferEngine (ceiling)"))


def main() -> int:
    folder = Path(sys.argv[1])
    rows = [json.loads(line) for line in (folder / "xnode_tensor.jsonl").read_text().splitlines()
            if line.strip()]
    local_rows = [r for r in rows if r["what"] == "xnode_local_get"]
    rows = [r for r in rows if r["what"] in ("xnode_get", "xnode_batch_get")]
    cases = list(dict.fromkeys((r["tensors"], r["tensor_bytes"]) for r in rows))
    labels = [f"{n} x {b >> 20} MiB" for n, b in cases]
    fig, axes = plt.subplots(1, 3 if local_rows else 2, figsize=(18 if local_rows else 12, 4.5))
    left, right = axes[0], axes[1]
    width = 0.8 / len(PATHS)
    for k, (path, name) in enumerate(PATHS):
        by_case = {(r["tensors"], r["tensor_bytes"]): r for r in rows if r["path"] == path}
        xs = [i + (k - 1) * width for i in range(len(cases))]
        left.bar(xs, [by_case[c]["gbps"] for c in cases], width, label=name)
        right.bar(xs, [by_case[c]["ratio"] for c in cases], width, label=name)
    device = rows[0].get("device", "cpu") if rows else "cpu"
    for ax, title, unit in ((left, "get on node B", "GB/s"),
                            (right, "fraction of the TransferEngine ceiling", "ratio")):
        ax.set_xticks(range(len(cases)), labels)
        ax.set_title(f"{title} ({device} tensors, TCP)")
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
    right.axhline(1.0, color="black", lw=0.8)
    left.legend(fontsize=8)
    if local_rows:
        ax = axes[2]
        by_case = {(r["tensors"], r["tensor_bytes"]): r for r in local_rows}
        ax.bar(range(len(cases)), [by_case[c]["ratio"] for c in cases], 0.5,
               color="tab:green")
        for i, c in enumerate(cases):
            ax.annotate(f"{by_case[c]['gbps']:.1f} GB/s", (i, by_case[c]["ratio"]),
                        ha="center", va="bottom", fontsize=8)
        ceiling = local_rows[0]["ceiling"].replace("xnode_", "").replace("_", " ")
        ax.set_xticks(range(len(cases)), labels)
        ax.set_title(f"node A's own replica, fraction of the {ceiling}")
        ax.set_ylabel("ratio")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out = folder / "xnode_tensor.png"
    fig.savefig(out, dpi=120)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
