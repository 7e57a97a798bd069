"""Plots read_path.jsonl (node bytes and per-target bytes vs the in-box ideal) and the demo."""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(folder):
    folder = Path(folder)
    recs = [json.loads(l) for l in (folder / "read_path.jsonl").read_text().splitlines() if l.strip()]
    cases = [r for r in recs if r["what"] == "read_path_bytes"]
    demo = [r for r in recs if r["what"] == "demo_strategy"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 5))
    labels = [f"{r['shape'][0]}x{r['shape'][1]} tp{r['tp']} d{r['split_dim']}{'' if r['aligned'] else ' unal.'}"
              for r in cases]
    x = range(len(cases))
    a.bar([i - 0.2 for i in x], [r["ratio"] for r in cases], width=0.4, label="node: range bytes / in-box ideal")
    a.bar([i + 0.2 for i in x], [r["target_ratio"] for r in cases], width=0.4,
          label="per target: bytes handed out / own box")
    a.axhline(1.1, color="red", ls="--", label="goal 1.1")
    a.set_xticks(list(x))
    a.set_xticklabels(labels, rotation=75, fontsize=7)
    a.set_ylabel("ratio to the brute-force ideal")
    a.set_title("read-path bytes vs in-box ideal (1% density, EP2 x TP)")
    a.legend(fontsize=8)
    if demo:
        names = [d["strategy"] for d in demo]
        moved = [d["range_bytes_read"] + d["full_bytes_read"] for d in demo]
        put = [d["bytes_put"] for d in demo]
        xs = range(len(demo))
        b.bar([i - 0.2 for i in xs], [p / 1e6 for p in put], width=0.4, label="bytes put (MB)")
        b.bar([i + 0.2 for i in xs], [m / 1e6 for m in moved], width=0.4, label="bytes read (MB)")
        b.set_yscale("log")
        b.set_xticks(list(xs))
        b.set_xticklabels(names)
        b.set_title(f"demo: {demo[0]['model_bytes'] / 1e6:.0f} MB model, {demo[0]['density'] * 100:.0f}% changed")
        b.legend()
    fig.tight_layout()
    fig.savefig(folder / "read_path.png", dpi=110)


if __name__ == "__main__":
    main(sys.argv[1])
