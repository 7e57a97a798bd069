"""The batch calls of a step on the GPU (docs/design.md §9): encode_updates of CUDA pairs (one
batch encode per device), put_sparse_objects of CUDA members (staged from the device in a few
large copies), read_sparse_objects(device=...) into one device allocation, and
apply_sparse_objects into CUDA weights (one batched apply; strided views of rank 1 to 3).
Each equals the host path item by item. Skipped without the GPU codec or a CUDA device."""
from __future__ import annotations

import time

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse import _core
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


def wait_pinned(store, nbytes, timeout=30):
    """Waits until the daemon behind `store` has pinned `nbytes` of its segments (it pins them
    in the background)."""
    deadline = time.monotonic() + timeout
    while store.metrics()["pinned_bytes"] < nbytes:
        assert time.monotonic() < deadline, "the daemon did not pin its segments"
        time.sleep(0.05)


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
    # The large rank-2 updates are checked on the daemon's GPU, the others on its host. Either
    # way the batch lies densely in the client's commit arena: a few device-to-host copies of
    # runs of members (one when all go the host's way), not two per update.
    on_gpu = m.get("sparse_device_commit_gpu_items", 0)
    large = sum(n.dim() == 2 and i.numel() * i.element_size() + v.numel() * v.element_size()
                >= 64 << 10 for (n, _), (i, v) in zip(pairs, coo))
    assert on_gpu in (0, large)
    assert m["sparse_device_commit_copies"] <= (len(pairs) - 1 if on_gpu else 1)
    # GPU-checked updates: first copied into the daemon's own device memory (a few spans of
    # the client's arena), checked there, and copied into the store from there; the fill's
    # clocks: its device-to-host copies landed within it.
    landed, fill = m["sparse_device_commit_landed_seconds"], m["sparse_device_commit_fill_seconds"]
    own = m["sparse_device_commit_private_bytes"]
    if on_gpu:
        assert 0 < landed <= fill
        assert 1 <= m["sparse_device_commit_private_copies"] <= 2 * on_gpu
        large_bytes = sum(i.numel() * i.element_size() + v.numel() * v.element_size()
                          for (n, _), (i, v) in zip(pairs, coo) if n.dim() == 2)
        assert own >= min(large_bytes, 64 << 20)
    else:
        assert landed == fill == m["sparse_device_commit_private_copies"] == own == 0
    # A second step reuses the client's commit arena (no new mapping in the daemon) and the
    # daemon's own memory (no larger allocation for a step of the same size).
    opens = m["cuda_ipc_opens"]
    stepped = pairs_of(MIXED, seed=SEED + 1)
    commit_all(store, stepped, "ipc", generation=(1, 2))
    assert store.metrics()["cuda_ipc_opens"] == opens
    assert store.metrics()["sparse_device_commit_private_bytes"] == own
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
    # The daemon planned the read and wrote each unique range of the sources straight into this
    # process's GPU memory (whole targets: every entry of every source, once), a copy per
    # member of a source at most (the ranges of one member lie side by side in both places).
    assert after["leases_to_device_bytes"] == sum(s.nnz * s.entry_bytes for s in m)
    assert 1 <= after["leases_to_device_copies"] <= 2 * len(m)
    # Laid out in the order of their addresses in the daemon's segments, a source's indices and
    # values (side by side there) move as one span, and sources stored next to each other too.
    assert 1 <= after["leases_to_device_runs"] <= sum(s.nnz > 0 for s in m)
    assert all(isinstance(d, DeviceSparseObject) for d in dev)
    for h, d in zip(host, dev):
        assert np.array_equal(np.asarray(h.indices), torch.as_tensor(d.indices).cpu().numpy())
        assert np.array_equal(bits(torch.as_tensor(h.values)), bits(torch.as_tensor(d.values).cpu()))
    for (new, old), d in zip(pairs, dev):
        w = old.clone()
        mcs.apply_sparse_object(w, d)
        assert np.array_equal(bits(w), bits(new))
    # The next read reuses the device memory its ranges landed in: no new mapping.
    opens = after["cuda_ipc_opens"]
    del dev, d
    again = store.read_sparse_objects(m, targets, device="cuda")
    assert store.metrics()["cuda_ipc_opens"] == opens
    assert len(again) == len(targets)
    # Nothing stays leased once the objects are gone: not the sources the planned reads leased
    # (released with the next call), not the host read's targets.
    del again, host, h
    store.metrics()
    assert store.metrics()["shm_leases"] == 0


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


@pytest.mark.parametrize("engine_bytes", [0, 1024], ids=["kernel", "engine"])
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("pinned_quota", [0, 2 << 20, 256 << 20],
                         ids=["pageable", "mixed", "pinned"])
def test_device_read_on_the_embedded_store_builds_targets_on_the_gpu(pinned_quota, groups,
                                                                     engine_bytes):
    # Pinned: the GPU reads the ranges straight from the store's memory; pageable: through
    # pinned staging; mixed (a quota that pins the first objects only): both in one read.
    # Either way the targets are filtered and rebased on the GPU, in one group of tensors or in
    # several (each planned while the one before is copied). The pinned ranges move by the
    # gather kernel alone, or (runs of 1 KiB and up, most of these) by the copy engine beside it.
    previous = _core._set_device_read_groups(groups)
    previous_engine = _core._set_device_gather_engine_bytes(engine_bytes)
    try:
        store = mcs.connect(capacity_bytes=256 << 20, pinned_quota_bytes=pinned_quota)
        check_targets_built_on_the_gpu(store)
        store.close()
    finally:
        _core._set_device_read_groups(previous)
        _core._set_device_gather_engine_bytes(previous_engine)


