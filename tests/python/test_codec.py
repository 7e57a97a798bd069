"""encode_update / apply round trips on numpy and torch CPU tensors."""

import numpy as np
import pytest

import mooncake.sparse as mcs


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
@pytest.mark.parametrize("shape", [(1000,), (96, 130), (5, 33, 40)])
def test_overwrite_round_trip_numpy(rng, dtype, shape):
    old = (rng.standard_normal(shape) * 100).astype(dtype)
    new = old.copy()
    flat = new.reshape(-1)
    k = max(1, flat.size // 100)
    pos = rng.choice(flat.size, size=k, replace=False)
    flat[pos] = (rng.standard_normal(k) * 100).astype(dtype)
    idx, vals = mcs.encode_update(new, old, apply="overwrite")
    assert idx.dtype == np.uint16 and idx.shape[1] == len(shape)
    changed = (new.reshape(-1).view(np.uint8).reshape(flat.size, -1)
               != old.reshape(-1).view(np.uint8).reshape(flat.size, -1)).any(axis=1)
    assert len(vals) == int(changed.sum()) <= k
    w = old.copy()
    mcs._core.apply_coo(w, idx, vals, "overwrite", 0)
    np.testing.assert_array_equal(w.view(np.uint8), new.view(np.uint8))


def test_scatter_add_threshold(rng):
    old = rng.standard_normal((64, 64)).astype(np.float32)
    new = old.copy()
    new[3, 4] += 1.0
    new[10, 11] += 1e-4
    idx, vals = mcs.encode_update(new, old, apply="scatter_add", threshold=1e-3)
    assert idx.tolist() == [[3, 4]]
    w = old.copy()
    mcs._core.apply_coo(w, idx, vals, "scatter_add", 0)
    assert abs(w[3, 4] - new[3, 4]) < 1e-6


def test_encoded_update_commits_without_resort(rng):
    store = mcs.connect()
    old = rng.standard_normal((300, 200)).astype(np.float32)
    new = old.copy()
    new[rng.integers(0, 300, 50), rng.integers(0, 200, 50)] = 7.0
    idx, vals = mcs.encode_update(new, old)
    store.put_sparse_object("w", old.shape, idx, vals, generation=(0, 1))
    (obj,) = store.read_sparse_objects(store.manifest((0, 1)),
                                       [mcs.Target("w", "r", "n", {}, (0, 0), old.shape)])
    w = old.copy()
    mcs.apply_sparse_object(w, obj)
    np.testing.assert_array_equal(w, new)


def test_torch_bfloat16_round_trip():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    old = torch.randn(512, 384, generator=g).to(torch.bfloat16)
    new = old.clone()
    mask = torch.rand(512, 384, generator=g) < 0.01
    new[mask] = torch.randn(int(mask.sum()), generator=g).to(torch.bfloat16)
    # -0.0 vs +0.0 and NaN payloads are bit differences too.
    new[0, 0] = -0.0 if old[0, 0].item() == 0.0 else new[0, 0]
    idx, vals = mcs.encode_update(new, old, apply="overwrite")
    assert vals.dtype == torch.bfloat16
    store = mcs.connect()
    store.put_sparse_object("w", (512, 384), idx, vals, generation=(0, 1))
    targets = [mcs.Target("w", f"r{t}", "n", {"tp": t}, (0, 192 * t), (512, 192)) for t in range(2)]
    objs = store.read_sparse_objects(store.manifest((0, 1)), targets)
    for t, obj in zip(targets, objs):
        shard = old[:, t.global_offset[1]:t.global_offset[1] + 192].contiguous()
        mcs.apply_sparse_object(shard, obj)
        ref = new[:, t.global_offset[1]:t.global_offset[1] + 192]
        assert torch.equal(shard.view(torch.int16), ref.contiguous().view(torch.int16))
        assert obj.values.dtype == torch.bfloat16


def test_torch_scatter_add_bf16():
    torch = pytest.importorskip("torch")
    old = torch.zeros(64, 64, dtype=torch.bfloat16)
    new = old.clone()
    new[1, 2] = 0.5
    new[60, 61] = -2.0
    idx, vals = mcs.encode_update(new, old, apply="scatter_add")
    assert idx.tolist() == [[1, 2], [60, 61]]
    w = old.clone()
    mcs._core.apply_coo(w, idx, vals, "scatter_add", 0)
    assert torch.equal(w, new)


def test_encode_rejects_mismatch(rng):
    a = np.zeros((4, 4), np.float32)
    with pytest.raises(mcs.InvalidArgument):
        mcs.encode_update(a, np.zeros((4, 5), np.float32))
    with pytest.raises(mcs.InvalidArgument):
        mcs.encode_update(a, np.zeros((4, 4), np.float64))
    with pytest.raises(mcs.InvalidArgument):
        mcs.encode_update(a, a, apply="overwrite", threshold=0.5)
    # Any layout is read (a Fortran-order input is gathered), never reinterpreted.
    new = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(4, 3))
    got = mcs.encode_update(new, np.zeros((4, 3), np.float32))
    ref = mcs.encode_update(np.ascontiguousarray(new), np.zeros((4, 3), np.float32))
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
