"""Array inputs in every layout numpy and torch produce, and strictly typed arguments.

- Big-endian numpy arrays and torch tensors with the lazy negation bit are read as the values
  they hold (or refused where they would be written in place), never reinterpreted.
- Fortran order, transposed, sliced, reversed and strided views, stride-0 empties and broadcasts
  are accepted wherever an array is read; weights and get_tensor_into destinations are written
  in place through their strides.
- Arguments are not coerced: a float generation, a str of keys or a None id is an
  InvalidArgument (a ValueError, from mcs.Error), never a plain TypeError or a silent
  conversion.

Each test compares bit for bit against a numpy / torch reference, on the embedded store and,
where the path differs (tensor copies through the client buffer), on the node daemon."""

import math

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse.testing import find_node_daemon, start_node_daemon

torch = pytest.importorskip("torch")

try:
    find_node_daemon()
    HAVE_DAEMON = True
except FileNotFoundError:  # pragma: no cover - the wheel always ships it
    HAVE_DAEMON = False

GEN = (0, 1)


@pytest.fixture(params=["embedded", "node"])
def store(request, tmp_path):
    if request.param == "embedded":
        yield mcs.connect()
        return
    if not HAVE_DAEMON:
        pytest.skip("no mooncake_sparse_node binary")
    with start_node_daemon(tmp_path, segment_size="8MiB", num_segments=4) as daemon:
        s = mcs.connect(daemon.url)
        yield s
        s.close()


@pytest.fixture
def embedded():
    return mcs.connect()


def read_whole(store, tensor_id, shape, generation=GEN):
    """The target-local object of the whole tensor."""
    target = mcs.Target(tensor_id, "r0", "node0", {}, (0,) * len(shape), tuple(shape))
    (obj,) = store.read_sparse_objects(store.manifest(generation), [target])
    return obj


def bits(x):
    """An array's raw bits as a native numpy array (bit-for-bit comparisons, NaN-safe)."""
    if isinstance(x, torch.Tensor):
        x = x.contiguous()
        if x.dtype == torch.bfloat16:
            x = x.view(torch.int16)
        x = x.numpy()
    x = np.asarray(x)
    x = x.astype(x.dtype.newbyteorder("="))
    return np.ascontiguousarray(x).view(f"u{x.dtype.itemsize}")


def assert_same(a, b):
    assert tuple(a.shape) == tuple(b.shape)
    np.testing.assert_array_equal(bits(a), bits(b))


def user_keys(store):
    return [k for k in store.list_keys("") if not k.startswith("mcs/")]


# ---------------------------------------------------------------------------------------------
# Item 4: big-endian numpy arrays, torch's negation bit
# ---------------------------------------------------------------------------------------------

def test_big_endian_indices_and_values_are_read_as_their_values(store):
    idx = np.array([[0, 1], [2, 3], [1, 300]], dtype=np.uint16)
    vals = np.array([1.5, -2.25, 1e30], dtype=np.float32)
    store.put_sparse_object("be", (4, 512), idx.astype(">u2"), vals.astype(">f4"))
    obj = read_whole(store, "be", (4, 512))
    w = np.zeros((4, 512), np.float32)
    mcs.apply_sparse_object(w, obj)
    want = np.zeros((4, 512), np.float32)
    want[tuple(idx.T.astype(np.int64))] = vals
    assert_same(w, want)
    # Wider big-endian index dtypes too.
    store.put_sparse_object("be64", (4, 512), idx.astype(">i8"), vals.astype(">f8").astype(">f4"))
    w2 = np.zeros((4, 512), np.float32)
    mcs.apply_sparse_object(w2, read_whole(store, "be64", (4, 512)))
    assert_same(w2, want)


def test_big_endian_encode_update_inputs():
    rng = np.random.default_rng(4)
    old = rng.standard_normal((33, 70)).astype(np.float32)
    new = old.copy()
    new[rng.random(new.shape) < 0.1] += 1
    ref_idx, ref_vals = mcs.encode_update(new, old)
    idx, vals = mcs.encode_update(new.astype(">f4"), old.astype(">f4"))
    assert_same(idx, ref_idx)
    assert_same(vals, ref_vals)


