"""The batch calls of a step on the GPU (docs/design.md §9): encode_updates of CUDA pairs (one
batch encode per device), put_sparse_objects of CUDA members (staged from the device in a few
large copies), read_sparse_objects(device=...) into one device allocation, and
apply_sparse_objects into CUDA weights (one batched apply; strided views of rank 1 to 3).
Each equals the host path item by item. Skipped without the GPU codec or a CUDA device."""
from __future__ import annotations

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse._gpu import DeviceSparseObject, gpu_available
from mooncake.sparse.testing import find_node_daemon, start_node_daemon

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (gpu_available() and torch.cuda.is_available()),
    reason="needs the GPU codec (built with nvcc) and a CUDA device")

try:
    find_node_daemon()
    HAVE_DAEMON = True
except FileNotFoundError:
    HAVE_DAEMON = False

SEED = int(np.random.SeedSequence().entropy % (1 << 31))

# (shape, dtype): ranks 1 to 3, every value dtype, a wide one (uint32 indices), odd extents.
MIXED = [
    ((256, 192), torch.bfloat16),
    ((96, 80), torch.float32),
    ((1000,), torch.float16),
    ((4, 48, 40), torch.bfloat16),
    ((2, 70000), torch.bfloat16),
    ((33, 17), torch.float16),
]


def pairs_of(specs, density=0.05, seed=SEED):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for shape, dtype in specs:
        old = torch.randn(shape, generator=g, device="cuda").to(dtype)
        mask = torch.rand(shape, generator=g, device="cuda") < density
        new = old.clone()
        new[mask] = (torch.randn(int(mask.sum()), generator=g, device="cuda") + 3).to(dtype)
        out.append((new, old))
    return out


def bits(t):
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    elif t.dtype == torch.float32:
        t = t.view(torch.int32)
    return t.cpu().numpy()


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


@pytest.mark.parametrize("apply", ["overwrite", "scatter_add"])
def test_batch_encode_on_gpu_equals_host_encode_item_by_item(apply):
    pairs = pairs_of(MIXED)
    dev = mcs.encode_updates(pairs, apply=apply)
    host = mcs.encode_updates([(n.cpu(), o.cpu()) for n, o in pairs], apply=apply)
    assert len(dev) == len(pairs)
    for (di, dv), (hi, hv), (shape, _) in zip(dev, host, MIXED):
        assert di.is_cuda and dv.is_cuda
        assert tuple(di.shape) == tuple(hi.shape), shape
        assert di.dtype == hi.dtype, shape
        assert np.array_equal(di.cpu().numpy(), hi.numpy()), shape
        assert np.array_equal(bits(dv), bits(hv)), shape
    # One allocation for the whole batch: members of different items lie in one range.
    starts = sorted(d[1].data_ptr() for d in dev if d[1].numel() > 0)
    assert starts[-1] - starts[0] < sum(d[1].numel() * d[1].element_size() for d in dev) + 4096


def test_batch_encode_with_tile_shape_and_single_call_agree():
    pairs = pairs_of([((128, 128), torch.bfloat16), ((64, 256), torch.bfloat16)])
    batch = mcs.encode_updates(pairs, tile_shape=(32, 64))
    for (new, old), (bi, bv) in zip(pairs, batch):
        si, sv = mcs.encode_update(new, old, tile_shape=(32, 64))
        hi, hv = mcs.encode_update(new.cpu(), old.cpu(), tile_shape=(32, 64))
        assert np.array_equal(bi.cpu().numpy(), si.cpu().numpy())
        assert np.array_equal(bi.cpu().numpy(), hi.numpy())
        assert np.array_equal(bits(bv), bits(hv))


