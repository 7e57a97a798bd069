"""End-to-end behaviour of the sparse object layer on the embedded store."""

import numpy as np
import pytest

import mooncake.sparse as mcs
from conftest import dense_of, random_coo, snapshot

GEN = (0, 1)


def targets_ep_tp(tensor_id, shape, ep, tp, split_dim, node="node0", expert=None):
    out = []
    for e in range(ep):
        for t in range(tp):
            off = [0] * len(shape)
            loc = list(shape)
            part = shape[split_dim] // tp
            off[split_dim] = t * part
            loc[split_dim] = part
            placement = {"ep": e, "tp": t}
            if expert is not None:
                placement["expert"] = expert
            out.append(mcs.Target(tensor_id, f"{node}/rank{e * tp + t}", node, placement, off, loc))
    return out


def apply_all(objs, targets, base):
    shards = []
    for obj, t in zip(objs, targets):
        sl = tuple(slice(o, o + s) for o, s in zip(t.global_offset, t.local_shape))
        shard = np.array(base[sl], order="C", copy=True)
        mcs.apply_sparse_object(shard, obj)
        shards.append((sl, shard))
    return shards


def test_non_ep_weight_ep2_tp2_acceptance(store, rng):
    shape = (2048, 7168)
    idx, vals = random_coo(rng, shape, 20000)
    store.put_sparse_object("shared.w1", shape, idx, vals, placement_policy="replicate(ep)",
                            generation=GEN)
    targets = targets_ep_tp("shared.w1", shape, 2, 2, split_dim=0)
    store.reset_metrics()
    objs = store.read_sparse_objects(store.manifest(GEN), targets)
    m = store.metrics()
    assert len(store.manifest(GEN)) == 1
    assert m["range_gets"] == 2
    assert m["full_gets"] == 0
    # The tile index the commit cached for the node's reads: none loaded.
    assert m["index_gets"] == 0 and m["index_cache_hits"] == 1
    assert m["target_objects_published"] == 4
    # No entry is read twice on the node: the two ranges together are the object once.
    entry_bytes = 2 * 2 + 4
    assert m["range_bytes_read"] == len(vals) * entry_bytes
    ref = dense_of(shape, idx, vals)
    for sl, shard in apply_all(objs, targets, np.zeros(shape, np.float32)):
        np.testing.assert_array_equal(shard, ref[sl])
    # Adjacent TP ranges coalesced into one read when asked.
    store.clear_caches()
    store.reset_metrics()
    store.read_sparse_objects(store.manifest(GEN), targets, read_coalesce_gap=0)
    assert store.metrics()["range_gets"] == 1


def test_ep_expert_routes_only_to_owner(store, rng):
    shape = (256, 512)
    experts = 8
    ref = {}
    for e in range(experts):
        idx, vals = random_coo(rng, shape, 500)
        store.put_sparse_object(f"experts.{e}.w1", shape, idx, vals, source_placement={"expert": e},
                                placement_policy="owner(expert)", generation=GEN)
        ref[e] = dense_of(shape, idx, vals)
    manifest = store.manifest(GEN)
    assert len(manifest) == experts
    # Inference EP4 (training may have used any EP size): rank r hosts experts 2r, 2r+1, TP2.
    for e in range(experts):
        targets = [
            mcs.Target(f"experts.{e}.w1", f"node0/rank{e // 2}/tp{t}", "node0",
                       {"expert": e, "tp": t}, (t * 128, 0), (128, 512))
            for t in range(2)
        ]
        objs = store.read_sparse_objects(manifest, targets)
        for sl, shard in apply_all(objs, targets, np.zeros(shape, np.float32)):
            np.testing.assert_array_equal(shard, ref[e][sl])
    # A target of expert 3 that names expert 5's ordinal matches nothing: not covered.
    bad = mcs.Target("experts.3.w1", "x", "node0", {"expert": 5}, (0, 0), shape)
    with pytest.raises(mcs.NotFound):
        store.read_sparse_objects(manifest, [bad])