@pytest.mark.parametrize("staging", [True, False], ids=["staged", "copy-request"])
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_device_read_through_the_daemon_builds_targets_on_the_gpu(tmp_path, pinned, groups,
                                                                   staging):
    # The daemon plans the read and copies the ranges into this process's GPU memory; the
    # targets are filtered and rebased here, as on the embedded store. From pinned segments
    # it answers once the copies are queued, with this process's ready event recorded after
    # them (from pageable ones, through its bounce buffer, once they are done); in several
    # groups, each group's plan while the group before is copied. A first read asks for the
    # copies once its plan is back; the second, staged, has them made as the daemon plans,
    # into an allocation the first one left.
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    previous = _core._set_device_read_groups(groups)
    previous_staging = _core._set_device_read_staging(staging)
    try:
        with start_node_daemon(tmp_path, segment_size="64MiB", num_segments=4,
                               pinned_quota_bytes="256MiB" if pinned else "0") as daemon:
            store = mcs.connect(daemon.url)
            if not store.capabilities().get("cuda_ipc_available"):
                pytest.skip("no CUDA IPC with the daemon here")
            # The daemon pins its segments in the background: the read waits for them here.
            if pinned:
                wait_pinned(store, 256 << 20)
            store.reset_metrics()
            before = _core._device_read_counters()
            check_targets_built_on_the_gpu(store, reads=2)
            after = _core._device_read_counters()
            m = store.metrics()
            # Built here on the GPU from ranges the daemon planned and copied (the fold of the
            # check is read on the daemon's host).
            assert after["reads"] == before["reads"] + 2
            assert after["ranges_seconds"] > before["ranges_seconds"]
            assert m["planned_reads"] == 2 * groups and m["leases_to_device_bytes"] > 0
            if pinned:
                assert m["leases_to_device_deferred"] >= 2
            else:
                assert m["leases_to_device_deferred"] == 0
            # The second read's first group at least (a later group may find no free
            # allocation large enough); none with staging off.
            if staging:
                assert 1 <= m["planned_reads_staged"] <= groups
            else:
                assert m["planned_reads_staged"] == 0
            store.close()
    finally:
        _core._set_device_read_groups(previous)
        _core._set_device_read_staging(previous_staging)


def test_a_device_read_larger_than_a_plan_request_is_read_in_groups_each_staged(tmp_path):
    # A read of more targets than one plan request takes (planned_read_targets; a node's read at
    # Kimi-K2 scale) is read in groups of whole tensors of at most as many targets, each planned
    # in one request and so each with its ranges copied as the daemon plans them: 19 targets
    # (six tensors of three, one unchanged) at most 7 a request are three groups.
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    previous = _core._set_device_read_groups(0)
    previous_staging = _core._set_device_read_staging(True)
    try:
        with start_node_daemon(tmp_path, segment_size="64MiB", num_segments=4,
                               pinned_quota_bytes="256MiB") as daemon:
            with pytest.raises(mcs.InvalidArgument):
                mcs.connect(daemon.url, planned_read_targets=0)
            store = mcs.connect(daemon.url, planned_read_targets=7)
            if not store.capabilities().get("cuda_ipc_available"):
                pytest.skip("no CUDA IPC with the daemon here")
            wait_pinned(store, 256 << 20)
            store.reset_metrics()
            check_targets_built_on_the_gpu(store, reads=2)
            m = store.metrics()
            assert m["planned_reads"] == 2 * 3
            # The first read's groups ask for their copies (no free allocation yet); the
            # second's are staged, each into an allocation of its own.
            assert 2 <= m["planned_reads_staged"] <= 3
            store.close()
    finally:
        _core._set_device_read_groups(previous)
        _core._set_device_read_staging(previous_staging)


def test_concurrent_device_reads_through_the_daemon_wait_for_their_own_copies(tmp_path):
    # Two connections of this process read from pinned segments on two threads at once: each
    # request is answered before its copies are done, and each thread's filter waits on its own
    # ready event, so that no read sees another's copies complete in place of its own.
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    import threading

    with start_node_daemon(tmp_path, segment_size="64MiB", num_segments=4,
                           pinned_quota_bytes="256MiB") as daemon:
        stores = [mcs.connect(daemon.url) for _ in range(2)]
        if not stores[0].capabilities().get("cuda_ipc_available"):
            pytest.skip("no CUDA IPC with the daemon here")
        wait_pinned(stores[0], 256 << 20)
        pairs = pairs_of([((512, 384), torch.bfloat16), ((96, 80), torch.float32),
                          ((2, 70000), torch.bfloat16)], density=0.2)
        assert all(isinstance(r, dict) for r in commit_all(stores[0], pairs, "c"))
        stores[0].seal_generation((0, 1), [f"c{i}" for i in range(len(pairs))])
        m = stores[0].manifest((0, 1))
        targets = whole_targets(pairs, "c")
        errors = []

        def reader(store):
            try:
                for _ in range(20):
                    objs = store.read_sparse_objects(m, targets, device="cuda")
                    for (new, old), o in zip(pairs, objs):
                        w = old.clone()
                        mcs.apply_sparse_object(w, o)
                        assert np.array_equal(bits(w), bits(new))
            except BaseException as e:  # reported on the main thread
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert stores[0].metrics()["leases_to_device_deferred"] >= 40
        # Each connection sent its targets once and named them on its 19 later reads.
        assert stores[0].metrics()["planned_reads_kept_targets"] == 38
        # A connection's first read asks for its copies (its read pool is empty); the next 19
        # have them made as the daemon plans, into the allocation the first one left.
        assert stores[0].metrics()["planned_reads_staged"] == 38
        for s in stores:
            s.close()


