"""Plots catchup_bench.py's JSON lines: time and bytes vs k for the fold, the replay and the dense
baseline, one row per file and apply mode.

    python benchmarks/plot_catchup.py FOLDER [FILE.jsonl ...]   # default: every catchup*.jsonl
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"embedded": "tab:blue", "node": "tab:orange"}


def load(path):
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def rows_of(files):
    rows = []
    for path in files:
        recs = [r for r in load(path) if r["what"] == "catchup"]
        for apply in dict.fromkeys(r["apply"] for r in recs):
            rows.append((path, apply, [r for r in recs if r["apply"] == apply]))
    return rows


def title_of(path, apply, recs):
    r = recs[0]
    shape = "x".join(map(str, r["shape"]))
    hot = "uniform" if r["hot"] >= 1 else f"drawn from a hot {r['hot'] * 100:g}% of each tensor"
    reader = f"TP{r['tp']} boxes" if r["tp"] > 1 else "whole tensors"
    return (f"{path.name}: {r['tensors']} x {shape} {r['dtype']}, {r['density'] * 100:g}% changed "
            f"per step ({hot}), {apply}, reader {reader}")


def main(folder, names=()):
    folder = Path(folder)
    files = [folder / n for n in names] if names else sorted(folder.glob("catchup*.jsonl"))
    rows = rows_of(files)
    fig, axes = plt.subplots(len(rows), 2, figsize=(14, 4.6 * len(rows)), squeeze=False)
    for (path, apply, recs), (at, ab) in zip(rows, axes):
        for backend in dict.fromkeys(r["backend"] for r in recs):
            rs = sorted((r for r in recs if r["backend"] == backend), key=lambda r: r["k"])
            ks = [r["k"] for r in rs]
            c = COLORS.get(backend)
            at.plot(ks, [r["replay"]["seconds"] * 1e3 for r in rs], "o-", color=c,
                    label=f"{backend}: replay (k reads + applies)")
            at.plot(ks, [r["fold"]["seconds"] * 1e3 for r in rs], "s--", color=c,
                    label=f"{backend}: fold (1 read + apply)")
            at.plot(ks, [r["dense"]["seconds"] * 1e3 for r in rs], ":", color=c, lw=2,
                    label=f"{backend}: dense get_tensor_into of the boxes")
        # Bytes do not depend on the backend: the first backend's lines.
        first = recs[0]["backend"]
        rs = sorted((r for r in recs if r["backend"] == first), key=lambda r: r["k"])
        ks = [r["k"] for r in rs]
        mb = 1e6
        ab.plot(ks, [r["replay"]["bytes_read"] / mb for r in rs], "o-", color="tab:gray",
                label="read from the store, replay")
        ab.plot(ks, [r["fold"]["bytes_read"] / mb for r in rs], "x", color="black", ms=9,
                label="read from the store, fold")
        ab.plot(ks, [r["replay"]["target_bytes"] / mb for r in rs], "o-", color="tab:green",
                label="objects handed to the reader, replay")
        ab.plot(ks, [r["fold"]["target_bytes"] / mb for r in rs], "s--", color="tab:red",
                label="objects handed to the reader, fold")
        ab.plot(ks, [r["dense"]["bytes"] / mb for r in rs], ":", color="tab:purple", lw=2,
                label="dense weights of the boxes")
        for a in (at, ab):
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            a.set_xticks(ks)
            a.set_xticklabels([str(k) for k in ks])
            a.set_xlabel("k (steps behind)")
            a.grid(True, which="both", alpha=0.3)
        at.set_ylabel("ms (median)")
        ab.set_ylabel("MB")
        at.legend(fontsize=7)
        ab.legend(fontsize=7)
        exact = all(r["fold_bit_exact_vs_replay"] and r["fold_matches_trainer"] for r in recs)
        at.set_title(title_of(path, apply, recs) + ("" if exact else "  [NOT bit-exact]"),
                     fontsize=8, loc="left")
    fig.suptitle("catch-up of k steps: one fold read vs replaying k deltas vs dense weights")
    fig.tight_layout()
    out = folder / "catchup.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
