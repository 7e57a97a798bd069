"""The native sparse layer on an ObjectStore written in Python (the seam the upstream Mooncake
adapter plugs into): a plain in-memory implementation, checked for behaviour and for the way
its exceptions come back as typed errors."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse import _core


class DictObjectStore:
    """The ObjectStore contract over a dict (see python/csrc/python_object_store.h)."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple] = {}
        self.lock = threading.Lock()
        self.calls = {"put": 0, "stat": 0, "read_ranges": 0, "read_member": 0}
        self.fail_next_read: Exception | None = None

    def put(self, key, metadata, members, mode, hard_pin):
        self.calls["put"] += 1
        data = {}
        table = []
        for name, dtype, shape, address, nbytes, checksum in members:
            data[name] = ctypes.string_at(address, nbytes) if nbytes else b""
            table.append((name, dtype, tuple(shape), nbytes, checksum))
        with self.lock:
            old = self.objects.get(key)
            if mode == "create" and old is not None:
                raise mcs.Conflict(f"{key} exists")
            version = (old[2] + 1) if old else 1
            self.objects[key] = (bytes(metadata), table, version, hard_pin, data)

    def stat(self, key):
        self.calls["stat"] += 1
        with self.lock:
            if key not in self.objects:
                raise mcs.NotFound(f"no {key}")
            meta, table, version, pin, _ = self.objects[key]
        return meta, table, version, pin

    def _member(self, key, name):
        with self.lock:
            if key not in self.objects:
                raise mcs.NotFound(f"no {key}")
            _, table, _, _, data = self.objects[key]
        for m in table:
            if m[0] == name:
                return m, data[name]
        raise mcs.NotFound(f"{key} has no member {name}")

    def read_member(self, key, member, address, nbytes):
        self.calls["read_member"] += 1
        m, blob = self._member(key, member)
        if nbytes != len(blob):
            raise mcs.InvalidArgument("size")
        ctypes.memmove(address, blob, nbytes)

    def read_ranges(self, items):
        self.calls["read_ranges"] += 1
        if self.fail_next_read is not None:
            e, self.fail_next_read = self.fail_next_read, None
            raise e
        plan = []
        for key, member, r0, r1, address, nbytes in items:
            m, blob = self._member(key, member)
            rows = m[2][0]
            if r1 > rows:
                raise mcs.OutOfRange("rows")
            row = len(blob) // rows if rows else 0
            plan.append((address, blob[r0 * row:r1 * row]))
        for address, chunk in plan:
            ctypes.memmove(address, chunk, len(chunk))

    def remove(self, key):
        with self.lock:
            if self.objects.pop(key, None) is None:
                raise mcs.NotFound(key)

    def list(self, prefix):
        with self.lock:
            return sorted(k for k in self.objects if k.startswith(prefix))

    def counters(self):
        return {"puts": self.calls["put"], "range_reads": self.calls["read_ranges"]}


def store_on(impl):
    return mcs.Store(backend=_core._Store(node_id="n", object_store=impl))


def test_commit_read_apply_on_a_python_object_store():
    impl = DictObjectStore()
    store = store_on(impl)
    rng = np.random.default_rng()
    old = rng.standard_normal((256, 128)).astype(np.float32)
    new = old.copy()
    mask = rng.random(old.shape) < 0.03
    new[mask] += 1
    idx, vals = mcs.encode_update(new, old)
    store.put_sparse_object("w", old.shape, idx, vals, generation=(0, 1))
    assert any(k.startswith("mcs/src/") for k in impl.objects)
    targets = [mcs.Target("w", f"n/r{i}", "n", {}, (128 * i, 0), (128, 128)) for i in range(2)]
    objs = store.read_sparse_objects(store.manifest((0, 1)), targets)
    for t, o in zip(targets, objs):
        shard = old[t.global_offset[0]:t.global_offset[0] + 128].copy()
        mcs.apply_sparse_object(shard, o)
        assert shard.tobytes() == new[t.global_offset[0]:t.global_offset[0] + 128].tobytes()
    assert impl.calls["read_ranges"] >= 1
    assert store.store_counters()["puts"] == impl.calls["put"]
    # Readers of an object store of the caller's have stores of their own: the commit cached
    # no tile index here, and the read loaded the source's.
    assert store.metrics()["index_gets"] == 1


def test_python_exceptions_come_back_typed():
    impl = DictObjectStore()
    store = store_on(impl)
    idx = np.array([[0, 0], [3, 3]], np.int64)
    store.put_sparse_object("w", (8, 8), idx, np.ones(2, np.float32), generation=(0, 1))
    with pytest.raises(mcs.Conflict):
        store.put_sparse_object("w", (8, 8), idx, np.full(2, 2, np.float32), generation=(0, 1))
    t = mcs.Target("w", "n/r", "n", {}, (0, 0), (8, 8))
    store.clear_caches()
    impl.fail_next_read = mcs.Unavailable("the network went away")
    with pytest.raises(mcs.Unavailable, match="the network went away"):
        store.read_sparse_objects(store.manifest((0, 1)), [t])
    store.clear_caches()
    impl.fail_next_read = RuntimeError("a bug in the backend")
    with pytest.raises(mcs.Internal, match="a bug in the backend"):
        store.read_sparse_objects(store.manifest((0, 1)), [t])
    # And it recovers: the next read works.
    store.clear_caches()
    (obj,) = store.read_sparse_objects(store.manifest((0, 1)), [t])
    assert obj.nnz == 2


def test_admission_loses_to_a_create_still_in_flight():
    """A store that reports a key as taken before the object is visible (upstream Mooncake while
    another writer's put of it is in progress): admit returns False instead of NotFound, and a
    writer's retry after its own create still wins."""

    class InFlight(DictObjectStore):
        def __init__(self):
            super().__init__()
            self.in_flight: set[str] = set()

        def put(self, key, metadata, members, mode, hard_pin):
            if mode == "create" and key in self.in_flight:
                raise mcs.Conflict(f"{key} is being created")
            super().put(key, metadata, members, mode, hard_pin)

    args = ("layers.9.w", (7, 8), "owner(expert)", {"expert": 3})
    probe = DictObjectStore()  # learns the admission key
    store_on(probe).admit(*args, "probe")
    (key,) = probe.objects
    impl = InFlight()
    impl.in_flight.add(key)
    store = store_on(impl)
    assert store.admit(*args, "writer-b") is False
    impl.in_flight.clear()
    assert store.admit(*args, "writer-a") is True
    assert store.admit(*args, "writer-a") is True   # its retry
    assert store.admit(*args, "writer-b") is False


def test_an_incomplete_implementation_is_rejected():
    class Partial:
        def put(self, *a):
            pass

    with pytest.raises(mcs.InvalidArgument, match="lacks"):
        _core._Store(object_store=Partial())