def check_targets_built_on_the_gpu(store, reads=1):
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
    for _ in range(reads):  # a reader's later reads reuse what its first one left
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


def test_apply_of_device_objects_checks_shapes_first_and_takes_any_mix():
    # Device objects (the core reads them and checks every shape before any write), a
    # Parameter that requires grad, and a list mixing device and host objects.
    pairs = pairs_of([((32, 24), torch.bfloat16)] * 3, density=0.1)
    store = mcs.connect()
    names = ["a", "b", "c"]
    coo = mcs.encode_updates(pairs)
    store.put_sparse_objects([dict(tensor_id=t, global_shape=(32, 24), indices=i, values=v,
                                   generation=(0, 1)) for t, (i, v) in zip(names, coo)])
    targets = [mcs.Target(t, f"r/{t}", "n", {}, (0, 0), (32, 24)) for t in names]
    m = store.manifest((0, 1))
    objs = store.read_sparse_objects(m, targets, device="cuda")
    olds = [o for _, o in pairs]
    weights = [olds[0].clone(), torch.nn.Parameter(olds[1].clone()),
               olds[2].clone()[:, :20]]  # the last one's shape is wrong
    with pytest.raises(mcs.InvalidArgument, match=r"weights\[2\] shape \(32, 20\) != object "
                                                  r"local shape \(32, 24\)"):
        mcs.apply_sparse_objects(weights, objs)
    torch.cuda.synchronize()
    for w, o in zip(weights, olds):
        assert torch.equal(w, o[:, :w.shape[1]])  # nothing written
    weights[2] = olds[2].clone()
    mixed = [objs[0], store.read_sparse_objects(m, targets[1:2])[0], objs[2]]
    assert not isinstance(mixed[1], DeviceSparseObject)
    mcs.apply_sparse_objects(weights, mixed)
    torch.cuda.synchronize()
    for w, (new, _) in zip(weights, pairs):
        assert np.array_equal(bits(w.detach()), bits(new))


def test_device_objects_of_several_reads_apply_together_and_outlive_their_lists():
    # A device read's objects are views of one batch: objects of two reads (and an upload)
    # apply in one call, and each keeps its batch's device memory alive on its own.
    pairs = pairs_of([((40, 24), torch.bfloat16), ((64,), torch.float32)] * 2, density=0.2)
    store = mcs.connect()
    names = ["p", "q", "r", "s"]
    coo = mcs.encode_updates(pairs)
    store.put_sparse_objects([dict(tensor_id=t, global_shape=tuple(n.shape), indices=i, values=v,
                                   generation=(0, 1)) for t, (n, _), (i, v) in
                              zip(names, pairs, coo)])
    targets = [mcs.Target(t, f"r/{t}", "n", {}, (0,) * n.dim(), tuple(n.shape))
               for t, (n, _) in zip(names, pairs)]
    m = store.manifest((0, 1))
    first = store.read_sparse_objects(m, targets[:2], device="cuda")
    second = store.read_sparse_objects(m, targets[2:3], device="cuda")
    host = store.read_sparse_objects(m, targets)
    from mooncake.sparse import _gpu
    up = _gpu.upload(host[3:], "cuda")
    assert all(isinstance(o, DeviceSparseObject) for o in first + second + up)
    objs = [second[0], first[1], up[0], first[0]]
    order = [2, 1, 3, 0]
    del first, second, up
    torch.cuda.empty_cache()
    for o, k in zip(objs, order):
        assert o.nnz == host[k].nnz and o.tensor_id == names[k]
        assert o.local_shape == host[k].local_shape
        assert repr(o).startswith(f"<DeviceSparseObject r/{names[k]} {names[k]} nnz={o.nnz}")
        same_entries(host[k], o)
    weights = [pairs[k][1].clone() for k in order]
    mcs.apply_sparse_objects(weights, objs)
    torch.cuda.synchronize()
    for w, k in zip(weights, order):
        assert np.array_equal(bits(w), bits(pairs[k][0]))
    with pytest.raises(AttributeError):
        _ = objs[0].no_such_attribute


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


# ---------------------------------------------------------------------------------------------
# The embedded store's commit from the GPU: the batch is checked, indexed and checksummed on the
# device, and its entries are copied once, straight into the store's memory. The same results,
# objects (metadata, checksums, tile index, bytes), manifest, metrics and read-back as the same
# batch committed from host copies; what the device does not take goes through the host's
# encode in the same commit.
# ---------------------------------------------------------------------------------------------
# Rank 2 (the direct path: bf16/fp16/fp32, uint16 and uint32 indices, several 1 KiB blocks of
# entries, odd extents), beside ranks 1 and 3 (the host's encode, in the same commit).
DIRECT = [
    ((512, 384), torch.bfloat16),
    ((96, 80), torch.float32),
    ((2, 70000), torch.bfloat16),
    ((33, 17), torch.float16),
    ((1000,), torch.float16),
    ((4, 48, 40), torch.bfloat16),
    ((1031, 257), torch.bfloat16),
]


def direct_counters():
    from mooncake.sparse import _core
    return _core._device_commit_counters()


