"""Plots a before/after pair of batch_bench.py runs: per-object commit (steady state), manifest
and read, before vs after, every run drawn (interleaved runs of one host show its noise).

    python benchmarks/plot_batch_ab.py benchmarks/results/DIR
    # reads DIR/{cpu,cuda}_{before,after}*.jsonl, writes DIR/batch_ab.png
"""
from __future__ import annotations

import json
import pathlib
import sys

METRICS = [("commit_steady_us_per_object", "commit (steady)"),
           ("manifest_us_per_object", "manifest"),
           ("manifest_again_us_per_object", "manifest, again"),
           ("read_us_per_object", "read"),
           ("read_part_us_per_target", "read, part"),
           ("read_target_batch_us_per_object", "read, TargetBatch")]


def runs(out_dir: pathlib.Path, pattern: str) -> list[dict]:
    recs = []
    for f in sorted(out_dir.glob(pattern)):
        recs += [r for r in map(json.loads, f.read_text().splitlines()) if r.get("what") == "batch"]
    return recs


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = pathlib.Path(argv[0])
    devices = [d for d in ("cpu", "cuda") if list(out_dir.glob(f"{d}_before*.jsonl"))]
    backends = ("embedded", "node")
    fig, axes = plt.subplots(len(devices), len(backends), figsize=(17, 3.6 * len(devices)),
                             squeeze=False)
    for i, dev in enumerate(devices):
        for j, backend in enumerate(backends):
            ax = axes[i][j]
            for k, (side, color) in enumerate((("before", "tab:gray"), ("after", "tab:blue"))):
                recs = [r for r in runs(out_dir, f"{dev}_{side}*.jsonl")
                        if r["backend"] == backend and r["objects"] == 10000]
                for m, (key, _) in enumerate(METRICS):
                    vals = [r[key] for r in recs if key in r]
                    xs = [m * 3 + k + 0.1 * n for n in range(len(vals))]
                    ax.bar(xs, vals, width=0.1 if len(vals) > 1 else 0.8, color=color,
                           label=side if m == 0 else None)
            ax.set_xticks([m * 3 + 0.5 for m in range(len(METRICS))])
            ax.set_xticklabels([name for _, name in METRICS])
            ax.set_ylabel("µs per object (10,000 objects)")
            ax.set_title(f"{dev}, {'daemon' if backend == 'node' else backend}")
            ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "batch_ab.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
