"""The tensor API (docs/design.md §5) on host tensors, in the embedded store and through the node
daemon: the seven calls, dense box reads, upstream Mooncake's tensor object format, and
validation that leaves destinations untouched. CUDA tensors: test_tensor_gpu.py."""

import struct
import threading

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse import _core
from mooncake.sparse.testing import find_node_daemon, start_node_daemon

try:
    find_node_daemon()
    HAVE_DAEMON = True
except FileNotFoundError:
    HAVE_DAEMON = False

# Upstream's TensorDtype numbering (mooncake integration_utils.h).
UPSTREAM_CODES = {
    "float32": 0, "float64": 1, "int8": 2, "uint8": 3, "int16": 4, "uint16": 5, "int32": 6,
    "uint32": 7, "int64": 8, "uint64": 9, "bool": 10, "float16": 11, "bfloat16": 12,
    "float8_e4m3fn": 13, "float8_e5m2": 14,
}
NUMPY_DTYPES = [np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32,
                np.uint32, np.int64, np.uint64, np.bool_, np.float16]


@pytest.fixture(params=["embedded", "node"])
def store(request, tmp_path):
    if request.param == "embedded":
        yield mcs.connect(pinned_quota_bytes=64 << 20)
        return
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    with start_node_daemon(tmp_path, segment_size="16MiB", num_segments=4) as node:
        s = mcs.connect(node.url)
        yield s
        s.close()


@pytest.fixture
def rng():
    return np.random.default_rng()  # fresh data every run


def random_array(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def upstream_header(dtype_code, shape, data_bytes, data_offset=304):
    """An independent writer of upstream's TensorMetadata (struct layout, little-endian)."""
    dims = list(shape) + [-1] * (8 - len(shape))
    header = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, dtype_code, len(shape), 0, 0,
                         data_offset, data_bytes)
    layout = struct.pack("<8q8qII", *dims, *dims, 0, 0) + bytes(4 * 32)
    out = header + layout
    assert len(header) == 40 and len(layout) == 264 and len(out) == 304
    return out


# ---------------------------------------------------------------------------------------------
# The seven calls.
# ---------------------------------------------------------------------------------------------


def test_all_seven_calls_numpy(store, rng):
    a = random_array(rng, (7, 33), np.float32)
    store.put_tensor("w/a", a)
    np.testing.assert_array_equal(store.get_tensor("w/a"), a)

    keys = [f"w/b{i}" for i in range(5)]
    arrays = [random_array(rng, (i + 1, 16), np.int32) for i in range(5)]
    store.batch_put_tensor(keys, arrays)
    outs = [np.zeros_like(x) for x in arrays]
    store.batch_get_tensor_into(keys, outs)
    for x, y in zip(arrays, outs):
        np.testing.assert_array_equal(x, y)

    a2 = random_array(rng, (7, 33), np.float32)
    store.upsert_tensor("w/a", a2)
    into = np.empty_like(a2)
    store.get_tensor_into("w/a", into)
    np.testing.assert_array_equal(into, a2)

    arrays2 = [random_array(rng, (2, 3), np.float64) for _ in range(5)]
    store.batch_upsert_tensor(keys + ["w/new"], arrays2 + [a])
    for k, x in zip(keys, arrays2):
        np.testing.assert_array_equal(store.get_tensor(k), x)
    np.testing.assert_array_equal(store.get_tensor("w/new"), a)
    assert store.tensor_info("w/a")["version"] == 2


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_numpy_dtype(store, rng, dtype):
    a = random_array(rng, (3, 4, 5), dtype)
    store.put_tensor("k", a)
    got = store.get_tensor("k")
    assert got.dtype == a.dtype and got.shape == a.shape
    np.testing.assert_array_equal(got, a)
    info = store.tensor_info("k")
    assert info["upstream_dtype"] == UPSTREAM_CODES[np.dtype(dtype).name if dtype is not np.bool_ else "bool"]


