"""Read-path bytes against the in-box ideal, and the demo's three-way comparison (JSON lines).

For random sparse updates and EP x TP target layouts (tile-aligned and unaligned boxes), reads
every target through read_sparse_objects on the embedded store and compares the bytes the node
read (range_bytes_read) with the ideal: the bytes of exactly the entries inside the union of the
node's boxes, found by a brute-force scan of the COO (the ceiling of this benchmark).

    python benchmarks/read_path_bench.py --json OUT.jsonl [--demo-json DEMO.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import mooncake.sparse as mcs


def emit(rec, out):
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        out.write(line + "\n")


def run_case(shape, density, tp, split_dim, offset_shift, seed, out):
    rng = np.random.default_rng(seed)
    total = int(np.prod(shape))
    nnz = int(total * density)
    flat = rng.choice(total, size=nnz, replace=False)
    idx = np.stack(np.unravel_index(flat, shape), axis=1).astype(np.int64)
    vals = rng.standard_normal(nnz).astype(np.float32)
    store = mcs.connect()
    store.put_sparse_object("w", shape, idx, vals, placement_policy="replicate(ep)", generation=(0, 1))
    manifest = store.manifest((0, 1))
    part = shape[split_dim] // tp
    targets = []
    boxes = []
    for t in range(tp):
        off = [0, 0]
        loc = list(shape)
        # offset_shift moves the TP cut away from tile edges (unaligned boxes)
        lo = min(max(0, t * part + (offset_shift if t > 0 else 0)), shape[split_dim] - 1)
        hi = shape[split_dim] if t == tp - 1 else (t + 1) * part + offset_shift
        off[split_dim], loc[split_dim] = lo, hi - lo
        for ep in range(2):
            targets.append(mcs.Target("w", f"ep{ep}tp{t}", "node0", {"ep": ep, "tp": t}, off, loc))
        boxes.append((off, loc))
    store.reset_metrics()
    t0 = time.perf_counter()
    store.read_sparse_objects(manifest, targets)
    seconds = time.perf_counter() - t0
    m = store.metrics()
    t1 = time.perf_counter()
    inside = np.zeros(nnz, bool)
    for off, loc in boxes:
        ok = np.ones(nnz, bool)
        for d in range(2):
            ok &= (idx[:, d] >= off[d]) & (idx[:, d] < off[d] + loc[d])
        inside |= ok
    bruteforce_ms = (time.perf_counter() - t1) * 1e3
    entry_bytes = manifest[0].entry_bytes
    ideal = int(inside.sum()) * entry_bytes
    # Per target (before node dedup): the bytes handed to each target vs its own box.
    per_target_ideal = 0
    for t in targets:
        ok = np.ones(nnz, bool)
        for d in range(2):
            ok &= (idx[:, d] >= t.global_offset[d]) & (idx[:, d] < t.global_offset[d] + t.local_shape[d])
        per_target_ideal += int(ok.sum()) * entry_bytes
    emit({"what": "read_path_bytes", "shape": list(shape), "density": density, "tp": tp,
          "split_dim": split_dim, "aligned": offset_shift == 0, "targets": len(targets),
          "tile_shape": list(manifest[0].tile_shape), "range_bytes_read": m["range_bytes_read"],
          "ideal_bytes": ideal, "ratio": m["range_bytes_read"] / max(1, ideal), "goal_ratio": 1.1,
          "fanout_bytes": m["fanout_bytes"], "per_target_ideal_bytes": per_target_ideal,
          "target_ratio": m["fanout_bytes"] / max(1, per_target_ideal),
          "range_gets": m["range_gets"], "full_gets": m["full_gets"], "seconds": seconds,
          "bruteforce_ms": bruteforce_ms}, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--demo-json", help="also run the demo (--quick unless --full) and record it")
    ap.add_argument("--full", action="store_true")
    args = ap.parse_args()
    out = open(args.json, "w") if args.json else None
    seed = 0
    for shape in ((2048, 7168), (7168, 2048)):
        for tp in (2, 4, 8):
            for split_dim in (0, 1):
                for shift in (0, 37):
                    run_case(shape, 0.01, tp, split_dim, shift, seed, out)
                    seed += 1
    if args.demo_json:
        from mooncake.sparse import demo

        demo.main((["--quick"] if not args.full else []) + ["--no-progress", "--json", args.demo_json])
        with open(args.demo_json) as f:
            r = json.load(f)
        for name, s in r["strategies"].items():
            emit({"what": "demo_strategy", "strategy": name, "bytes_put": s["bytes_put"],
                  "range_bytes_read": s["range_bytes_read"], "full_bytes_read": s["full_bytes_read"],
                  "fanout_bytes": s["fanout_bytes"], "target_bytes": s["target_bytes"],
                  "seconds": s["seconds"], "verified": s["verified"],
                  "model_bytes": r["model_bytes"], "density": r["density"]}, out)
    if out:
        out.close()


if __name__ == "__main__":
    main()