def test_batch_encode_refuses_bad_pairs():
    new, old = pairs_of([((64, 64), torch.bfloat16)])[0]
    with pytest.raises(mcs.InvalidArgument, match="pairs\\[1\\]"):
        mcs.encode_updates([(new, old), (new, old.cpu())])
    with pytest.raises(mcs.InvalidArgument):
        mcs.encode_updates([(new, old[:32])])
    with pytest.raises(mcs.InvalidArgument):
        mcs.encode_updates([(new.to(torch.int32), old.to(torch.int32))])
    with pytest.raises(mcs.InvalidArgument):
        mcs.encode_updates([(new, old)], apply="overwrite", threshold=0.5)
    empty = torch.empty(0, 16, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(mcs.InvalidArgument, match="non-positive"):
        mcs.encode_updates([(empty, empty.clone())])  # as the host codec


def commit_all(store, pairs, prefix, generation=(0, 1), apply="overwrite"):
    coo = mcs.encode_updates(pairs, apply=apply)
    updates = [dict(tensor_id=f"{prefix}{i}", global_shape=tuple(n.shape), indices=idx,
                    values=vals, generation=generation, apply=apply)
               for i, ((n, _), (idx, vals)) in enumerate(zip(pairs, coo))]
    return store.put_sparse_objects(updates)


def whole_targets(pairs, prefix):
    return [mcs.Target(f"{prefix}{i}", f"n/r{i}", "n", {}, (0,) * n.dim(), tuple(n.shape))
            for i, (n, _) in enumerate(pairs)]


def test_commit_of_device_members_equals_host_commit(store):
    pairs = pairs_of(MIXED)
    dev = commit_all(store, pairs, "d")
    host_pairs = [(n.cpu(), o.cpu()) for n, o in pairs]
    host = commit_all(store, host_pairs, "h")
    for d, h in zip(dev, host):
        assert isinstance(d, dict) and isinstance(h, dict)
        assert d["nnz"] == h["nnz"] and d["bytes"] == h["bytes"]
    m = store.manifest((0, 1))
    objs_d = store.read_sparse_objects(m, whole_targets(pairs, "d"))
    objs_h = store.read_sparse_objects(m, whole_targets(pairs, "h"))
    for a, b in zip(objs_d, objs_h):
        assert np.array_equal(np.asarray(a.indices), np.asarray(b.indices))
        assert np.array_equal(bits(torch.as_tensor(a.values)), bits(torch.as_tensor(b.values)))


def test_device_commit_through_the_daemon_goes_by_cuda_ipc(store):
    if "sparse_device_commit_items" not in store.metrics():
        pytest.skip("the embedded store stages device members itself")
    pairs = pairs_of(MIXED)
    coo = mcs.encode_updates(pairs)
    r = commit_all(store, pairs, "ipc")
    assert all(isinstance(x, dict) for x in r)
    m = store.metrics()
    # Every update's members were copied by the daemon from this process's GPU memory.
    assert m["sparse_device_commit_items"] == len(pairs)
    assert m["sparse_device_commit_bytes"] == sum(
        i.numel() * i.element_size() + v.numel() * v.element_size() for i, v in coo)
    assert m["cuda_ipc_opens"] >= 1
    # The batch lies densely in the client's commit arena: one device-to-host copy for all.
    assert m["sparse_device_commit_copies"] == 1
    # A second step reuses the client's commit arena: no new mapping in the daemon.
    opens = m["cuda_ipc_opens"]
    stepped = pairs_of(MIXED, seed=SEED + 1)
    commit_all(store, stepped, "ipc", generation=(1, 2))
    assert store.metrics()["cuda_ipc_opens"] == opens
    objs = store.read_sparse_objects(store.manifest((1, 2)), whole_targets(pairs, "ipc"))
    for (new, old), obj in zip(stepped, objs):
        w = old.clone()
        mcs.apply_sparse_object(w, obj)
        assert np.array_equal(bits(w), bits(new))


def test_device_read_through_the_daemon_is_copied_by_it(store):
    if "leases_to_device_bytes" not in store.metrics():
        pytest.skip("the embedded store uploads through pinned staging")
    pairs = pairs_of(MIXED)
    assert all(isinstance(x, dict) for x in commit_all(store, pairs, "rd"))
    m = store.manifest((0, 1))
    targets = whole_targets(pairs, "rd")
    host = store.read_sparse_objects(m, targets)
    dev = store.read_sparse_objects(m, targets, device="cuda")
    after = store.metrics()
    # The daemon wrote every member straight into this process's GPU memory, a few copies in
    # all (a read publishes its objects side by side in the daemon's segments).
    def nbytes(x):
        t = torch.as_tensor(x)
        return t.numel() * t.element_size()
    assert after["leases_to_device_bytes"] == sum(nbytes(h.indices) + nbytes(h.values)
                                                  for h in host)
    assert 1 <= after["leases_to_device_copies"] <= len(targets)
    for h, d in zip(host, dev):
        assert np.array_equal(np.asarray(h.indices), torch.as_tensor(d.indices).cpu().numpy())
        assert np.array_equal(bits(torch.as_tensor(h.values)), bits(torch.as_tensor(d.values).cpu()))
    for (new, old), d in zip(pairs, dev):
        w = old.clone()
        mcs.apply_sparse_object(w, d)
        assert np.array_equal(bits(w), bits(new))
    # The next read reuses the device memory once nothing views it: no new mapping.
    opens = after["cuda_ipc_opens"]
    del dev, d
    again = store.read_sparse_objects(m, targets, device="cuda")
    assert store.metrics()["cuda_ipc_opens"] == opens
    assert len(again) == len(targets)


def test_device_read_on_the_embedded_store_views_in_place(store):
    if "leases_to_device_bytes" in store.metrics():
        pytest.skip("through the daemon its --read_in_place setting decides")
    pairs = pairs_of(MIXED)
    assert all(isinstance(x, dict) for x in commit_all(store, pairs, "vp"))
    m = store.manifest((0, 1))
    targets = whole_targets(pairs, "vp")
    store.clear_caches()
    store.reset_metrics()
    copied = store.read_sparse_objects(m, targets, device="cuda", view_in_place=False)
    first = store.metrics()
    store.reset_metrics()
    viewed = store.read_sparse_objects(m, targets, device="cuda")
    second = store.metrics()
    # The default device read viewed the stored bytes: the range cache that the copying read
    # filled was neither used nor filled again.
    assert first["range_gets"] > 0 and second["range_gets"] > 0
    assert second["range_cache_hits"] == 0
    store.reset_metrics()
    store.read_sparse_objects(m, targets, device="cuda", view_in_place=False)
    assert store.metrics()["range_cache_hits"] > 0  # a copying read finds them cached
    for c, v in zip(copied, viewed):
        assert torch.equal(torch.as_tensor(c.indices), torch.as_tensor(v.indices))
        assert np.array_equal(bits(torch.as_tensor(c.values)), bits(torch.as_tensor(v.values)))
    for (new, old), v in zip(pairs, viewed):
        w = old.clone()
        mcs.apply_sparse_object(w, v)
        assert np.array_equal(bits(w), bits(new))


def box_slices(origin, extent):
    return tuple(slice(o, o + e) for o, e in zip(origin, extent))


def same_entries(host, dev):
    """Host and device objects hold the same (coordinate, value) entries (in any order: a
    target whose origin is off the sources' tile grid keeps the sources' order on the GPU)."""
    assert dev.nnz == host.nnz
    hi = np.asarray(host.indices).astype(np.int64)
    di = torch.as_tensor(dev.indices).cpu().numpy().astype(np.int64)
    hv, dv = bits(torch.as_tensor(host.values)), bits(torch.as_tensor(dev.values).cpu())
    assert hi.shape == di.shape
    oh, od = np.lexsort(hi.T[::-1]), np.lexsort(di.T[::-1])
    assert np.array_equal(hi[oh], di[od])
    assert np.array_equal(hv[oh], dv[od])


@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_device_read_on_the_embedded_store_builds_targets_on_the_gpu(pinned):
    # Pinned: the GPU reads the ranges straight from the store's memory; pageable: through
    # pinned staging. Either way the targets are filtered and rebased on the GPU.
    quota = 256 << 20
    store = mcs.connect(capacity_bytes=quota, pinned_quota_bytes=quota if pinned else 0)
    pairs = pairs_of(MIXED)
    assert all(isinstance(r, dict) for r in commit_all(store, pairs, "g"))
    ids = [f"g{i}" for i in range(len(pairs))] + ["same"]
    store.seal_generation((0, 1), ids)
    boxes = []  # (tensor index, origin, extent): whole, halves of the last dim, off the grid
    for i, (n, _) in enumerate(pairs):
        shape = tuple(n.shape)
        boxes.append((i, (0,) * len(shape), shape))
        half = shape[-1] // 2
        boxes.append((i, (0,) * (len(shape) - 1) + (half,), shape[:-1] + (shape[-1] - half,)))
        origin = tuple(s // 3 for s in shape)
        boxes.append((i, origin, tuple(max(1, s // 2 + 1) for s in shape)))
    targets = [mcs.Target(f"g{i}", f"n/t{k}", "n", {}, o, e) for k, (i, o, e) in enumerate(boxes)]
    targets.append(mcs.Target("same", "n/same", "n", {}, (0, 0), (8, 8)))  # unchanged
    m = store.manifest((0, 1))
    host = store.read_sparse_objects(m, targets)
    store.reset_metrics()
    dev = store.read_sparse_objects(m, targets, device="cuda")
    metrics = store.metrics()
    assert metrics["target_objects_published"] == len(targets)
    assert metrics["full_gets"] == 0 and metrics["range_gets"] > 0
    assert all(isinstance(d, DeviceSparseObject) for d in dev)
    for h, d in zip(host, dev):
        same_entries(h, d)
        assert d.tensor_id == h.tensor_id and d.local_shape == h.local_shape
        assert d.index_dtype == h.index_dtype
    assert dev[-1].nnz == 0
    # The host members of a device object are not there: a typed error, not garbage.
    with pytest.raises(mcs.FailedPrecondition):
        _ = dev[0].tile_ptr
    for (i, origin, extent), d in zip(boxes, dev):
        new, old = pairs[i]
        w = old[box_slices(origin, extent)].clone()
        mcs.apply_sparse_object(w, d)
        assert np.array_equal(bits(w), bits(new[box_slices(origin, extent)]))
    # A fold of two steps is merged on the host, then uploaded: the same weights.
    stepped = pairs_of(MIXED[:1], seed=SEED + 7)
    news = [(stepped[0][0], pairs[0][0])]
    assert all(isinstance(r, dict) for r in commit_all(store, news, "g", generation=(1, 2)))
    store.seal_generation((1, 2), ids)
    folded = store.read_sparse_objects(store.manifest((0, 2)), targets[:1], device="cuda")
    w = pairs[0][1].clone()
    mcs.apply_sparse_objects([w], folded)
    assert np.array_equal(bits(w), bits(stepped[0][0]))
    store.close()


def test_single_commit_of_device_members(store):
    (new, old), = pairs_of([((128, 96), torch.bfloat16)])
    idx, vals = mcs.encode_update(new, old)
    info = store.put_sparse_object("w", tuple(new.shape), idx, vals, generation=(0, 1),
                                   return_info=True)
    assert info["nnz"] == idx.shape[0]
    target = mcs.Target("w", "n/r", "n", {}, (0, 0), (128, 96))
    obj = store.read_sparse_objects(store.manifest((0, 1)), [target])[0]
    w = old.clone()
    mcs.apply_sparse_object(w, obj)
    assert np.array_equal(bits(w), bits(new))


def test_commit_of_strided_device_members(store):
    (new, old), = pairs_of([((96, 64), torch.bfloat16)])
    idx, vals = mcs.encode_update(new, old)
    # The same entries as strided CUDA views (a column of a wider array, a strided vector).
    wide = torch.zeros(idx.shape[0], 4, dtype=torch.int32, device="cuda")
    wide[:, 1:3] = idx.to(torch.int32)
    spread = torch.zeros(2 * vals.shape[0], dtype=vals.dtype, device="cuda")
    spread[::2] = vals
    r = store.put_sparse_objects([dict(tensor_id="s", global_shape=(96, 64), indices=wide[:, 1:3],
                                       values=spread[::2])])
    assert isinstance(r[0], dict) and r[0]["nnz"] == idx.shape[0]
    obj = store.read_sparse_objects(store.manifest((0, 1)),
                                    [mcs.Target("s", "n/r", "n", {}, (0, 0), (96, 64))])[0]
    w = old.clone()
    mcs.apply_sparse_object(w, obj)
    assert np.array_equal(bits(w), bits(new))


def test_bad_device_update_fails_alone(store):
    pairs = pairs_of([((64, 64), torch.bfloat16), ((64, 64), torch.bfloat16)])
    coo = mcs.encode_updates(pairs)
    updates = [dict(tensor_id="ok", global_shape=(64, 64), indices=coo[0][0], values=coo[0][1]),
               dict(tensor_id="bad", global_shape=(32, 64), indices=coo[1][0], values=coo[1][1])]
    r = store.put_sparse_objects(updates)
    assert isinstance(r[0], dict)
    assert isinstance(r[1], mcs.InvalidArgument)
    ids = {s.tensor_id for s in store.manifest((0, 1))}
    assert ids == {"ok"}


@pytest.mark.parametrize("apply", ["overwrite", "scatter_add"])
def test_step_on_gpu_end_to_end_into_fused_and_strided_weights(store, apply):
    # Trainer: per-expert w1/w3 [I, H], w2 [H, I], a norm vector; inference: a FusedMoE-style
    # w13 [E, 2I, H] (gate then up), w2 [E, H, I] and the vector, TP2 rank 0 of each.
    E, I, H = 4, 64, 48
    specs = ([((I, H), torch.bfloat16)] * (2 * E) + [((H, I), torch.bfloat16)] * E +
             [((H,), torch.bfloat16)])
    pairs = pairs_of(specs, density=0.03)
    names = ([f"w1.{e}" for e in range(E)] + [f"w3.{e}" for e in range(E)] +
             [f"w2.{e}" for e in range(E)] + ["norm"])
    coo = mcs.encode_updates(pairs, apply=apply)
    updates = [dict(tensor_id=t, global_shape=tuple(n.shape), indices=i, values=v, apply=apply,
                    generation=(0, 1)) for t, (n, _), (i, v) in zip(names, pairs, coo)]
    assert all(isinstance(r, dict) for r in store.put_sparse_objects(updates))
    old = {t: o for t, (_, o) in zip(names, pairs)}
    new = {t: n for t, (n, _) in zip(names, pairs)}
    half = I // 2
    w13 = torch.empty(E, 2 * half, H, dtype=torch.bfloat16, device="cuda")
    w2 = torch.empty(E, H, half, dtype=torch.bfloat16, device="cuda")
    norm = old["norm"].clone()
    for e in range(E):
        w13[e, :half] = old[f"w1.{e}"][:half]
        w13[e, half:] = old[f"w3.{e}"][:half]
        w2[e] = old[f"w2.{e}"][:, :half]
    targets, dests = [], []
    for e in range(E):
        targets.append(mcs.Target(f"w1.{e}", f"r0/w1.{e}", "n", {}, (0, 0), (half, H)))
        dests.append(w13[e, :half])
        targets.append(mcs.Target(f"w3.{e}", f"r0/w3.{e}", "n", {}, (0, 0), (half, H)))
        dests.append(w13[e, half:])
        targets.append(mcs.Target(f"w2.{e}", f"r0/w2.{e}", "n", {}, (0, 0), (H, half)))
        dests.append(w2[e])  # a [H, I/2] slice of the stacked parameter: contiguous rows
    targets.append(mcs.Target("norm", "r0/norm", "n", {}, (0,), (H,)))
    dests.append(norm)
    objs = store.read_sparse_objects(store.manifest((0, 1)), targets, device="cuda")
    assert all(isinstance(o, DeviceSparseObject) for o in objs)
    mcs.apply_sparse_objects(dests, objs)
    torch.cuda.synchronize()
    for e in range(E):
        want13 = torch.cat([new[f"w1.{e}"][:half], new[f"w3.{e}"][:half]])
        got, want = w13[e], want13
        if apply == "overwrite":
            assert np.array_equal(bits(got), bits(want))
            assert np.array_equal(bits(w2[e]), bits(new[f"w2.{e}"][:, :half]))
        else:
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    if apply == "overwrite":
        assert np.array_equal(bits(norm), bits(new["norm"]))


def test_batched_apply_matches_host_apply_on_views():
    g = torch.Generator(device="cuda").manual_seed(SEED)
    parent = torch.randn(64, 96, generator=g, device="cuda").to(torch.bfloat16)
    stacked = torch.randn(3, 40, 24, generator=g, device="cuda").to(torch.float32)
    views = [parent[:, 32:80], parent.t()[:48], stacked[1], stacked[:, 8:, ::2]]
    shapes = [tuple(v.shape) for v in views]
    store = mcs.connect()
    rng = np.random.default_rng(SEED)
    for k, (v, shape) in enumerate(zip(views, shapes)):
        host = v.cpu().contiguous()
        new = host.clone()
        flat = new.view(-1)
        pick = torch.from_numpy(rng.choice(flat.numel(), size=max(1, flat.numel() // 20),
                                           replace=False))
        flat[pick] = flat[pick] + 1
        idx, vals = mcs.encode_update(new, host)
        store.put_sparse_object(f"v{k}", shape, idx, vals, generation=(0, 1))
    targets = [mcs.Target(f"v{k}", f"r/v{k}", "n", {}, (0,) * len(s), s)
               for k, s in enumerate(shapes)]
    objs = store.read_sparse_objects(store.manifest((0, 1)), targets)
    # Host reference on copies. parent[:, 32:80] and parent.t()[:48] share memory: the batch
    # applies them in list order, as the host path does.
    ref_parent, ref_stacked = parent.cpu().clone(), stacked.cpu().clone()
    ref_views = [ref_parent[:, 32:80], ref_parent.t()[:48], ref_stacked[1],
                 ref_stacked[:, 8:, ::2]]
    for v, o in zip(ref_views, objs):
        mcs.apply_sparse_object(v, o)
    mcs.apply_sparse_objects(views, objs)
    torch.cuda.synchronize()
    assert np.array_equal(bits(parent), bits(ref_parent))
    assert np.array_equal(bits(stacked), bits(ref_stacked))


def test_batched_apply_out_of_range_changes_no_weight():
    a = torch.zeros(8, 8, dtype=torch.bfloat16, device="cuda")
    b = torch.zeros(8, 8, dtype=torch.bfloat16, device="cuda")
    from mooncake.sparse import _core
    good = (np.array([[1, 1]], np.uint16), torch.ones(1, dtype=torch.bfloat16, device="cuda"))
    bad = (np.array([[1, 1], [9, 0]], np.uint16), torch.ones(2, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(mcs.InvalidArgument, match="item 1"):
        _core._gpu_apply_batch([a, b], [good[0], bad[0]], [good[1], bad[1]],
                               ["overwrite", "overwrite"], None)
    assert not a.any() and not b.any()


def test_scatter_add_of_overlapping_items_applies_in_order():
    w = torch.zeros(4, 4, dtype=torch.float32, device="cuda")
    from mooncake.sparse import _core
    idx = np.array([[0, 0], [2, 3]], np.uint16)
    one = torch.ones(2, dtype=torch.float32, device="cuda")
    _core._gpu_apply_batch([w, w, w[1:]], [idx, idx, np.array([[1, 3]], np.uint16)],
                           [one, one * 2, torch.full((1,), 5.0, device="cuda")],
                           ["scatter_add", "scatter_add", "overwrite"], None)
    torch.cuda.synchronize()
    assert w[0, 0].item() == 3.0 and w[2, 3].item() == 5.0