def test_big_endian_weight_is_refused_untouched(embedded):
    embedded.put_sparse_object("w", (3, 4), np.array([[1, 1]], np.uint16),
                               np.array([7.0], np.float32))
    obj = read_whole(embedded, "w", (3, 4))
    w = np.arange(12, dtype=">f4").reshape(3, 4)
    before = w.copy()
    with pytest.raises(mcs.InvalidArgument, match="byte order"):
        mcs.apply_sparse_object(w, obj)
    assert_same(w, before)


def test_big_endian_put_tensor_and_get_tensor_into(store):
    x = np.array([[1.5, -2.0, 3.25], [1e-30, 0.0, -7.0]], dtype=np.float32)
    store.put_tensor("f", x.astype(">f4"))
    assert_same(store.get_tensor("f"), x)
    store.put_tensor("i", np.arange(6, dtype=">i8").reshape(2, 3))
    assert_same(store.get_tensor("i"), np.arange(6, dtype=np.int64).reshape(2, 3))
    dst = np.zeros((2, 3), dtype=">f4")
    with pytest.raises(mcs.InvalidArgument, match="byte order"):
        store.get_tensor_into("f", dst)
    assert not dst.any()


def test_negation_bit_is_resolved_for_inputs(store):
    x = torch.tensor([[1.0, -2.0, 3.5], [0.25, 0.0, -8.0]])
    store.put_tensor("neg", torch._neg_view(x))
    assert_same(store.get_tensor("neg"), (-x).numpy())
    store.batch_put_tensor(["neg_b"], [torch._neg_view(x)])
    assert_same(store.get_tensor("neg_b"), (-x).numpy())
    # Values of a sparse object, and encode_update's inputs.
    vals = torch.tensor([1.0, -3.0])
    store.put_sparse_object("nv", (2, 3), np.array([[0, 0], [1, 2]], np.uint16),
                            torch._neg_view(vals))
    w = np.zeros((2, 3), np.float32)
    mcs.apply_sparse_object(w, read_whole(store, "nv", (2, 3)))
    assert w[0, 0] == -1.0 and w[1, 2] == 3.0
    idx, got = mcs.encode_update(torch._neg_view(x), torch.zeros(2, 3))
    ref_idx, ref = mcs.encode_update(-x, torch.zeros(2, 3))
    assert_same(idx, ref_idx)
    assert_same(got, ref)


def test_batch_calls_take_torch_members_as_they_are(store):
    # The core takes torch tensors through torch's C++ exporter: gradients, non-contiguous
    # views and a negation bit (resolved through the generic path) all come out right.
    from mooncake.sparse import _core

    x = torch.tensor([[1.0, -2.0, 3.5], [0.25, 0.0, -8.0]])
    objects, streams, device = _core._torch_prepare(
        [x, x.t(), torch._neg_view(x), np.ones(2)], False)
    assert streams == [None] * 4 and device == -1
    assert type(objects[0]).__name__ == "PyCapsule" and objects[2] is not x
    assert objects[3] is not None and type(objects[3]) is np.ndarray
    vals = torch.tensor([1.0, -3.0], requires_grad=True)
    idx = torch.tensor([[0, 0], [1, 2]], dtype=torch.int64)
    results = store.put_sparse_objects([
        {"tensor_id": "g", "global_shape": (2, 3), "indices": idx, "values": vals},
        {"tensor_id": "n", "global_shape": (2, 3), "indices": idx,
         "values": torch._neg_view(vals.detach())},
        {"tensor_id": "s", "global_shape": (2, 3), "indices": idx.t().contiguous().t(),
         "values": torch.tensor([[4.0, 9.0], [5.0, 9.0]])[:, 0]},
    ])
    assert all(isinstance(r, dict) and r["created"] for r in results), results
    for name, want in (("g", (1.0, -3.0)), ("n", (-1.0, 3.0)), ("s", (4.0, 5.0))):
        w = torch.zeros(2, 3)
        mcs.apply_sparse_objects([w], [read_whole(store, name, (2, 3))])
        assert (float(w[0, 0]), float(w[1, 2])) == want, name


def test_negation_bit_destinations_are_refused_untouched(store):
    store.put_tensor("t", np.ones((2, 3), np.float32))
    base = torch.zeros(2, 3)
    with pytest.raises(mcs.InvalidArgument, match="negation"):
        store.get_tensor_into("t", torch._neg_view(base))
    assert not base.any()
    store.put_sparse_object("w", (2, 3), np.array([[1, 1]], np.uint16), np.array([5.0], np.float32))
    with pytest.raises(mcs.InvalidArgument, match="negation"):
        mcs.apply_sparse_object(torch._neg_view(base), read_whole(store, "w", (2, 3)))
    assert not base.any()


