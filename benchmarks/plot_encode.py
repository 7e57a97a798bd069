#!/usr/bin/env python3
# Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
"""Plots the JSON lines of encode_bench (benchmarks/encode_bench.cc).

Usage: python3 benchmarks/plot_encode.py [RESULTS_DIR_OR_JSONL] [-o PNG]

By default reads benchmarks/results/2026-11-30-cpu-x86_64/encode.jsonl and writes encode.png
beside it. Three panels: encode_update GB/s (one dense tensor) against the fraction changed,
with the single-thread memcpy ceiling measured in the same run and the 1 GB/s-per-core goal;
build_sparse_object entries/s; apply time against a dense memcpy of the weight.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                           "2026-11-30-cpu-x86_64")


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "encode.jsonl")
    with open(path) as f:
        return path, [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default=DEFAULT_DIR)
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    path, rows = load(args.results)
    out = args.output or os.path.join(os.path.dirname(path), "encode.png")

    fig, axes = plt.subplots(1, 3, figsize=(17, 5))

    # 1. encode_update
    ax = axes[0]
    enc = [r for r in rows if r["what"] == "encode_update"]
    for apply, marker in (("overwrite", "o"), ("scatter_add", "s")):
        for threads in sorted({r["threads"] for r in enc}):
            pts = sorted((r["density"], r["gbps"]) for r in enc
                         if r["threads"] == threads and r.get("apply", "overwrite") == apply)
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot([x * 100 for x in xs], ys, marker=marker,
                    linestyle="-" if apply == "overwrite" else "none",
                    label=f"{apply}, {threads} thread{'s' if threads > 1 else ''}")
    if enc:
        ceiling = enc[0]["ceiling_gbps"]
        ax.axhline(ceiling, color="gray", linestyle="--",
                   label=f"memcpy 1 thread, same bytes ({ceiling:.1f} GB/s)")
        ax.axhline(1.0, color="red", linestyle=":", label="goal: 1 GB/s per core")
        shape = "x".join(str(s) for s in enc[0]["shape"])
        ax.set_title(f"encode_update, bf16 {shape}")
    ax.set_xscale("log")
    ax.set_xlabel("elements changed (%)")
    ax.set_ylabel("GB/s of one dense tensor")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)

    # 2. build_sparse_object
    ax = axes[1]
    bld = [r for r in rows if r["what"] == "build_sparse_object"]
    labels, values = [], []
    for r in bld:
        labels.append(f"{r['input']}\n{r['threads']} thr")
        values.append(r["entries_per_s"] / 1e6)
    ax.bar(range(len(values)), values, color=["C0" if "unsorted" in lbl else "C2" for lbl in labels])
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("M entries / s")
    if bld:
        shape = "x".join(str(s) for s in bld[0]["shape"])
        ax.set_title(f"build_sparse_object, {bld[0]['entries']} int64 COO entries of {shape}")
    ax.grid(True, axis="y", alpha=0.3)

    # 3. apply
    ax = axes[2]
    app = [r for r in rows if r["what"] == "apply"]
    labels, values = [], []
    for r in app:
        labels.append(f"{r['apply']}\n{r['threads']} thr")
        values.append(r["seconds"] * 1e3)
    ax.bar(range(len(values)), values, color="C1")
    if app:
        ax.axhline(app[0]["dense_memcpy_seconds"] * 1e3, color="gray", linestyle="--",
                   label="dense memcpy of the weight, 1 thread")
        shape = "x".join(str(s) for s in app[0]["shape"])
        ax.set_title(f"apply {app[0]['entries']} entries into bf16 {shape}")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("ms")
    ax.grid(True, axis="y", alpha=0.3)

    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