def stored(store, ref):
    """A committed source object as the store holds it: metadata, member table, member bytes."""
    info, members = store._core._object_store().get(ref)
    return (info["metadata"], [(m["name"], m["dtype"], tuple(m["shape"]), m["checksum"])
                               for m in info["members"]],
            {k: np.ascontiguousarray(np.asarray(v)).view(np.uint8).tobytes()
             for k, v in members.items()})


def same_commits(dev_store, dev_results, host_store, host_results):
    """Two stores hold the same commits: results, manifests, objects and metrics."""
    assert len(dev_results) == len(host_results)
    for d, h in zip(dev_results, host_results):
        if isinstance(h, dict):
            assert d == h
        else:
            assert type(d) is type(h) and str(d) == str(h)
    md = sorted(dev_store.manifest((0, 1)), key=lambda s: s.source_ref)
    mh = sorted(host_store.manifest((0, 1)), key=lambda s: s.source_ref)
    assert [repr(s) for s in md] == [repr(s) for s in mh]
    for a, b in zip(md, mh):
        assert (a.tensor_id, a.tile_shape, a.nnz, a.num_tiles, a.index_dtype, a.value_dtype,
                a.global_offset, a.local_shape) == \
               (b.tensor_id, b.tile_shape, b.nnz, b.num_tiles, b.index_dtype, b.value_dtype,
                b.global_offset, b.local_shape)
        assert stored(dev_store, a.source_ref) == stored(host_store, b.source_ref)
    assert counted(dev_store) == counted(host_store)


def counted(store):
    """The store's metrics without the timings."""
    return {k: v for k, v in store.metrics().items() if not k.endswith("_seconds")}


@pytest.fixture
def commit_groups(request):
    """This process's commits from CUDA memory checked in one group (0) or in groups, the first
    of `request.param` entry bytes (each next one checked while the one before it is copied)."""
    from mooncake.sparse import _core
    previous = _core._set_device_commit_group_bytes(request.param)
    yield request.param
    _core._set_device_commit_group_bytes(previous)


def host_copy(update):
    u = dict(update)
    u["indices"] = update["indices"].cpu()
    u["values"] = update["values"].cpu()
    return u


@pytest.mark.parametrize("pinned_quota", [0, 2 << 20, 512 << 20],
                         ids=["pageable", "mixed", "pinned"])
def test_embedded_commit_from_the_gpu_equals_host_commit(pinned_quota):
    pairs = pairs_of(DIRECT)
    coo = mcs.encode_updates(pairs)
    updates = [dict(tensor_id=f"d{i}", global_shape=tuple(n.shape), indices=idx, values=vals)
               for i, ((n, _), (idx, vals)) in enumerate(zip(pairs, coo))]
    # A box of the first tensor (its entries in rows 256-511: a tile boundary, so they stay in
    # canonical order), a tile shape of the caller's, and int8 values at an odd address (byte
    # loads in the checksum).
    rows = coo[0][0].view(torch.int16)[:, 0]
    below = rows >= 256
    idx0 = coo[0][0].view(torch.int16)[below].contiguous().view(coo[0][0].dtype)
    vals0 = coo[0][1][below].contiguous()
    updates.append(dict(tensor_id="box0", global_shape=(512, 384), indices=idx0, values=vals0,
                        global_offset=(256, 0), local_shape=(256, 384)))
    idx1, vals1 = mcs.encode_update(*pairs[1], tile_shape=(7, 9))
    updates.append(dict(tensor_id="tiled", global_shape=(96, 80), indices=idx1, values=vals1,
                        tile_shape=(7, 9)))
    odd = torch.zeros(idx1.shape[0] + 1, dtype=torch.int8, device="cuda")[1:]
    odd.copy_(torch.arange(idx1.shape[0], device="cuda") % 97 - 40)
    updates.append(dict(tensor_id="odd", global_shape=(96, 80), indices=idx1, values=odd,
                        tile_shape=(7, 9)))
    dev_store = mcs.connect(capacity_bytes=512 << 20, pinned_quota_bytes=pinned_quota)
    host_store = mcs.connect(capacity_bytes=512 << 20, pinned_quota_bytes=pinned_quota)
    before = direct_counters()
    dev = dev_store.put_sparse_objects(updates)
    after = direct_counters()
    host = host_store.put_sparse_objects([host_copy(u) for u in updates])
    assert all(isinstance(r, dict) for r in dev), dev
    # Every rank-2 update went the direct way: one batch, its entries copied from the device.
    rank2 = [u for u in updates if len(u["global_shape"]) == 2]
    assert after["batches"] == before["batches"] + 1
    assert after["objects"] == before["objects"] + len(rank2)
    assert after["bytes"] - before["bytes"] == sum(
        u["indices"].numel() * u["indices"].element_size() +
        u["values"].numel() * u["values"].element_size() for u in rank2)
    # The batch's clocks nest: its fill, and the commit's parts before and after the fill, lie
    # within the store's commit, and that within the call.
    took = {k: after[k] - before[k] for k in after if k.endswith("_seconds")}
    assert took["prepare_seconds"] > 0 and took["fill_seconds"] > 0 and took["publish_seconds"] > 0
    assert took["prepare_seconds"] + took["fill_seconds"] + took["publish_seconds"] \
        <= took["commit_seconds"] <= took["total_seconds"]
    same_commits(dev_store, dev, host_store, host)
    # Read back: the same objects, and they apply to the new weights.
    targets = whole_targets(pairs, "d")
    objs_d = dev_store.read_sparse_objects(dev_store.manifest((0, 1)), targets)
    objs_h = host_store.read_sparse_objects(host_store.manifest((0, 1)), targets)
    for a, b in zip(objs_d, objs_h):
        assert np.array_equal(np.asarray(a.indices), np.asarray(b.indices))
        assert np.array_equal(bits(torch.as_tensor(a.values)), bits(torch.as_tensor(b.values)))
    for (new, old), o in zip(pairs, objs_d):
        w = old.clone()
        mcs.apply_sparse_object(w, o)
        assert np.array_equal(bits(w), bits(new))
    # A retry is idempotent, on both paths alike.
    same_commits(dev_store, dev_store.put_sparse_objects(updates),
                 host_store, host_store.put_sparse_objects([host_copy(u) for u in updates]))
    dev_store.close()
    host_store.close()


