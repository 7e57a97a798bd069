#!/usr/bin/env python3
"""Catch-up read of k steps vs replaying k deltas, and vs reading the dense weights (JSON lines).

A trainer runs S = max(k) steps of a model of T tensors: per step it changes a fraction of the
elements of every tensor (overwrite; scatter_add with --apply), commits each tensor's delta as
a source object of step i = generation (i-1, i) and seals the step with the model's list of
tensor ids (docs/design.md §9). A reader node holding the whole model as TP boxes (--tp ranks,
split along --split-dim; --tp 1: whole tensors) that sits at step j = S - k catches up to step S
in two ways:

  replay  k reads of single steps: store.manifest((i-1, i)), read_sparse_objects, apply, for
          i = j+1..S;
  fold    one read of the fold: store.manifest((j, S)), read_sparse_objects (one object per
          target, the latest value per coordinate or the sum), apply.

The baseline measured in the same run is what a reader without sparse catch-up does: get the
dense weights of its boxes (put_tensor of each box by the trainer, untimed, then one
batch_get_tensor_into of every box; `dense` in each line).

Each figure is the median of --repeats runs; before every run the reader's weights are reset to
step j (untimed) and the store's tile-index and range caches are dropped (store.clear_caches())
so every range is really read. Bytes: store.metrics() deltas of the read (range_bytes_read,
full_bytes_read, range_gets, index_gets) and the bytes and entries of the objects applied
(target_bytes, nnz_applied). Every line checks the fold's weights against the replay's bit for
bit and both against the trainer's weights (computed with torch indexing, not by the store).
scatter_add deltas and the starting weights are small integers so that every sum is exact in
bfloat16 and the fold must match bit for bit there too.

With --hot F the changed elements of every step are drawn from a fixed subset of F x numel
elements of each tensor (steps overlap, as when the same weights keep moving); default 1.0:
uniform over the tensor.

    python benchmarks/catchup_bench.py --json OUT.jsonl
    python benchmarks/catchup_bench.py --tensors 16 --shape 512x512 --ks 1,4,16 --backends embedded
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import mooncake.sparse as mcs

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def log(*args):
    print(*args, file=sys.stderr, flush=True)


class Emitter:
    def __init__(self, path):
        self.file = open(path, "w") if path else None

    def __call__(self, record):
        line = json.dumps(record)
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()


def parse_shape(text):
    return tuple(int(x) for x in text.lower().split("x"))


class Model:
    """The trainer's side: initial weights and the deterministic delta of (step, tensor)."""

    def __init__(self, args, apply):
        self.names = [f"layer{t:03d}.w" for t in range(args.tensors)]
        self.shape = parse_shape(args.shape)
        self.numel = int(np.prod(self.shape))
        self.dtype = DTYPES[args.dtype]
        self.apply = apply
        self.seed = args.seed
        self.nnz = max(1, int(round(self.numel * args.density)))
        hot_n = max(self.nnz, int(round(self.numel * args.hot)))
        self.hot = None
        if hot_n < self.numel:
            self.hot = [np.sort(np.random.default_rng((self.seed, 7, t)).choice(
                self.numel, hot_n, replace=False)) for t in range(args.tensors)]

    def initial(self, t):
        g = torch.Generator().manual_seed(self.seed * 100003 + t)
        if self.apply == "scatter_add":  # small integers: every sum exact in bfloat16
            return torch.randint(-16, 17, self.shape, generator=g).to(self.dtype)
        return torch.randn(self.shape, generator=g).to(self.dtype)

    def delta(self, step, t):
        """(flat indices int64 sorted unique, values as a torch tensor of the model's dtype)."""
        rng = np.random.default_rng((self.seed, step, t))
        if self.hot is None:
            flat = rng.choice(self.numel, self.nnz, replace=False)
        else:
            flat = self.hot[t][rng.choice(len(self.hot[t]), self.nnz, replace=False)]
        flat = np.sort(flat).astype(np.int64)
        if self.apply == "scatter_add":
            v = rng.integers(-3, 4, self.nnz).astype(np.float32)
            v[v == 0] = 1.0
        else:
            v = rng.standard_normal(self.nnz).astype(np.float32)
        return flat, torch.from_numpy(v).to(self.dtype)

    def advance(self, weights, step):
        """Applies step `step` to the trainer's dense weights (torch indexing)."""
        for t, w in enumerate(weights):
            flat, vals = self.delta(step, t)
            view = w.view(-1)
            idx = torch.from_numpy(flat)
            if self.apply == "scatter_add":
                view[idx] += vals
            else:
                view[idx] = vals


