"""Worker functions for the multi-process node-daemon tests (started with the 'spawn' context,
so they live in an importable module of their own)."""

from __future__ import annotations

import os
import time
import traceback

import numpy as np

GEN = (0, 1)

# The 8-process dedup scenario: one non-EP weight read by EP2 x TP4 ranks, and a few experts
# (owner(expert), expert x hosted by EP rank x % EP) split by TP.
EP, TP = 2, 4
SHARED = ("layers.0.attn.wo", (1024, 512), 30000)
EXPERTS = [(f"layers.0.mlp.experts.{x}.w1", (256, 128), 3000) for x in range(4)]


def coo(seed: int, shape, nnz: int):
    """Deterministic unique coordinates and float32 values."""
    rng = np.random.default_rng(seed)
    total = int(np.prod(shape))
    flat = rng.choice(total, size=min(nnz, total), replace=False)
    idx = np.stack(np.unravel_index(flat, shape), axis=1).astype(np.int64)
    vals = rng.standard_normal(len(flat)).astype(np.float32)
    return idx, vals


def dense(shape, idx, vals):
    w = np.zeros(shape, np.float32)
    w[tuple(idx.T)] = vals
    return w


def commit_scenario(url: str) -> None:
    import mooncake.sparse as mcs

    store = mcs.connect(url)
    name, shape, nnz = SHARED
    idx, vals = coo(1, shape, nnz)
    store.put_sparse_object(name, shape, idx, vals, placement_policy="replicate(ep)",
                            generation=GEN)
    for x, (ename, eshape, ennz) in enumerate(EXPERTS):
        idx, vals = coo(100 + x, eshape, ennz)
        store.put_sparse_object(ename, eshape, idx, vals, source_placement={"expert": x},
                                placement_policy="owner(expert)", generation=GEN)


def rank_targets(ep: int, tp: int):
    import mooncake.sparse as mcs

    node = "node0"
    rank = f"{node}/rank{ep * TP + tp}"
    out = []
    name, shape, _ = SHARED
    part = shape[0] // TP
    out.append(mcs.Target(name, rank, node, {"ep": ep, "tp": tp}, (tp * part, 0),
                          (part, shape[1])))
    for x, (ename, eshape, _) in enumerate(EXPERTS):
        if x % EP != ep:
            continue
        part = eshape[0] // TP
        out.append(mcs.Target(ename, rank, node, {"ep": ep, "tp": tp, "expert": x},
                              (tp * part, 0), (part, eshape[1])))
    return out


def reference_shards(ep: int, tp: int):
    refs = []
    name, shape, nnz = SHARED
    full = dense(shape, *coo(1, shape, nnz))
    part = shape[0] // TP
    refs.append(full[tp * part:(tp + 1) * part])
    for x, (ename, eshape, ennz) in enumerate(EXPERTS):
        if x % EP != ep:
            continue
        full = dense(eshape, *coo(100 + x, eshape, ennz))
        part = eshape[0] // TP
        refs.append(full[tp * part:(tp + 1) * part])
    return refs


def dedup_reader(url: str, ep: int, tp: int, barrier, results) -> None:
    """One inference rank: reads its own targets, applies them, compares with numpy."""
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url, client_name=f"rank{ep * TP + tp}")
        manifest = store.manifest(GEN)
        targets = rank_targets(ep, tp)
        barrier.wait(timeout=60)
        t0 = time.perf_counter()
        objs = store.read_sparse_objects(manifest, targets)
        seconds = time.perf_counter() - t0
        ok = True
        zero_copy = all(not o.indices.flags.writeable for o in objs)
        requested_bytes = 0
        for obj, ref in zip(objs, reference_shards(ep, tp)):
            shard = np.zeros(obj.local_shape, np.float32)
            mcs.apply_sparse_object(shard, obj)
            ok = ok and np.array_equal(shard, ref)
            requested_bytes += obj.nnz * (2 * 2 + 4)
        results.put({"rank": (ep, tp), "ok": bool(ok), "zero_copy": zero_copy,
                     "objects": len(objs), "seconds": seconds,
                     "requested_bytes": requested_bytes})
    except Exception:  # noqa: BLE001 - reported to the parent
        results.put({"rank": (ep, tp), "ok": False, "error": traceback.format_exc()})


def admit_racer(url: str, writer: str, barrier, results) -> None:
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url)
        barrier.wait(timeout=60)
        won = store.admit("race.w", (3, 4), "owner(expert)", {"expert": 5}, writer)
        again = store.admit("race.w", (3, 4), "owner(expert)", {"expert": 5}, writer)
        results.put({"writer": writer, "won": bool(won), "again": bool(again)})
    except Exception:  # noqa: BLE001
        results.put({"writer": writer, "error": traceback.format_exc()})


