#!/usr/bin/env python3
"""Device-to-host copies from GPU memory another process exported by CUDA IPC, against the same
copies from the process's own GPU memory (the ceiling), into page-locked host memory.

The node daemon fills a device commit by copying each update out of the client's commit arena,
which it opened by CUDA IPC; the embedded store copies the same bytes out of its own process's
memory. This measures whether the source being an IPC mapping changes the copy engine's rate:
one copy of the whole buffer, and the buffer in N pieces (a layer step's commit: 592 transfers
of 262 MB), each with cudaMemcpyAsync on one stream.

    python benchmarks/ipc_copy_bench.py [--mib 250] [--pieces 592] [--repeats 7] [--json PATH]

JSON lines: one per (source, pieces) with the best and median GB/s and the ratio to the own-memory
copy of the same pieces.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp


def timed_copies(dst: torch.Tensor, src: torch.Tensor, pieces: int, repeats: int) -> list[float]:
    n = src.numel()
    bounds = [n * k // pieces for k in range(pieces + 1)]
    stream = torch.cuda.current_stream()
    out = []
    for _ in range(repeats):
        stream.synchronize()
        t0 = time.perf_counter()
        for a, b in zip(bounds, bounds[1:]):
            dst[a:b].copy_(src[a:b], non_blocking=True)
        stream.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def consumer(q_in, q_out, args) -> None:
    torch.cuda.init()
    shared = q_in.get()  # opened here by CUDA IPC
    own = torch.empty_like(shared)
    own.copy_(shared)
    torch.cuda.synchronize()
    host = torch.empty(shared.numel(), dtype=torch.uint8, pin_memory=True)
    rows = []
    for pieces in (1, args.pieces):
        base = None
        for name, src in (("own", own), ("ipc", shared)):
            times = timed_copies(host, src, pieces, args.repeats)
            best = min(times)
            gbps = shared.numel() / best / 1e9
            row = {"what": "ipc_copy", "source": name, "pieces": pieces, "bytes": shared.numel(),
                   "best_s": best, "median_s": statistics.median(times), "gbps": gbps}
            if name == "own":
                base = gbps
                row["ceiling"] = "the same copies from this process's own GPU memory"
            row["ratio_to_own"] = gbps / base
            # The bytes that landed are the source's.
            row["exact"] = bool(torch.equal(host[: 1 << 20].cuda(), src[: 1 << 20]))
            rows.append(row)
    q_out.put(rows)
    del shared
    q_in.get()  # the producer may now free its buffer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=250)
    ap.add_argument("--pieces", type=int, default=592)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("ipc_copy_bench: no CUDA device", file=sys.stderr)
        return 0
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=consumer, args=(q_in, q_out, args))
    proc.start()
    buf = torch.randint(0, 256, (args.mib << 20,), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    q_in.put(buf)
    rows = q_out.get()
    q_in.put(None)
    proc.join()
    meta = {"what": "meta", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "argv": sys.argv[1:]}
    out = open(args.json, "w") if args.json else None
    for row in [meta] + rows:
        line = json.dumps(row)
        print(line)
        if out:
            out.write(line + "\n")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
