#!/usr/bin/env python3
"""How fast the GPU's copy engines move bytes to and from each kind of page-locked host memory.

The node daemon's segments are shared memory (memfd, mapped MAP_SHARED) registered with
cudaHostRegister; the embedded store's pinned pool comes from cudaHostAlloc. Both are
page-locked, but the pages behind them differ (the kernel's 4 KiB pages of a shared-memory file,
unless it gives that file huge pages, against the driver's own allocation), and so may the rate
at which the GPU walks them. Per kind of memory, one JSON line each:

  - "contiguous": one copy of --mib MiB, host to device and device to host;
  - "ranges": --ranges copies of --mib / --ranges MiB each at random places of a --span-gib GiB
    buffer (a read's ranges scattered over the store's segments), both directions.

Kinds: cudaHostAlloc (`host_alloc`, the ceiling), anonymous memory registered (`anon`), a
memfd registered (`memfd`, the daemon's segments), and both again after madvise(MADV_HUGEPAGE)
(`anon_thp`, `memfd_thp`). The machine's transparent huge page settings are in the meta line.

  python benchmarks/host_memory_bench.py --json host_memory.jsonl
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import sys
import time


def thp_settings() -> dict:
    out = {}
    for name in ("enabled", "shmem_enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as f:
                out[name] = f.read().strip()
        except OSError as e:
            out[name] = f"unreadable: {e.strerror}"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(("HugePages_Total", "Hugepagesize", "ShmemHugePages",
                                    "AnonHugePages")):
                    k, v = line.split(":", 1)
                    out[k] = v.strip()
    except OSError:
        pass
    return out


def huge_kb(addr: int, size: int) -> int | None:
    """Kilobytes of [addr, addr + size) backed by huge pages (smaps), or None if unreadable."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.readlines()
    except OSError:
        return None
    total = 0
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < addr + size and hi > addr
        elif inside and head in ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:"):
            total += int(line.split()[1])
    return total


class Region:
    """Page-locked host memory of one kind; `tensor` views it as uint8."""

    def __init__(self, torch, kind: str, size: int):
        self.kind = kind
        self.size = size
        self.map = None
        self.fd = None
        self.registered = False
        rt = torch.cuda.cudart()
        if kind == "host_alloc":
            self.tensor = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            self.addr = self.tensor.data_ptr()
        else:
            if kind.startswith("memfd"):
                self.fd = os.memfd_create("host_memory_bench", os.MFD_CLOEXEC)
                os.ftruncate(self.fd, size)
                self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                                     mmap.PROT_READ | mmap.PROT_WRITE)
            else:
                self.map = mmap.mmap(-1, size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                                     mmap.PROT_READ | mmap.PROT_WRITE)
            if kind.endswith("_thp"):
                self.map.madvise(mmap.MADV_HUGEPAGE)
            self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)
            self.addr = self.tensor.data_ptr()
            self.tensor.fill_(1)  # every page present before it is locked
            err = rt.cudaHostRegister(self.addr, size, 1)  # cudaHostRegisterPortable
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister({kind}): error {int(err)}")
            self.registered = True
        self.huge_kb = huge_kb(self.addr, size)

    def close(self, torch) -> None:
        if self.registered:
            torch.cuda.cudart().cudaHostUnregister(self.addr)
        del self.tensor
        if self.map is not None:
            self.map.close()
        if self.fd is not None:
            os.close(self.fd)


def timed_copies(torch, pairs, repeats: int) -> float:
    """Best wall of `repeats` rounds of the copies, by CUDA events (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for dst, src in pairs:
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="bytes moved per measurement (MiB)")
    ap.add_argument("--span-gib", type=float, default=2.0, help="host buffer of each kind (GiB)")
    ap.add_argument("--ranges", type=int, default=1024, help="copies of the scattered measurement")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kinds", default="host_alloc,anon,memfd,anon_thp,memfd_thp")
    ap.add_argument("--json", default=None, help="also append the JSON lines to this file")
    args = ap.parse_args()

    import random

    import torch

    if not torch.cuda.is_available():
        print("host_memory_bench: no CUDA device", file=sys.stderr)
        return 2
    out = open(args.json, "a") if args.json else None

    def emit(r: dict) -> None:
        line = json.dumps(r)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    emit({"what": "meta", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
          "thp": thp_settings(), "argv": sys.argv[1:]})
    span = int(args.span_gib * (1 << 30)) // (2 << 20) * (2 << 20)
    nbytes = args.mib << 20
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    rng = random.Random(7)
    piece = nbytes // args.ranges
    for kind in args.kinds.split(","):
        t0 = time.perf_counter()
        try:
            region = Region(torch, kind, span)
        except (OSError, RuntimeError) as e:
            emit({"what": "host_memory", "kind": kind, "error": str(e)})
            continue
        setup_s = time.perf_counter() - t0
        host = region.tensor
        slots = sorted(rng.sample(range(span // piece), args.ranges))
        scattered_h = [host[s * piece:(s + 1) * piece] for s in slots]
        scattered_d = [dev[k * piece:(k + 1) * piece] for k in range(args.ranges)]
        rows = {
            "contiguous": ([(dev, host[:nbytes])], [(host[:nbytes], dev)]),
            "ranges": (list(zip(scattered_d, scattered_h)), list(zip(scattered_h, scattered_d))),
        }
        for pattern, (h2d, d2h) in rows.items():
            timed_copies(torch, h2d, 1)  # warm
            t_h2d = timed_copies(torch, h2d, args.repeats)
            t_d2h = timed_copies(torch, d2h, args.repeats)
            emit({"what": "host_memory", "kind": kind, "pattern": pattern, "bytes": nbytes,
                  "copies": len(h2d), "h2d_s": t_h2d, "d2h_s": t_d2h,
                  "h2d_gbps": nbytes / t_h2d / 1e9, "d2h_gbps": nbytes / t_d2h / 1e9,
                  "huge_kb": region.huge_kb, "span_bytes": span, "setup_s": setup_s})
        region.close(torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
