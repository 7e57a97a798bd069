"""The GPU codec from Python: encode_update of CUDA tensors, apply_sparse_object on CUDA weights
(host or device objects), read_sparse_objects(device=...). Fresh random data every run; skipped
without a build that has the GPU codec or without a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse import _core
from mooncake.sparse._gpu import DeviceSparseObject, gpu_available

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (gpu_available() and torch.cuda.is_available()),
    reason="needs the GPU codec (built with nvcc) and a CUDA device")

SEED = int(np.random.SeedSequence().entropy % (1 << 31))


def pair(shape, density, dtype=torch.bfloat16, seed=SEED):
    g = torch.Generator(device="cuda").manual_seed(seed)
    old = torch.randn(shape, generator=g, device="cuda").to(dtype)
    mask = torch.rand(shape, generator=g, device="cuda") < density
    new = old.clone()
    new[mask] = torch.randn(int(mask.sum()), generator=g, device="cuda").to(dtype)
    return old, new


def bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).cpu().numpy()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_encode_matches_cpu_encode(dtype):
    old, new = pair((1024, 768), 0.02, dtype)
    gi, gv = mcs.encode_update(new, old)
    assert gi.is_cuda and gv.is_cuda and gv.dtype == dtype
    ci, cv = mcs.encode_update(new.cpu(), old.cpu())
    assert np.array_equal(gi.cpu().numpy(), np.asarray(ci))
    assert np.array_equal(bits(gv), bits(torch.as_tensor(cv)))


def test_device_encode_commit_read_apply_overwrite_bit_exact():
    old, new = pair((2048, 1024), 0.01)
    store = mcs.connect()
    idx, vals = mcs.encode_update(new, old)  # on the GPU
    store.put_sparse_object("w", tuple(old.shape), idx, vals, generation=(0, 1))
    targets = [mcs.Target("w", f"n/r{tp}", "n", {"tp": tp}, (0, 512 * tp), (2048, 512))
               for tp in range(2)]
    manifest = store.manifest((0, 1))
    host_objs = store.read_sparse_objects(manifest, targets)
    dev_objs = store.read_sparse_objects(manifest, targets, device="cuda")
    assert all(isinstance(o, DeviceSparseObject) and o.indices.is_cuda for o in dev_objs)
    for t, h, d in zip(targets, host_objs, dev_objs):
        cols = slice(t.global_offset[1], t.global_offset[1] + 512)
        a = old[:, cols].contiguous()
        b = old[:, cols].contiguous()
        mcs.apply_sparse_object(a, h)  # host object -> uploaded, applied on the device
        mcs.apply_sparse_object(b, d)  # device object
        torch.cuda.synchronize()
        want = bits(new[:, cols])
        assert np.array_equal(bits(a), want)
        assert np.array_equal(bits(b), want)


def test_scatter_add_on_gpu_matches_cpu():
    old, new = pair((512, 512), 0.05, torch.float32)
    idx, vals = mcs.encode_update(new, old, apply="scatter_add")
    store = mcs.connect()
    store.put_sparse_object("w", (512, 512), idx, vals, generation=(0, 1), apply="scatter_add")
    t = mcs.Target("w", "n/r0", "n", {}, (0, 0), (512, 512))
    obj = store.read_sparse_objects(store.manifest((0, 1)), [t])[0]
    w_gpu = old.clone()
    mcs.apply_sparse_object(w_gpu, obj)
    w_cpu = old.cpu().numpy().copy()
    mcs.apply_sparse_object(w_cpu, obj)
    assert np.array_equal(w_gpu.cpu().numpy(), w_cpu)


def _special_pairs(dtype):
    """(new, old) with every kind of pair a scatter_add delta can hit: signed zeros, smallest
    subnormals, NaN, infinities, the largest finite values, tiny and ordinary changes, equal
    bits; each value against each other, then random values around them."""
    info = torch.finfo(dtype)
    vals = [0.0, -0.0, info.tiny, -info.tiny, info.smallest_normal * 0.5, float("nan"),
            float("inf"), -float("inf"), info.max, -info.max, 1.0, 1.0 + info.eps, -1.0, 3e-3,
            0.5, 2.0 ** -20]
    v = torch.tensor(vals, dtype=torch.float32).to(dtype)
    if dtype != torch.float32:  # the dtype's smallest subnormal, by its bits
        one = torch.tensor([1], dtype=torch.int16).view(dtype)
        v = torch.cat([v, one, -one])
    n, o = torch.meshgrid(v, v, indexing="ij")
    g = torch.Generator().manual_seed(SEED)
    r_old = torch.randn(64, 64, generator=g).to(dtype) * 1e-3
    r_new = r_old.clone()
    flip = torch.rand(64, 64, generator=g) < 0.3
    r_new[flip] = (r_new[flip].float() + torch.randn(int(flip.sum()), generator=g) * 1e-6).to(dtype)
    return torch.cat([n.reshape(-1), r_new.reshape(-1)]), torch.cat([o.reshape(-1), r_old.reshape(-1)])


@pytest.mark.parametrize("threshold", [0.0, 1e-6])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_scatter_add_encode_of_special_values_matches_host(dtype, threshold):
    new, old = _special_pairs(dtype)
    gi, gv = mcs.encode_updates([(new.cuda(), old.cuda())], apply="scatter_add",
                                threshold=threshold)[0]
    ci, cv = mcs.encode_update(new, old, apply="scatter_add", threshold=threshold)
    assert np.array_equal(gi.cpu().numpy(), np.asarray(ci))
    # The same deltas bit for bit, NaN ones as NaN (the payload is the processor's).
    g, c = gv.cpu(), torch.as_tensor(cv)
    nan = torch.isnan(g.float())
    assert torch.equal(nan, torch.isnan(c.float()))
    assert np.array_equal(bits(g[~nan]), bits(c[~nan]))
    assert len(ci) > 0 and nan.any()


def test_bad_input_leaves_weight_unchanged():
    old, new = pair((256, 256), 0.02)
    store = mcs.connect()
    idx, vals = mcs.encode_update(new, old)
    store.put_sparse_object("w", (256, 256), idx, vals, generation=(0, 1))
    obj = store.read_sparse_objects(
        store.manifest((0, 1)), [mcs.Target("w", "n/r", "n", {}, (0, 0), (256, 256))])[0]
    w = old[:128].clone()
    before = bits(w)
    with pytest.raises(mcs.InvalidArgument):
        mcs.apply_sparse_object(w, obj)  # shape mismatch
    wrong = old.to(torch.float32)
    with pytest.raises(mcs.InvalidArgument):
        mcs.apply_sparse_object(wrong, obj)  # dtype mismatch
    # An out-of-range coordinate is caught on the device before anything is written.
    bad_idx = np.array([[1, 1], [300, 2]], np.uint16)
    bad_val = torch.ones(2, dtype=torch.bfloat16)
    w2 = old.clone()
    snap = bits(w2)
    with pytest.raises(mcs.InvalidArgument):
        _core._gpu_apply_batch([w2], [bad_idx], [bad_val], ["overwrite"], None)
    assert np.array_equal(bits(w2), snap)
    assert np.array_equal(bits(w), before)
    with pytest.raises(mcs.InvalidArgument):
        mcs.encode_update(new, old.cpu())  # mixed devices


# Strided CUDA weights, updated in place: (parent shape, the view of the parent).
WEIGHT_VIEWS = {
    "tp_columns": ((512, 2048), lambda p: p[:, 1024:2048]),
    "transposed": ((768, 512), lambda p: p.t()),
    "every_other_row": ((1024, 384), lambda p: p[::2]),
    "transposed_slice": ((256, 1024), lambda p: p[:, 256:768].t()),
}


@pytest.mark.parametrize("apply", ["overwrite", "scatter_add"])
@pytest.mark.parametrize("name", sorted(WEIGHT_VIEWS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_apply_into_strided_weight_view_in_place(name, apply, dtype):
    shape, view = WEIGHT_VIEWS[name]
    g = torch.Generator(device="cuda").manual_seed(SEED)
    parent = torch.randn(shape, generator=g, device="cuda").to(dtype)
    w = view(parent)
    assert not w.is_contiguous()
    old = w.contiguous()
    mask = torch.rand(old.shape, generator=g, device="cuda") < 0.03
    new = old.clone()
    new[mask] = torch.randn(int(mask.sum()), generator=g, device="cuda").to(dtype)
    idx, vals = mcs.encode_update(new, old, apply=apply)
    store = mcs.connect()
    store.put_sparse_object("w", tuple(w.shape), idx, vals, generation=(0, 1), apply=apply)
    target = mcs.Target("w", "n/r0", "n", {}, (0, 0), tuple(w.shape))
    manifest = store.manifest((0, 1))
    host_obj = store.read_sparse_objects(manifest, [target])[0]
    dev_obj = store.read_sparse_objects(manifest, [target], device="cuda")[0]
    # The reference, in torch: the update applied to a contiguous copy.
    i = torch.from_numpy(np.asarray(host_obj.indices).astype(np.int64)).cuda()
    expect = old.clone()
    if apply == "overwrite":
        expect[i[:, 0], i[:, 1]] = dev_obj.values
    else:
        expect[i[:, 0], i[:, 1]] = (expect[i[:, 0], i[:, 1]].float() +
                                    dev_obj.values.float()).to(dtype)
    expect_parent = parent.clone()
    view(expect_parent).copy_(expect)
    for obj in (host_obj, dev_obj):
        p = parent.clone()
        mcs.apply_sparse_object(view(p), obj)
        torch.cuda.synchronize()
        assert np.array_equal(bits(view(p)), bits(expect)), (name, type(obj).__name__)
        assert np.array_equal(bits(p), bits(expect_parent)), f"{name}: bytes outside the view changed"
    if apply == "overwrite":
        assert np.array_equal(bits(expect), bits(new))


def test_apply_refuses_overlapping_weight_view():
    old = torch.zeros(32, 64, device="cuda", dtype=torch.bfloat16)
    new = old.clone()
    new[3, 5] = 1.0
    idx, vals = mcs.encode_update(new, old)
    store = mcs.connect()
    store.put_sparse_object("o", (32, 64), idx, vals, generation=(0, 1))
    obj = store.read_sparse_objects(store.manifest((0, 1)),
                                    [mcs.Target("o", "n/r0", "n", {}, (0, 0), (32, 64))])[0]
    row = torch.zeros(1, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(mcs.InvalidArgument, match="overlapping"):
        mcs.apply_sparse_object(row.expand(32, 64), obj)
    assert bool((row == 0).all())


def test_encode_of_strided_inputs_matches_contiguous():
    old, new = pair((256, 1024), 0.02)
    a, b = new[:, 256:768], old[:, 256:768]
    gi, gv = mcs.encode_update(a, b)
    ci, cv = mcs.encode_update(a.contiguous(), b.contiguous())
    assert np.array_equal(gi.cpu().numpy(), ci.cpu().numpy())
    assert np.array_equal(bits(gv), bits(cv))
