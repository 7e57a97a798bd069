#!/usr/bin/env python3
"""Where the phases of a gpu_sync_bench.py --trace step go: per trace file and phase, its wall
time, the GPU's busy time within it, how long the host ran before the first GPU operation and
after the last one, and the largest GPU and host operations; with --timeline, every GPU
operation and every host event of 30 us or more of one trace, in order.

    python benchmarks/gpu_sync_bench.py --backends embedded --repeats 3 --trace DIR
    python benchmarks/trace_phases.py DIR                      # -> DIR/trace_summary.json
    python benchmarks/trace_phases.py DIR --timeline trace_embedded_overwrite.json
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
HOST = ("cpu_op", "cuda_runtime", "cuda_driver", "python_function")


def phases(events: list[dict]) -> list[dict]:
    return [e for e in events if e["name"].startswith("phase:") and e.get("cat") == "user_annotation"]


def top(events: list[dict], n: int) -> list[list]:
    by: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        by[e["name"][:70]][0] += 1
        by[e["name"][:70]][1] += e["dur"] / 1e3
    return sorted(([k, c, round(ms, 3)] for k, (c, ms) in by.items()), key=lambda x: -x[2])[:n]


def summarize(path: pathlib.Path) -> dict:
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    out = {}
    for p in phases(events):
        a, b = p["ts"], p["ts"] + p["dur"]
        inside = [e for e in events if a <= e["ts"] <= b and e is not p]
        gpu = [e for e in inside if e.get("cat") in GPU]
        host = [e for e in inside if e.get("cat") in HOST and e["dur"] > 50]
        out[p["name"]] = {
            "wall_ms": p["dur"] / 1e3,
            "gpu_busy_ms": sum(e["dur"] for e in gpu) / 1e3,
            "host_before_first_gpu_ms": (min((e["ts"] for e in gpu), default=b) - a) / 1e3,
            "host_after_last_gpu_ms": (b - max((e["ts"] + e["dur"] for e in gpu), default=b)) / 1e3,
            "gpu_top": top(gpu, 8), "host_top": top(host, 10)}
    return out


def timeline(path: pathlib.Path) -> str:
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    lines = []
    for p in phases(events):
        a, b = p["ts"], p["ts"] + p["dur"]
        lines.append(f"== {p['name']} {p['dur'] / 1e3:.2f} ms  (ms from its start, ms long)")
        for e in sorted((e for e in events if a <= e["ts"] <= b and e is not p), key=lambda e: e["ts"]):
            on_gpu = e.get("cat") in GPU
            if on_gpu or e["dur"] >= 30:
                where = "GPU" if on_gpu else e.get("cat", "")[:8]
                lines.append(f"{(e['ts'] - a) / 1e3:8.3f} {e['dur'] / 1e3:7.3f} {where:8} {e['name'][:70]}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=pathlib.Path)
    ap.add_argument("--timeline", default=None, metavar="TRACE", help="a trace file name in DIR")
    args = ap.parse_args()
    if args.timeline:
        sys.stdout.write(timeline(args.dir / args.timeline))
        return 0
    summary = args.dir / "trace_summary.json"  # this script's own output: not a trace
    res = {f.name: summarize(f) for f in sorted(args.dir.glob("trace_*.json")) if f != summary}
    summary.write_text(json.dumps(res, indent=1))
    for name, ph in res.items():
        print(name)
        for p, v in ph.items():
            print(f"  {p}: wall {v['wall_ms']:.2f} ms, GPU busy {v['gpu_busy_ms']:.2f}, host first "
                  f"{v['host_before_first_gpu_ms']:.2f}, host last {v['host_after_last_gpu_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