def test_scalar_and_rank8(store, rng):
    s = np.array(3.5, dtype=np.float64)
    store.put_tensor("s", s)
    got = store.get_tensor("s")
    assert got.shape == () and got == 3.5
    a = random_array(rng, (1, 2, 1, 2, 1, 2, 1, 2), np.uint8)
    store.put_tensor("r8", a)
    np.testing.assert_array_equal(store.get_tensor("r8"), a)


def test_torch_cpu_bf16_all_calls(store):
    torch = pytest.importorskip("torch")
    t = torch.randn(64, 48, dtype=torch.bfloat16)
    store.put_tensor("bf", t)
    got = store.get_tensor("bf")
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert torch.equal(got, t)
    out = torch.empty_like(t)
    store.get_tensor_into("bf", out)
    assert torch.equal(out, t)
    ts = [torch.randn(8, 8, dtype=torch.bfloat16) for _ in range(3)]
    store.batch_put_tensor(["b0", "b1", "b2"], ts)
    store.batch_upsert_tensor(["b0", "b1"], [ts[1], ts[0]])
    outs = [torch.empty(8, 8, dtype=torch.bfloat16) for _ in range(3)]
    store.batch_get_tensor_into(["b0", "b1", "b2"], outs)
    assert torch.equal(outs[0], ts[1]) and torch.equal(outs[1], ts[0]) and torch.equal(outs[2], ts[2])
    store.upsert_tensor("bf", t * 2)
    assert torch.equal(store.get_tensor("bf"), t * 2)
    # requires_grad tensors are stored by value; as_torch forces a torch result.
    g = torch.randn(5, requires_grad=True)
    store.put_tensor("grad", g)
    assert torch.equal(store.get_tensor("grad", as_torch=True), g.detach())
    for name in ("float8_e4m3fn", "float8_e5m2"):
        tdt = getattr(torch, name, None)
        if tdt is None:
            continue
        f8 = torch.randn(16).to(tdt)
        store.put_tensor(name, f8)
        assert store.tensor_info(name)["upstream_dtype"] == UPSTREAM_CODES[name]
        assert torch.equal(store.get_tensor(name).view(torch.uint8), f8.view(torch.uint8))


def test_module_level_functions(rng):
    a = random_array(rng, (4,), np.int64)
    key = f"module/{rng.integers(1 << 62)}"
    mcs.put_tensor(key, a)
    mcs.upsert_tensor(key, a + 1)
    mcs.batch_put_tensor([key + "/x"], [a])
    mcs.batch_upsert_tensor([key + "/x"], [a + 2])
    np.testing.assert_array_equal(mcs.get_tensor(key), a + 1)
    out = np.empty_like(a)
    mcs.get_tensor_into(key + "/x", out)
    np.testing.assert_array_equal(out, a + 2)
    mcs.batch_get_tensor_into([key], [out])
    np.testing.assert_array_equal(out, a + 1)


# ---------------------------------------------------------------------------------------------
# Dense box reads.
# ---------------------------------------------------------------------------------------------


def test_box_reads_tp_rows_and_columns_numpy(store, rng):
    a = random_array(rng, (1024, 1024), np.float32)
    store.put_tensor("anchor/w", a)
    rows = np.empty((512, 1024), np.float32)
    store.get_tensor_into("anchor/w", rows, global_offset=(512, 0))
    assert rows.tobytes() == a[512:1024].tobytes()
    cols = np.empty((1024, 256), np.float32)
    store.get_tensor_into("anchor/w", cols, global_offset=[0, 256])
    assert cols.tobytes() == np.ascontiguousarray(a[:, 256:512]).tobytes()
    # numpy integers are offsets too; a box of one element; the whole tensor as a box.
    one = np.empty((1, 1), np.float32)
    store.get_tensor_into("anchor/w", one, global_offset=(np.int64(1023), np.int32(1023)))
    assert one[0, 0].tobytes() == a[1023, 1023].tobytes()
    whole = np.empty_like(a)
    store.get_tensor_into("anchor/w", whole, global_offset=(0, 0))
    assert whole.tobytes() == a.tobytes()


