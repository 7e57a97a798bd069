#!/usr/bin/env python3
# Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
"""Plots the hot tile-index query time of mooncake_sparse_plan against nnz and against the
number of tiles, with the brute-force ceilings measured in the same runs.

Reads every plan_*.jsonl in a results folder (the JSON lines written by
`mooncake_sparse_plan --sweep nnz|tiles --json PATH`, and optionally the plan_node lines of a
model run) and writes plan_query.png into the same folder.

Usage: python3 benchmarks/plot_plan.py [RESULTS_DIR]
       (default: the newest folder under benchmarks/results/)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BOX_STYLE = {
    "tp_row_half": ("tab:blue", "o"),
    "tp_col_half": ("tab:red", "s"),
    "small": ("tab:green", "^"),
}


def read_lines(folder: Path) -> list[dict]:
    lines = []
    for path in sorted(folder.glob("plan_*.jsonl")):
        with path.open() as f:
            for n, text in enumerate(f, 1):
                text = text.strip()
                if not text:
                    continue
                try:
                    lines.append(json.loads(text))
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{n}: not a JSON line: {e}")
    return lines


def default_folder() -> Path:
    root = Path(__file__).resolve().parent / "results"
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not folders:
        sys.exit(f"no results folder under {root}")
    return folders[-1]


def plot_vs_nnz(ax, rows: list[dict]) -> None:
    by_series = defaultdict(list)
    for r in rows:
        by_series[(r["box"], r["tile_side"])].append(r)
    sides = sorted({r["tile_side"] for r in rows}, reverse=True)
    dashes = {side: ls for side, ls in zip(sides, ["-", "--", ":", "-."])}
    for (box, side), pts in sorted(by_series.items()):
        pts.sort(key=lambda r: r["nnz"])
        color, marker = BOX_STYLE.get(box, ("black", "x"))
        ax.plot([r["nnz"] for r in pts], [r["query_us"] for r in pts], color=color,
                marker=marker, linestyle=dashes[side], label=f"query {box}, tile {side}²")
    # Ceilings: the entry scan (no index at all; materialised sizes only) and the tile scan of
    # the tp_col_half box for each tile shape.
    for side in sides:
        pts = sorted((r for r in rows if r["tile_side"] == side and r["box"] == "tp_col_half"),
                     key=lambda r: r["nnz"])
        ax.plot([r["nnz"] for r in pts], [r["tile_scan_ms"] * 1e3 for r in pts], color="gray",
                linestyle=dashes[side], linewidth=1, label=f"brute-force tile scan, tile {side}²")
        if side == sides[0]:
            ent = [r for r in pts if r.get("entry_scan_ms") is not None]
            ax.plot([r["nnz"] for r in ent], [r["entry_scan_ms"] * 1e3 for r in ent],
                    color="black", linewidth=2, alpha=0.6, label="brute-force entry scan")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nnz (entries in the source object)")
    ax.set_ylabel("time per query (µs)")
    shape = rows[0].get("shape", [])
    ax.set_title(f"hot query vs nnz, tensor {shape}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")


def plot_vs_tiles(ax, rows: list[dict]) -> None:
    by_box = defaultdict(list)
    for r in rows:
        by_box[r["box"]].append(r)
    for box, pts in sorted(by_box.items()):
        pts.sort(key=lambda r: r["tiles"])
        color, marker = BOX_STYLE.get(box, ("black", "x"))
        ax.plot([r["tiles"] for r in pts], [r["query_us"] for r in pts], color=color,
                marker=marker, label=f"query {box}")
        for r in pts:
            if box == "tp_col_half":
                ax.annotate(r["path"][0], (r["tiles"], r["query_us"]), fontsize=6,
                            textcoords="offset points", xytext=(3, -8))
    ref = sorted(by_box.get("tp_col_half", rows), key=lambda r: r["tiles"])
    ax.plot([r["tiles"] for r in ref], [r["tile_scan_ms"] * 1e3 for r in ref], color="gray",
            linestyle="--", label="brute-force tile scan")
    ent = [r for r in ref if r.get("entry_scan_ms") is not None]
    if ent:
        ax.plot([r["tiles"] for r in ent], [r["entry_scan_ms"] * 1e3 for r in ent],
                color="black", linewidth=2, alpha=0.6, label="brute-force entry scan")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("non-empty tiles T (tile side 8192 ... 32)")
    ax.set_ylabel("time per query (µs)")
    nnz = rows[0]["nnz"]
    ax.set_title(f"hot query vs tiles, nnz {nnz:.3g} (c = column path, r = row path)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, help="results folder")
    args = parser.parse_args()
    folder = args.folder or default_folder()
    lines = read_lines(folder)
    vs_nnz = [r for r in lines if r.get("what") == "query_vs_nnz"]
    vs_tiles = [r for r in lines if r.get("what") == "query_vs_tiles"]
    nodes = [r for r in lines if r.get("what") == "plan_node"]
    if not vs_nnz and not vs_tiles:
        sys.exit(f"no query_vs_nnz / query_vs_tiles lines in {folder}/plan_*.jsonl")

    fig, axes = plt.subplots(1, 2, figsize=(15, 6.5))
    if vs_nnz:
        plot_vs_nnz(axes[0], vs_nnz)
    if vs_tiles:
        plot_vs_tiles(axes[1], vs_tiles)
    if nodes:
        # One footer line per tile policy; thread CPU time first (the machine may be shared),
        # wall time in parentheses.
        by_policy = defaultdict(list)
        for n in nodes:
            by_policy[n.get("tile_policy", "default")].append(n)

        def describe(n: dict) -> str:
            cpu = n.get("plan_cpu_ms_cold")
            cpu_warm = n.get("plan_cpu_ms_warm")
            timing = (f"cpu {cpu:.0f} ms cold / {cpu_warm:.0f} ms warm (wall {n['plan_ms']:.0f} / "
                      f"{n['plan_ms_warm']:.0f})" if cpu is not None else
                      f"plan {n['plan_ms']:.0f} ms cold / {n['plan_ms_warm']:.0f} ms warm")
            return (f"{n['layout']}: {timing}, goal {n['goal_plan_ms']:.0f}, brute-force "
                    f"{n['bruteforce_ms']:.0f} ms, {n['unique_ranges']} ranges, "
                    f"ratio {n['ratio']:.3f}")

        footer = [f"{nodes[0].get('model', '')} node plan, tiles {policy} — " +
                  "   ".join(describe(n) for n in group)
                  for policy, group in sorted(by_policy.items())]
        fig.text(0.5, 0.005, "\n".join(footer), ha="center", fontsize=8)
    fig.suptitle(f"mooncake_sparse_plan — {folder.name}")
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    out = folder / "plan_query.png"
    fig.savefig(out, dpi=120)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
