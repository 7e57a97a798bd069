#!/usr/bin/env python3
# Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
"""Node daemon benchmarks (docs/design.md §5-6): one JSON object per line on stdout, each with the
ceiling it measured in the same run; human text on stderr.

  what="node_stat_rtt"     metadata RPC latency (Stat round trip through the daemon), p50/p99,
                           vs a raw SOCK_SEQPACKET echo round trip between two processes
  what="node_put" / "node_get" / "node_lease_read" / "node_lease"
                           host-memory throughput through shared memory (put: copy into the
                           client buffer + one daemon copy into a segment; get: daemon copy into
                           the client buffer + copy into the caller's array; lease_read: zero-
                           copy lease + one copy out of the mapped segment; lease: the hand-off
                           alone), vs a numpy copy of the same size into a ready array
  what="node_dedup"        N reader processes (EP x TP ranks) each read their own targets of one
                           non-EP weight and of the experts they host, concurrently: source
                           bytes read once per node vs the sum of what the processes requested,
                           vs one embedded process reading every target (in-process dedup)

Usage: python3 benchmarks/node_bench.py [--quick] [--json PATH] [--only stat,put,dedup]
Needs the installed package (pip install .), which ships mooncake_sparse_node.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time

import numpy as np

import mooncake.sparse as mcs
from mooncake.sparse.testing import start_node_daemon

GEN = (0, 1)


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def loadavg() -> float:
    return os.getloadavg()[0]


def emit(out, record: dict) -> None:
    record.setdefault("loadavg_1m", round(loadavg(), 2))
    line = json.dumps(record, sort_keys=False)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# ---------------------------------------------------------------------------------------------
# Metadata RPC latency.
# ---------------------------------------------------------------------------------------------


def _echo(sock) -> None:
    while True:
        data = sock.recv(65536)
        if not data:
            return
        sock.send(data)


def bench_stat(url: str, iterations: int, out) -> None:
    store = mcs.connect(url)
    store.objects.put("bench/stat", {"a": np.arange(16, dtype=np.uint64)}, metadata=b"{}",
                      mode="upsert")
    for _ in range(200):
        store.objects.stat("bench/stat")
    lat = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        store.objects.stat("bench/stat")
        lat.append((time.perf_counter_ns() - t0) / 1000)
    # Ceiling: the bare socket round trip between two processes, from Python.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = mp.get_context("fork").Process(target=_echo, args=(b,))
    child.start()
    b.close()
    msg = b"x" * 64
    for _ in range(200):
        a.send(msg)
        a.recv(65536)
    raw = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        a.send(msg)
        a.recv(65536)
        raw.append((time.perf_counter_ns() - t0) / 1000)
    a.shutdown(socket.SHUT_RDWR)  # the forked child holds a copy of `a` too
    a.close()
    child.join()
    rec = {
        "what": "node_stat_rtt",
        "iterations": iterations,
        "p50_us": round(percentile(lat, 0.5), 2),
        "p99_us": round(percentile(lat, 0.99), 2),
        "mean_us": round(statistics.fmean(lat), 2),
        "ceiling": "raw SOCK_SEQPACKET echo round trip, Python to Python process",
        "ceiling_p50_us": round(percentile(raw, 0.5), 2),
        "ceiling_p99_us": round(percentile(raw, 0.99), 2),
    }
    emit(out, rec)
    log(f"stat rtt p50 {rec['p50_us']} us, p99 {rec['p99_us']} us "
        f"(raw socket p50 {rec['ceiling_p50_us']} us)")


# ---------------------------------------------------------------------------------------------
# Throughput through shared memory.
# ---------------------------------------------------------------------------------------------


def best_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_throughput(url: str, sizes_mib, repeats: int, out) -> None:
    store = mcs.connect(url, initial_buffer_bytes=(max(sizes_mib) + 1) << 20)
    for mib in sizes_mib:
        nbytes = mib << 20
        src = np.random.default_rng(mib).integers(0, 255, nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        key = f"bench/blob{mib}"
        store.objects.put(key, {"a": src}, mode="upsert")  # warm: buffer, extent, pages
        store.objects.get(key)
        ceiling = best_seconds(lambda: np.copyto(dst, src), repeats)
        put = best_seconds(lambda: store.objects.put(key, {"a": src}, mode="upsert"), repeats)
        get = best_seconds(lambda: store.objects.read_into(key, "a", dst), repeats)

        def lease_and_read():
            _, members = store.backend.lease_object(key)
            np.copyto(dst, members["a"])  # one copy out of the mapped segment

        lease_read = best_seconds(lease_and_read, repeats)
        lease_only = best_seconds(lambda: store.backend.lease_object(key), repeats)
        ceil_gbps = nbytes / ceiling / 1e9
        common = {"bytes": nbytes, "repeats": repeats, "ceiling": "numpy copyto, same size",
                  "ceiling_gbps": round(ceil_gbps, 2)}
        for what, seconds, copies in (("node_put", put, 2), ("node_get", get, 2),
                                      ("node_lease_read", lease_read, 1),
                                      ("node_lease", lease_only, 0)):
            emit(out, {"what": what, **common, "seconds": round(seconds, 6),
                       "gbps": round(nbytes / seconds / 1e9, 2), "host_copies": copies,
                       "ratio_to_ceiling": round(ceiling / seconds, 3)})
        log(f"{mib:4d} MiB: put {nbytes / put / 1e9:6.2f} GB/s, get {nbytes / get / 1e9:6.2f}, "
            f"lease+read {nbytes / lease_read / 1e9:6.2f}, lease {lease_only * 1e6:7.1f} us; "
            f"numpy copy {ceil_gbps:6.2f} GB/s")
        store.objects.remove(key)


# ---------------------------------------------------------------------------------------------
# Node dedup across processes.
# ---------------------------------------------------------------------------------------------


def scenario(quick: bool):
    shared = ("layers.0.attn.wo", (7168, 2048) if not quick else (2048, 1024))
    experts = [(f"layers.0.mlp.experts.{x}.w1", (2048, 1024) if not quick else (512, 256))
               for x in range(8 if not quick else 4)]
    return shared, experts


def coo(seed, shape, density=0.01):
    rng = np.random.default_rng(seed)
    total = int(np.prod(shape))
    flat = rng.choice(total, size=int(total * density), replace=False)
    idx = np.stack(np.unravel_index(flat, shape), axis=1).astype(np.int64)
    return idx, rng.standard_normal(len(flat)).astype(np.float16)


def rank_targets(shared, experts, ep, tp, n_ep, n_tp):
    node, rank = "node0", f"node0/rank{ep * n_tp + tp}"
    name, shape = shared
    part = shape[0] // n_tp
    out = [mcs.Target(name, rank, node, {"ep": ep, "tp": tp}, (tp * part, 0), (part, shape[1]))]
    for x, (ename, eshape) in enumerate(experts):
        if x % n_ep == ep:
            part = eshape[0] // n_tp
            out.append(mcs.Target(ename, rank, node, {"ep": ep, "tp": tp, "expert": x},
                                  (tp * part, 0), (part, eshape[1])))
    return out


def commit(store, shared, experts):
    name, shape = shared
    store.put_sparse_object(name, shape, *coo(1, shape), placement_policy="replicate(ep)",
                            generation=GEN)
    for x, (ename, eshape) in enumerate(experts):
        store.put_sparse_object(ename, eshape, *coo(100 + x, eshape),
                                source_placement={"expert": x}, placement_policy="owner(expert)",
                                generation=GEN)


def reader(url, quick, ep, tp, n_ep, n_tp, barrier, results):
    shared, experts = scenario(quick)
    store = mcs.connect(url)
    manifest = store.manifest(GEN)
    targets = rank_targets(shared, experts, ep, tp, n_ep, n_tp)
    by_id = {s.tensor_id: s for s in manifest}
    barrier.wait(timeout=120)
    t0 = time.perf_counter()
    objs = store.read_sparse_objects(manifest, targets)
    seconds = time.perf_counter() - t0
    # What this process asked for: the entries of its boxes, in source bytes.
    requested = sum(o.nnz * by_id[t.tensor_id].entry_bytes for o, t in zip(objs, targets))
    results.put({"seconds": seconds, "requested_bytes": requested, "targets": len(targets)})


def bench_dedup(url: str, quick: bool, n_ep: int, n_tp: int, out) -> None:
    shared, experts = scenario(quick)
    store = mcs.connect(url)
    commit(store, shared, experts)
    manifest = store.manifest(GEN)
    source_bytes = sum(s.nnz * s.entry_bytes for s in manifest)
    store.reset_metrics()
    ctx = mp.get_context("spawn")
    n = n_ep * n_tp
    barrier, results = ctx.Barrier(n + 1), ctx.Queue()
    procs = [ctx.Process(target=reader, args=(url, quick, e, t, n_ep, n_tp, barrier, results))
             for e in range(n_ep) for t in range(n_tp)]
    for p in procs:
        p.start()
    barrier.wait(timeout=120)
    t0 = time.perf_counter()
    per = [results.get(timeout=300) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    m = store.metrics()

    # Ceiling: one embedded process reading every target of the node (in-process dedup).
    embedded = mcs.connect()
    commit(embedded, shared, experts)
    emanifest = embedded.manifest(GEN)
    all_targets = [t for e in range(n_ep) for tp in range(n_tp)
                   for t in rank_targets(shared, experts, e, tp, n_ep, n_tp)]
    embedded.reset_metrics()
    t1 = time.perf_counter()
    embedded.read_sparse_objects(emanifest, all_targets)
    one_process = time.perf_counter() - t1
    em = embedded.metrics()
    requested = sum(r["requested_bytes"] for r in per)
    rec = {
        "what": "node_dedup",
        "processes": n,
        "ep": n_ep,
        "tp": n_tp,
        "sources": len(manifest),
        "source_bytes": source_bytes,
        "targets": sum(r["targets"] for r in per),
        "node_range_gets": int(m["range_gets"]),
        "node_range_bytes_read": int(m["range_bytes_read"]),
        "node_cache_hits": int(m["range_cache_hits"]),
        "node_single_flight_waits": int(m["single_flight_waits"]),
        "requested_ranges": int(m["range_gets"] + m["range_cache_hits"] + m["single_flight_waits"]),
        "requested_bytes_sum_over_processes": requested,
        "dedup_ratio": round(requested / max(1, m["range_bytes_read"]), 3),
        "full_gets": int(m["full_gets"]),
        "wall_seconds": round(wall, 4),
        "process_seconds_p50": round(statistics.median(r["seconds"] for r in per), 4),
        "process_seconds_max": round(max(r["seconds"] for r in per), 4),
        "ceiling": "one embedded process reading every target (in-process dedup)",
        "bruteforce_ms": round(one_process * 1000, 2),
        "ceiling_range_bytes_read": int(em["range_bytes_read"]),
        "ceiling_range_gets": int(em["range_gets"]),
    }
    emit(out, rec)
    log(f"dedup: {n} processes requested {requested / 1e6:.2f} MB of source entries; the node "
        f"read {m['range_bytes_read'] / 1e6:.2f} MB in {int(m['range_gets'])} range reads "
        f"(one process, embedded: {em['range_bytes_read'] / 1e6:.2f} MB, "
        f"{int(em['range_gets'])} reads); wall {wall:.3f} s vs {one_process:.3f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, few iterations")
    ap.add_argument("--json", help="also append the JSON lines to this file")
    ap.add_argument("--only", default="stat,put,dedup", help="comma list of: stat, put, dedup")
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--tp", type=int, default=4)
    args = ap.parse_args()
    only = set(args.only.split(","))
    out = open(args.json, "a") if args.json else None
    sizes = [1, 4] if args.quick else [1, 16, 64, 256]
    with tempfile.TemporaryDirectory(prefix="mcs-bench-") as tmp:
        with start_node_daemon(tmp, segment_size="512MiB", num_segments=2,
                               client_buffer_max_bytes="1GiB", log_level="warning") as node:
            emit(out, {"what": "node_bench_config", "quick": args.quick, "nproc": os.cpu_count(),
                       "daemon": node.binary, "segment_size": "512MiB", "num_segments": 2})
            if "stat" in only:
                bench_stat(node.url, 500 if args.quick else 5000, out)
            if "put" in only:
                bench_throughput(node.url, sizes, 3 if args.quick else 5, out)
            if "dedup" in only:
                bench_dedup(node.url, args.quick, args.ep, args.tp, out)
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