def test_box_reads_into_views_and_batches(store, rng):
    a = random_array(rng, (1024, 1024), np.int32)
    b = random_array(rng, (16,), np.uint8)
    store.batch_put_tensor(["w", "b"], [a, b])
    # Into a slice of a larger buffer (written in place, the rest untouched) and into a
    # Fortran-order shard.
    parent = np.full((1024, 600), -1, np.int32)
    view = parent[:, 100:356]
    store.get_tensor_into("w", view, global_offset=(0, 256))
    np.testing.assert_array_equal(view, a[:, 256:512])
    assert (parent[:, :100] == -1).all() and (parent[:, 356:] == -1).all()
    fortran = np.asfortranarray(np.zeros((512, 256), np.int32))
    store.get_tensor_into("w", fortran, global_offset=(512, 768))
    np.testing.assert_array_equal(fortran, a[512:, 768:])
    # A batch of boxes and whole tensors, read from one state of the store.
    r0, r1 = np.empty((512, 1024), np.int32), np.empty((512, 1024), np.int32)
    c1, whole = np.empty((1024, 512), np.int32), np.empty_like(b)
    store.batch_get_tensor_into(["w", "w", "w", "b"], [r0, r1, c1, whole],
                                global_offsets=[(0, 0), (512, 0), (0, 512), None])
    assert r0.tobytes() == a[:512].tobytes() and r1.tobytes() == a[512:].tobytes()
    assert c1.tobytes() == np.ascontiguousarray(a[:, 512:]).tobytes()
    assert whole.tobytes() == b.tobytes()


def test_box_reads_of_one_to_four_dimensions(store, rng):
    cases = [
        ((1000,), (250,), (500,)),
        ((8, 16, 32), (2, 4, 0), (3, 8, 32)),
        ((8, 16, 32), (1, 2, 3), (4, 5, 6)),
        ((4, 6, 8, 10), (1, 2, 3, 4), (2, 3, 4, 5)),
        ((4, 6, 8, 10), (0, 0, 0, 5), (4, 6, 8, 5)),
    ]
    for i, (full, origin, box) in enumerate(cases):
        a = random_array(rng, full, np.float64)
        store.put_tensor(f"box/{i}", a)
        out = np.empty(box, np.float64)
        store.get_tensor_into(f"box/{i}", out, global_offset=origin)
        want = a[tuple(slice(o, o + n) for o, n in zip(origin, box))]
        assert out.tobytes() == np.ascontiguousarray(want).tobytes(), (full, origin, box)


def test_box_reads_torch_cpu(store):
    torch = pytest.importorskip("torch")
    t = torch.randn(8, 1024, 64, dtype=torch.bfloat16)
    store.put_tensor("experts", t)
    shard = torch.empty(8, 256, 64, dtype=torch.bfloat16)
    store.get_tensor_into("experts", shard, global_offset=(0, 512, 0))
    assert torch.equal(shard, t[:, 512:768])
    cols = torch.empty(2, 1024, 16, dtype=torch.bfloat16)
    store.get_tensor_into("experts", cols, global_offset=(6, 0, 48))
    assert torch.equal(cols, t[6:, :, 48:])
    # A transposed destination (a view written in place).
    dst = torch.empty(64, 1024, dtype=torch.bfloat16).t()
    store.get_tensor_into("experts", dst.unsqueeze(0), global_offset=(3, 0, 0))
    assert torch.equal(dst, t[3])
    w = torch.randn(1024, 1024)
    store.put_tensor("w32", w)
    out = torch.empty(1024, 256)
    store.batch_get_tensor_into(["w32"], [out], global_offsets=[(0, 256)])
    assert out.numpy().tobytes() == w[:, 256:512].contiguous().numpy().tobytes()