def test_ep_only_whole_tensor(store, rng):
    shape = (64, 96)
    idx, vals = random_coo(rng, shape, 300)
    store.put_sparse_object("w", shape, idx, vals, generation=GEN)
    t = mcs.Target("w", "r0", "node0", {"ep": 0}, (0, 0), shape)
    store.reset_metrics()
    (obj,) = store.read_sparse_objects(store.manifest(GEN), [t])
    assert store.metrics()["range_gets"] == 1
    assert obj.nnz == len(vals)
    w = np.zeros(shape, np.float32)
    mcs.apply_sparse_object(w, obj)
    np.testing.assert_array_equal(w, dense_of(shape, idx, vals))


def test_node_cache_hits(store, rng):
    shape = (512, 512)
    idx, vals = random_coo(rng, shape, 3000)
    store.put_sparse_object("w", shape, idx, vals, placement_policy="replicate(ep)", generation=GEN)
    manifest = store.manifest(GEN)
    targets = targets_ep_tp("w", shape, 1, 2, split_dim=1)
    store.read_sparse_objects(manifest, targets)
    first = store.metrics()
    # Another process-local batch on the same node for the other EP replica: all cached.
    targets2 = [mcs.Target(t.tensor_id, t.target_id + "b", t.node_id, t.placement, t.global_offset,
                           t.local_shape) for t in targets]
    store.read_sparse_objects(manifest, targets2)
    second = store.metrics()
    assert second["range_gets"] == first["range_gets"]
    assert second["index_gets"] == first["index_gets"] == 0  # cached by the commit
    assert second["index_cache_hits"] == first["index_cache_hits"] + 1
    assert second["cache_hits"] > first["cache_hits"]


@pytest.mark.parametrize("apply", ["overwrite", "scatter_add"])
def test_read_in_place_builds_the_same_targets(store, rng, apply):
    shape = (512, 384)
    idx, vals = random_coo(rng, shape, 5000)
    store.put_sparse_object("w", shape, idx, vals, apply=apply, generation=GEN)
    manifest = store.manifest(GEN)
    targets = targets_ep_tp("w", shape, 2, 3, split_dim=1)
    copied = store.read_sparse_objects(manifest, targets)
    store.clear_caches()
    store.reset_metrics()
    viewed = store.read_sparse_objects(manifest, targets, view_in_place=True)
    m = store.metrics()
    assert m["range_cache_hits"] == 0 and m["full_gets"] == 0 and m["range_gets"] >= 3
    for a, b in zip(copied, viewed):
        assert (a.target_id, a.nnz, a.apply) == (b.target_id, b.nnz, b.apply)
        np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))
        assert np.asarray(a.values).tobytes() == np.asarray(b.values).tobytes()
    # Viewed again: nothing was cached, the ranges are viewed again.
    store.read_sparse_objects(manifest, targets, view_in_place=True)
    assert store.metrics()["range_gets"] == 2 * m["range_gets"]
    with pytest.raises(mcs.InvalidArgument):
        store.read_sparse_objects(manifest, targets, view_in_place="yes")


def test_repeated_reads_take_their_target_memory_from_the_pool(store, rng):
    # Each step's target objects are carved from pooled chunks; once a step's objects are
    # dropped the next step's read takes those chunks again instead of new memory.
    shape = (2048, 2048)
    idx, vals = random_coo(rng, shape, 400000)  # 12.8 MB of target objects a step
    store.put_sparse_object("w", shape, idx, vals, generation=GEN)
    manifest = store.manifest(GEN)
    targets = targets_ep_tp("w", shape, 4, 8, split_dim=1)
    ref = dense_of(shape, idx, vals)
    before = mcs.host_memory()
    chunks = []
    for _ in range(6):
        # One thread: each materializing thread carves from a chunk of its own.
        objs = store.read_sparse_objects(manifest, targets, num_threads=1)
        for sl, shard in apply_all(objs, targets, np.zeros(shape, np.float32)):
            np.testing.assert_array_equal(shard, ref[sl])
        del objs
        chunks.append(mcs.host_memory()["pooled_chunks"])
    after = mcs.host_memory()
    assert after["pooled_allocations"] >= before["pooled_allocations"] + 6 * 2 * len(targets)
    assert after["pooled_chunk_reuses"] > before["pooled_chunk_reuses"]
    # A step starts carving where the last one stopped: at most one chunk more, no growth.
    assert chunks[-1] <= chunks[0] + 1
    mcs.trim_host_memory()
    trimmed = mcs.host_memory()
    assert trimmed["pooled_free_chunks"] == 0 and trimmed["cache_free_bytes"] == 0
    assert trimmed["pooled_bytes"] == trimmed["pooled_chunks"] * 4 * 2**20


