#!/usr/bin/env python3
# Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
"""Plots the node daemon benchmarks of a results folder into node.png:

  left:   host-memory throughput through shared memory (put, get, lease + read) against the
          numpy-copy ceiling measured in the same run, per size (node_throughput.jsonl)
  middle: metadata RPC latency p50/p99 against the echo ceiling (node_latency.jsonl)
  right:  the multi-process dedup run: bytes the processes requested vs bytes the node read
          (node_dedup.jsonl)

Usage: python3 benchmarks/plot_node.py [RESULTS_DIR]   (default: the newest results folder)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    results = Path(__file__).resolve().parent / "results"
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else max(
        (p for p in results.iterdir() if p.is_dir()), key=lambda p: p.name)
    thr = load(folder / "node_throughput.jsonl")
    lat = [r for r in load(folder / "node_latency.jsonl") if "p50_us" in r]
    dedup = [r for r in load(folder / "node_dedup.jsonl") if r["what"] == "node_dedup"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))

    ax = axes[0]
    for what, label in (("node_put", "put (2 copies)"), ("node_get", "get (2 copies)"),
                        ("node_lease_read", "lease + read (1 copy)")):
        rows = sorted((r for r in thr if r["what"] == what), key=lambda r: r["bytes"])
        if rows:
            ax.plot([r["bytes"] / 2**20 for r in rows], [r["gbps"] for r in rows], "o-",
                    label=label)
    ceil = sorted({(r["bytes"], r["ceiling_gbps"]) for r in thr if r["what"] == "node_put"})
    if ceil:
        ax.plot([b / 2**20 for b, _ in ceil], [g for _, g in ceil], "k--",
                label="numpy copy (ceiling)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("object size (MiB)")
    ax.set_ylabel("GB/s")
    ax.set_title("host memory through the daemon's shared memory")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

    ax = axes[1]
    names = [r["what"].replace("node_", "").replace("_rtt", "").replace("_cpp", " (C++)")
             .replace("stat", "stat (Py)" if not r["what"].endswith("_cpp") else "stat")
             for r in lat]
    x = range(len(lat))
    ax.bar([i - 0.2 for i in x], [r["p50_us"] for r in lat], 0.2, label="p50")
    ax.bar([i for i in x], [r["p99_us"] for r in lat], 0.2, label="p99")
    ax.bar([i + 0.2 for i in x], [r["ceiling_p50_us"] for r in lat], 0.2, label="ceiling p50")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("microseconds")
    ax.set_title("metadata RPC round trip")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")

    ax = axes[2]
    for i, r in enumerate(dedup):
        ax.bar(i - 0.2, r["requested_bytes_sum_over_processes"] / 1e6, 0.4,
               color="tab:orange", label="requested by the processes" if i == 0 else None)
        ax.bar(i + 0.2, r["node_range_bytes_read"] / 1e6, 0.4, color="tab:blue",
               label="read by the node" if i == 0 else None)
    ax.set_xticks(range(len(dedup)))
    ax.set_xticklabels([f"{r['processes']} procs\nEP{r['ep']}xTP{r['tp']}" for r in dedup])
    ax.set_ylabel("MB of source entries")
    ax.set_title("node dedup across processes")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")

    fig.tight_layout()
    out = folder / "node.png"
    fig.savefig(out, dpi=120)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