def test_bad_boxes_leave_destinations_untouched(store, rng):
    a = random_array(rng, (4, 6), np.float32)
    store.put_tensor("k", a)
    dst = np.full((2, 3), 7.0, np.float32)
    before = dst.copy()
    cases = [
        ((3, 0), "outside"),
        ((0, 4), "outside"),
        ((-1, 0), "negative"),
        ((0,), "rank"),
        ((0, 0, 0), "rank"),
        ((), "empty"),
        (("0", 0), "ints"),
        ((0.0, 0), "ints"),
        ((True, 0), "ints"),
        ((1 << 64, 0), "outside"),
        ("00", "offset"),
        (3, "ints"),
    ]
    for offset, match in cases:
        with pytest.raises(mcs.InvalidArgument, match=match):
            store.get_tensor_into("k", dst, global_offset=offset)
        np.testing.assert_array_equal(dst, before)
    with pytest.raises(mcs.InvalidArgument, match="float32 \\[4, 6\\]"):
        store.get_tensor_into("k", np.zeros((2, 3), np.int32), global_offset=(0, 0))
    with pytest.raises(mcs.InvalidArgument, match="rank"):
        store.get_tensor_into("k", np.zeros(6, np.float32), global_offset=(0,))
    with pytest.raises(mcs.InvalidArgument, match="outside"):
        store.get_tensor_into("k", np.zeros((5, 6), np.float32), global_offset=(0, 0))
    with pytest.raises(mcs.NotFound):
        store.get_tensor_into("missing", dst, global_offset=(0, 0))
    # A batch whose second box is bad writes neither; offsets of another length fail.
    first = np.full((2, 3), 7.0, np.float32)
    with pytest.raises(mcs.InvalidArgument, match="outside"):
        store.batch_get_tensor_into(["k", "k"], [first, dst], global_offsets=[(0, 0), (3, 3)])
    with pytest.raises(mcs.InvalidArgument, match="global offsets"):
        store.batch_get_tensor_into(["k"], [dst], global_offsets=[(0, 0), (0, 0)])
    np.testing.assert_array_equal(first, before)
    np.testing.assert_array_equal(dst, before)
    store.get_tensor_into("k", dst, global_offset=(2, 3))
    np.testing.assert_array_equal(dst, a[2:, 3:])


def test_box_reads_module_level(rng):
    a = random_array(rng, (64, 32), np.int16)
    key = f"module/box/{rng.integers(1 << 62)}"
    mcs.put_tensor(key, a)
    out = np.empty((64, 8), np.int16)
    mcs.get_tensor_into(key, out, global_offset=(0, 24))
    np.testing.assert_array_equal(out, a[:, 24:])
    outs = [np.empty((32, 32), np.int16) for _ in range(2)]
    mcs.batch_get_tensor_into([key, key], outs, global_offsets=[(0, 0), (32, 0)])
    np.testing.assert_array_equal(np.concatenate(outs), a)


# ---------------------------------------------------------------------------------------------
# Upstream Mooncake's format.
# ---------------------------------------------------------------------------------------------


def test_dtype_codes_both_ways():
    for name, code in UPSTREAM_CODES.items():
        assert _core.upstream_dtype_code(name) == code
        assert _core.dtype_of_upstream_code(code) == name
    with pytest.raises(mcs.InvalidArgument):
        _core.dtype_of_upstream_code(15)


def test_header_matches_an_independent_writer():
    assert mcs.TENSOR_HEADER_BYTES == 304
    for name, code in UPSTREAM_CODES.items():
        for shape in [(), (3,), (2, 3, 4), (1,) * 8]:
            itemsize = 2 if "16" in name else 1 if ("8" in name or name == "bool") else \
                8 if "64" in name else 4
            n = int(np.prod(shape)) * itemsize
            ours = mcs.encode_tensor_header(name, shape)
            assert ours == upstream_header(code, shape, n), (name, shape)
            info = mcs.decode_tensor_header(ours + bytes(n))
            assert info["dtype"] == name and info["shape"] == shape and info["nbytes"] == n