@pytest.mark.parametrize("commit_groups", [0, 64 << 10], ids=["one-group", "groups"],
                         indirect=True)
@pytest.mark.parametrize("pinned_quota", [0, 8 << 20, 512 << 20],
                         ids=["pageable", "mixed", "pinned"])
def test_embedded_commit_from_the_gpu_of_large_and_small_members(pinned_quota, commit_groups):
    # Members of MiBs (copy-engine transfers) beside many small ones (one kernel for all of
    # them), into pinned and pageable store memory alike: the same commits as from host copies,
    # checked in one group or in groups (the large update, then the small ones, checked while the
    # large one is copied, in two groups or more).
    pairs = pairs_of([((1024, 2048), torch.float32)], density=0.4)
    pairs += pairs_of([((64, 64), torch.float32)] * 300 + [((128, 96), torch.bfloat16)] * 50,
                      density=0.03, seed=SEED + 1)
    coo = mcs.encode_updates(pairs)
    assert coo[0][0].numel() * coo[0][0].element_size() > 256 << 10
    assert coo[0][1].numel() * coo[0][1].element_size() > 256 << 10
    updates = [dict(tensor_id=f"t{i}", global_shape=tuple(n.shape), indices=idx, values=vals)
               for i, ((n, _), (idx, vals)) in enumerate(zip(pairs, coo))]
    dev_store = mcs.connect(capacity_bytes=512 << 20, pinned_quota_bytes=pinned_quota)
    host_store = mcs.connect(capacity_bytes=512 << 20, pinned_quota_bytes=pinned_quota)
    before = direct_counters()
    dev = dev_store.put_sparse_objects(updates)
    after = direct_counters()
    host = host_store.put_sparse_objects([host_copy(u) for u in updates])
    assert all(isinstance(r, dict) for r in dev), dev
    assert after["objects"] == before["objects"] + len(updates)
    groups = after["groups"] - before["groups"]
    assert groups >= 2 if commit_groups else groups == 1
    same_commits(dev_store, dev, host_store, host)
    targets = whole_targets(pairs, "t")
    for (new, old), o in zip(pairs, dev_store.read_sparse_objects(dev_store.manifest((0, 1)),
                                                                  targets)):
        w = old.clone()
        mcs.apply_sparse_object(w, o)
        assert np.array_equal(bits(w), bits(new))
    dev_store.close()
    host_store.close()


@pytest.mark.parametrize("commit_groups", [0, 1], ids=["one-group", "groups"], indirect=True)
def test_embedded_commit_from_the_gpu_fails_bad_updates_alone_as_the_host_does(commit_groups):
    # In one group, or in groups of about one update each (a failure in any group fails alone).
    pairs = pairs_of([((64, 48), torch.bfloat16)] * 6, density=0.2)
    coo = mcs.encode_updates(pairs)
    ups = [dict(tensor_id=f"b{i}", global_shape=(64, 48), indices=i_, values=v)
           for i, (i_, v) in enumerate(coo)]
    def as_i16(idx):  # uint16 indices as int16 (torch's uint16 has few ops)
        return idx.view(torch.int16)

    # Unsorted (the host sorts it: it commits), out of the box, a duplicate, out of the shape
    # (the box of a smaller tensor), and a stale step: each fails or succeeds alone, as on the
    # host.
    ups[1]["indices"] = as_i16(coo[1][0]).flip(0).contiguous().view(coo[1][0].dtype)
    ups[1]["values"] = coo[1][1].flip(0).contiguous()
    ups[2]["global_offset"], ups[2]["local_shape"] = (0, 0), (32, 48)
    ups[3]["indices"] = torch.cat([as_i16(coo[3][0])[:1], as_i16(coo[3][0])]).view(coo[3][0].dtype)
    ups[3]["values"] = torch.cat([coo[3][1][:1], coo[3][1]])
    ups[4]["global_shape"] = (40, 48)
    ups[5]["tensor_id"] = "stale"
    ups[5]["generation"] = (0, 1)
    stores = []
    for _ in range(2):
        s = mcs.connect(pinned_quota_bytes=64 << 20)
        for g in ((0, 1), (1, 2)):
            first = dict(ups[5], generation=g, indices=coo[0][0].cpu(), values=coo[0][1].cpu())
            assert isinstance(s.put_sparse_objects([first])[0], dict)
        stores.append(s)
    ups[5]["generation"] = (0, 3)
    dev_store, host_store = stores
    before = direct_counters()
    dev = dev_store.put_sparse_objects(ups)
    after = direct_counters()
    host = host_store.put_sparse_objects([host_copy(u) for u in ups])
    assert isinstance(dev[0], dict) and isinstance(dev[1], dict)
    assert isinstance(dev[2], mcs.InvalidArgument) and "outside the source box" in str(dev[2])
    assert isinstance(dev[3], mcs.InvalidArgument) and "duplicate" in str(dev[3])
    assert isinstance(dev[4], mcs.InvalidArgument)
    assert isinstance(dev[5], mcs.StaleGeneration)
    # b0 and the stale step took the direct way; the others the host's encode.
    assert after["objects"] - before["objects"] == 2
    groups = after["groups"] - before["groups"]
    assert groups >= 4 if commit_groups else groups == 1
    same_commits(dev_store, dev, host_store, host)
    assert {s.tensor_id for s in dev_store.manifest((0, 1))} == {"b0", "b1", "stale"}
    dev_store.close()
    host_store.close()


