#!/usr/bin/env python3
"""Plots gpu_sync_bench.py results: one RL step of a MoE layer, sparse phases against the dense
paths and the floor of the same run, per backend and apply mode (the last step of each).

    python benchmarks/plot_gpu_sync.py DIR   # reads DIR/gpu_sync.jsonl, writes DIR/gpu_sync.png
    python benchmarks/plot_gpu_sync.py DIR NAME...  # runs side by side: DIR/NAME.jsonl, every
                                                     # step from the third, -> DIR/compare.png
"""
from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


# A pipelined trainer (put_sparse_updates) times encode and commit as one, in encode_s; a
# pipelined reader (apply_sparse_updates) read and apply, in read_s.
PHASES = [("encode_s", "encode (pipelined: + commit)"), ("commit_s", "commit"),
          ("read_s", "read (pipelined: + apply)"), ("apply_s", "apply")]
COLORS = ["#4c72b0", "#55a868", "#c44e52", "#8172b2"]


def compare(out_dir: pathlib.Path, names: list[str]) -> int:
    """The steady steps (third on) of several runs, each step's phases stacked, with the best
    dense path and the floor of the same step."""
    bars: list[tuple[str, dict]] = []
    for name in names:
        for line in (out_dir / f"{name}.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("what") == "gpu_sync" and r["step"] >= 3:
                pipe = " pipe" if r.get("trainer") == "pipelined" else ""
                bars.append((f"{name}\n{r['backend']}{pipe} {r['step']}\n"
                             f"{r.get('timing', 'phases')}", r))
    fig, ax = plt.subplots(figsize=(0.7 * len(bars) + 2, 4.5))
    for k, (_, r) in enumerate(bars):
        bottom = 0.0
        for (field, label), c in zip(PHASES, COLORS):
            ax.bar(k, r[field] * 1e3, 0.6, bottom=bottom, color=c, label=label if k == 0 else None)
            bottom += r[field] * 1e3
        # The step's wall (a "step"-timed step: more than its phases by the Python between them)
        ax.plot([k], [r["sparse_s"] * 1e3], marker="D", ms=3, color="black", ls="")
        ax.plot([k - 0.3, k + 0.3], [r["floor_s"] * 1e3] * 2, color="black",
                label="floor" if k == 0 else None)
        if r.get("dense_box_s") is not None:  # none in a --no-dense run
            ax.text(k, max(bottom, r["sparse_s"] * 1e3), f"{r['speedup_vs_dense_box']:.1f}x",
                    ha="center", va="bottom", fontsize=7)
            ax.plot([k - 0.3, k + 0.3], [r["dense_box_s"] * 1e2] * 2, color="#dd8452", ls="--",
                    label="best dense path / 10" if k == 0 else None)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b for b, _ in bars], fontsize=7)
    ax.set_ylabel("ms per step")
    r0 = bars[0][1]
    ax.set_title(f"steady steps: {r0['tensors']} tensors, {r0['targets']} targets, "
                 f"{r0['dense_bytes'] / 1e9:.1f} GB, density {r0['density']} (label: x dense)",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "compare.png", dpi=120)
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = pathlib.Path(argv[0])
    if len(argv) > 1:
        return compare(out_dir, argv[1:])
    recs = [json.loads(line) for line in (out_dir / "gpu_sync.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r.get("what") == "gpu_sync"]
    last: dict[tuple[str, str, str], dict] = {}
    for r in recs:
        last[(r["backend"], r["apply"], r.get("timing", "phases"))] = r
    keys = sorted(last)
    fig, ax = plt.subplots(figsize=(2.6 * len(keys) + 2, 4.5))
    width = 0.2
    phases, colors = PHASES, COLORS
    for k, key in enumerate(keys):
        r = last[key]
        bottom = 0.0
        for (field, label), c in zip(phases, colors):
            ax.bar(k - 1.5 * width, r[field] * 1e3, width, bottom=bottom, color=c,
                   label=label if k == 0 else None)
            bottom += r[field] * 1e3
        ax.plot([k - 1.5 * width], [r["sparse_s"] * 1e3], marker="D", ms=3, color="black",
                ls="", label="sparse step (wall)" if k == 0 else None)
        bottom = max(bottom, r["sparse_s"] * 1e3)
        if r.get("dense_box_s") is not None:  # none in a --no-dense run
            ax.bar(k - 0.5 * width, r["dense_box_s"] * 1e3, width, color="#dd8452",
                   label="dense, own box" if k == 0 else None)
            ax.bar(k + 0.5 * width, r["dense_full_s"] * 1e3, width, color="#937860",
                   label="dense, whole tensors" if k == 0 else None)
        ax.bar(k + 1.5 * width, r["floor_s"] * 1e3, width, color="#999999",
               label="floor" if k == 0 else None)
        if r.get("speedup_vs_dense_box") is not None:
            ax.text(k - 1.5 * width, bottom, f"{r['speedup_vs_dense_box']:.1f}x", ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{b}\n{a}\n{t}" for b, a, t in keys])
    ax.set_ylabel("ms per step")
    r0 = last[keys[0]]
    ax.set_title(f"one MoE layer step: {r0['tensors']} tensors, {r0['targets']} targets, "
                 f"{r0['dense_bytes'] / 1e9:.1f} GB, density {r0['density']}, {r0['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "gpu_sync.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