def test_stored_bytes_are_upstreams_value(store, rng):
    a = random_array(rng, (5, 6), np.float16)
    store.put_tensor("u", a)
    meta, members = store.objects.get("u")
    assert list(members) == ["tensor"]
    blob = members["tensor"].tobytes()
    assert blob[:304] == upstream_header(11, (5, 6), a.nbytes)
    assert blob[304:] == a.tobytes()


def test_reads_an_upstream_written_object(store, rng):
    a = random_array(rng, (3, 7), np.int16)
    # Upstream may place the data after a padded data_offset.
    blob = upstream_header(4, a.shape, a.nbytes, data_offset=320) + bytes(16) + a.tobytes()
    store.objects.put("raw", {"tensor": np.frombuffer(blob, dtype=np.uint8)})
    np.testing.assert_array_equal(store.get_tensor("raw"), a)
    out = np.zeros_like(a)
    store.get_tensor_into("raw", out)
    np.testing.assert_array_equal(out, a)
    # A shard written by upstream's TP writers reads as its local shard.
    dims_g, dims_l = [6, 7] + [-1] * 6, [3, 7] + [-1] * 6
    header = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, 4, 2, 1, 0, 304, a.nbytes)
    axis = struct.pack("<iiiiiiq", 1, 0, 1, 2, 0, 0, 0)
    layout = struct.pack("<8q8qII", *dims_g, *dims_l, 1, 0) + axis + bytes(3 * 32)
    store.objects.put("shard", {"tensor": np.frombuffer(header + layout + a.tobytes(), np.uint8)})
    info = store.tensor_info("shard")
    assert info["layout"] == "shard" and info["global_shape"] == (6, 7) and info["shape"] == (3, 7)
    assert info["axes"][0]["shard_rank"] == 1
    np.testing.assert_array_equal(store.get_tensor("shard"), a)


def test_non_tensor_objects_are_rejected(store):
    store.objects.put("two", {"a": np.zeros(4, np.uint8), "b": np.zeros(4, np.uint8)})
    with pytest.raises(mcs.InvalidArgument, match="not a tensor object"):
        store.get_tensor("two")
    store.objects.put("junk", {"tensor": np.zeros(400, np.uint8)})
    with pytest.raises(mcs.InvalidArgument, match="magic"):
        store.get_tensor_into("junk", np.zeros(4, np.uint8))


# ---------------------------------------------------------------------------------------------
# Validation before any byte moves.
# ---------------------------------------------------------------------------------------------


def test_get_into_validation_leaves_destinations_untouched(store, rng):
    a = random_array(rng, (4, 6), np.float32)
    store.put_tensor("k", a)
    sentinel = np.full((4, 6), 7.0, dtype=np.float32)

    cases = [
        (np.full((4, 6), 7, dtype=np.int32), mcs.InvalidArgument, "float32 \\[4, 6\\]"),  # dtype
        (np.full((6, 4), 7.0, dtype=np.float32), mcs.InvalidArgument, "destination is float32 \\[6, 4\\]"),
        (np.full((24,), 7.0, dtype=np.float32), mcs.InvalidArgument, "\\[24\\]"),  # shape
        (np.full((4, 7), 7.0, dtype=np.float32), mcs.InvalidArgument, "\\[4, 7\\]"),  # size
        # A view is written in place, but not one whose elements overlap.
        (np.lib.stride_tricks.as_strided(np.full(6, 7.0, np.float32), (4, 6), (0, 4),
                                         writeable=True), mcs.InvalidArgument, "overlapping"),
    ]
    for dst, error, match in cases:
        before = dst.copy()
        with pytest.raises(error, match=match):
            store.get_tensor_into("k", dst)
        np.testing.assert_array_equal(dst, before)

    read_only = sentinel.copy()
    read_only.setflags(write=False)
    with pytest.raises(mcs.InvalidArgument, match="read-only"):
        store.get_tensor_into("k", read_only)
    with pytest.raises(mcs.InvalidArgument, match="numpy array or a tensor"):
        store.get_tensor_into("k", [[0.0] * 6] * 4)

    first, second = sentinel.copy(), sentinel.copy()
    with pytest.raises(mcs.NotFound):
        store.batch_get_tensor_into(["k", "missing"], [first, second])
    with pytest.raises(KeyError):  # NotFound is also a KeyError
        store.get_tensor_into("missing", second)
    with pytest.raises(mcs.InvalidArgument):
        store.batch_get_tensor_into(["k", "k"], [first, np.zeros((4, 6), np.float64)])
    np.testing.assert_array_equal(first, sentinel)
    np.testing.assert_array_equal(second, sentinel)
    with pytest.raises(mcs.InvalidArgument, match="2 keys but 1"):
        store.batch_get_tensor_into(["k", "k"], [first])

    torch = pytest.importorskip("torch")
    t = torch.full((6,), 7.0).expand(4, 6)  # one row seen four times
    with pytest.raises(mcs.InvalidArgument, match="overlapping"):
        store.get_tensor_into("k", t)
    assert bool((t == 7.0).all())
    view = torch.full((6, 4), 7.0).t()  # a non-contiguous view is written in place
    store.get_tensor_into("k", view)
    np.testing.assert_array_equal(view.numpy(), a)


