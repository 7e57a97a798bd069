"""Plots node_scale_bench JSON lines: each read phase's seconds, first touch (step 1) and steady
state (the last step, warm memory), next to the memcpy floor of its bytes from the same run.

Usage: python benchmarks/plot_node_scale.py RESULTS.jsonl OUT.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = [
    ("plan", "node_scale_plan"),
    ("range reads", "node_scale_range_read"),
    ("materialize", "node_scale_materialize"),
    ("read\n(whole call)", "node_scale_read"),
]


def main(path: str, out: str) -> None:
    steps = {}  # step -> what -> line
    commit = None
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            if d["what"] == "node_scale_commit":
                commit = d
            elif "step" in d:
                steps.setdefault(d["step"], {})[d["what"]] = d
            else:  # a run from before --steps: one first-touch read
                steps.setdefault(1, {})[d["what"]] = d
    first = steps[min(steps)]
    last = steps[max(steps)] if len(steps) > 1 else None
    read = first["node_scale_read"]
    x = list(range(len(PHASES)))
    fig, ax = plt.subplots(figsize=(9.5, 5))
    series = [("first touch (step 1, fresh memory)", first, -0.27, "tab:blue")]
    if last is not None:
        series.append((f"steady state (step {max(steps)}, warm memory)", last, 0.0, "tab:green"))
    for label, lines, dx, color in series:
        secs = [lines[w]["seconds"] for _, w in PHASES]
        ax.bar([i + dx for i in x], secs, width=0.27, label=label, color=color)
        for i, s in enumerate(secs):
            ax.text(i + dx, s, f"{s:.2f}", ha="center", va="bottom", fontsize=8)
    # Planning moves no payload bytes: it has no memcpy floor.
    floors = [0.0 if w == "node_scale_plan" else first[w]["floor_seconds"] for _, w in PHASES]
    ax.bar([i + 0.27 for i in x], floors, width=0.27, color="tab:orange",
           label="memcpy floor of its bytes (1 thread, warm buffers, same run)")
    for i, s in enumerate(floors):
        if s > 0:
            ax.text(i + 0.27, s, f"{s:.2f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(read["goal_seconds"], color="tab:red", linestyle="--", linewidth=1,
               label=f"goal: read <= {read['goal_seconds']:g} s")
    ax.set_xticks(x)
    ax.set_xticklabels([p[0] for p in PHASES])
    ax.set_ylabel("seconds (one core)")
    commit_txt = f"; commit {commit['seconds']:.1f} s" if commit else ""
    ax.set_title(
        f"Kimi-K2 {read['layers']} layers, node {read['layout']}: {read['num_sources']:,} sources, "
        f"{read['num_targets']:,} targets, density {read['density']:g}{commit_txt}\n"
        f"read moves {read['bytes'] / 1e9:.2f} GB (range reads + target objects); "
        f"floor {read['ceiling_gbps']:.1f} GB/s warm\nfirst touch: {read['minor_faults']:.3g} "
        f"page faults; fresh-memory memcpy right after it {read['fresh_memcpy_gbps']:.2f} GB/s",
        fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
