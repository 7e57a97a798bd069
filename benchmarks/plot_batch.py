#!/usr/bin/env python3
"""Plots batch_bench.py results: fixed cost per object, single calls vs batch calls, per backend.

    python benchmarks/plot_batch.py benchmarks/results/DIR   # reads DIR/batch.jsonl, writes DIR/batch.png
    python benchmarks/plot_batch.py DIR NAME...   # reads DIR/NAME.jsonl, writes DIR/NAME.png, each
"""
from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = pathlib.Path(argv[0])
    for stem in argv[1:] or ["batch"]:
        plot(out_dir, stem)
    return 0


def plot(out_dir: pathlib.Path, stem: str) -> None:
    recs = [json.loads(line) for line in (out_dir / f"{stem}.jsonl").read_text().splitlines()]
    machine = next((r for r in recs if r["what"] == "batch_machine"), {})
    allocator = "jemalloc" if "jemalloc" in machine.get("ld_preload", "") else "glibc malloc"
    recs = [r for r in recs if r["what"] == "batch"]
    counts = sorted({r["objects"] for r in recs})
    backends = sorted({r["backend"] for r in recs})
    phases = [("encode", "encode_single", "encode_batch"), ("commit", "commit_single", "commit_batch"),
              ("apply", "apply_single", "apply_batch")]
    fig, axes = plt.subplots(1, len(backends), figsize=(6.5 * len(backends), 4), squeeze=False)
    for ax, backend in zip(axes[0], backends):
        n = max(c for c in counts if any(r["objects"] == c and r["backend"] == backend
                                         for r in recs))
        r = next(x for x in recs if x["backend"] == backend and x["objects"] == n)
        labels, single, batch = [], [], []
        if "admit_single_us_per_object" in r:  # older results lack it
            phases_here = phases + [("admit", "admit_single", "admit_batch")]
        else:
            phases_here = phases
        for name, s_key, b_key in phases_here:
            labels.append(name)
            single.append(r[f"{s_key}_us_per_object"])
            batch.append(r[f"{b_key}_us_per_object"])
        for label, key in (("commit\nsteady", "commit_steady"), ("seal\nsteady", "seal_steady"),
                           ("manifest", "manifest"),
                           ("read", "read"),
                           ("read\nin place", "read_in_place")):
            if f"{key}_us_per_object" in r:  # older results lack some of these
                labels.append(label)
                single.append(float("nan"))
                batch.append(r[f"{key}_us_per_object"])
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], single, 0.4, label="one call per object")
        ax.bar([x + 0.2 for x in xs], batch, 0.4, label="one call per step (batch)")
        for x, v in zip(xs, batch):
            ax.annotate(f"{v:.1f}", (x + 0.2, v), ha="center", va="bottom", fontsize=8)
        ax.axhline(20, color="gray", ls="--", lw=0.8)
        ax.text(len(labels) - 0.5, 20.5, "20 µs (commit goal)", color="gray", fontsize=8,
                ha="right")
        ax.axhline(10, color="gray", ls=":", lw=0.8)
        ax.text(len(labels) - 0.5, 10.5, "10 µs (read goal)", color="gray", fontsize=8,
                ha="right")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels)
        ax.set_ylabel("µs per object")
        ax.set_title(f"{backend} ({r['device']}, {allocator}): {n} objects of "
                     f"{'x'.join(map(str, r['shape']))} float32, {r['density']:.0%} changed",
                     fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / f"{stem}.png", dpi=120)
    print(out_dir / f"{stem}.png")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