def test_put_validation_writes_nothing(store, rng):
    a = random_array(rng, (4, 6), np.float32)
    with pytest.raises(mcs.InvalidArgument, match="extent < 1"):  # a view, then a bad tensor
        store.batch_put_tensor(["nc", "bad"], [a.T, np.zeros((0, 3), np.float32)])
    with pytest.raises(mcs.InvalidArgument, match="extent < 1"):
        store.put_tensor("empty", np.zeros((0, 3), np.float32))
    with pytest.raises(mcs.InvalidArgument, match="at most 8"):
        store.put_tensor("rank9", np.zeros((1,) * 9, np.float32))
    with pytest.raises(mcs.InvalidArgument, match="more than once"):
        store.batch_put_tensor(["d", "d"], [a, a])
    with pytest.raises(mcs.InvalidArgument, match="2 keys but 1"):
        store.batch_put_tensor(["x", "y"], [a])
    for key in ("nc", "empty", "rank9", "d", "x"):
        with pytest.raises(mcs.NotFound):
            store.tensor_info(key)

    store.put_tensor("exists", a)
    with pytest.raises(mcs.Conflict):
        store.put_tensor("exists", a + 1)
    with pytest.raises(mcs.Conflict):
        store.batch_put_tensor(["fresh1", "exists", "fresh2"], [a, a, a])
    for key in ("fresh1", "fresh2"):
        with pytest.raises(mcs.NotFound):
            store.get_tensor(key)
    np.testing.assert_array_equal(store.get_tensor("exists"), a)


def test_capabilities(store):
    caps = store.capabilities()
    for key in ("cuda_available", "cuda_ipc_available", "pinned_quota_bytes", "pinned_bytes",
                "pageable_bytes"):
        assert key in caps, key
    if caps["backend"] == "embedded":
        assert caps["pinned_quota_bytes"] == 64 << 20
        store.put_tensor("c", np.zeros(1 << 20, np.uint8))
        caps = store.capabilities()
        if not caps["cuda_available"]:
            assert caps["pinned_bytes"] == 0 and caps["pageable_bytes"] >= 1 << 20


def test_upserts_are_atomic_for_readers(store):
    """A reader never sees a mix of two versions."""
    n = 1 << 16
    patterns = [np.full(n, v, dtype=np.uint32) for v in (1, 2)]
    store.put_tensor("flip", patterns[0])
    stop = threading.Event()
    errors = []

    def writer():
        i = 0
        while not stop.is_set():
            store.upsert_tensor("flip", patterns[i % 2])
            i += 1

    def reader():
        out = np.empty(n, np.uint32)
        for _ in range(200):
            store.get_tensor_into("flip", out)
            if not (out[0] in (1, 2) and (out == out[0]).all()):
                errors.append(np.unique(out))

    w = threading.Thread(target=writer)
    w.start()
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    stop.set()
    w.join()
    assert not errors
