"""The batch calls of a step (docs/design.md §9): encode_updates, put_sparse_objects and
apply_sparse_objects, on the embedded store and through the node daemon: each equals its
single-object call item by item, and a bad item fails alone with its typed error."""
from __future__ import annotations

import collections.abc
import dataclasses

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse.testing import find_node_daemon, start_node_daemon

try:
    find_node_daemon()
    HAVE_DAEMON = True
except FileNotFoundError:
    HAVE_DAEMON = False


@pytest.fixture(params=["embedded", "node"])
def store(request, tmp_path):
    if request.param == "embedded":
        yield mcs.connect()
        return
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    with start_node_daemon(tmp_path, segment_size="64MiB", num_segments=2) as daemon:
        s = mcs.connect(daemon.url)
        yield s
        s.close()


def changed(rng, w, frac):
    new = w.copy()
    m = rng.random(w.shape) < frac
    new[m] = rng.standard_normal(int(m.sum())).astype(w.dtype)
    return new


def test_a_step_through_the_batch_calls_is_bit_exact(store):
    rng = np.random.default_rng(3)
    shapes = {f"w{i}": (int(rng.integers(1, 48)), int(rng.integers(1, 40))) for i in range(1200)}
    old = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    new = {n: changed(rng, w, 0.05) for n, w in old.items()}
    names = list(shapes)
    coos = mcs.encode_updates([(new[n], old[n]) for n in names])
    for n, (idx, vals) in zip(names, coos):
        one_idx, one_vals = mcs.encode_update(new[n], old[n])
        assert np.array_equal(idx, one_idx) and np.array_equal(vals, one_vals)
    results = store.put_sparse_objects(
        [{"tensor_id": n, "global_shape": shapes[n], "indices": idx, "values": vals,
          "generation": (0, 1)} for n, (idx, vals) in zip(names, coos)])
    assert all(isinstance(r, dict) and r["created"] for r in results)
    assert [r["nnz"] for r in results] == [len(v) for _, v in coos]
    store.seal_generation((0, 1), names)
    man = store.wait_generation((0, 1), timeout=10)
    # Two TP halves of every tensor, as views into the rows of one weight each.
    weights = {n: old[n].copy() for n in names}
    targets, views = [], []
    for n in names:
        rows = shapes[n][0]
        for r, (lo, hi) in enumerate(((0, rows // 2), (rows // 2, rows))):
            if hi > lo:
                targets.append(mcs.Target(n, f"{n}/tp{r}", "node0", {}, (lo, 0),
                                          (hi - lo, shapes[n][1])))
                views.append(weights[n][lo:hi])
    objs = store.read_sparse_objects(man, targets)
    mcs.apply_sparse_objects(views, objs)
    for n in names:
        assert weights[n].tobytes() == new[n].tobytes(), n
    # A retry of the whole batch is idempotent.
    again = store.put_sparse_objects(
        [{"tensor_id": n, "global_shape": shapes[n], "indices": idx, "values": vals,
          "generation": (0, 1)} for n, (idx, vals) in zip(names, coos)])
    assert all(isinstance(r, dict) and not r["created"] for r in again)


def test_a_batch_commit_leaves_the_collector_as_it_found_it(store):
    # The batch pauses Python's cyclic collector while it makes its result dicts, then restores
    # it: enabled stays enabled, disabled stays disabled, a failed update included.
    import gc
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    idx, vals = mcs.encode_update(changed(rng, w, 0.2), w)
    good = {"tensor_id": "g", "global_shape": (16, 16), "indices": idx, "values": vals,
            "generation": (0, 1)}
    bad = dict(good, tensor_id="b", global_shape=(2, 2))
    was = gc.isenabled()
    try:
        for enabled, gen in ((True, (0, 1)), (False, (1, 2))):
            gc.enable() if enabled else gc.disable()
            out = store.put_sparse_objects([dict(good, generation=gen), dict(bad, generation=gen)])
            assert isinstance(out[0], dict) and isinstance(out[1], mcs.InvalidArgument)
            assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_a_read_takes_its_manifest_in_every_form(store):
    """A step's manifest as the store gave it is read where it lies; a slice, a reversed list,
    entries of two manifests joined, or a plain list all read the same objects, and an entry
    that is not a SourceInfo is a typed error."""
    rng = np.random.default_rng(5)
    names = [f"m{i}" for i in range(40)]
    old = {n: rng.standard_normal((12, 10)).astype(np.float32) for n in names}
    for k in (1, 2):
        new = {n: changed(rng, w, 0.1) for n, w in old.items()}
        store.put_sparse_objects(
            [{"tensor_id": n, "global_shape": (12, 10), "indices": i, "values": v,
              "generation": (k - 1, k)}
             for n, (i, v) in zip(names, mcs.encode_updates([(new[n], old[n]) for n in names]))])
        store.seal_generation((k - 1, k), names)
    m1, m2 = store.manifest((0, 1)), store.manifest((1, 2))
    targets = [mcs.Target(n, f"{n}/t", "node0", {}, (0, 0), (12, 10)) for n in names]

    def contents(objs):
        return [(o.target_id, o.nnz, np.asarray(o.indices).tobytes(),
                 np.asarray(o.values).tobytes()) for o in objs]

    whole = contents(store.read_sparse_objects(m2, targets))
    assert contents(store.read_sparse_objects(list(m2), targets)) == whole
    assert contents(store.read_sparse_objects(m2[::-1], targets)) == whole
    half = len(names) // 2
    by_id = {s.tensor_id: s for s in m2}
    part = [by_id[n] for n in names[half:]]
    assert contents(store.read_sparse_objects(part, targets[half:])) == whole[half:]
    # The first half from step 1, the rest from step 2: each target reads its own step's source.
    joined = [s for s in m1 if s.tensor_id in names[:half]] + part
    mixed = contents(store.read_sparse_objects(joined, targets))
    assert mixed[half:] == whole[half:]
    assert mixed[:half] == contents(store.read_sparse_objects(m1, targets[:half]))
    del m2, by_id  # the SourceInfo of `part` keep their step's array alive
    assert contents(store.read_sparse_objects(part, targets[half:])) == whole[half:]
    with pytest.raises(mcs.InvalidArgument):
        store.read_sparse_objects(list(m1) + ["not a source"], targets)


def test_a_sealed_steps_manifest_outlives_the_stores_kept_copy(store):
    """A sealed step's manifest is the store's kept copy of it, viewed: every call gives the
    same entries, and a list keeps its entries after clear_caches and after retention frees
    the step (whose sources then read as NotFound)."""
    rng = np.random.default_rng(9)
    names = [f"k{i}" for i in range(6)]
    old = {n: rng.standard_normal((16, 8)).astype(np.float32) for n in names}
    targets = [mcs.Target(n, f"{n}/t", "node0", {}, (0, 0), (16, 8)) for n in names]
    store.set_retention(1)

    def commit(k):
        new = {n: changed(rng, w, 0.2) for n, w in old.items()}
        store.put_sparse_objects(
            [{"tensor_id": n, "global_shape": (16, 8), "indices": i, "values": v,
              "generation": (k - 1, k)}
             for n, (i, v) in zip(names, mcs.encode_updates([(new[n], old[n]) for n in names]))])
        store.seal_generation((k - 1, k), names + ["idle"])

    def entries(m):
        return [(s.source_ref, s.tensor_id, s.nnz, s.tile_shape, s.generation) for s in m]

    commit(1)
    m = store.manifest((0, 1))
    again = store.manifest((0, 1))
    assert entries(m) == entries(again) and len(m) == len(names)
    waited = store.wait_generation((0, 1), timeout=5)
    assert entries(waited) == entries(m) and waited.unchanged == ("idle",) and waited.sealed
    assert m.unchanged == again.unchanged == ("idle",)
    store.clear_caches()
    assert entries(store.manifest((0, 1))) == entries(m)
    want = [(o.target_id, o.nnz, np.asarray(o.values).tobytes())
            for o in store.read_sparse_objects(m, targets)]
    assert [(o.target_id, o.nnz, np.asarray(o.values).tobytes())
            for o in store.read_sparse_objects(again, targets)] == want
    kept = entries(m)
    commit(2)  # retention keeps one step: step 1 goes
    assert entries(m) == kept
    with pytest.raises(mcs.NotFound):
        store.manifest((0, 1))
    with pytest.raises(mcs.NotFound):
        store.read_sparse_objects(m, targets)


def test_a_target_batch_reads_as_its_list_does_at_every_step(store):
    """A TargetBatch converts its targets once: reads of every step with it give the objects
    that reads with the list give; it is a sequence of its Targets; bad targets are typed errors
    when it is made."""
    rng = np.random.default_rng(11)
    names = [f"b{i}" for i in range(5)]
    w = {n: rng.standard_normal((12, 6)).astype(np.float32) for n in names}
    targets = [mcs.Target(n, f"{n}/tp{r}", "node0", {"tp": r}, (6 * r, 0), (6, 6))
               for n in names for r in (0, 1)]
    batch = mcs.TargetBatch(targets)
    assert len(batch) == len(targets) and list(batch) == targets and batch[3] == targets[3]
    assert isinstance(batch, collections.abc.Sequence)

    def contents(objs):
        return [(o.target_id, o.nnz, o.global_offset, np.asarray(o.indices).tobytes(),
                 np.asarray(o.values).tobytes()) for o in objs]

    for k in (1, 2, 3):
        new = {n: changed(rng, x, 0.2) for n, x in w.items()}
        store.put_sparse_objects(
            [{"tensor_id": n, "global_shape": (12, 6), "indices": i, "values": v,
              "generation": (k - 1, k)}
             for n, (i, v) in zip(names, mcs.encode_updates([(new[n], w[n]) for n in names]))])
        store.seal_generation((k - 1, k), names)
        m = store.manifest((k - 1, k))
        assert contents(store.read_sparse_objects(m, batch)) == \
            contents(store.read_sparse_objects(m, targets))
        w = new
    fold = store.manifest((0, 3))
    assert contents(store.read_sparse_objects(fold, batch)) == \
        contents(store.read_sparse_objects(fold, targets))
    for bad in ("b0", None, [object()], [dataclasses.replace(targets[0], local_shape=(0, 6))]):
        with pytest.raises(mcs.InvalidArgument):
            mcs.TargetBatch(bad)


def test_targets_take_every_sequence_form_and_bad_ones_are_typed_errors(store):
    """A target's offset and shape as a tuple, a list, numpy integers, a range or a generator
    read the same object; a missing field, a non-str id or a non-integer extent is
    InvalidArgument."""
    import dataclasses

    rng = np.random.default_rng(6)
    w = rng.standard_normal((12, 10)).astype(np.float32)
    idx, vals = mcs.encode_update(changed(rng, w, 0.2), w)
    store.put_sparse_object("f", (12, 10), idx, vals, generation=(0, 1))
    store.seal_generation((0, 1), ["f"])
    m = store.manifest((0, 1))

    def read(off, shape):
        (o,) = store.read_sparse_objects(m, [mcs.Target("f", "t", "node0", {}, off, shape)])
        return o.nnz, np.asarray(o.indices).tobytes(), np.asarray(o.values).tobytes()

    want = read((4, 2), (6, 8))
    assert read([4, 2], [6, 8]) == want
    assert read((np.int64(4), np.int32(2)), np.array([6, 8])) == want
    assert read((4, 2), range(6, 9, 2)) == want
    assert read((x for x in (4, 2)), (x for x in (6, 8))) == want

    @dataclasses.dataclass
    class NoShape:
        tensor_id: str = "f"
        target_id: str = "t"
        node_id: str = "node0"
        placement: dict = dataclasses.field(default_factory=dict)
        global_offset: tuple = (0, 0)

    for bad in (NoShape(),
                mcs.Target("f", 7, "node0", {}, (0, 0), (12, 10)),
                mcs.Target("f", "t", "node0", {}, (0, 0.5), (12, 10)),
                mcs.Target("f", "t", "node0", {}, (0, 0), [12, "10"]),
                mcs.Target("f", "t", "node0", {}, (0, 0), "12"),
                mcs.Target("f", "t", "node0", {}, (0, 0), (12, 11))):
        with pytest.raises(mcs.InvalidArgument):
            store.read_sparse_objects(m, [bad])


def test_a_bad_update_fails_alone_with_its_typed_error(store):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    idx, vals = mcs.encode_update(changed(rng, w, 0.2), w)
    good = {"tensor_id": "ok", "global_shape": (16, 8), "indices": idx, "values": vals}
    store.put_sparse_object("ahead", (16, 8), idx, vals, generation=(0, 1))
    store.put_sparse_object("ahead", (16, 8), idx, vals, generation=(1, 2))
    updates = [
        good,
        {**good, "tensor_id": "out", "indices": np.array([[16, 0]], np.int64),
         "values": np.ones(1, np.float32)},                    # outside the tensor
        {**good, "tensor_id": "typo", "generaton": (0, 1)},     # unknown field
        {"tensor_id": "short", "global_shape": (16, 8)},        # no indices / values
        {**good, "tensor_id": 7},                               # not a str
        "not a dict",
        {**good, "tensor_id": "ahead", "generation": (0, 3)},   # stale: base 0 < head 2
        {**good, "tensor_id": "ok2", "apply": "scatter_add"},
    ]
    results = store.put_sparse_objects(updates)
    assert isinstance(results[0], dict) and results[0]["created"]
    assert isinstance(results[7], dict) and results[7]["created"]
    for i in (1, 2, 3, 4, 5):
        assert isinstance(results[i], mcs.InvalidArgument), (i, results[i])
        assert f"update {i}" in str(results[i])
    assert "generaton" in str(results[2])
    assert isinstance(results[6], mcs.StaleGeneration)
    # Nothing of the failed updates is in the store; the step lists the two that committed.
    assert {s.tensor_id for s in store.manifest((0, 1))} == {"ok", "ok2", "ahead"}
    assert not [k for k in store.list_keys("mcs/") if "/out/" in k or k.endswith("/out")]


def test_put_sparse_updates_encodes_and_commits_what_the_two_calls_do(store):
    rng = np.random.default_rng(11)
    shapes = {f"u{i}": (int(rng.integers(1, 40)), int(rng.integers(1, 30))) for i in range(300)}
    old = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    new = {n: changed(rng, w, 0.05) for n, w in old.items()}
    names = list(shapes)
    # The last tensor is owned as two row boxes by two updates (a trainer's TP shards).
    boxed = names[-1]
    rows = shapes[boxed][0] + 8
    shapes[boxed] = (rows, shapes[boxed][1])
    old[boxed] = rng.standard_normal(shapes[boxed]).astype(np.float32)
    new[boxed] = changed(rng, old[boxed], 0.1)
    half = rows // 2
    updates = [{"tensor_id": n, "global_shape": shapes[n], "new": new[n], "old": old[n],
                "generation": (0, 1)} for n in names[:-1]]
    for lo, hi in ((0, half), (half, rows)):
        updates.append({"tensor_id": boxed, "global_shape": shapes[boxed],
                        "new": new[boxed][lo:hi], "old": old[boxed][lo:hi],
                        "global_offset": (lo, 0), "local_shape": (hi - lo, shapes[boxed][1]),
                        "generation": (0, 1)})
    results, coos = store.put_sparse_updates(updates)
    assert all(isinstance(r, dict) and r["created"] for r in results), results
    for u, (idx, vals), r in zip(updates, coos, results):
        want_idx, want_vals = mcs.encode_update(u["new"], u["old"],
                                                global_offset=u.get("global_offset"))
        assert np.array_equal(idx, want_idx) and np.array_equal(vals, want_vals)
        assert r["nnz"] == len(vals)
    store.seal_generation((0, 1), names)
    man = store.wait_generation((0, 1), timeout=10)
    weights = {n: old[n].copy() for n in names}
    targets = [mcs.Target(n, f"{n}/all", "node0", {}, (0, 0), shapes[n]) for n in names]
    mcs.apply_sparse_objects([weights[n] for n in names], store.read_sparse_objects(man, targets))
    for n in names:
        assert weights[n].tobytes() == new[n].tobytes(), n
    # A retry is idempotent; scatter_add values are the differences.
    again, _ = store.put_sparse_updates(updates)
    assert all(isinstance(r, dict) and not r["created"] for r in again)
    _, add = store.put_sparse_updates([{**updates[0], "tensor_id": "add", "apply": "scatter_add"}])
    want = mcs.encode_update(updates[0]["new"], updates[0]["old"], apply="scatter_add")
    assert np.array_equal(add[0][1], want[1])


def test_put_sparse_updates_fails_a_bad_pair_alone_and_refuses_bad_calls(store):
    rng = np.random.default_rng(12)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    good = {"tensor_id": "ok", "global_shape": (16, 8), "new": changed(rng, w, 0.2), "old": w}
    updates = [
        good,
        {**good, "tensor_id": "shape", "old": w[:8]},            # new and old differ
        {**good, "tensor_id": "wide", "global_shape": (8, 8)},   # larger than its tensor
        {**good, "tensor_id": "ok2"},
    ]
    results, coos = store.put_sparse_updates(updates)
    assert isinstance(results[0], dict) and isinstance(results[3], dict)
    assert isinstance(results[1], mcs.InvalidArgument) and coos[1] is None
    assert isinstance(results[2], mcs.InvalidArgument) and coos[2] is not None
    assert {s.tensor_id for s in store.manifest((0, 1))} == {"ok", "ok2"}
    for bad in ({"tensor_id": "x", "global_shape": (16, 8), "new": w},
                {**good, "indices": np.zeros((0, 2), np.int64)},
                "not a mapping"):
        with pytest.raises(mcs.InvalidArgument):
            store.put_sparse_updates([good, bad])
    with pytest.raises(mcs.InvalidArgument):
        store.put_sparse_updates([good], parts=-1)
    assert store.put_sparse_updates([]) == ([], [])
    assert {s.tensor_id for s in store.manifest((0, 1))} == {"ok", "ok2"}


def test_apply_sparse_updates_reads_and_applies_as_the_two_calls_do(store):
    rng = np.random.default_rng(13)
    shapes = {f"a{i}": (int(rng.integers(2, 40)), int(rng.integers(1, 30))) for i in range(200)}
    old = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    new = {n: changed(rng, w, 0.05) for n, w in old.items()}
    names = list(shapes)
    results, _ = store.put_sparse_updates(
        [{"tensor_id": n, "global_shape": shapes[n], "new": new[n], "old": old[n]}
         for n in names])
    assert all(isinstance(r, dict) for r in results)
    store.seal_generation((0, 1), names)
    man = store.wait_generation((0, 1), timeout=10)
    # Row halves of every tensor, as views into one weight each.
    weights = {n: old[n].copy() for n in names}
    targets, views = [], []
    for n in names:
        half = shapes[n][0] // 2
        for r, (lo, hi) in enumerate(((0, half), (half, shapes[n][0]))):
            targets.append(mcs.Target(n, f"{n}/tp{r}", "node0", {}, (lo, 0),
                                      (hi - lo, shapes[n][1])))
            views.append(weights[n][lo:hi])
    want = [o.nnz for o in store.read_sparse_objects(man, targets)]
    for ts in (targets, mcs.TargetBatch(targets)):
        for n in names:
            weights[n][...] = old[n]
        assert store.apply_sparse_updates(man, ts, views) == want
        for n in names:
            assert weights[n].tobytes() == new[n].tobytes(), n
    with pytest.raises(mcs.InvalidArgument):
        store.apply_sparse_updates(man, targets, views[:-1])
    with pytest.raises(mcs.InvalidArgument):
        store.apply_sparse_updates(man, targets, views, parts=-1)


def test_put_sparse_updates_parts_cover_the_step_in_order_by_bytes():
    from mooncake.sparse._api import _split_by_bytes
    assert _split_by_bytes([1] * 10, 4) == [(0, 3), (3, 5), (5, 8), (8, 10)]
    assert _split_by_bytes([100, 1, 1, 1], 2) == [(0, 1), (1, 4)]
    assert _split_by_bytes([1, 1, 1, 100], 3) == [(0, 4)]  # nothing reaches a share before it
    assert _split_by_bytes([5, 5], 4) == [(0, 1), (1, 2)]
    assert _split_by_bytes([7], 4) == [(0, 1)]
    assert _split_by_bytes([0, 0, 0], 2) == [(0, 1), (1, 3)]
    rng = np.random.default_rng(5)
    for _ in range(200):
        sizes = [int(x) for x in rng.integers(0, 50, int(rng.integers(1, 30)))]
        got = _split_by_bytes(sizes, int(rng.integers(1, 9)))
        assert got[0][0] == 0 and got[-1][1] == len(sizes)
        assert all(lo < hi for lo, hi in got)
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))


def test_batch_calls_take_torch_and_return_torch():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    olds = [torch.randn(32, 24, generator=g).to(torch.bfloat16) for _ in range(20)]
    news = [o.clone() for o in olds]
    for n in news:
        n.view(-1)[torch.randint(0, n.numel(), (40,), generator=g)] += 1
    coos = mcs.encode_updates(list(zip(news, olds)))
    for (idx, vals), n, o in zip(coos, news, olds):
        assert isinstance(idx, torch.Tensor) and isinstance(vals, torch.Tensor)
        assert vals.dtype == torch.bfloat16
        one_idx, one_vals = mcs.encode_update(n, o)
        assert isinstance(one_idx, torch.Tensor)
        assert torch.equal(idx, one_idx) and torch.equal(vals, one_vals)
    s = mcs.connect()
    res = s.put_sparse_objects([{"tensor_id": f"t{i}", "global_shape": (32, 24), "indices": idx,
                                 "values": vals} for i, (idx, vals) in enumerate(coos)])
    assert all(isinstance(r, dict) for r in res)
    s.seal_generation((0, 1), [f"t{i}" for i in range(20)])
    # Columns 8..24 of each weight: strided views of a larger tensor, written in place.
    big = torch.stack(olds)  # [20, 32, 24]
    targets = [mcs.Target(f"t{i}", f"c{i}", "node0", {}, (0, 8), (32, 16)) for i in range(20)]
    objs = s.read_sparse_objects(s.manifest((0, 1)), targets)
    mcs.apply_sparse_objects([big[i, :, 8:] for i in range(20)], objs)
    for i in range(20):
        assert torch.equal(big[i, :, 8:], news[i][:, 8:])
        assert torch.equal(big[i, :, :8], olds[i][:, :8])


def test_apply_sparse_objects_checks_before_writing():
    s = mcs.connect()
    w = np.zeros((8, 8), np.float32)
    s.put_sparse_object("w", (8, 8), np.array([[1, 1]], np.int64), np.ones(1, np.float32))
    s.seal_generation((0, 1), ["w"])
    objs = s.read_sparse_objects(s.manifest((0, 1)),
                                 [mcs.Target("w", "a", "node0", {}, (0, 0), (8, 8))] * 2)
    a, b = np.zeros((8, 8), np.float32), np.zeros((4, 8), np.float32)
    with pytest.raises(mcs.InvalidArgument, match=r"weights\[1\] shape"):
        mcs.apply_sparse_objects([a, b], objs)
    assert not a.any()  # nothing was written
    with pytest.raises(mcs.InvalidArgument, match="2 weights but 1"):
        mcs.apply_sparse_objects([a, w], objs[:1])
    f64 = np.zeros((8, 8), np.float64)
    with pytest.raises(mcs.InvalidArgument, match=r"weights\[1\]"):
        mcs.apply_sparse_objects([a, f64], objs)
    assert a[1, 1] == 1.0 and not f64.any()  # the good one applied, the bad one untouched


def test_apply_sparse_objects_on_cuda_weights_of_one_and_two_dims():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    s = mcs.connect()
    g = torch.Generator().manual_seed(8)
    vec_old, mat_old = torch.randn(300, generator=g), torch.randn(40, 30, generator=g)
    vec_new, mat_new = vec_old.clone(), mat_old.clone()
    vec_new[::7] += 1
    mat_new[::3, 1::4] -= 1
    for name, new, old in (("vec", vec_new, vec_old), ("mat", mat_new, mat_old)):
        idx, vals = mcs.encode_update(new, old)
        s.put_sparse_object(name, tuple(new.shape), idx, vals)
    s.seal_generation((0, 1), ["vec", "mat"])
    # Every other element of a longer CUDA vector (a strided 1-D view), and columns of a matrix.
    big_vec = torch.zeros(600, device="cuda")
    big_vec[::2] = vec_old.cuda()
    big_mat = torch.zeros(40, 50, device="cuda")
    big_mat[:, 10:40] = mat_old.cuda()
    targets = [mcs.Target("vec", "v", "node0", {}, (0,), (300,)),
               mcs.Target("mat", "m", "node0", {}, (0, 0), (40, 30))]
    for device in (None, "cuda"):
        big_vec[::2] = vec_old.cuda()
        big_mat[:, 10:40] = mat_old.cuda()
        objs = s.read_sparse_objects(s.manifest((0, 1)), targets, device=device)
        mcs.apply_sparse_objects([big_vec[::2], big_mat[:, 10:40]], objs)
        torch.cuda.synchronize()
        assert torch.equal(big_vec[::2].cpu(), vec_new) and not big_vec[1::2].any()
        assert torch.equal(big_mat[:, 10:40].cpu(), mat_new)
        assert not big_mat[:, :10].any() and not big_mat[:, 40:].any()


def test_admit_batch_admits_as_admit_does_one_outcome_per_item(store):
    gen = (0, 1)
    items = [{"tensor_id": f"t{i}", "generation": gen, "placement_policy": "owner(expert)",
              "source_placement": {"expert": i}, "writer_id": "w0"} for i in range(300)]
    assert store.admit_batch(items) == [True] * 300
    # Again by the same writer: still its own; another writer is refused, key by key, and a
    # key nobody holds yet goes to it.
    assert store.admit_batch(items[:2]) == [True, True]
    other = [{**it, "writer_id": "w1"} for it in items[:3]]
    other.append({"tensor_id": "fresh", "generation": gen, "writer_id": "w1"})
    assert store.admit_batch(other) == [False, False, False, True]
    for i in (0, 150, 299):
        assert store.admit(f"t{i}", gen, "owner(expert)", {"expert": i}, "w1") is False
    # A bad item fails alone with its typed error; the others are admitted.
    mixed = [{"tensor_id": "a", "generation": gen, "writer_id": "w2"},
             {"tensor_id": "b", "generation": (3, 2), "writer_id": "w2"},
             {"tensor_id": "c", "generation": gen, "placement_policy": "sideways",
              "writer_id": "w2"},
             {"tensor_id": "d", "generation": gen, "source_placement": {"expert": "x"},
              "writer_id": "w2"},
             {"tensor_id": "e", "generation": gen, "writer_id": "w2"}]
    got = store.admit_batch(mixed)
    assert got[0] is True and got[4] is True
    for r in got[1:4]:
        assert isinstance(r, mcs.InvalidArgument), got
    assert store.admit("e", gen, None, {}, "w3") is False
    assert store.admit_batch([]) == []
    # More than one request's worth through the daemon (4,096 per request), in order.
    many = [{"tensor_id": f"m{i}", "generation": gen, "writer_id": "w4"} for i in range(9000)]
    many[5000] = {**many[5000], "generation": (1, 1)}  # bad, in the second request
    got = store.admit_batch(many)
    assert isinstance(got[5000], mcs.InvalidArgument)
    assert got[:5000] == [True] * 5000 and got[5001:] == [True] * 3999
    assert store.admit_batch([{**it, "writer_id": "w5"} for it in many[4090:4100]]) == [False] * 10
    with pytest.raises(mcs.InvalidArgument):
        store.admit_batch([{"tensor_id": "x", "generation": gen}])  # no writer_id
    with pytest.raises(mcs.InvalidArgument):
        store.admit_batch([{"tensor_id": "x", "generation": gen, "writer_id": "w",
                            "placement": None}])
    with pytest.raises(mcs.InvalidArgument):
        store.admit_batch(["not a mapping"])