def test_embedded_commit_from_the_gpu_of_two_steps_of_a_tensor_takes_the_staging_path():
    pairs = pairs_of([((64, 48), torch.bfloat16)] * 2)
    coo = mcs.encode_updates(pairs)
    ups = [dict(tensor_id="a", global_shape=(64, 48), indices=coo[0][0], values=coo[0][1],
                generation=(0, 1)),
           dict(tensor_id="a", global_shape=(64, 48), indices=coo[1][0], values=coo[1][1],
                generation=(1, 2))]
    dev_store, host_store = mcs.connect(), mcs.connect()
    before = direct_counters()
    dev = dev_store.put_sparse_objects(ups)
    assert direct_counters()["batches"] == before["batches"]
    host = host_store.put_sparse_objects([host_copy(u) for u in ups])
    assert all(isinstance(r, dict) for r in dev)
    assert dev == host
    assert dev_store.current_generation("a") == (1, 2)
    assert counted(dev_store) == counted(host_store)


def daemon_checks_on_its_gpu(store):
    return store.metrics().get("sparse_device_commit_gpu_items", 0) > 0


@pytest.mark.skipif(not HAVE_DAEMON, reason="mooncake_sparse_node is not built")
@pytest.mark.parametrize("group_bytes", ["0", "64KiB"], ids=["one-group", "groups"])
def test_daemon_commit_checked_on_its_gpu_equals_its_host_check_and_fails_bad_updates_alone(
        tmp_path, group_bytes):
    # Large enough to be checked on the GPU (64 KiB of entries and more), and one small one.
    # In one group, or in groups each checked while the one before it is copied into the store
    # (a failure in a later group fails alone as well).
    pairs = pairs_of([((512, 384), torch.bfloat16)] * 6 + [((300, 200), torch.float32),
                                                            ((64, 48), torch.bfloat16)],
                     density=0.2)
    coo = mcs.encode_updates(pairs)
    ups = [dict(tensor_id=f"b{i}", global_shape=tuple(n.shape), indices=i_, values=v)
           for i, ((n, _), (i_, v)) in enumerate(zip(pairs, coo))]

    def as_i16(idx):
        return idx.view(torch.int16)

    # As the embedded store's test: unsorted (sorted on the host: it commits), outside the box,
    # a duplicate, outside the shape, and a stale step; each fails or commits alone.
    ups[1]["indices"] = as_i16(coo[1][0]).flip(0).contiguous().view(coo[1][0].dtype)
    ups[1]["values"] = coo[1][1].flip(0).contiguous()
    ups[2]["global_offset"], ups[2]["local_shape"] = (0, 0), (256, 384)
    ups[3]["indices"] = torch.cat([as_i16(coo[3][0])[:1], as_i16(coo[3][0])]).view(coo[3][0].dtype)
    ups[3]["values"] = torch.cat([coo[3][1][:1], coo[3][1]])
    ups[4]["global_shape"] = (320, 384)
    ups[5]["tensor_id"] = "stale"
    results = []
    with start_node_daemon(tmp_path / "gpu", segment_size="64MiB", num_segments=2,
                           device_commit_group_bytes=group_bytes) as a, \
            start_node_daemon(tmp_path / "host", segment_size="64MiB", num_segments=2,
                              gpu_commit_check="false") as b:
        stores = [mcs.connect(a.url), mcs.connect(b.url)]
        for s in stores:
            for g in ((0, 1), (1, 2)):
                first = dict(ups[5], generation=g, indices=coo[0][0].cpu(), values=coo[0][1].cpu())
                assert isinstance(s.put_sparse_objects([first])[0], dict)
        ups[5]["generation"] = (0, 3)
        groups = stores[0].metrics().get("sparse_device_commit_check_groups", 0)
        for s in stores:
            before = s.metrics().get("sparse_device_commit_gpu_items", 0)
            results.append(s.put_sparse_objects(ups))
            results.append(s.metrics().get("sparse_device_commit_gpu_items", 0) - before)
        groups = stores[0].metrics().get("sparse_device_commit_check_groups", 0) - groups
        dev, on_gpu, host, on_host_gpu = results
        if not daemon_checks_on_its_gpu(stores[0]):
            pytest.skip("this daemon is built without the GPU codec")
        assert on_host_gpu == 0
        assert groups == 1 if group_bytes == "0" else groups >= 2
        # b0, the float32 one and the stale step were checked on the GPU; the others (and the
        # small b7) went through the host's check, which found what is wrong with them.
        assert on_gpu == 3
        assert all(isinstance(dev[k], dict) for k in (0, 1, 6, 7))
        assert isinstance(dev[2], mcs.InvalidArgument) and "outside the source box" in str(dev[2])
        assert isinstance(dev[3], mcs.InvalidArgument) and "duplicate" in str(dev[3])
        assert isinstance(dev[4], mcs.InvalidArgument)
        assert isinstance(dev[5], mcs.StaleGeneration)
        assert [type(r) for r in dev] == [type(r) for r in host]
        for d, h in zip(dev, host):
            if isinstance(h, dict):
                assert d == h
            else:
                assert str(d) == str(h)
        # The same objects, bit for bit, through either check.
        ma = sorted(stores[0].manifest((0, 1)), key=lambda x: x.source_ref)
        mb = sorted(stores[1].manifest((0, 1)), key=lambda x: x.source_ref)
        assert [repr(x) for x in ma] == [repr(x) for x in mb]
        assert {x.tensor_id for x in ma} == {"b0", "b1", "b6", "b7", "stale"}
        targets = [mcs.Target(x.tensor_id, f"n/{x.tensor_id}", "n", {}, (0, 0),
                              tuple(x.global_shape)) for x in ma]
        for oa, ob in zip(stores[0].read_sparse_objects(ma, targets),
                          stores[1].read_sparse_objects(mb, targets)):
            assert np.array_equal(np.asarray(oa.indices), np.asarray(ob.indices))
            assert np.array_equal(bits(torch.as_tensor(oa.values)),
                                  bits(torch.as_tensor(ob.values)))
        # Two steps of one tensor in one batch: the host check orders them.
        two = [dict(tensor_id="t", global_shape=(512, 384), indices=coo[0][0],
                    values=coo[0][1], generation=(0, 1)),
               dict(tensor_id="t", global_shape=(512, 384), indices=coo[1][0],
                    values=coo[1][1], generation=(1, 2))]
        before = stores[0].metrics()["sparse_device_commit_gpu_items"]
        assert all(isinstance(r, dict) for r in stores[0].put_sparse_objects(two))
        assert stores[0].metrics()["sparse_device_commit_gpu_items"] == before
        assert stores[0].current_generation("t") == (1, 2)
        for s in stores:
            s.close()