@pytest.mark.parametrize("apply", ["overwrite", "scatter_add"])
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_random_boxes_match_numpy(store, rng, apply, ndim):
    for trial in range(6):
        shape = tuple(int(x) for x in rng.integers(3, 70, size=ndim))
        total = int(np.prod(shape))
        idx, vals = random_coo(rng, shape, int(rng.integers(0, total // 3 + 1)))
        tile = tuple(int(x) for x in rng.integers(1, 9, size=ndim))
        tid = f"t{ndim}.{trial}.{apply}"
        store.put_sparse_object(tid, shape, idx, vals, generation=GEN, apply=apply, tile_shape=tile)
        base = rng.standard_normal(shape).astype(np.float32)
        ref = base.copy()
        if apply == "overwrite":
            ref[tuple(idx.T)] = vals
        else:
            ref[tuple(idx.T)] += vals
        targets = []
        for k in range(4):
            lo = [int(rng.integers(0, s)) for s in shape]
            ext = [int(rng.integers(1, s - l + 1)) for s, l in zip(shape, lo)]
            targets.append(mcs.Target(tid, f"r{k}", f"node{k % 2}", {}, lo, ext))
        objs = store.read_sparse_objects(store.manifest(GEN), targets)
        for sl, shard in apply_all(objs, targets, base):
            np.testing.assert_allclose(shard, ref[sl], rtol=0, atol=0 if apply == "overwrite" else 1e-6)


def test_empty_update_is_a_noop(store):
    shape = (16, 16)
    store.put_sparse_object("e", shape, np.zeros((0, 2), np.int64), np.zeros(0, np.float32), generation=GEN)
    (obj,) = store.read_sparse_objects(store.manifest(GEN), [mcs.Target("e", "r", "n", {}, (0, 0), shape)])
    assert obj.nnz == 0
    w = np.ones(shape, np.float32)
    mcs.apply_sparse_object(w, obj)
    assert (w == 1).all()


def test_partial_sources_cover_a_target(store, rng):
    shape = (64, 64)
    idx, vals = random_coo(rng, shape, 400)
    for half in range(2):
        sel = (idx[:, 0] >= 32 * half) & (idx[:, 0] < 32 * (half + 1))
        store.put_sparse_object("p", shape, idx[sel], vals[sel], source_placement={"ep": half},
                                placement_policy="owner(ep)", generation=GEN,
                                global_offset=(32 * half, 0), local_shape=(32, 64))
    t = mcs.Target("p", "r", "n", {"ep": 0}, (16, 0), (32, 64))
    with pytest.raises(mcs.NotFound):  # owner(ep) routes only the ep=0 half: not covered
        store.read_sparse_objects(store.manifest(GEN), [t])


def test_admission_exactly_one_writer(store):
    winners = [store.admit("shared.w", GEN, "replicate(ep)", {}, f"ep{r}") for r in range(8)]
    assert winners.count(True) == 1
    w = winners.index(True)
    assert store.admit("shared.w", GEN, "replicate(ep)", {}, f"ep{w}")  # retry by the winner


def test_idempotent_commit_and_conflict(store, rng):
    shape = (32, 32)
    idx, vals = random_coo(rng, shape, 50)
    info = store.put_sparse_object("w", shape, idx, vals, generation=GEN, return_info=True)
    assert info["created"]
    again = store.put_sparse_object("w", shape, idx, vals, generation=GEN, return_info=True)
    assert again["source_ref"] == info["source_ref"] and not again["created"]
    before = snapshot(store)
    with pytest.raises(mcs.Conflict):
        store.put_sparse_object("w", shape, idx, vals + 1, generation=GEN)
    assert snapshot(store) == before


def test_generation_fencing(store, rng):
    shape = (32, 32)
    idx, vals = random_coo(rng, shape, 10)
    store.put_sparse_object("w", shape, idx, vals, generation=(0, 1))
    store.put_sparse_object("w", shape, idx, vals, generation=(1, 2))
    assert store.current_generation("w") == (1, 2)
    before = snapshot(store)
    with pytest.raises(mcs.StaleGeneration):
        store.put_sparse_object("w", shape, idx, vals + 1, generation=(0, 3))
    with pytest.raises(mcs.InvalidArgument):
        store.put_sparse_object("w", shape, idx, vals, generation=(2, 2))
    with pytest.raises(mcs.InvalidArgument):
        store.put_sparse_object("w", shape, idx, vals, generation=(3, 2))
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "mutate, exc",
    [
        (lambda i, v: (i + np.array([32, 0]), v), mcs.InvalidArgument),  # out of range
        (lambda i, v: (i - np.array([1, 0]) * (i[:, :1] == 0), v), mcs.InvalidArgument),  # negative
        (lambda i, v: (i, v[:-1]), mcs.InvalidArgument),  # length mismatch
        (lambda i, v: (i.astype(np.float32), v), mcs.InvalidArgument),  # float indices
        (lambda i, v: (i, v.astype(bool)), mcs.InvalidArgument),  # bool values
        (lambda i, v: (i[:, :1], v), mcs.InvalidArgument),  # rank mismatch
        (lambda i, v: (np.concatenate([i, i[:1]]), np.concatenate([v, v[:1]])), mcs.InvalidArgument),  # dup
    ],
)
def test_bad_input_leaves_store_unchanged(store, rng, mutate, exc):
    shape = (32, 32)
    idx, vals = random_coo(rng, shape, 40)
    idx[0] = (0, 0)
    store.put_sparse_object("ok", shape, idx, vals, generation=GEN)
    before = snapshot(store)
    bad_idx, bad_vals = mutate(idx.copy(), vals.copy())
    with pytest.raises(exc):
        store.put_sparse_object("bad", shape, bad_idx, bad_vals, generation=GEN)
    assert snapshot(store) == before
    assert [s.tensor_id for s in store.manifest(GEN)] == ["ok"]


def test_duplicates_sum_for_scatter_add(store):
    shape = (8, 8)
    idx = np.array([[1, 2], [1, 2], [3, 3]])
    vals = np.array([1.0, 2.0, 5.0], np.float32)
    with pytest.raises(mcs.InvalidArgument):
        store.put_sparse_object("d", shape, idx, vals, generation=GEN, apply="overwrite", duplicates="sum")
    store.put_sparse_object("d", shape, idx, vals, generation=GEN, apply="scatter_add", duplicates="sum")
    (obj,) = store.read_sparse_objects(store.manifest(GEN), [mcs.Target("d", "r", "n", {}, (0, 0), shape)])
    w = np.zeros(shape, np.float32)
    mcs.apply_sparse_object(w, obj)
    assert w[1, 2] == 3.0 and w[3, 3] == 5.0 and obj.nnz == 2


def test_apply_rejects_wrong_weight(store, rng):
    shape = (16, 16)
    idx, vals = random_coo(rng, shape, 20)
    store.put_sparse_object("w", shape, idx, vals, generation=GEN)
    (obj,) = store.read_sparse_objects(store.manifest(GEN), [mcs.Target("w", "r", "n", {}, (0, 0), shape)])
    with pytest.raises(mcs.InvalidArgument):
        mcs.apply_sparse_object(np.zeros((16, 15), np.float32), obj)
    with pytest.raises(mcs.InvalidArgument):
        mcs.apply_sparse_object(np.zeros(shape, np.float64), obj)
    ro = np.zeros(shape, np.float32)
    ro.setflags(write=False)
    with pytest.raises(mcs.InvalidArgument):
        mcs.apply_sparse_object(ro, obj)


def test_errors_are_typed():
    assert issubclass(mcs.InvalidArgument, ValueError)
    assert issubclass(mcs.NotFound, KeyError)
    for cls in (mcs.StaleGeneration, mcs.Conflict, mcs.InvalidArgument, mcs.NotFound):
        assert issubclass(cls, mcs.Error)
    with pytest.raises(mcs.InvalidArgument):
        mcs.connect("bogus://x")


def test_pep420_namespace():
    """This package ships no mooncake/__init__.py: the namespace is shared with upstream's
    wheel, which may provide one (then mooncake is upstream's regular package)."""
    import importlib.metadata

    import mooncake
    import mooncake.sparse

    try:
        files = importlib.metadata.files("mooncake-sparse") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    assert "mooncake/__init__.py" not in {str(f) for f in files}
    init = getattr(mooncake, "__file__", None)
    assert init is None or "sparse" not in init
    assert mooncake.sparse.__name__ == "mooncake.sparse"
