#!/usr/bin/env python3
"""Tensor fast-path benchmark (docs/design.md §5): put / upsert / get_into / get of one tensor of
64 MiB, 256 MiB and 1 GiB, and batch_put / batch_get_into of 256 x 4 MiB, for CPU and CUDA
tensors, in the embedded store and through the node daemon (DummyClient -> daemon, CUDA IPC).

One JSON object per result line on stdout (and in --json PATH); human text on stderr. Every line
carries the ceiling measured in the same run:

  CUDA lines  ceiling_gbps  = cudaMemcpy through pinned host memory (torch pin_memory + copy_),
                              D2H for puts, H2D for gets;
              pageable_gbps = the same copy through pageable memory (.cpu() / .to('cuda')),
                              i.e. what a staging path through ordinary host memory gets.
  CPU lines   ceiling_gbps  = multi-threaded host memcpy (torch CPU copy_), memcpy_1t_gbps =
                              one thread (numpy).

Plus `staged_put` / `staged_get_into` lines: the naive path a caller takes without the fast path
(`t.cpu()` then put of the host copy; get_tensor then `.to('cuda')`).

    python benchmarks/tensor_bench.py --json out.jsonl
    python benchmarks/tensor_bench.py --sizes-mib 64 --backends embedded --devices cpu --iters 2
    python benchmarks/tensor_bench.py --strided --sizes-mib 256 --batch '' --devices cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import numpy as np

MiB = 1 << 20


def log(*args):
    print(*args, file=sys.stderr, flush=True)


class Emitter:
    def __init__(self, path):
        self.file = open(path, "w") if path else None

    def __call__(self, record):
        line = json.dumps(record, sort_keys=False)
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()


def timed(fn, iters, sync=None, setup=None):
    """(first_seconds, median_seconds of the rest, all) — setup() runs untimed before each."""
    times = []
    for i in range(iters + 1):
        if setup is not None:
            setup(i)
        if sync:
            sync()
        t0 = time.perf_counter()
        fn(i)
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    rest = times[1:] if len(times) > 1 else times
    return times[0], statistics.median(rest), times


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


# ---------------------------------------------------------------------------------------------
# Ceilings, measured in this run.
# ---------------------------------------------------------------------------------------------


def cuda_ceilings(torch, nbytes, iters):
    n = nbytes // 2
    dev = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    pinned = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    pageable = torch.empty(n, dtype=torch.bfloat16)
    pageable.zero_()  # fault the pages in
    sync = torch.cuda.synchronize
    out = {}
    _, s, _ = timed(lambda i: pinned.copy_(dev, non_blocking=True), iters, sync)
    out["pinned_d2h_gbps"] = gbps(nbytes, s)
    _, s, _ = timed(lambda i: dev.copy_(pinned, non_blocking=True), iters, sync)
    out["pinned_h2d_gbps"] = gbps(nbytes, s)
    _, s, _ = timed(lambda i: dev.cpu(), iters, sync)  # a new pageable tensor, as a caller does
    out["pageable_d2h_gbps"] = gbps(nbytes, s)
    # Into pageable memory whose pages are already resident (what a store's pre-faulted,
    # unpinned segment offers): the driver's staged copy without page faults.
    _, s, _ = timed(lambda i: pageable.copy_(dev), iters, sync)
    out["pageable_d2h_resident_gbps"] = gbps(nbytes, s)
    _, s, _ = timed(lambda i: pageable.to("cuda"), iters, sync)
    out["pageable_h2d_gbps"] = gbps(nbytes, s)
    del dev, pinned, pageable
    torch.cuda.empty_cache()
    return out


def host_ceilings(nbytes, iters):
    src = np.random.default_rng().integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    out = {}
    _, s, _ = timed(lambda i: np.copyto(dst, src), iters)
    out["memcpy_1t_gbps"] = gbps(nbytes, s)
    try:
        import torch

        ts, td = torch.from_numpy(src), torch.from_numpy(dst)
        _, s, _ = timed(lambda i: td.copy_(ts), iters)
        out["memcpy_mt_gbps"] = gbps(nbytes, s)
    except ImportError:
        out["memcpy_mt_gbps"] = out["memcpy_1t_gbps"]
    return out


# ---------------------------------------------------------------------------------------------
# Runs.
# ---------------------------------------------------------------------------------------------


def make_tensor(torch, device, numel):
    if torch is None:  # bfloat16 bit patterns
        return np.random.default_rng().integers(0, 1 << 16, numel, dtype=np.uint16)
    t = torch.empty(numel, dtype=torch.bfloat16, device=device)
    t.normal_()
    return t


def empty_like(torch, t):
    return np.empty_like(t) if torch is None else torch.empty_like(t)


def run_config(store, backend, device, torch, tensor_bytes, count, iters, ceilings, emit,
               strided=False):
    """One (backend, device, tensor size, count) point: every call plus the staged baseline."""
    is_cuda = device == "cuda"
    sync = torch.cuda.synchronize if is_cuda else None
    numel = tensor_bytes // 2  # bfloat16
    tensors = [make_tensor(torch, device, numel) for _ in range(count)]
    outs = [empty_like(torch, t) for t in tensors]
    total = tensor_bytes * count
    size = f"{tensor_bytes // MiB}MiB" if tensor_bytes >= MiB else f"{tensor_bytes >> 10}KiB"
    tag = f"{backend}/{device}/{size}" + (f"x{count}" if count > 1 else "")
    prefix = f"bench/{tag}"
    keys = [f"{prefix}/{j}" for j in range(count)]
    if is_cuda:
        put_ceiling, get_ceiling = ceilings["pinned_d2h_gbps"], ceilings["pinned_h2d_gbps"]
        put_pageable, get_pageable = ceilings["pageable_d2h_gbps"], ceilings["pageable_h2d_gbps"]
        ceiling_put_name, ceiling_get_name = "pinned_d2h", "pinned_h2d"
    else:
        put_ceiling = get_ceiling = ceilings["memcpy_mt_gbps"]
        put_pageable = get_pageable = None
        ceiling_put_name = ceiling_get_name = "memcpy_mt"

    def record(what, first, median, ceiling, ceiling_name, pageable, before, extra=None):
        after = store.tensor_stats()
        r = {
            "what": what, "backend": backend, "device": device, "dtype": "bfloat16",
            "tensor_bytes": tensor_bytes, "count": count, "bytes": total,
            "seconds": median, "gbps": gbps(total, median), "first_seconds": first,
            "ceiling_gbps": ceiling, "ceiling": ceiling_name,
            "ratio": gbps(total, median) / ceiling if ceiling else None,
            "pageable_gbps": pageable, "iters": iters,
            "pageable_resident_gbps": ceilings.get("pageable_d2h_resident_gbps") if is_cuda
            and what.endswith(("put", "upsert")) else None,
            "pinned_copies": after.get("pinned_copies", 0) - before.get("pinned_copies", 0),
            "pageable_copies": after.get("pageable_copies", 0) - before.get("pageable_copies", 0),
        }
        if not is_cuda:
            r["memcpy_1t_gbps"] = ceilings["memcpy_1t_gbps"]
        if extra:
            r.update(extra)
        emit(r)
        log(f"  {what:>16} {tag:<28} {r['gbps']:7.2f} GB/s  (ceiling {ceiling:6.2f}, "
            f"first {first * 1e3:8.1f} ms)")

    def remove(ks):
        for k in ks:
            try:
                store.objects.remove(k)
            except Exception:  # noqa: BLE001 - absent is fine
                pass

    single = count == 1
    # put: a new key each iteration (the previous one removed, untimed).
    before = store.tensor_stats()
    put_keys = [[f"{k}/p{i}" for k in keys] for i in range(iters + 1)]
    first, med, _ = timed(
        (lambda i: store.put_tensor(put_keys[i][0], tensors[0])) if single
        else (lambda i: store.batch_put_tensor(put_keys[i], tensors)),
        iters, sync, setup=lambda i: remove(put_keys[i - 1]) if i else None)
    remove(put_keys[iters])
    record("tensor_put" if single else "tensor_batch_put", first, med, put_ceiling,
           ceiling_put_name, put_pageable, before)

    # upsert: the steady state of an RL loop (same keys every step).
    before = store.tensor_stats()
    first, med, _ = timed(
        (lambda i: store.upsert_tensor(keys[0], tensors[0])) if single
        else (lambda i: store.batch_upsert_tensor(keys, tensors)), iters, sync)
    record("tensor_upsert" if single else "tensor_batch_upsert", first, med, put_ceiling,
           ceiling_put_name, put_pageable, before)

    # get_into: straight into the caller's (CUDA or host) tensors.
    before = store.tensor_stats()
    first, med, _ = timed(
        (lambda i: store.get_tensor_into(keys[0], outs[0])) if single
        else (lambda i: store.batch_get_tensor_into(keys, outs)), iters, sync)
    record("tensor_get_into" if single else "tensor_batch_get_into", first, med, get_ceiling,
           ceiling_get_name, get_pageable, before)
    ok = all(bool((a == b).all()) if torch is None else bool(torch.equal(a, b))
             for a, b in zip(tensors, outs))
    if not ok:
        raise SystemExit(f"{tag}: get_into returned different bytes")

    if single:
        # get: a new host copy (always host memory).
        before = store.tensor_stats()
        first, med, _ = timed(lambda i: store.get_tensor(keys[0]), iters, sync)
        record("tensor_get", first, med, ceilings.get("memcpy_mt_gbps", get_ceiling), "memcpy_mt",
               None, before)

    if strided and is_cuda and single:
        run_strided(store, torch, tensors[0], prefix, iters, sync, record, get_ceiling,
                    ceiling_get_name, get_pageable, tag)

    if is_cuda:
        # The staging path a caller takes without the fast path.
        host_keys = [f"{k}/host" for k in keys]
        before = store.tensor_stats()

        def staged_put(i):
            hosts = [t.cpu() for t in tensors]
            store.batch_upsert_tensor(host_keys, hosts)

        first, med, _ = timed(staged_put, iters, sync)
        record("staged_put", first, med, put_ceiling, ceiling_put_name, put_pageable, before,
               {"path": ".cpu() then put of the host copy"})
        before = store.tensor_stats()

        def staged_get(i):
            for k, o in zip(host_keys, outs):
                o.copy_(store.get_tensor(k, as_torch=True).to("cuda"))

        first, med, _ = timed(staged_get, iters, sync)
        record("staged_get_into", first, med, get_ceiling, ceiling_get_name, get_pageable, before,
               {"path": "get_tensor then .to('cuda')"})
        remove(host_keys)
    remove(keys)
    del tensors, outs
    if is_cuda:
        torch.cuda.empty_cache()


def run_strided(store, torch, flat, prefix, iters, sync, record, ceiling, ceiling_name, pageable,
                tag):
    """get_tensor_into a [rows, 4096] bf16 tensor three ways: a contiguous destination, the TP
    half `parent[:, 4096:]` of a 2x wider parameter (rows of one run with a pitch: one 2-D copy
    in place), and a transposed view (gathered on the host first, then one flat copy)."""
    cols = 4096
    rows = flat.numel() // cols
    src = flat[: rows * cols].view(rows, cols)
    key = f"{prefix}/strided"
    store.upsert_tensor(key, src)
    parent = torch.zeros(rows, 2 * cols, dtype=src.dtype, device=src.device)
    views = [
        ("tensor_get_into_2d", "contiguous", torch.empty_like(src)),
        ("tensor_get_into_tp_half", "parent[:, 4096:] of a [rows, 8192] parameter",
         parent[:, cols:]),
        ("tensor_get_into_transposed", "torch.empty(4096, rows).t()",
         torch.empty(cols, rows, dtype=src.dtype, device=src.device).t()),
    ]
    for what, layout, dst in views:
        before = store.tensor_stats()
        first, med, _ = timed(lambda i: store.get_tensor_into(key, dst), iters, sync)
        if not bool(torch.equal(dst, src)):
            raise SystemExit(f"{tag}: {what} returned different bytes")
        record(what, first, med, ceiling, ceiling_name, pageable, before,
               {"layout": layout, "shape": [rows, cols], "strides": list(dst.stride())})
    if not bool((parent[:, :cols] == 0).all()):
        raise SystemExit(f"{tag}: tensor_get_into_tp_half wrote outside its view")
    try:
        store.objects.remove(key)
    except Exception:  # noqa: BLE001 - absent is fine
        pass
    del parent, views
    torch.cuda.empty_cache()


def parse_size(s):
    s = s.strip()
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the JSON lines to this file")
    ap.add_argument("--sizes-mib", default="64,256,1024")
    ap.add_argument("--batch", default="256x4",
                    help="batch points, comma-separated COUNTxMIB or COUNTxSIZE (e.g. "
                         "'64x4,1024x256KiB'; '' to skip)")
    ap.add_argument("--backends", default="embedded,node")
    ap.add_argument("--devices", default="cuda,cpu")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations after one warm-up")
    ap.add_argument("--strided", action="store_true",
                    help="CUDA single-tensor points also get_tensor_into a TP half of a 2x wider "
                         "parameter and a transposed view (tensor_get_into_tp_half / "
                         "_transposed lines, against tensor_get_into_2d)")
    ap.add_argument("--pinned-quota", default="16GiB", help="embedded store's pinned quota")
    ap.add_argument("--node-segment-size", default="1536MiB")
    ap.add_argument("--node-segments", type=int, default=6)
    ap.add_argument("--node-pinned-quota", default="9GiB")
    ap.add_argument("--node-client-buffer-max", default="2GiB")
    ap.add_argument("--node-prefault", default="true", choices=("true", "false"),
                    help="the daemon's prefault_segments (false: puts fault fresh pages in)")
    ap.add_argument("--node-no-wait-prepared", action="store_true",
                    help="measure while the daemon still pins / pre-faults in the background")
    ap.add_argument("--node-reply-spin-max", type=float, default=None,
                    help="seconds a node-store tensor call polls for its reply (0: sleeps at once)")
    args = ap.parse_args(argv)

    import mooncake.sparse as mcs

    try:
        import torch
    except ImportError:
        torch = None
    devices = [d for d in args.devices.split(",") if d]
    if "cuda" in devices and (torch is None or not torch.cuda.is_available()):
        log("no CUDA device (or no torch): CUDA points skipped")
        devices = [d for d in devices if d != "cuda"]
    sizes = [int(s) * MiB for s in args.sizes_mib.split(",") if s]
    points = [(s, 1) for s in sizes]
    for spec in [p for p in args.batch.split(",") if p]:
        count, size = spec.split("x", 1)
        points.append((int(size) * MiB if size.isdigit() else parse_size(size), int(count)))
    emit = Emitter(args.json)

    device_name = torch.cuda.get_device_name() if torch is not None and "cuda" in devices else ""
    emit({"what": "run", "device": device_name, "torch": getattr(torch, "__version__", None),
          "points": [[b, c] for b, c in points], "devices": devices,
          "backends": args.backends.split(","), "iters": args.iters,
          "embedded_pinned_quota": parse_size(args.pinned_quota)})

    # Ceilings per payload size, measured once.
    ceilings = {}
    for b, c in points:
        total = b * c
        if total in ceilings:
            continue
        ceil = host_ceilings(total, args.iters)
        if "cuda" in devices:
            ceil.update(cuda_ceilings(torch, total, args.iters))
        ceilings[total] = ceil
        emit({"what": "ceiling", "bytes": total, **ceil})
        log(f"ceilings for {total // MiB} MiB: " + ", ".join(f"{k}={v:.2f}" for k, v in ceil.items()))

    for backend in [b for b in args.backends.split(",") if b]:
        if backend == "embedded":
            store = mcs.connect(pinned_quota_bytes=parse_size(args.pinned_quota))
            ctx = None
        elif backend == "node":
            from mooncake.sparse.testing import find_node_daemon, start_node_daemon

            try:
                find_node_daemon()
            except FileNotFoundError as e:
                log(f"node backend skipped: {e}")
                emit({"what": "skipped", "backend": "node", "reason": str(e)})
                continue
            started = time.perf_counter()
            ctx = start_node_daemon(tempfile.mkdtemp(prefix="mcs-bench-"),
                                    segment_size=args.node_segment_size,
                                    num_segments=args.node_segments,
                                    pinned_quota_bytes=args.node_pinned_quota,
                                    client_buffer_max_bytes=args.node_client_buffer_max,
                                    prefault_segments=args.node_prefault)
            node = ctx.__enter__()
            node_kwargs = {"call_timeout": 600.0}
            if args.node_reply_spin_max is not None:
                node_kwargs["reply_spin_max"] = args.node_reply_spin_max
            store = mcs.connect(node.url, **node_kwargs)
            listening = time.perf_counter() - started
            # The daemon listens at once and pins / pre-faults in the background.
            caps = store.capabilities()
            while not args.node_no_wait_prepared and not caps.get("pinning_complete", True):
                time.sleep(0.02)
                caps = store.capabilities()
            emit({"what": "node_startup", "listen_seconds": listening,
                  "prepared_seconds": None if args.node_no_wait_prepared
                  else time.perf_counter() - started,
                  **{k: caps.get(k) for k in ("pinned_bytes", "pinned_target_bytes",
                                              "prefaulted_bytes", "prefault_target_bytes",
                                              "pin_failures", "pinning_complete")}})
        else:
            raise SystemExit(f"unknown backend {backend!r}")
        caps = store.capabilities()
        emit({"what": "capabilities", "backend": backend,
              **{k: v for k, v in caps.items() if isinstance(v, (bool, int, float, str))}})
        log(f"== {backend}: " + json.dumps({k: caps.get(k) for k in (
            "cuda_available", "cuda_ipc_available", "pinned_quota_bytes", "pinned_bytes")}))
        try:
            for device in devices:
                if device == "cuda" and not caps.get("cuda_available"):
                    log(f"{backend}: the library has no CUDA here; CUDA points skipped")
                    continue
                if backend == "node" and device == "cuda" and not caps.get("cuda_ipc_available"):
                    log("node: CUDA IPC unavailable; CUDA points skipped")
                    continue
                for b, c in points:
                    run_config(store, backend, device, torch, b, c, args.iters, ceilings[b * c], emit,
                               strided=args.strided)
            if backend == "node":
                m = store.metrics()
                emit({"what": "node_metrics", **{k: v for k, v in m.items() if "tensor" in k or
                                                 "ipc" in k or "pinned" in k}})
                emit({"what": "node_client_stats", **store._core.client_stats()})
        finally:
            if ctx is not None:
                store.close()
                ctx.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
