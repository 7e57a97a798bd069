#!/usr/bin/env python3
"""encode_updates of one MoE layer on the GPU: the call's wall time, its kernels, and the floor.

The layer is gpu_sync_bench.py's (Kimi-K2 shapes, --experts routed experts, bf16), a fraction
--density of every tensor changed. Per apply mode: the wall time of encode_updates of every
tensor at once (steady calls, the first dropped), then one call under the torch profiler, its
GPU kernels' times; the ceiling of the same run is a device-to-device copy (reads + writes), and
the floor reads new and old once at that rate. One JSON line per mode.

    python benchmarks/gpu_encode_bench.py --experts 96 --json gpu_encode.jsonl
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import torch
except ImportError:  # pragma: no cover - the benchmark needs torch
    sys.exit("gpu_encode_bench needs torch")

import mooncake.sparse as mcs  # noqa: E402

import gpu_sync_bench as layer_bench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    layer_bench.add_layer_args(ap)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_encode_bench needs a CUDA device")
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    specs = layer_bench.layer(args)
    olds = [torch.randn(s.shape, generator=gen, device=dev).to(torch.bfloat16) for s in specs]
    pairs = [(layer_bench.changed(o, args.density, gen), o) for o in olds]
    dense = sum(o.numel() * o.element_size() for o in olds)
    # The ceiling: a device copy of 4 GiB (its bytes read and written).
    a = torch.empty(4 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    b.copy_(a)
    best = min(layer_bench.timed(lambda: b.copy_(a), dev)[0] for _ in range(5))
    d2d = 2 * a.numel() / best
    del a, b
    out = open(args.json, "w") if args.json else None
    for apply in ("overwrite", "scatter_add"):
        walls = [layer_bench.timed(lambda: mcs.encode_updates(pairs, apply=apply), dev)[0]
                 for _ in range(args.calls)][1:]
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            coo = mcs.encode_updates(pairs, apply=apply)
            torch.cuda.synchronize(dev)
        kernels: dict[str, float] = collections.defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                name = e.name.replace("(anonymous namespace)::", "").split("(")[0]
                name = name.removeprefix("void ").replace("mooncake::sparse::cuda::", "")[:80]
                kernels[name] += e.device_time_total / 1e3
        nnz = sum(int(i.shape[0]) for i, _ in coo)
        r = {"what": "gpu_encode", "apply": apply, "tensors": len(pairs), "dense_bytes": dense,
             "density": args.density, "nnz": nnz, "calls": len(walls),
             "wall_min_s": min(walls), "wall_median_s": sorted(walls)[len(walls) // 2],
             "kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1])),
             "kernel_total_ms": sum(kernels.values()), "d2d_gbps": d2d / 1e9,
             "floor_s": 2 * dense / d2d, "gpu": torch.cuda.get_device_name(dev)}
        line = json.dumps(r)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