@pytest.mark.parametrize("group_bytes", ["0", "256KiB", "16MiB"],
                         ids=["one-group", "groups", "one-large-group"])
def test_daemon_commit_of_many_large_updates_checked_on_its_gpu_equals_its_host_check(
        tmp_path, group_bytes):
    # Forty updates of 64 KiB of entries and more into pinned segments: the daemon checks them
    # on its GPU and copies them from its copy of this process's memory into its segments, in
    # one group or in groups (256 KiB, 768 KiB, the rest), each checked while the one before it
    # is copied. The objects are those a daemon checking on its host makes.
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    pairs = pairs_of([((256, 256), torch.bfloat16)] * 36 + [((384, 256), torch.float32)] * 4,
                     density=0.2)
    with start_node_daemon(tmp_path / "gpu", segment_size="64MiB", num_segments=2,
                           pinned_quota_bytes="128MiB",
                           device_commit_group_bytes=group_bytes) as a, \
            start_node_daemon(tmp_path / "host", segment_size="64MiB", num_segments=2,
                              gpu_commit_check="false") as b:
        stores = [mcs.connect(a.url), mcs.connect(b.url)]
        if not stores[0].capabilities().get("cuda_ipc_available"):
            pytest.skip("no CUDA IPC with the daemon here")
        wait_pinned(stores[0], 128 << 20)
        for s in stores:
            assert all(isinstance(r, dict) for r in commit_all(s, pairs, "g"))
        if not daemon_checks_on_its_gpu(stores[0]):
            pytest.skip("this daemon is built without the GPU codec")
        m = stores[0].metrics()
        assert m["sparse_device_commit_gpu_items"] == len(pairs)
        assert m["sparse_device_commit_check_groups"] == (3 if group_bytes == "256KiB" else 1)
        ma = sorted(stores[0].manifest((0, 1)), key=lambda x: x.source_ref)
        mb = sorted(stores[1].manifest((0, 1)), key=lambda x: x.source_ref)
        assert [repr(x) for x in ma] == [repr(x) for x in mb]
        objs = stores[0].read_sparse_objects(stores[0].manifest((0, 1)),
                                             whole_targets(pairs, "g"))
        for (new, old), obj in zip(pairs, objs):
            w = old.clone()
            mcs.apply_sparse_object(w, obj)
            assert np.array_equal(bits(w), bits(new))
        for s in stores:
            s.close()


