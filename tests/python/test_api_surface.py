"""The module-level functions are the default store's methods with the same signatures (so
type checkers and help() see real parameters, not *args/**kwargs)."""

import inspect

import numpy as np

import mooncake.sparse as mcs

FUNCTIONS = ("put_sparse_object", "read_sparse_objects", "manifest", "metrics", "put_tensor",
             "batch_put_tensor", "upsert_tensor", "batch_upsert_tensor", "get_tensor",
             "get_tensor_into", "batch_get_tensor_into")


def test_module_functions_have_the_store_methods_signatures():
    for name in FUNCTIONS:
        f = getattr(mcs, name)
        method = inspect.signature(getattr(mcs.Store, name))
        params = [p for p in method.parameters.values() if p.name != "self"]
        got = list(inspect.signature(f).parameters.values())
        assert [(p.name, p.kind, p.default) for p in got] == \
            [(p.name, p.kind, p.default) for p in params], name
        for p in got:
            assert p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD), (name, p)
        assert f.__doc__ == getattr(mcs.Store, name).__doc__


def test_module_functions_use_the_default_store():
    idx = np.array([[1, 2]], dtype=np.int64)
    vals = np.array([3.0], dtype=np.float32)
    mcs.put_sparse_object("api.surface", (4, 4), idx, vals, generation=(0, 1),
                          tile_shape=(2, 2))
    m = mcs.manifest((0, 1))
    assert any(s.tensor_id == "api.surface" for s in m)
    objs = mcs.read_sparse_objects(
        [s for s in m if s.tensor_id == "api.surface"],
        [mcs.Target("api.surface", "r0", "n0", {}, (0, 0), (4, 4))])
    w = np.zeros((4, 4), np.float32)
    mcs.apply_sparse_object(w, objs[0])
    assert w[1, 2] == 3.0
    assert mcs.metrics()["source_objects_put"] >= 1
    mcs.put_tensor("api.surface.t", np.arange(3, dtype=np.int32))
    np.testing.assert_array_equal(mcs.get_tensor("api.surface.t"), [0, 1, 2])