def boxes_of(shape, tp, split_dim):
    """(global_offset, local_shape) of each TP rank's box."""
    if tp <= 1:
        return [((0,) * len(shape), tuple(shape))]
    n = shape[split_dim]
    out = []
    for r in range(tp):
        lo, hi = r * n // tp, (r + 1) * n // tp
        off = [0] * len(shape)
        loc = list(shape)
        off[split_dim], loc[split_dim] = lo, hi - lo
        out.append((tuple(off), tuple(loc)))
    return out


def box_view(w, off, loc):
    return w[tuple(slice(o, o + n) for o, n in zip(off, loc))]


def run_backend(store, backend, apply, args, emit):
    model = Model(args, apply)
    ks = sorted(set(args.ks))
    steps = max(ks)
    boxes = boxes_of(model.shape, args.tp, args.split_dim)
    targets = [mcs.Target(name, f"tp{r}/{name}", "node0", {"tp": r} if args.tp > 1 else {},
                          off, loc)
               for name in model.names for r, (off, loc) in enumerate(boxes)]
    elem = torch.empty((), dtype=model.dtype).element_size()
    model_bytes = len(model.names) * model.numel * elem
    common = {"backend": backend, "apply": apply, "dtype": args.dtype, "tensors": len(model.names),
              "shape": list(model.shape), "tp": args.tp, "split_dim": args.split_dim,
              "density": args.density, "hot": args.hot, "steps": steps, "targets": len(targets),
              "model_bytes": model_bytes, "repeats": args.repeats}
    store.set_retention(steps)  # every step stays readable, the fold (0, S) included

    # -- trainer: S steps, each tensor's delta committed, the step sealed ------------------------
    trainer = [model.initial(t) for t in range(len(model.names))]
    put_s = seal_s = 0.0
    source_bytes = 0
    for step in range(1, steps + 1):
        for t, name in enumerate(model.names):
            flat, vals = model.delta(step, t)
            idx = np.stack(np.unravel_index(flat, model.shape), axis=1).astype(np.int64)
            t0 = time.perf_counter()
            info = store.put_sparse_object(name, model.shape, idx, vals,
                                           generation=(step - 1, step), apply=apply,
                                           return_info=True)
            put_s += time.perf_counter() - t0
            source_bytes += info["bytes"]
        model.advance(trainer, step)
        t0 = time.perf_counter()
        store.seal_generation((step - 1, step), model.names)
        seal_s += time.perf_counter() - t0
    assert store.latest_generation() == (steps - 1, steps)
    emit({"what": "catchup_trainer", **common, "put_seconds": put_s, "seal_seconds": seal_s,
          "source_bytes": source_bytes, "source_bytes_per_step": source_bytes / steps,
          "nnz_per_step": model.nnz * len(model.names)})
    log(f"[{backend}/{apply}] trainer: {steps} steps, {source_bytes / 1e6:.1f} MB of sources, "
        f"put {put_s:.2f} s, seal {seal_s * 1e3:.1f} ms")

    # -- dense baseline: the reader's boxes of the newest weights, as tensor objects -----------
    keys = [f"bench/dense/{t.target_id}" for t in targets]
    dense_src = [box_view(trainer[i // len(boxes)], *boxes[i % len(boxes)]).contiguous()
                 for i in range(len(targets))]
    t0 = time.perf_counter()
    store.batch_put_tensor(keys, dense_src)
    dense_put_s = time.perf_counter() - t0
    dense_out = [torch.empty_like(s) for s in dense_src]
    times = []
    for _ in range(args.repeats):
        store.clear_caches()
        t0 = time.perf_counter()
        store.batch_get_tensor_into(keys, dense_out)
        times.append(time.perf_counter() - t0)
    assert all(torch.equal(a, b) for a, b in zip(dense_out, dense_src))
    dense = {"seconds": statistics.median(times), "bytes": sum(s.nbytes for s in dense_src),
             "put_seconds": dense_put_s, "times": times}
    for k in keys:
        store.objects.remove(k)
    del dense_src, dense_out
    log(f"[{backend}/{apply}] dense get of {dense['bytes'] / 1e6:.0f} MB: "
        f"{dense['seconds'] * 1e3:.1f} ms")

    # -- reader: for each k (ascending j = S - k), replay vs fold ------------------------------
    state = [model.initial(t) for t in range(len(model.names))]  # the reader at step j
    at = 0
    weights = [torch.empty(loc, dtype=model.dtype) for _ in model.names for _, loc in boxes]

    def reset():
        for i, w in enumerate(weights):
            w.copy_(box_view(state[i // len(boxes)], *boxes[i % len(boxes)]))

    def catch_up(gens):
        m_s = r_s = a_s = 0.0
        nnz = tbytes = 0
        for g in gens:
            t0 = time.perf_counter()
            man = store.manifest(g)
            t1 = time.perf_counter()
            objs = store.read_sparse_objects(man, targets)
            t2 = time.perf_counter()
            for w, o in zip(weights, objs):
                mcs.apply_sparse_object(w, o)
            t3 = time.perf_counter()
            m_s, r_s, a_s = m_s + t1 - t0, r_s + t2 - t1, a_s + t3 - t2
            nnz += sum(o.nnz for o in objs)
            tbytes += sum(o.nbytes for o in objs)
        return {"seconds": m_s + r_s + a_s, "manifest_seconds": m_s, "read_seconds": r_s,
                "apply_seconds": a_s, "nnz_applied": nnz, "target_bytes": tbytes}

    def measure(gens):
        runs = []
        for _ in range(args.repeats):
            reset()
            store.clear_caches()
            store.reset_metrics()
            r = catch_up(gens)
            m = store.metrics()
            for key in ("range_bytes_read", "full_bytes_read", "range_gets", "full_gets",
                        "index_gets", "unique_ranges"):
                r[key] = int(m.get(key, 0))
            runs.append(r)
        out = {key: statistics.median(r[key] for r in runs) for key in
               ("seconds", "manifest_seconds", "read_seconds", "apply_seconds")}
        for key in ("nnz_applied", "target_bytes", "range_bytes_read", "full_bytes_read",
                    "range_gets", "full_gets", "index_gets", "unique_ranges"):
            out[key] = runs[-1][key]
        out["reads"] = len(gens)
        out["bytes_read"] = out["range_bytes_read"] + out["full_bytes_read"]
        out["times"] = [r["seconds"] for r in runs]
        return out, [w.clone() for w in weights]

    final = [box_view(trainer[i // len(boxes)], *boxes[i % len(boxes)])
             for i in range(len(targets))]
    reset()
    catch_up([(steps - 1, steps)])  # warm-up, untimed: first-call costs stay out of the figures
    for k in sorted(ks, reverse=True):
        j = steps - k
        while at < j:
            at += 1
            model.advance(state, at)
        replay, w_replay = measure([(i - 1, i) for i in range(j + 1, steps + 1)])
        fold, w_fold = measure([(j, steps)])
        exact = all(torch.equal(a, b) for a, b in zip(w_fold, w_replay))
        replay_ok = all(torch.equal(a, b) for a, b in zip(w_replay, final))
        fold_ok = all(torch.equal(a, b) for a, b in zip(w_fold, final))
        max_diff = 0.0 if exact else max(float((a.float() - b.float()).abs().max())
                                         for a, b in zip(w_fold, w_replay))
        rec = {"what": "catchup", **common, "k": k, "from_step": j, "to_step": steps,
               "replay": replay, "fold": fold, "dense": dense,
               "fold_bit_exact_vs_replay": exact, "fold_max_abs_diff_vs_replay": max_diff,
               "replay_matches_trainer": replay_ok, "fold_matches_trainer": fold_ok,
               "fold_over_replay_seconds": fold["seconds"] / replay["seconds"],
               "fold_over_replay_bytes_read": fold["bytes_read"] / max(1, replay["bytes_read"]),
               "fold_over_replay_nnz": fold["nnz_applied"] / max(1, replay["nnz_applied"]),
               "fold_over_dense_seconds": fold["seconds"] / dense["seconds"],
               "fold_over_dense_bytes": fold["bytes_read"] / dense["bytes"],
               "replay_over_dense_seconds": replay["seconds"] / dense["seconds"],
               "replay_over_dense_bytes": replay["bytes_read"] / dense["bytes"]}
        emit(rec)
        log(f"[{backend}/{apply}] k={k:3d}: replay {replay['seconds'] * 1e3:8.1f} ms "
            f"{replay['bytes_read'] / 1e6:7.1f} MB nnz {replay['nnz_applied']:9d} | fold "
            f"{fold['seconds'] * 1e3:8.1f} ms {fold['bytes_read'] / 1e6:7.1f} MB nnz "
            f"{fold['nnz_applied']:9d} | dense {dense['seconds'] * 1e3:.1f} ms | "
            f"exact {exact} trainer {replay_ok and fold_ok}")
        if apply == "overwrite" and not exact:
            log(f"  fold differs from replay (max abs diff {max_diff})")


def argv_record(argv):
    """The arguments as recorded: the --json file by its name only (no directories)."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--json" and i + 1 < len(out):
            out[i + 1] = os.path.basename(out[i + 1])
        elif a.startswith("--json="):
            out[i] = "--json=" + os.path.basename(a[len("--json="):])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the JSON lines here")
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--shape", default="1024x1024")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--density", type=float, default=0.01, help="fraction changed per step")
    ap.add_argument("--hot", type=float, default=1.0,
                    help="changes drawn from this fraction of each tensor (1.0: uniform)")
    ap.add_argument("--ks", default="1,2,4,8,16,32")
    ap.add_argument("--tp", type=int, default=2, help="TP ranks of the reader (1: whole tensors)")
    ap.add_argument("--split-dim", type=int, default=0)
    ap.add_argument("--apply", default="overwrite",
                    help="comma list of overwrite, scatter_add")
    ap.add_argument("--backends", default="embedded,node", help="comma list of embedded, node")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--segment-size", default="256MiB", help="node daemon segment size")
    ap.add_argument("--num-segments", type=int, default=4, help="node daemon segments")
    args = ap.parse_args(argv)
    args.ks = [int(x) for x in args.ks.split(",") if x]
    emit = Emitter(args.json)
    # The harness's own torch work (resets, checks, the trainer's weights) on one thread: on a
    # small shared machine torch's thread pool costs far more than it gains for these copies.
    torch.set_num_threads(1)
    emit({"what": "catchup_machine", "python": platform.python_version(),
          "torch": torch.__version__, "cpus": os.cpu_count(), "machine": platform.machine(),
          "loadavg": list(os.getloadavg()),
          "argv": argv_record(sys.argv[1:] if argv is None else list(argv))})
    for backend in [b for b in args.backends.split(",") if b]:
        for apply in [a for a in args.apply.split(",") if a]:
            if backend == "embedded":
                run_backend(mcs.connect(), backend, apply, args, emit)
            elif backend == "node":
                from mooncake.sparse.testing import start_node_daemon

                with tempfile.TemporaryDirectory(prefix="mcs-catchup-") as tmp:
                    with start_node_daemon(tmp, segment_size=args.segment_size,
                                           num_segments=args.num_segments) as daemon:
                        store = mcs.connect(daemon.url)
                        try:
                            run_backend(store, backend, apply, args, emit)
                        finally:
                            store.close()
            else:
                raise SystemExit(f"unknown backend {backend!r}")


if __name__ == "__main__":
    main()
