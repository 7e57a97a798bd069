#!/usr/bin/env python3
"""Plots host_memory_bench results: GB/s of the copy engines to and from each kind of
page-locked host memory, one contiguous copy and many scattered ones, side by side.

    python benchmarks/plot_host_memory.py DIR [NAME ...]   # DIR/NAME.jsonl (default
                                                           # host_memory), writes DIR/NAME.png
"""
from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(out_dir: pathlib.Path, name: str) -> None:
    lines = (out_dir / f"{name}.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    meta = next((r for r in recs if r.get("what") == "meta"), {})
    recs = [r for r in recs if r.get("what") == "host_memory" and "pattern" in r]
    kinds = list(dict.fromkeys(r["kind"] for r in recs))
    bars = [(p, d) for p in ("contiguous", "ranges") for d in ("h2d", "d2h")]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(bars)
    for b, (pattern, direction) in enumerate(bars):
        ys = []
        for k in kinds:
            r = next((r for r in recs if r["kind"] == k and r["pattern"] == pattern), None)
            ys.append(r[f"{direction}_gbps"] if r else 0.0)
        copies = next((r["copies"] for r in recs if r["pattern"] == pattern), 1)
        ax.bar([i + b * width for i in range(len(kinds))], ys, width,
               label=f"{direction}, {pattern} ({copies} cop{'y' if copies == 1 else 'ies'})")
    labels = []
    for k in kinds:
        huge = next((r["huge_kb"] for r in recs if r["kind"] == k), None)
        labels.append(k + ("" if not huge else f"\n{huge >> 10} MiB huge"))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(kinds))], labels, fontsize=8)
    ax.set_ylabel("GB/s")
    mib = recs[0]["bytes"] >> 20 if recs else 0
    shmem = meta.get("thp", {}).get("shmem_enabled", "?")
    ax.set_title(f"{meta.get('gpu', '')}: {mib} MiB per measurement; shmem THP: {shmem}",
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out_dir / f"{name}.png", dpi=120)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = pathlib.Path(argv[0])
    for name in argv[1:] or ["host_memory"]:
        plot(out_dir, name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