@pytest.mark.parametrize("apply", ["overwrite", "scatter_add"])
def test_put_sparse_updates_in_parts_commits_what_the_two_calls_do(store, apply):
    # Parts of a step: the GPU encodes a part while the one before it is committed from a side
    # stream; a pair the encode refuses (in the middle part) fails alone.
    pairs = pairs_of(MIXED * 4)
    names = [f"p{i}" for i in range(len(pairs))]
    updates = [dict(tensor_id=n, global_shape=tuple(new.shape), new=new, old=old,
                    generation=(0, 1), apply=apply) for n, (new, old) in zip(names, pairs)]
    bad = 13
    updates[bad] = {**updates[bad], "old": updates[bad]["old"][:-1]}
    before = direct_counters()
    results, coos = store.put_sparse_updates(updates, parts=3)
    after = direct_counters()
    assert isinstance(results[bad], mcs.InvalidArgument) and coos[bad] is None
    good = [i for i in range(len(pairs)) if i != bad]
    assert all(isinstance(results[i], dict) and results[i]["created"] for i in good), results
    if store.url is None:  # three commits from the device, one per part
        assert after["batches"] == before["batches"] + 3
    # The same entries as one encode_updates of the good pairs, usable on the caller's stream.
    want = mcs.encode_updates([pairs[i] for i in good], apply=apply)
    for i, (idx, vals) in zip(good, want):
        assert torch.equal(coos[i][0], idx) and np.array_equal(bits(coos[i][1]), bits(vals))
        assert results[i]["nnz"] == vals.shape[0]
    store.seal_generation((0, 1), names)
    man = store.wait_generation((0, 1), timeout=10)
    objs = store.read_sparse_objects(man, whole_targets(pairs, "p"))
    for i, ((new, old), o) in enumerate(zip(pairs, objs)):
        w = old.clone()
        mcs.apply_sparse_object(w, o)
        if i == bad:
            assert np.array_equal(bits(w), bits(old))  # no source: an empty object
        elif apply == "overwrite":
            assert np.array_equal(bits(w), bits(new))
        else:
            assert torch.allclose(w.float(), new.float(), atol=0.05, rtol=0.02)
    # A retry is idempotent; in one part it commits the same.
    again, _ = store.put_sparse_updates([u for i, u in enumerate(updates) if i != bad], parts=1)
    assert all(isinstance(r, dict) and not r["created"] for r in again)


def test_apply_sparse_updates_in_parts_applies_what_the_two_calls_do(store):
    # Targets read on the GPU in parts (the next part read on a side stream while one applies)
    # into strided views: TP column halves of every weight.
    pairs = pairs_of([((64, 96), torch.bfloat16), ((48, 40), torch.float32),
                      ((70, 34), torch.float16)] * 8)
    names = [f"a{i}" for i in range(len(pairs))]
    results, _ = store.put_sparse_updates(
        [dict(tensor_id=n, global_shape=tuple(new.shape), new=new, old=old)
         for n, (new, old) in zip(names, pairs)])
    assert all(isinstance(r, dict) for r in results)
    store.seal_generation((0, 1), names)
    man = store.wait_generation((0, 1), timeout=10)
    targets, views = [], []
    weights = [old.clone() for _, old in pairs]
    for n, w in zip(names, weights):
        rows, cols = w.shape
        for r, (lo, hi) in enumerate(((0, cols // 2), (cols // 2, cols))):
            targets.append(mcs.Target(n, f"{n}/tp{r}", "n", {}, (0, lo), (rows, hi - lo)))
            views.append(w[:, lo:hi])
    want = [o.nnz for o in store.read_sparse_objects(man, targets)]
    batch = mcs.TargetBatch(targets)
    for ts, parts in ((targets, 3), (batch, 4), (batch, 4), (targets, 1), (batch, 1)):
        for w, (_, old) in zip(weights, pairs):
            w.copy_(old)
        assert store.apply_sparse_updates(man, ts, views, parts=parts) == want
        for w, (new, _) in zip(weights, pairs):
            assert np.array_equal(bits(w), bits(new))
    # A wrong shape in the last part: refused before any part applies.
    for w, (_, old) in zip(weights, pairs):
        w.copy_(old)
    bad = views[:-1] + [views[-1][:, :-1]]
    with pytest.raises(mcs.InvalidArgument, match=r"weights\[47\]"):
        store.apply_sparse_updates(man, targets, bad, parts=3)
    for w, (_, old) in zip(weights, pairs):
        assert np.array_equal(bits(w), bits(old))


def test_inference_sync_of_cuda_shards_reads_on_the_gpu(store):
    # A reader's shards on the GPU (device="cuda"): every step read on the device and applied;
    # the shards equal the trainer's weights bit for bit, step after step.
    from mooncake.sparse import layout as L
    shapes = {f"model.layers.0.mlp.experts.{e}.{p}.weight": s for e in range(32)
              for p, s in (("gate_proj", (64, 32)), ("up_proj", (64, 32)),
                           ("down_proj", (32, 64)))}
    rules = L.qwen3_moe_rules(num_kv_heads=2)
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=rules, name="trainer"),
                        mcs.ParallelLayout(tp=2, rules=rules, name="inference"), shapes)
    g = torch.Generator(device="cuda").manual_seed(SEED)
    state = {n: torch.randn(s, generator=g, device="cuda").to(torch.bfloat16)
             for n, s in shapes.items()}
    trainer = mcs.TrainerSync(store, plan, 0)
    trainer.snapshot(state)
    shards = {t.tensor_id: state[t.tensor_id][tuple(slice(o, o + n) for o, n in zip(
        t.global_offset, t.local_shape))].clone() for t in plan.targets(1)}
    reader = mcs.InferenceSync(store, plan, 1, shards, device="cuda")
    for k in (1, 2):
        for w in state.values():
            mask = torch.rand(w.shape, generator=g, device="cuda") < 0.05
            w[mask] = torch.randn(int(mask.sum()), generator=g, device="cuda").to(w.dtype)
        trainer.step(state)
        trainer.seal()
        stats = reader.update(k, timeout=10)
        assert stats.nnz > 0
        for t in plan.targets(1):
            want = state[t.tensor_id][tuple(slice(o, o + n) for o, n in zip(
                t.global_offset, t.local_shape))]
            assert np.array_equal(bits(shards[t.tensor_id]), bits(want)), t.target_id