# ---------------------------------------------------------------------------------------------
# Item 8: no lenient coercions, typed errors
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", [(0.9, 1.7), ("0", "1"), (-1, 1), (0, -1), (True, 2),
                                        (0, 1, 2), "01", None, 1, (0, 1 << 64)])
def test_generation_must_be_a_pair_of_non_negative_ints(embedded, generation):
    idx, vals = np.zeros((0, 2), np.uint16), np.zeros(0, np.float32)
    with pytest.raises(mcs.InvalidArgument, match="generation"):
        embedded.put_sparse_object("g", (2, 2), idx, vals, generation=generation)
    with pytest.raises(mcs.InvalidArgument, match="generation"):
        embedded.manifest(generation)
    assert embedded.list_keys("") == []


def test_numpy_integer_generations_are_ints(embedded):
    idx, vals = np.zeros((0, 2), np.uint16), np.zeros(0, np.float32)
    embedded.put_sparse_object("g", (2, 2), idx, vals, generation=(np.uint64(0), np.int32(1)))
    assert len(embedded.manifest((0, 1))) == 1


def test_tensor_keys_are_strings(store):
    a, b, c = (np.full(2, i, np.float32) for i in range(3))
    with pytest.raises(mcs.InvalidArgument, match="keys"):
        store.batch_put_tensor("T24", [a, b, c])
    with pytest.raises(mcs.InvalidArgument, match="key"):
        store.put_tensor(None, a)
    with pytest.raises(mcs.InvalidArgument, match="key"):
        store.upsert_tensor(7, a)
    with pytest.raises(mcs.InvalidArgument, match=r"keys\[1\]"):
        store.batch_put_tensor(["a", None], [a, b])
    with pytest.raises(mcs.InvalidArgument, match="tensors"):
        store.batch_put_tensor(["a", "b"], np.stack([a, b]))  # an array, not a list of them
    assert user_keys(store) == []
    store.put_tensor("a", a)
    for call in (lambda: store.get_tensor(None), lambda: store.tensor_info(None),
                 lambda: store.get_tensor_into(None, a.copy()),
                 lambda: store.batch_get_tensor_into("a", [a.copy()])):
        with pytest.raises(mcs.InvalidArgument):
            call()


@pytest.mark.parametrize("option", ["call_timeout", "connect_timeout"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 0, 0.0, -1, 1e300, "5", None,
                                   True])
def test_node_timeouts_must_be_finite_positive_seconds(tmp_path, option, value):
    # Refused before any connection is attempted: no daemon needed.
    with pytest.raises(mcs.InvalidArgument, match=option):
        mcs.connect(f"unix://{tmp_path}/none.sock", **{option: value})


@pytest.mark.parametrize("value", [0, -1, 2.5, "7", None, True, (1 << 20) + 1, 1 << 70])
def test_node_planned_read_targets_must_be_a_positive_count(tmp_path, value):
    with pytest.raises(mcs.InvalidArgument, match="planned_read_targets"):
        mcs.connect(f"unix://{tmp_path}/none.sock", planned_read_targets=value)


@pytest.mark.parametrize("value", [math.inf, math.nan, -1e-9])
def test_node_timeouts_are_checked_by_the_core_too(tmp_path, value):
    from mooncake.sparse import _core
    with pytest.raises(mcs.InvalidArgument, match="call_timeout"):
        _core._NodeStore(str(tmp_path / "none.sock"), call_timeout=value)
    with pytest.raises(mcs.InvalidArgument, match="reply_spin_max"):
        _core._NodeStore(str(tmp_path / "none.sock"), reply_spin_max=value if value < 0
                         else math.inf)