def tagged(tag: int, nbytes: int) -> np.ndarray:
    return np.full(nbytes // 8, tag, dtype=np.uint64)


def upsert_writer(url: str, key: str, nbytes: int, first_tag: int, ready) -> None:
    """Upserts `key` forever with increasing tags (until killed)."""
    import mooncake.sparse as mcs

    store = mcs.connect(url)
    tag = first_tag
    store.objects.put(key, {"a": tagged(tag, nbytes), "b": tagged(tag, nbytes // 2)},
                      metadata=str(tag).encode(), mode="upsert")
    ready.set()
    while True:
        tag += 1
        store.objects.put(key, {"a": tagged(tag, nbytes), "b": tagged(tag, nbytes // 2)},
                          metadata=str(tag).encode(), mode="upsert")


def commit_writer(url: str, prefix: str, ready, limit: int = 30) -> None:
    """Commits large sparse objects under fresh tensor ids until killed (or `limit`)."""
    import mooncake.sparse as mcs

    store = mcs.connect(url)
    shape = (2048, 1024)
    idx, vals = coo(7, shape, 200000)
    i = 0
    while i < limit:
        store.put_sparse_object(f"{prefix}.{i}", shape, idx, vals,
                                placement_policy="replicate(ep)", generation=GEN)
        if i == 0:
            ready.set()
        i += 1


def object_reader(url: str, key: str, stop, results) -> None:
    """Reads `key` through leases and copies until `stop`; every read must be one whole
    version (uniform tag equal to the metadata)."""
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url)
        reads = torn = 0
        while not stop.is_set():
            meta, members = store.backend.lease_object(key)
            tag = int(meta)
            a, b = members["a"], members["b"]
            if not (np.all(a == tag) and np.all(b == tag)):
                torn += 1
            info, copies = store.objects.get(key)
            ca = copies["a"]
            if not np.all(ca == ca[0]):
                torn += 1
            del a, b, members
            reads += 1
        results.put({"reads": reads, "torn": torn})
    except Exception:  # noqa: BLE001
        results.put({"error": traceback.format_exc()})


def sparse_writer(url: str, writer: int, count: int, results) -> None:
    """Commits `count` tensors of its own, then reads them all back."""
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url)
        shape = (256, 256)
        for i in range(count):
            idx, vals = coo(1000 * writer + i, shape, 2000)
            store.put_sparse_object(f"w{writer}.t{i}", shape, idx, vals,
                                    placement_policy="replicate(ep)", generation=GEN)
        results.put({"writer": writer, "ok": True})
    except Exception:  # noqa: BLE001
        results.put({"writer": writer, "ok": False, "error": traceback.format_exc()})


def sparse_reader(url: str, writers: int, count: int, deadline: float, results) -> None:
    """Reads whatever has been committed until every tensor is there; checks each one."""
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url)
        shape = (256, 256)
        checked = set()
        while len(checked) < writers * count and time.time() < deadline:
            manifest = [s for s in store.manifest(GEN) if s.tensor_id not in checked]
            for src in manifest:
                w, i = (int(p[1:]) for p in src.tensor_id.split("."))
                t = mcs.Target(src.tensor_id, f"r{os.getpid()}", "node0", {"ep": 0}, (0, 0), shape)
                (obj,) = store.read_sparse_objects([src], [t])
                got = np.zeros(shape, np.float32)
                mcs.apply_sparse_object(got, obj)
                if not np.array_equal(got, dense(shape, *coo(1000 * w + i, shape, 2000))):
                    results.put({"ok": False, "error": f"{src.tensor_id} differs"})
                    return
                checked.add(src.tensor_id)
            time.sleep(0.01)
        results.put({"ok": len(checked) == writers * count, "checked": len(checked)})
    except Exception:  # noqa: BLE001
        results.put({"ok": False, "error": traceback.format_exc()})


def looping_reader(url: str, stop, results, connected=None, reconnected=None) -> None:
    """Calls the daemon in a loop across a daemon kill + restart; records error types. Sets
    `connected` after its first call answered, `reconnected` after its first call answered
    after an error (so that the test waits for each, however slow the machine)."""
    try:
        import mooncake.sparse as mcs

        store = mcs.connect(url, call_timeout=5.0, connect_timeout=1.0)
        ok = 0
        errors: dict[str, int] = {}
        ok_after_error = 0
        while not stop.is_set():
            try:
                store.list_keys("")
                ok += 1
                if connected is not None:
                    connected.set()
                if errors:
                    ok_after_error += 1
                    if reconnected is not None:
                        reconnected.set()
            except mcs.Error as e:  # Unavailable while the daemon is down
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                time.sleep(0.02)
        results.put({"ok": ok, "errors": errors, "ok_after_error": ok_after_error})
    except Exception:  # noqa: BLE001
        results.put({"error": traceback.format_exc()})


def in_process_server_dumpable(socket_path: str, results) -> None:
    """PR_GET_DUMPABLE before and after this process starts an in-process node daemon."""
    try:
        import ctypes

        from mooncake.sparse.node import NodeDaemon

        libc = ctypes.CDLL(None, use_errno=True)
        pr_get_dumpable = 3
        before = libc.prctl(pr_get_dumpable, 0, 0, 0, 0)
        daemon = NodeDaemon(socket_path, segment_size=2 << 20, num_segments=1)
        after = libc.prctl(pr_get_dumpable, 0, 0, 0, 0)
        daemon.stop()
        results.put(("ok", before, after))
    except Exception:  # pragma: no cover - reported to the parent
        results.put(("error", traceback.format_exc(), None))
