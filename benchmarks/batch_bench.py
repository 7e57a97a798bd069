#!/usr/bin/env python3
"""Fixed cost per object of a step's calls, single-object vs batch (docs/design.md §9).

For N small tensors (one step of a model with many tensors: the cost per object dominates, not
the bytes), on the embedded store and through the node daemon, it times:

- encode: N x encode_update vs one encode_updates;
- commit: N x put_sparse_object vs one put_sparse_objects (the first batch of a fresh store,
  `commit_batch_s`; a fresh node daemon has first prepared its segments, --wait-prepared),
  then `--steps` more batch commits, one generation each, with the store's retention keeping
  the last 2 (a training run's steady state: each step's objects reuse the
  memory the retired ones freed; `commit_steady_s`, their median; each step's seal,
  `seal_steady_s`, which also frees the step past retention);
- admit: N x admit vs one admit_batch (a trainer's admissions of a step);
- read: one read_sparse_objects of N targets (already a batch), after the step's manifest
  (timed apart: `manifest_s`, and a second reader's call for it, `manifest_again_s`, which the
  store answers from its manifests of sealed steps); the node caches are cleared and the last
  read's objects freed before each run, outside the timing; on the embedded store also in
  place (`view_in_place=True`: `read_in_place_s`); with --read-fraction F < 1 also a read of
  the first F * N targets against the whole manifest (`read_part_us_per_target`: a rank's part
  of a step); and the same read with the targets converted once (`mcs.TargetBatch`, as a
  reader keeps them for a run: `read_target_batch_s`);
- apply: N x apply_sparse_object vs one apply_sparse_objects;

and, as the floor of the same run, a memcpy of the bytes each phase moves (numpy copy of the
COO and of the dense weights). Every result is checked: the batch's weights equal the single
calls' weights bit for bit. Prints one JSON line per (backend, N); --json also writes them.

    python benchmarks/batch_bench.py --counts 1000,10000 --json batch.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

import mooncake.sparse as mcs
from mooncake.sparse.testing import find_node_daemon, start_node_daemon, wait_prepared


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


DEVICE = "cpu"


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        sync(DEVICE)
        t = time.perf_counter()
        fn()
        sync(DEVICE)
        times.append(time.perf_counter() - t)
    return min(times)


def nbytes(x) -> int:
    return int(x.nbytes) if hasattr(x, "nbytes") else int(x.numel() * x.element_size())


def sync(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


class Clocks:
    """Seconds a store's clocks count over the calls made inside `with clocks:` (the store's
    metrics ending in _seconds, the direct device commit's counters, and the binding's split of
    put_sparse_objects), summed."""

    def __init__(self, store) -> None:
        self.store = store
        self.sums: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        out = {k: v for k, v in self.store.metrics().items() if k.endswith("_seconds")}
        counters = getattr(mcs._core, "_device_commit_counters", None)
        if counters is not None:
            out.update({f"direct_{k}": v for k, v in counters().items() if k.endswith("_seconds")})
        # The binding's split of put_sparse_objects: parse, the backend's commit, results.
        calls = getattr(mcs._core, "_commit_call_counters", None)
        if calls is not None:
            out.update({f"call_{k}": v for k, v in calls().items() if k.endswith("_seconds")})
        return out

    def __enter__(self) -> "Clocks":
        self.before = self._read()
        return self

    def __exit__(self, *exc) -> None:
        for k, v in self._read().items():
            self.sums[k] = self.sums.get(k, 0.0) + v - self.before.get(k, 0.0)

    def per_object(self, objects: int) -> dict[str, float]:
        return {k[:-len("_seconds")]: round(v / objects * 1e6, 2)
                for k, v in sorted(self.sums.items()) if v > 0}


def run(store, backend: str, n: int, args, rng) -> dict:
    shape = tuple(int(s) for s in args.shape.split("x"))
    olds = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
    news = []
    for o in olds:
        w = o.copy()
        m = rng.random(shape) < args.density
        w[m] += 1.0
        news.append(w)
    cuda = args.device == "cuda"
    if cuda:  # the same step with every tensor on the GPU
        import torch
        olds = [torch.from_numpy(o).cuda() for o in olds]
        news = [torch.from_numpy(w).cuda() for w in news]
    names = [f"{backend}.t{i}" for i in range(n)]
    r = {"what": "batch", "backend": backend, "device": args.device, "objects": n,
         "shape": list(shape), "density": args.density, "repeats": args.repeats,
         "steps": args.steps, "keep_last": args.keep_last}

    # encode
    r["encode_single_s"] = best(lambda: [mcs.encode_update(a, b) for a, b in zip(news, olds)],
                                args.repeats)
    coos = []
    r["encode_batch_s"] = best(lambda: coos.__setitem__(slice(None), mcs.encode_updates(
        list(zip(news, olds)))), args.repeats)
    nnz = sum(len(v) for _, v in coos)
    coo_bytes = sum(nbytes(i) + nbytes(v) for i, v in coos)
    dense_bytes = sum(nbytes(o) for o in olds)
    r.update(nnz=nnz, coo_bytes=coo_bytes, dense_bytes=dense_bytes)

    # commit: single calls into step 1, one batch into step 2 (the same updates)
    t = time.perf_counter()
    for name, (idx, vals) in zip(names, coos):
        store.put_sparse_object(name, shape, idx, vals, generation=(0, 1))
    r["commit_single_s"] = time.perf_counter() - t
    store.seal_generation((0, 1), names)
    ups = [{"tensor_id": name, "global_shape": shape, "indices": idx, "values": vals,
            "generation": (1, 2)} for name, (idx, vals) in zip(names, coos)]
    t = time.perf_counter()
    results = store.put_sparse_objects(ups)
    r["commit_batch_s"] = time.perf_counter() - t
    # The node daemon's background preparation of its segments as that batch ended (None:
    # the embedded store).
    r["daemon_pinning_complete"] = store.metrics().get("pinning_complete")
    assert all(isinstance(x, dict) and x["created"] for x in results), results[:3]
    store.seal_generation((1, 2), names)
    # admission of every tensor (a trainer's boxes of a step), one call per key against one
    # batch, each for a step of its own that is never committed or sealed
    t = time.perf_counter()
    for name in names:
        store.admit(name, (10**9, 10**9 + 1), None, {}, "w")
    r["admit_single_s"] = time.perf_counter() - t
    items = [{"tensor_id": name, "generation": (10**9 + 1, 10**9 + 2), "writer_id": "w"}
             for name in names]
    t = time.perf_counter()
    admitted = store.admit_batch(items)
    r["admit_batch_s"] = time.perf_counter() - t
    assert admitted == [True] * n, admitted[:3]
    # The steady state of a run: more steps, the store keeping the last --keep-last generations.
    store.set_retention(args.keep_last)
    steady = []
    seals = []
    last = (1, 2)
    # Where the steady commits' time goes: the store's clocks (metrics), and on the embedded
    # store with CUDA members the direct path's (_device_commit_counters), summed over the steps.
    clocks = Clocks(store)
    for k in range(2, 2 + args.steps):
        gen = (k, k + 1)
        for u in ups:
            u["generation"] = gen
        sync(DEVICE)
        t = time.perf_counter()
        with clocks:
            results = store.put_sparse_objects(ups)
        steady.append(time.perf_counter() - t)
        assert all(isinstance(x, dict) and x["created"] for x in results), results[:3]
        t = time.perf_counter()
        store.seal_generation(gen, names)  # frees the step past retention from the third on
        seals.append(time.perf_counter() - t)
        last = gen
    if seals:
        r["seal_steady_s"] = statistics.median(seals)
    if steady:
        r["commit_steady_s"] = statistics.median(steady)
        r["commit_steady_clocks_us_per_object"] = clocks.per_object(n * len(steady))
        r["commit_steps"] = [round(x, 6) for x in steady]
    # Two more steady steps encoded and committed in one call (store.put_sparse_updates: on
    # the GPU in parts, the commit of one overlapping the encode of the next).
    published = []
    for k in range(last[1], last[1] + 2):
        gen = (k, k + 1)
        pubs = [{"tensor_id": name, "global_shape": shape, "new": a, "old": b,
                 "generation": gen} for name, a, b in zip(names, news, olds)]
        sync(DEVICE)
        t = time.perf_counter()
        results, _ = store.put_sparse_updates(pubs)
        sync(DEVICE)
        published.append(time.perf_counter() - t)
        assert all(isinstance(x, dict) and x["created"] for x in results), results[:3]
        store.seal_generation(gen, names)
        last = gen
    r["publish_steady_s"] = statistics.median(published)

    # read (a batch already), of the last step's manifest
    targets = [mcs.Target(name, f"r/{name}", "node0", {}, (0, 0), shape) for name in names]
    objs = []

    kw = {"device": "cuda"} if cuda else {}

    def step_read(**extra) -> tuple[float, float]:
        # A step's read as a reader makes it: the manifest, then one read of every target.
        # Clearing the node caches (the step's sources are new to them) and freeing the last
        # read's objects are set-up, outside the timing.
        man_times, again_times, read_times = [], [], []
        clocks = Clocks(store)
        for _ in range(args.repeats):
            store.clear_caches()
            objs.clear()
            sync(DEVICE)
            t0 = time.perf_counter()
            m = store.manifest(last)
            t1 = time.perf_counter()
            # Another reader of the node (a rank through the same daemon) reads it again.
            store.manifest(last)
            again_times.append(time.perf_counter() - t1)
            t1 = time.perf_counter()
            with clocks:
                objs[:] = store.read_sparse_objects(m, targets, **kw, **extra)
                sync(DEVICE)
            t2 = time.perf_counter()
            man_times.append(t1 - t0)
            read_times.append(t2 - t1)
        r["read_in_place_clocks_us_per_target" if extra else "read_clocks_us_per_target"] = \
            clocks.per_object(n * args.repeats)
        r["manifest_again_s"] = min(again_times)
        return min(man_times), min(read_times)

    if backend == "embedded":
        r["read_in_place_s"] = step_read(view_in_place=True)[1]
    r["manifest_s"], r["read_s"] = step_read()

    def read_only(ts) -> float:
        # The best read of `ts` alone (the caches cleared and the manifest taken before it).
        times = []
        for _ in range(args.repeats):
            store.clear_caches()
            sync(DEVICE)
            m = store.manifest(last)
            t0 = time.perf_counter()
            got = store.read_sparse_objects(m, ts, **kw)
            sync(DEVICE)
            times.append(time.perf_counter() - t0)
            del got
        return min(times)

    # The same read with the targets converted once (a TargetBatch, as a reader keeps them for
    # a run), not at every read.
    r["read_target_batch_s"] = read_only(mcs.TargetBatch(targets))
    if args.read_fraction < 1:
        # A rank reads its part of a step: its targets against the whole step's manifest
        # (a Kimi-K2 step lists about four times a rank's targets).
        part = targets[:max(1, int(n * args.read_fraction))]
        r["read_part_targets"] = len(part)
        r["read_part_us_per_target"] = read_only(part) / len(part) * 1e6

    # apply: single calls vs one batch, from the same objects; results bit-identical
    w_single = [o.clone() if cuda else o.copy() for o in olds]
    w_batch = [o.clone() if cuda else o.copy() for o in olds]
    r["apply_single_s"] = best(lambda: [mcs.apply_sparse_object(w, o)
                                        for w, o in zip(w_single, objs)], args.repeats)
    r["apply_batch_s"] = best(lambda: mcs.apply_sparse_objects(w_batch, objs), args.repeats)
    host = (lambda x: x.cpu().numpy()) if cuda else (lambda x: x)
    r["bit_exact"] = all(host(a).tobytes() == host(b).tobytes() == host(c).tobytes()
                         for a, b, c in zip(w_single, w_batch, news))

    # floors of the same run: a memcpy of the COO bytes (what commit and read move) and of the
    # dense weights (what a dense sync moves); on the GPU, the COO bytes over pinned PCIe
    if cuda:
        import torch
        flat = torch.empty(coo_bytes, dtype=torch.uint8, device="cuda")
        pinned = torch.empty(coo_bytes, dtype=torch.uint8, pin_memory=True)
        r["pinned_d2h_coo_s"] = best(lambda: pinned.copy_(flat, non_blocking=True), args.repeats)
        r["pinned_h2d_coo_s"] = best(lambda: flat.copy_(pinned, non_blocking=True), args.repeats)
        coos = [(i.cpu().numpy(), v.cpu().numpy()) for i, v in coos]
        olds = [o.cpu().numpy() for o in olds]
    flat_coo = np.concatenate([np.concatenate([i.view(np.uint8).ravel(), v.view(np.uint8)])
                               for i, v in coos]) if coos else np.zeros(0, np.uint8)
    dst = np.empty_like(flat_coo)
    r["memcpy_coo_s"] = best(lambda: np.copyto(dst, flat_coo), args.repeats)
    flat_dense = np.concatenate([o.ravel() for o in olds])
    dst_dense = np.empty_like(flat_dense)
    r["memcpy_dense_s"] = best(lambda: np.copyto(dst_dense, flat_dense), args.repeats)
    for k in ("encode_single", "encode_batch", "commit_single", "commit_batch", "commit_steady",
              "publish_steady", "admit_single", "admit_batch", "seal_steady", "manifest", "manifest_again",
              "read", "read_in_place", "read_target_batch", "apply_single", "apply_batch"):
        if f"{k}_s" in r:
            r[f"{k}_us_per_object"] = r[f"{k}_s"] / n * 1e6
    r["commit_batch_over_single"] = r["commit_batch_s"] / r["commit_single_s"]
    r["apply_batch_over_single"] = r["apply_batch_s"] / r["apply_single_s"]
    r["encode_batch_over_single"] = r["encode_batch_s"] / r["encode_single_s"]
    return r


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", default="1000,10000")
    ap.add_argument("--shape", default="64x64", help="every tensor's shape (float32)")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--backends", default="embedded,node")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6,
                    help="batch commits after the first, the store keeping the last --keep-last")
    ap.add_argument("--read-fraction", type=float, default=1.0,
                    help="also read this fraction of the targets against the whole manifest "
                         "(read_part_us_per_target: a rank's part of a step)")
    ap.add_argument("--keep-last", type=int, default=2,
                    help="steps the store keeps (more: a store of more objects, as a run that "
                         "keeps several steps for its readers to catch up)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the tensors live on the GPU (GPU encode, CUDA commits, "
                         "device reads, GPU apply)")
    ap.add_argument("--wait-prepared", type=float, default=120.0, metavar="SECONDS",
                    help="wait up to this long for a fresh node daemon to prepare its segments "
                         "(pre-fault and pin them) before the first call, as the daemon of a "
                         "running job has (0: start at once, the first batch beside that work)")
    ap.add_argument("--json", help="also write the JSON lines here")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    out = open(args.json, "w") if args.json else None

    def emit(rec: dict) -> None:
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    argv_rec = [os.path.basename(a) if i and argv[i - 1] == "--json" else a
                for i, a in enumerate(argv)]
    emit({"what": "batch_machine", "python": platform.python_version(),
          "cpus": os.cpu_count(), "machine": platform.machine(), "loadavg": os.getloadavg(),
          # The process's allocator, when one is preloaded (jemalloc halves the per-object
          # costs of an embedded store: docs/design.md)
          "ld_preload": os.environ.get("LD_PRELOAD", ""), "argv": argv_rec})
    rng = np.random.default_rng(0)
    for backend in args.backends.split(","):
        for n in (int(c) for c in args.counts.split(",")):
            if backend == "embedded":
                rec = run(mcs.connect(), backend, n, args, rng)
            else:
                try:
                    find_node_daemon()
                except FileNotFoundError:
                    log("node: mooncake_sparse_node not found, skipped")
                    continue
                with tempfile.TemporaryDirectory() as d, \
                        start_node_daemon(pathlib.Path(d), segment_size="512MiB",
                                          num_segments=2) as daemon:
                    s = mcs.connect(daemon.url)
                    waited = wait_prepared(s, args.wait_prepared)
                    rec = run(s, backend, n, args, rng)
                    rec["daemon_prepared_wait_s"] = waited
                    s.close()
            emit(rec)
            log(f"[{backend} n={n}] per object: commit {rec['commit_single_us_per_object']:.1f}"
                f" -> {rec['commit_batch_us_per_object']:.1f} us (steady "
                f"{rec.get('commit_steady_us_per_object', float('nan')):.1f}; encoded and "
                f"committed in one call {rec['publish_steady_us_per_object']:.1f}; seal "
                f"{rec.get('seal_steady_us_per_object', float('nan')):.1f}), admit "
                f"{rec['admit_single_us_per_object']:.1f} -> "
                f"{rec['admit_batch_us_per_object']:.1f} us, read "
                f"{rec['read_us_per_object']:.1f} us (manifest "
                f"{rec['manifest_us_per_object']:.1f}, again "
                f"{rec['manifest_again_us_per_object']:.1f}, TargetBatch "
                f"{rec['read_target_batch_us_per_object']:.1f}"
                + (f", in place {rec['read_in_place_us_per_object']:.1f}"
                   if "read_in_place_s" in rec else "") + "), apply "
                f"{rec['apply_single_us_per_object']:.1f} -> "
                f"{rec['apply_batch_us_per_object']:.1f} us, encode "
                f"{rec['encode_single_us_per_object']:.1f} -> "
                f"{rec['encode_batch_us_per_object']:.1f} us; memcpy of the COO "
                f"{rec['memcpy_coo_s'] * 1e3:.2f} ms; exact {rec['bit_exact']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
