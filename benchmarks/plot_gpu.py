#!/usr/bin/env python3
"""Plots of the H200 tensor results: this library's put / get_into against the pinned
cudaMemcpy ceiling (tensor_bench.jsonl), and side by side with upstream Mooncake's tensor calls
(upstream_tensor_bench.jsonl).

    python benchmarks/plot_gpu.py benchmarks/results/2026-11-30-h200
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


def label(r: dict) -> str:
    mib = r["tensor_bytes"] >> 20
    return f"{mib} MiB" if r.get("count", 1) == 1 else f"{r['count']}x{mib} MiB"


def bars(ax, rows: list[dict], series: list[str], key, title: str) -> None:
    sizes = sorted({(r.get("count", 1), r["tensor_bytes"]) for r in rows},
                   key=lambda x: (x[0] > 1, x[1]))
    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        ys = []
        for count, size in sizes:
            hit = [r for r in rows if key(r) == s and r["tensor_bytes"] == size
                   and r.get("count", 1) == count]
            ys.append(hit[0]["gbps"] if hit else 0.0)
        ax.bar([x + i * width for x in range(len(sizes))], ys, width, label=s)
    ceil = [max((r["ceiling_gbps"] for r in rows if r["tensor_bytes"] == size
                 and r.get("count", 1) == count), default=0) for count, size in sizes]
    for x, c in enumerate(ceil):
        ax.hlines(c, x - 0.1, x + 0.8, colors="black", linestyles="dashed")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(sizes))])
    ax.set_xticklabels([label({"tensor_bytes": s, "count": c}) for c, s in sizes])
    ax.set_ylabel("GB/s")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("dashed: pinned cudaMemcpy ceiling, same run", fontsize=8)
    ax.legend(fontsize=7, loc="center right")


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else ".")
    tb = out / "tensor_bench.jsonl"
    if tb.exists():
        rows = [r for r in load(tb) if r.get("device") == "cuda"]
        # The same node points with a client that sleeps for its replies (NOSPIN=1).
        nospin = out / "tensor_bench_nospin.jsonl"
        if nospin.exists():
            rows += [{**r, "backend": "node, client sleeps"} for r in load(nospin)
                     if r.get("device") == "cuda" and not r["what"].startswith("staged")]
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        for ax, (put, get) in zip(axes, (("tensor_put", "tensor_batch_put"),
                                        ("tensor_get_into", "tensor_batch_get_into"))):
            sel = [r for r in rows if r["what"] in (put, get, "staged_put", "staged_get_into")
                   and (("put" in r["what"]) == ("put" in put))]
            bars(ax, sel, ["embedded", "node", "node, client sleeps", "embedded staged",
                           "node staged"],
                 lambda r: r["backend"] + (" staged" if r["what"].startswith("staged") else ""),
                 "CUDA " + ("put" if "put" in put else "get_into"))
        fig.tight_layout()
        fig.savefig(out / "tensor.png", dpi=120)
    ub = out / "upstream_tensor_bench.jsonl"
    if ub.exists():
        rows = [r for r in load(ub) if r["what"] in ("tensor_put", "tensor_get_into")]
        series = ["upstream_dummy", "upstream_embedded", "ours_embedded", "ours_daemon",
                  "ours_mooncake"]
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        for ax, what in zip(axes, ("tensor_put", "tensor_get_into")):
            bars(ax, [r for r in rows if r["what"] == what], series, lambda r: r["backend"],
                 f"CUDA {what.removeprefix('tensor_')}: upstream Mooncake vs mooncake.sparse")
        fig.tight_layout()
        fig.savefig(out / "upstream_side_by_side.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