def test_typed_errors_for_bad_ids_shapes_and_manifests(embedded):
    idx, vals = np.array([[0, 0]], np.uint16), np.array([1.0], np.float32)
    cases = [
        lambda: embedded.put_sparse_object(None, (2, 2), idx, vals),
        lambda: embedded.put_sparse_object(5, (2, 2), idx, vals),
        lambda: embedded.put_sparse_object("t", 64, idx, vals),
        lambda: embedded.put_sparse_object("t", "64", idx, vals),
        lambda: embedded.put_sparse_object("t", (2.5, 2), idx, vals),
        lambda: embedded.put_sparse_object("t", (2, 2), None, vals),
        lambda: embedded.put_sparse_object("t", (2, 2), idx, None),
        lambda: embedded.put_sparse_object("t", (2, 2), idx, vals, apply=None),
        lambda: embedded.put_sparse_object("t", (2, 2), idx, vals, placement_policy=3),
        lambda: embedded.put_sparse_object("t", (2, 2), idx, vals, tile_shape=8),
        lambda: embedded.put_sparse_object("t", (2, 2), idx, vals, source_placement=[1]),
        lambda: embedded.put_sparse_object("t", (2, 2), idx, vals, num_threads=-1),
        lambda: embedded.read_sparse_objects(None, []),
        lambda: embedded.read_sparse_objects([None], []),
        lambda: embedded.read_sparse_objects([], None),
        lambda: embedded.read_sparse_objects(
            [], [mcs.Target("t", None, "node0", {}, (0, 0), (2, 2))]),
        lambda: embedded.read_sparse_objects(
            [], [mcs.Target(None, "r0", "node0", {}, (0, 0), (2, 2))]),
        lambda: embedded.current_generation(None),
        lambda: embedded.admit(None, GEN, None, {}, "w0"),
        lambda: embedded.admit("t", GEN, None, {}, None),
        lambda: embedded.list_keys(None),
        lambda: mcs.encode_update(np.ones(3, np.float32), np.zeros(3, np.float32), threshold="0"),
        lambda: mcs.apply_sparse_object(np.zeros((2, 2), np.float32), None),
    ]
    for i, call in enumerate(cases):
        with pytest.raises(mcs.InvalidArgument) as info:
            call()
        assert isinstance(info.value, mcs.Error) and isinstance(info.value, ValueError), i
    assert embedded.list_keys("") == []


# ---------------------------------------------------------------------------------------------
# Item 9: every layout numpy and torch accept
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_encode_update_of_an_unchanged_tensor_commits(store, dtype):
    w = torch.randn(16, 24).to(dtype)
    idx, vals = mcs.encode_update(w, w)
    assert idx.shape == (0, 2) and tuple(vals.shape) == (0,)
    info = store.put_sparse_object("norm", w.shape, idx, vals, return_info=True)
    assert info["nnz"] == 0
    obj = read_whole(store, "norm", tuple(w.shape))
    before = w.clone()
    mcs.apply_sparse_object(w, obj)
    assert torch.equal(w.view(torch.int16) if dtype == torch.bfloat16 else w,
                       before.view(torch.int16) if dtype == torch.bfloat16 else before)


def test_stride_zero_empties_everywhere(store):
    empty_idx = torch.empty(0, 2, dtype=torch.int64).expand(0, 2)
    empty_vals = torch.empty(0, dtype=torch.float32)
    assert empty_vals.stride() in ((1,), (0,))
    store.put_sparse_object("e", (3, 3), empty_idx, torch.zeros(5)[5:])
    store.put_sparse_object("e2", (3, 3), np.empty((0, 2), np.uint16)[:, ::2].repeat(2, 1),
                            np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (0,), (0,)))
    assert [s.nnz for s in store.manifest(GEN)] == [0, 0]


# Views of `shape` (r, c) into a buffer of BUFFER_SHAPE(r, c): each non-contiguous.
LAYOUTS = {
    "fortran": lambda b, r, c: b.T[:c, :r].T,  # b is Fortran-ordered (see buffer_for)
    "transposed": lambda b, r, c: b[:c, :r].T,
    "sliced": lambda b, r, c: b[1:r + 1, 2:c + 2],
    "strided": lambda b, r, c: b[::2, ::2][:r, :c],
    "reversed": lambda b, r, c: b[:r, :c][::-1, ::-1],
}


def buffer_for(name, values):
    """A buffer for LAYOUTS[name], filled from `values` (of BUFFER_SHAPE)."""
    return np.asfortranarray(values) if name == "fortran" else values.copy()


def buffer_shape(r, c):
    return (2 * max(r, c) + 3, 2 * max(r, c) + 5)


