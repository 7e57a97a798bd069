#!/usr/bin/env python3
"""Plots of the H200 hardening run: daemon start-up with pinning in the background, CUDA puts
into the daemon's pageable (pre-faulted) segments against the pageable copy ceilings of the
same run, and get_tensor_into strided CUDA views against the contiguous one.

    python benchmarks/plot_hardening.py benchmarks/results/2026-12-01-h200
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(folder: str) -> None:
    d = Path(folder)
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))

    # 1. Start-up: time to listen and time until every segment is pre-faulted and pinned.
    ax = axes[0]
    rows = []
    for name, label in (("tensor_pageable.jsonl", "no pinned quota\n(8 GiB pre-faulted)"),
                        ("tensor_pinned32g_startup.jsonl", "32 GiB pinned\n(40 GiB pre-faulted)")):
        for r in load(d / name):
            if r["what"] == "node_startup":
                rows.append((label, r["listen_seconds"], r["prepared_seconds"]))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r[1] for r in rows], 0.4, label="listening")
    ax.bar([i + 0.2 for i in x], [r[2] for r in rows], 0.4, label="prepared (background)")
    ax.set_xticks(list(x), [r[0] for r in rows])
    ax.set_ylabel("seconds after start")
    ax.set_title("daemon start-up (listened after 4.2 s at 8 GiB,\n18.5 s at 32 GiB before)")
    ax.legend()

    # 2. CUDA puts into pageable segments vs the pageable D2H ceilings.
    ax = axes[1]
    rows = [r for r in load(d / "tensor_pageable.jsonl")
            if r["what"] in ("tensor_put", "tensor_upsert", "tensor_batch_put")]
    labels = [f"{r['what'].replace('tensor_', '')}\n{r['count']}x{r['tensor_bytes'] >> 20} MiB"
              if r["count"] > 1 else f"{r['what'].replace('tensor_', '')}\n{r['tensor_bytes'] >> 20} MiB"
              for r in rows]
    ax.bar(labels, [r["gbps"] for r in rows], label="put through the daemon")
    ax.plot(labels, [r["pageable_resident_gbps"] for r in rows], "k_", markersize=30,
            label="cudaMemcpy D2H, resident pageable")
    ax.plot(labels, [r["pageable_gbps"] for r in rows], "r_", markersize=30,
            label="t.cpu() (fresh pageable pages)")
    for i, r in enumerate(rows):
        ax.text(i, r["gbps"] + 0.3, f"{r['gbps'] / r['pageable_resident_gbps']:.2f}", ha="center")
    ax.set_ylabel("GB/s")
    ax.set_title("over the pinned quota: CUDA put into pageable segments")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)

    # 3. get_tensor_into strided CUDA views (embedded store).
    ax = axes[2]
    rows = [r for r in load(d / "tensor_strided_pageable64.jsonl")
            if r["what"].startswith("tensor_get_into") and r["backend"] == "embedded"
            and r["count"] == 1]
    labels = [f"{r['what'].replace('tensor_get_into', 'into') or 'into'}\n{r['tensor_bytes'] >> 20} MiB"
              for r in rows]
    ax.bar(labels, [r["gbps"] for r in rows])
    ax.plot(labels, [r["ceiling_gbps"] for r in rows], "k_", markersize=25,
            label="pinned H2D ceiling")
    ax.set_ylabel("GB/s")
    ax.set_title("get_tensor_into CUDA views (embedded)")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(d / "hardening.png", dpi=110)
    print(d / "hardening.png")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/2026-12-01-h200")
