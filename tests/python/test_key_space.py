"""The tensor API and the sparse layer share one store: the sparse layer's keys are out of the
tensor API's reach, and a stored tensor stays readable until it is removed or replaced.

Runs on the embedded store and through a real node daemon (whose shared-memory store evicts
what is not pinned when it runs out of space)."""

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse.testing import find_node_daemon, start_node_daemon


def _has_daemon() -> bool:
    try:
        find_node_daemon()
        return True
    except FileNotFoundError:
        return False


@pytest.fixture(params=["embedded", "node"])
def store(request, tmp_path):
    if request.param == "embedded":
        s = mcs.connect()
        yield s
        s.close()
        return
    if not _has_daemon():
        pytest.skip("no mooncake_sparse_node")
    with start_node_daemon(tmp_path, segment_size="1MiB", num_segments=4) as daemon:
        s = mcs.connect(daemon.url)
        yield s
        s.close()


def _commit(store, tid, gen, value):
    idx = np.array([[0, 1], [2, 3]], dtype=np.int64)
    vals = np.array([value, value + 1], dtype=np.float32)
    return store.put_sparse_object(tid, (4, 4), idx, vals, generation=gen)


def test_tensor_api_cannot_touch_the_sparse_layers_keys(store):
    _commit(store, "head", (0, 1), 1.0)
    x = np.arange(4, dtype=np.float32)
    for key in ("mcs/head/head", "mcs/src/head", "mcs/manifest/x", "mcs/"):
        with pytest.raises(mcs.InvalidArgument, match="reserves"):
            store.upsert_tensor(key, x)
        with pytest.raises(mcs.InvalidArgument):
            store.put_tensor(key, x)
        with pytest.raises(mcs.InvalidArgument):
            store.get_tensor(key)
        with pytest.raises(mcs.InvalidArgument):
            store.get_tensor_into(key, np.empty(4, np.float32))
    with pytest.raises(mcs.InvalidArgument):
        store.batch_upsert_tensor(["fine", "mcs/head/head"], [x, x])
    with pytest.raises(mcs.NotFound):
        store.get_tensor("fine")  # nothing of the failed batch was written
    # The tensor's generation chain is intact: the next step extends it.
    _commit(store, "head", (1, 2), 5.0)
    with pytest.raises(mcs.StaleGeneration):
        _commit(store, "head", (0, 3), 7.0)
    # Keys that merely contain the prefix are ordinary tensor keys.
    store.put_tensor("models/mcs/w", x)
    np.testing.assert_array_equal(store.get_tensor("models/mcs/w"), x)


def test_stored_tensors_stay_until_removed(store):
    """Default puts are hard-pinned: a store that fills up fails the new put with
    ResourceExhausted instead of silently evicting a stored weight; hard_pin=False opts into
    eviction (the node daemon's store evicts such objects, least recently used first)."""
    chunk = np.full(256 << 10, 7, dtype=np.uint8)  # 256 KiB; the daemon holds 4 MiB
    store.put_tensor("weights/0", chunk)
    assert store.tensor_info("weights/0")["hard_pinned"]
    store.put_tensor("scratch/0", chunk, hard_pin=False)
    assert not store.tensor_info("scratch/0")["hard_pinned"]
    stored = ["weights/0"]
    if store.capabilities()["backend"] == "node":
        with pytest.raises(mcs.ResourceExhausted):
            for i in range(1, 64):
                store.put_tensor(f"weights/{i}", chunk)
                stored.append(f"weights/{i}")
        # The evictable tensor made room; no pinned weight did.
        with pytest.raises(mcs.NotFound):
            store.get_tensor("scratch/0")
        assert len(stored) >= 8
    for key in stored:
        np.testing.assert_array_equal(store.get_tensor(key), chunk)