def test_put_sparse_object_takes_any_index_and_value_layout(store):
    rng = np.random.default_rng(9)
    shape = (40, 50)
    flat = rng.choice(shape[0] * shape[1], size=300, replace=False)
    idx = np.stack(np.unravel_index(flat, shape), axis=1).astype(np.int64)
    vals = rng.standard_normal(300).astype(np.float32)
    want = np.zeros(shape, np.float32)
    want[tuple(idx.T)] = vals
    idx_views = {
        "fortran": np.asfortranarray(idx),
        "every_other_row": np.repeat(idx, 2, axis=0)[::2],
        "transposed": np.ascontiguousarray(idx.T).T,
        "u16_reversed_columns":
            np.concatenate([idx, idx], axis=1).astype(np.uint16)[:, 1:3][:, ::-1],
        "torch_transposed": torch.from_numpy(np.ascontiguousarray(idx.T)).T,
    }
    val_views = {
        "strided": np.repeat(vals, 3)[::3],
        "reversed": vals[::-1].copy()[::-1],
        "torch_strided": torch.from_numpy(np.repeat(vals, 2))[::2],
    }
    n = 0
    for iname, iv in idx_views.items():
        for vname, vv in val_views.items():
            tid = f"t{n}"
            n += 1
            store.put_sparse_object(tid, shape, iv, vv)
            w = np.zeros(shape, np.float32)
            mcs.apply_sparse_object(w, read_whole(store, tid, shape))
            assert_same(w, want), (iname, vname)


def test_encode_update_takes_any_layout():
    rng = np.random.default_rng(3)
    r, c = 37, 29
    old_full = rng.standard_normal(buffer_shape(r, c)).astype(np.float32)
    new_full = old_full.copy()
    new_full[rng.random(new_full.shape) < 0.2] += 1.0
    for name, view in LAYOUTS.items():
        old = view(buffer_for(name, old_full), r, c)
        new = view(buffer_for(name, new_full), r, c)
        assert not old.flags.c_contiguous, name
        ref = mcs.encode_update(np.ascontiguousarray(new), np.ascontiguousarray(old))
        got = mcs.encode_update(new, old)
        assert_same(got[0], ref[0])
        assert_same(got[1], ref[1])
        # The same views through torch (DLPack); torch has no negative steps.
        if name in ("transposed", "sliced", "strided"):
            tnew = view(torch.from_numpy(new_full.copy()), r, c)
            told = view(torch.from_numpy(old_full.copy()), r, c)
            assert not tnew.is_contiguous()
            tgot = mcs.encode_update(tnew, told)
            assert_same(tgot[0], ref[0])
            assert_same(tgot[1], ref[1])


