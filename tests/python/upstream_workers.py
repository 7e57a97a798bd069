"""Worker functions of the many-node tests on upstream Mooncake Store (test_upstream.py),
started with the 'spawn' context, so they live in an importable module of their own.

The scenario: the trainer on node A (its own Mooncake client and segment) commits one RL step
of a small MoE layer; inference ranks on node B (EP2 x TP2, a node daemon hosted in Python on
the same Mooncake master) read their boxes through the daemon and apply them.
"""

from __future__ import annotations

import traceback

import numpy as np

EP, TP = 2, 2
# A non-EP weight read by every rank (replicate(ep): each EP rank reads the same TP box) and
# one expert per EP rank (owner(expert)), split by TP along columns.
SHARED = ("layers.0.attn.wq", (512, 256), 0.02)
EXPERTS = [(f"layers.0.mlp.experts.{x}.w1", (256, 192), 0.02) for x in range(EP)]


def weights(seed: int, shape, density: float):
    """Deterministic (old, new) bf16-like float32 weights that differ in ~density of entries."""
    rng = np.random.default_rng(seed)
    old = rng.standard_normal(shape).astype(np.float32)
    new = old.copy()
    mask = rng.random(shape) < density
    new[mask] += rng.standard_normal(int(mask.sum())).astype(np.float32)
    return old, new


def tensors(seed: int):
    out = [(SHARED[0], SHARED[1], weights(seed, SHARED[1], SHARED[2]), "replicate(ep)", {})]
    for x, (name, shape, density) in enumerate(EXPERTS):
        out.append((name, shape, weights(seed + 1 + x, shape, density), "owner(expert)",
                    {"expert": x}))
    return out


def rank_boxes(ep: int, tp: int):
    """(tensor_id, placement, offset, shape) of the boxes rank (ep, tp) holds."""
    name, shape, _ = SHARED
    rows = shape[0] // TP
    out = [(name, {"ep": ep, "tp": tp}, (tp * rows, 0), (rows, shape[1]))]
    ename, eshape, _ = EXPERTS[ep]
    cols = eshape[1] // TP
    out.append((ename, {"expert": ep, "tp": tp}, (0, tp * cols), (eshape[0], cols)))
    return out


def targets_of(node: str, ep: int, tp: int):
    import mooncake.sparse as mcs

    return [mcs.Target(tid, f"{node}/rank{ep * TP + tp}", node, placement, off, shp)
            for tid, placement, off, shp in rank_boxes(ep, tp)]


def trainer(url: str, generation, seed: int, conn) -> None:
    """Node A: commit the step, report, then keep the client (and its segment, which holds the
    committed objects) alive until told to stop."""
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url)
        committed = 0
        for name, shape, (old, new), policy, placement in tensors(seed):
            idx, vals = mcs.encode_update(new, old)
            store.put_sparse_object(name, shape, idx, vals, source_placement=placement,
                                    placement_policy=policy, generation=generation)
            committed += len(vals)
        conn.send(("ok", committed, store.upstream.counters()))
        conn.recv()  # stop
        conn.send(("bye",))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def inference_rank(url: str, node: str, generation, seed: int, ep: int, tp: int, conn) -> None:
    """Node B: one rank reads its boxes through the node daemon, applies them to its shards of
    the old weights and checks them against the new ones bit for bit."""
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url)
        manifest = store.manifest(generation)
        targets = targets_of(node, ep, tp)
        objs = store.read_sparse_objects(manifest, targets)
        by_name = {name: (old, new) for name, _, (old, new), _, _ in tensors(seed)}
        exact = True
        for t, obj in zip(targets, objs):
            old, new = by_name[t.tensor_id]
            box = tuple(slice(o, o + s) for o, s in zip(t.global_offset, t.local_shape))
            shard = np.ascontiguousarray(old[box])
            mcs.apply_sparse_object(shard, obj)
            exact &= shard.tobytes() == np.ascontiguousarray(new[box]).tobytes()
        conn.send(("ok", exact, len(manifest)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def admit(url: str, writer: str, conn) -> None:
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url)
        won = store.admit("layers.9.w", (7, 8), "owner(expert)", {"expert": 3}, writer)
        conn.send(("ok", won))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


# A short training run across the two nodes: node A commits and seals steps; a reader on
# node B (a Mooncake client of its own) waits for each, reads its TP half and applies it.
RUN_SHAPES = {"w": (128, 64), "norm": (64,)}


def run_weights(seed: int, steps: int):
    """The weights after each step 0..steps (only "w" changes; "norm" never does)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(RUN_SHAPES["w"]).astype(np.float32)
    out = [{"w": w, "norm": np.ones(RUN_SHAPES["norm"], np.float32)}]
    for _ in range(steps):
        w = w.copy()
        mask = rng.random(w.shape) < 0.03
        w[mask] = rng.standard_normal(int(mask.sum())).astype(np.float32)
        out.append({"w": w, "norm": out[0]["norm"]})
    return out


def step_reader(url: str, namespace: str, seed: int, steps: int, rank: int, conn) -> None:
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url, namespace=namespace)
        ref = run_weights(seed, steps)
        rows = RUN_SHAPES["w"][0] // 2
        targets = [mcs.Target("w", f"nodeB/rank{rank}", "nodeB", {}, (rank * rows, 0),
                              (rows, RUN_SHAPES["w"][1])),
                   mcs.Target("norm", f"nodeB/rank{rank}/n", "nodeB", {}, (0,),
                              RUN_SHAPES["norm"])]
        shard = {"w": ref[0]["w"][rank * rows:(rank + 1) * rows].copy(),
                 "norm": ref[0]["norm"].copy()}
        exact = True
        conn.send(("at", 0))
        for k in range(1, steps + 1):
            manifest = store.wait_generation((k - 1, k), timeout=60)  # a seal on node A
            for t, o in zip(targets, store.read_sparse_objects(manifest, targets)):
                mcs.apply_sparse_object(shard[t.tensor_id], o)
            exact &= np.array_equal(shard["w"], ref[k]["w"][rank * rows:(rank + 1) * rows])
            exact &= np.array_equal(shard["norm"], ref[k]["norm"])
            conn.send(("at", k))
        conn.send(("ok", exact))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