def sparse_update(store, tid, shape, rng, apply="overwrite"):
    flat = rng.choice(shape[0] * shape[1], size=min(200, shape[0] * shape[1] // 2), replace=False)
    idx = np.stack(np.unravel_index(flat, shape), axis=1).astype(np.uint16)
    vals = rng.standard_normal(len(flat)).astype(np.float32)
    store.put_sparse_object(tid, shape, idx, vals, apply=apply)
    return idx, vals


@pytest.mark.parametrize("apply", ["overwrite", "scatter_add"])
def test_apply_writes_numpy_views_in_place(embedded, apply):
    rng = np.random.default_rng(5)
    r, c = 31, 23
    sparse_update(embedded, "w", (r, c), rng, apply)
    obj = read_whole(embedded, "w", (r, c))
    full = rng.standard_normal(buffer_shape(r, c)).astype(np.float32)
    for name, layout in LAYOUTS.items():
        for threads in (1, 2):
            buf = buffer_for(name, full)
            view = layout(buf, r, c)
            want = np.ascontiguousarray(view)
            mcs.apply_sparse_object(want, obj)
            mcs.apply_sparse_object(view, obj, num_threads=threads)
            assert_same(view, want)
            # In place, and nothing outside the view moved.
            expect = buffer_for(name, full)
            layout(expect, r, c)[...] = want
            assert_same(buf, expect)


@pytest.mark.parametrize("apply", ["overwrite", "scatter_add"])
def test_apply_writes_torch_views_in_place(store, apply):
    rng = np.random.default_rng(6)
    shape = (24, 20)
    sparse_update(store, "w", shape, rng, apply)
    obj = read_whole(store, "w", shape)
    big = torch.randn(60, 50)
    views = {
        "transposed": big[:20, :24].t(),
        "sliced": big[3:27, 5:25],
        "strided": big[::2, ::2][:24, :20],
    }
    for name, view in views.items():
        want = view.contiguous().numpy().copy()
        mcs.apply_sparse_object(want, obj)
        before = big.clone()
        mcs.apply_sparse_object(view, obj)
        assert_same(view, want), name
        # Only the view's elements changed.
        mask = torch.zeros_like(big, dtype=torch.bool)
        {"transposed": lambda m: m[:20, :24], "sliced": lambda m: m[3:27, 5:25],
         "strided": lambda m: m[::2, ::2][:24, :20]}[name](mask).fill_(True)
        assert torch.equal(big[~mask], before[~mask]), name


def test_apply_refuses_overlapping_weights(embedded):
    embedded.put_sparse_object("w", (4, 3), np.array([[0, 0], [2, 1]], np.uint16),
                               np.array([1.0, 2.0], np.float32))
    obj = read_whole(embedded, "w", (4, 3))
    base = torch.zeros(3)
    with pytest.raises(mcs.InvalidArgument, match="overlap"):
        mcs.apply_sparse_object(base.expand(4, 3), obj)
    assert not base.any()


def tensor_sources(rng):
    x = rng.standard_normal((6, 10)).astype(np.float32)
    big = rng.standard_normal((13, 21)).astype(np.float32)
    return [
        ("fortran", np.asfortranarray(x)),
        ("transposed", np.ascontiguousarray(x.T).T),
        ("sliced", big[2:8, 3:13]),
        ("strided", big[::2, ::2][:6, :10]),
        ("reversed", x[::-1, ::-1]),
        ("broadcast", np.broadcast_to(x[0], (6, 10))),
        ("torch_transposed", torch.from_numpy(np.ascontiguousarray(x.T)).t()),
        ("torch_expanded", torch.from_numpy(x[0].copy()).expand(6, 10)),
        ("torch_strided", torch.from_numpy(big)[::2, 1::2][:6, :10]),
    ]


def test_put_tensor_takes_any_layout(store):
    rng = np.random.default_rng(7)
    sources = tensor_sources(rng)
    for name, src in sources:
        store.put_tensor(name, src)
        want = np.ascontiguousarray(src.numpy() if isinstance(src, torch.Tensor) else src)
        assert_same(store.get_tensor(name), want), name
    # A batch mixing layouts.
    store.batch_upsert_tensor([n for n, _ in sources], [s for _, s in sources])
    for name, src in sources:
        want = np.ascontiguousarray(src.numpy() if isinstance(src, torch.Tensor) else src)
        assert_same(store.get_tensor(name), want), name


def test_get_tensor_into_writes_views_in_place(store):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 10)).astype(np.float32)
    store.put_tensor("x", x)
    big = np.zeros((15, 25), np.float32)
    views = {
        "fortran": np.asfortranarray(np.zeros((6, 10), np.float32)),
        "transposed": np.zeros((10, 6), np.float32).T,
        "sliced": big[2:8, 3:13],
        "strided": big[::2, ::2][1:7, 1:11],
        "reversed": np.zeros((6, 10), np.float32)[::-1, ::-1],
    }
    for name, view in views.items():
        before = big.copy()
        store.get_tensor_into("x", view)
        assert_same(view, x), name
        if view.base is big or (view.base is not None and view.base.base is big):
            mask = np.ones(big.shape, bool)
            {"sliced": lambda m: m[2:8, 3:13], "strided": lambda m: m[::2, ::2][1:7, 1:11]}[
                name](mask)[...] = False
            assert_same(big[mask], before[mask]), name
        big[...] = 0
    # torch views, in a batch with a contiguous destination.
    tbig = torch.zeros(20, 30)
    tviews = [tbig[:10, :6].t(), tbig[5:11, 7:17], torch.zeros(6, 10)]
    store.batch_get_tensor_into(["x", "x", "x"], tviews)
    for v in tviews:
        assert_same(v, x)
    mask = torch.ones_like(tbig, dtype=torch.bool)
    mask[:10, :6] = False
    mask[5:11, 7:17] = False
    assert not tbig[mask].any()


def test_get_tensor_into_refuses_overlapping_destinations(store):
    store.put_tensor("x", np.ones((4, 3), np.float32))
    base = torch.zeros(3)
    with pytest.raises(mcs.InvalidArgument, match="overlap"):
        store.get_tensor_into("x", base.expand(4, 3))
    assert not base.any()
    readonly = np.zeros((4, 3), np.float32)
    readonly.setflags(write=False)
    with pytest.raises(mcs.InvalidArgument, match="read-only"):
        store.get_tensor_into("x", readonly)
