"""The tensor fast path with CUDA tensors (docs/design.md §5): the embedded store's direct D2H/H2D
copies into pinned object memory, ordering on the caller's stream, and the node daemon's CUDA IPC
handoff between processes. Skips cleanly without torch or a GPU; the IPC tests start children
with the 'spawn' context. Data is fresh random every run and compared bit-exactly."""

import hashlib
import multiprocessing as mp
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import mooncake.sparse as mcs  # noqa: E402
import tensor_workers as tw  # noqa: E402
from mooncake.sparse.testing import find_node_daemon, start_node_daemon  # noqa: E402

try:
    find_node_daemon()
    HAVE_DAEMON = True
except FileNotFoundError:
    HAVE_DAEMON = False

CTX = mp.get_context("spawn")
needs_daemon = pytest.mark.skipif(not HAVE_DAEMON, reason="mooncake_sparse_node is not built")


def seed():
    torch.manual_seed(int.from_bytes(os.urandom(8), "little"))


def digest(t):
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def bits_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8).cpu(), b.contiguous().view(torch.uint8).cpu())


@pytest.fixture
def embedded():
    if not mcs.connect().capabilities()["cuda_available"]:
        pytest.skip("the library cannot load the CUDA runtime here")
    return mcs.connect(pinned_quota_bytes=512 << 20)


@pytest.fixture
def node(tmp_path):
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    with start_node_daemon(tmp_path, segment_size="64MiB", num_segments=4,
                           pinned_quota_bytes="256MiB") as daemon:
        yield daemon


@pytest.fixture
def node_store(node):
    s = mcs.connect(node.url)
    if not s.capabilities()["cuda_ipc_available"]:
        pytest.skip("CUDA IPC is not available here")
    yield s
    s.close()


def all_calls(store):
    seed()
    dev = torch.device("cuda")
    a = torch.randn(1000, 37, device=dev, dtype=torch.bfloat16)
    store.put_tensor("g/a", a)
    got = store.get_tensor("g/a")
    assert got.device.type == "cpu" and bits_equal(got, a.cpu())
    out = torch.empty_like(a)
    store.get_tensor_into("g/a", out)
    assert bits_equal(out, a)

    keys = [f"g/b{i}" for i in range(8)]
    ts = [torch.randn(i + 1, 4096, device=dev) for i in range(8)]
    store.batch_put_tensor(keys, ts)
    outs = [torch.empty_like(t) for t in ts]
    store.batch_get_tensor_into(keys, outs)
    assert all(bits_equal(x, y) for x, y in zip(ts, outs))

    a2 = torch.randn_like(a)
    store.upsert_tensor("g/a", a2)
    store.get_tensor_into("g/a", out)
    assert bits_equal(out, a2)
    ts2 = [t * 3 for t in ts]
    store.batch_upsert_tensor(keys, ts2)
    store.batch_get_tensor_into(keys, outs)
    assert all(bits_equal(x, y) for x, y in zip(ts2, outs))

    # Mixed memory kinds in one batch, both directions.
    cpu = torch.randn(64, 64)
    cuda = torch.randn(64, 64, device=dev)
    store.batch_upsert_tensor(["g/cpu", "g/cuda"], [cpu, cuda])
    o_cuda, o_cpu = torch.empty_like(cuda), torch.empty_like(cpu)
    store.batch_get_tensor_into(["g/cpu", "g/cuda"], [o_cuda, o_cpu])
    assert bits_equal(o_cuda, cpu.cuda()) and bits_equal(o_cpu, cuda.cpu())


# ---------------------------------------------------------------------------------------------
# Embedded store.
# ---------------------------------------------------------------------------------------------


def test_embedded_all_calls(embedded):
    all_calls(embedded)


def test_embedded_copies_are_ordered_on_the_callers_stream(embedded):
    n = 16 << 20
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.empty(n, device="cuda")
        torch.cuda._sleep(100_000_000)  # pending work on the side stream (~50+ ms)
        x.fill_(3.0)
        embedded.put_tensor("ord", x)  # must wait for fill_
        y = torch.zeros(n, device="cuda")
        torch.cuda._sleep(100_000_000)
        y.fill_(1.0)
        embedded.get_tensor_into("ord", y)  # must land after fill_(1.0)
        z = y * 2
    side.synchronize()
    assert bool((embedded.get_tensor("ord", as_torch=True) == 3.0).all())
    assert bool((z == 6.0).all())


def test_embedded_pinned_quota(embedded):
    t = torch.randn(4 << 20, device="cuda")
    embedded.put_tensor("p", t)
    out = torch.empty_like(t)
    embedded.get_tensor_into("p", out)
    assert bits_equal(out, t)
    caps = embedded.capabilities()
    assert caps["pinned_bytes"] >= t.numel() * 4
    stats = embedded.tensor_stats()
    assert stats["pinned_copies"] >= 2 and stats["pageable_copies"] == 0

    pageable = mcs.connect(pinned_quota_bytes=0)
    pageable.put_tensor("p", t)
    pageable.get_tensor_into("p", out)
    assert bits_equal(out, t)
    assert pageable.capabilities()["pinned_bytes"] == 0
    assert pageable.tensor_stats()["pageable_copies"] >= 2


def test_embedded_cuda_validation_leaves_destination_untouched(embedded):
    t = torch.randn(32, 16, device="cuda")
    embedded.put_tensor("v", t)
    for dst in (torch.full((32, 16), 7.0, device="cuda", dtype=torch.float16),
                torch.full((16, 32), 7.0, device="cuda"),
                torch.full((1, 16), 7.0, device="cuda").expand(32, 16)):  # overlapping
        before = dst.clone()
        with pytest.raises(mcs.InvalidArgument):
            embedded.get_tensor_into("v", dst)
        assert bits_equal(dst, before)
    first = torch.full((32, 16), 7.0, device="cuda")
    with pytest.raises(mcs.NotFound):
        embedded.batch_get_tensor_into(["v", "missing"], [first, first.clone()])
    assert bool((first == 7.0).all())
    # A strided CUDA source is gathered on its stream: the data moves anyway.
    src = torch.randn(16, 32, device="cuda").t()
    embedded.put_tensor("nc", src)
    back = torch.empty(32, 16, device="cuda")
    embedded.get_tensor_into("nc", back)
    assert bits_equal(back, src.contiguous())


def test_embedded_cuda_array_interface(embedded):
    t = torch.randn(1024, device="cuda")

    class Producer:  # only __cuda_array_interface__ (as numba / cupy arrays expose)
        def __init__(self, tensor):
            self.__cuda_array_interface__ = tensor.__cuda_array_interface__
            self.keep = tensor

    torch.cuda.synchronize()
    embedded.put_tensor("cai", Producer(t))
    out = torch.empty_like(t)
    embedded.get_tensor_into("cai", Producer(out))
    torch.cuda.synchronize()
    assert bits_equal(out, t)


def test_embedded_large_bit_exact(embedded):
    seed()
    t = torch.randint(0, 1 << 16, (96 << 20,), dtype=torch.int32, device="cuda").to(torch.int16)
    embedded.put_tensor("big", t)
    out = torch.empty_like(t)
    embedded.get_tensor_into("big", out)
    assert digest(out) == digest(t)


# Strided CUDA destinations, written in place: (parent shape, dtype, the view of the parent).
STRIDED_VIEWS = {
    "tp_half_columns": ((256, 2048), torch.bfloat16, lambda p: p[:, 1024:2048]),
    "tp_slice_middle": ((128, 3072), torch.float16, lambda p: p[:, 1024:2048]),
    "transposed": ((384, 512), torch.float32, lambda p: p.t()),
    "every_other_row": ((96, 160), torch.bfloat16, lambda p: p[::2]),
    "every_third_column": ((64, 96), torch.float32, lambda p: p[:, ::3]),
    "fused_expert_slice": ((8, 64, 128), torch.bfloat16, lambda p: p[2:6, :, 32:96]),
    "transposed_slice": ((64, 256), torch.bfloat16, lambda p: p[:, 64:192].t()),
}


def strided_get_into(store, names, batch=False):
    """Each view gets the stored tensor bit-exactly and the rest of its parent keeps its bytes
    (a sentinel pattern)."""
    seed()
    cases = []
    for i, name in enumerate(names):
        shape, dtype, view = STRIDED_VIEWS[name]
        parent = torch.randn(shape, device="cuda").to(dtype)
        dst = view(parent)
        assert not dst.is_contiguous(), name
        src = torch.randn(tuple(dst.shape), device="cuda").to(dtype)
        key = f"strided/{name}/{i}"
        store.upsert_tensor(key, src)
        expected = parent.clone()
        view(expected).copy_(src)
        cases.append((name, key, parent, dst, src, expected))
    if batch:
        store.batch_get_tensor_into([c[1] for c in cases], [c[3] for c in cases])
    else:
        for _, key, _, dst, _, _ in cases:
            store.get_tensor_into(key, dst)
    for name, _, parent, dst, src, expected in cases:
        assert bits_equal(dst.contiguous(), src), name
        assert bits_equal(parent, expected), f"{name}: bytes outside the view changed"


@pytest.mark.parametrize("name", sorted(STRIDED_VIEWS))
def test_embedded_get_into_strided_views_in_place(embedded, name):
    strided_get_into(embedded, [name])


def test_embedded_batch_get_into_strided_views(embedded):
    strided_get_into(embedded, sorted(STRIDED_VIEWS), batch=True)


def test_embedded_large_tp_half_is_one_copy_bit_exact(embedded):
    # A 64 MiB TP half of a 2x wider bf16 parameter (the benchmark's --strided point).
    seed()
    parent = torch.randn(4096, 16384, device="cuda").to(torch.bfloat16)
    src = torch.randn(4096, 8192, device="cuda").to(torch.bfloat16)
    embedded.upsert_tensor("tp_half", src)
    left = parent[:, :8192].clone()
    embedded.get_tensor_into("tp_half", parent[:, 8192:])
    assert digest(parent[:, 8192:]) == digest(src)
    assert bits_equal(parent[:, :8192], left)


# Dense box reads into CUDA shards: (stored shape, dtype, box origin, box shape, destination
# maker: the box-shaped CUDA tensor to read into, with its parent when it is a view).
def _contiguous(shape, dtype):
    t = torch.full(shape, -3, device="cuda").to(dtype)
    return t, t


def _columns_of_wider(shape, dtype):
    parent = torch.full((shape[0], shape[1] * 2 + 5), -3, device="cuda").to(dtype)
    return parent, parent[:, 3:3 + shape[1]]


def _transposed(shape, dtype):
    parent = torch.full((shape[1], shape[0]), -3, device="cuda").to(dtype)
    return parent, parent.t()


BOXES = {
    "rows": ((1024, 1024), torch.float32, (512, 0), (512, 1024), _contiguous),
    "columns": ((1024, 1024), torch.float32, (0, 256), (1024, 256), _contiguous),
    "columns_into_view": ((1024, 1024), torch.bfloat16, (0, 256), (1024, 256), _columns_of_wider),
    "columns_into_transposed": ((512, 768), torch.float16, (0, 128), (512, 256), _transposed),
    "inner_box": ((300, 200), torch.int32, (17, 33), (101, 77), _contiguous),
    "expert_rows": ((8, 512, 64), torch.bfloat16, (2, 128, 0), (4, 256, 64), _contiguous),
    "expert_box": ((8, 64, 128), torch.bfloat16, (1, 8, 32), (3, 40, 64), _contiguous),
    "four_d": ((4, 6, 8, 10), torch.float32, (1, 2, 3, 4), (2, 3, 4, 5), _contiguous),
}


def box_get_into(store, names, batch=False):
    """Each shard gets its box of the stored tensor bit-exactly; the rest of a view's parent
    keeps its bytes."""
    seed()
    cases = []
    for i, name in enumerate(names):
        full, dtype, origin, box, make = BOXES[name]
        src = torch.randn(full, device="cuda").to(dtype) if dtype.is_floating_point else \
            torch.randint(-(1 << 30), 1 << 30, full, device="cuda", dtype=dtype)
        key = f"box/{name}/{i}"
        store.upsert_tensor(key, src)
        parent, dst = make(box, dtype)
        want = src[tuple(slice(o, o + n) for o, n in zip(origin, box))]
        expected = parent.clone()
        if parent is dst:
            expected = want.clone()
        else:
            make_view = {_columns_of_wider: lambda p: p[:, 3:3 + box[1]],
                         _transposed: lambda p: p.t()}[make]
            make_view(expected).copy_(want)
        cases.append((name, key, origin, parent, dst, want, expected))
    if batch:
        store.batch_get_tensor_into([c[1] for c in cases], [c[4] for c in cases],
                                    global_offsets=[c[2] for c in cases])
    else:
        for _, key, origin, _, dst, _, _ in cases:
            store.get_tensor_into(key, dst, global_offset=origin)
    torch.cuda.synchronize()
    for name, _, _, parent, dst, want, expected in cases:
        assert bits_equal(dst.contiguous(), want.contiguous()), name
        assert bits_equal(parent, expected), f"{name}: bytes outside the view changed"


@pytest.mark.parametrize("name", sorted(BOXES))
def test_embedded_box_reads_into_cuda(embedded, name):
    box_get_into(embedded, [name])


def test_embedded_batch_box_reads_into_cuda(embedded):
    box_get_into(embedded, sorted(BOXES), batch=True)


def test_embedded_box_reads_from_pageable_memory():
    """Over the pinned quota a strided box is gathered on the host, then copied as a whole."""
    if not mcs.connect().capabilities()["cuda_available"]:
        pytest.skip("the library cannot load the CUDA runtime here")
    store = mcs.connect(pinned_quota_bytes=0)
    box_get_into(store, sorted(BOXES), batch=True)
    assert store.tensor_stats().get("pageable_copies", 0) >= 1


def test_embedded_large_column_box_bit_exact(embedded):
    # Columns [4096, 8192) of a [8192, 16384] bf16 anchor (256 MiB) into a 64 MiB shard.
    seed()
    src = torch.randn(8192, 16384, device="cuda").to(torch.bfloat16)
    embedded.upsert_tensor("anchor/big", src)
    out = torch.empty(8192, 4096, device="cuda", dtype=torch.bfloat16)
    embedded.get_tensor_into("anchor/big", out, global_offset=(0, 4096))
    assert digest(out) == digest(src[:, 4096:8192])


def test_embedded_bad_box_leaves_cuda_destination_untouched(embedded):
    src = torch.randn(64, 64, device="cuda")
    embedded.upsert_tensor("anchor/small", src)
    out = torch.full((32, 32), 5.0, device="cuda")
    for offset in [(40, 0), (0, 33), (-1, 0), (0,)]:
        with pytest.raises(mcs.InvalidArgument):
            embedded.get_tensor_into("anchor/small", out, global_offset=offset)
    assert bool((out == 5.0).all())


@needs_daemon
@pytest.mark.parametrize("name", sorted(BOXES))
def test_node_box_reads_into_cuda(node_store, name):
    box_get_into(node_store, [name])


@needs_daemon
def test_node_batch_box_reads_into_cuda(node_store):
    box_get_into(node_store, sorted(BOXES), batch=True)


@needs_daemon
def test_node_box_reads_from_pageable_memory(tmp_path):
    if not mcs.connect().capabilities()["cuda_available"]:
        pytest.skip("the library cannot load the CUDA runtime here")
    with start_node_daemon(tmp_path, segment_size="64MiB", num_segments=4,
                           pinned_quota_bytes=0) as daemon:
        s = mcs.connect(daemon.url)
        if not s.capabilities()["cuda_ipc_available"]:
            pytest.skip("CUDA IPC is not available here")
        box_get_into(s, sorted(BOXES), batch=True)
        s.close()


# ---------------------------------------------------------------------------------------------
# Node daemon: CUDA IPC.
# ---------------------------------------------------------------------------------------------


@needs_daemon
@pytest.mark.parametrize("name", sorted(STRIDED_VIEWS))
def test_node_get_into_strided_views_in_place(node_store, name):
    strided_get_into(node_store, [name])


@needs_daemon
def test_node_batch_get_into_strided_views(node_store):
    strided_get_into(node_store, sorted(STRIDED_VIEWS), batch=True)


@needs_daemon
def test_node_all_calls(node_store):
    all_calls(node_store)
    m = node_store.metrics()
    assert m["cuda_ipc_opens"] >= 1
    assert m["tensor_cuda_copies"] >= 1


@needs_daemon
def test_node_validation_leaves_destination_untouched(node_store):
    t = torch.randn(32, 16, device="cuda")
    node_store.put_tensor("v", t)
    for dst in (torch.full((32, 16), 7.0, device="cuda", dtype=torch.float16),
                torch.full((16, 32), 7.0, device="cuda")):
        before = dst.clone()
        with pytest.raises(mcs.InvalidArgument):
            node_store.get_tensor_into("v", dst)
        assert bits_equal(dst, before)
    first = torch.full((32, 16), 7.0, device="cuda")
    with pytest.raises(mcs.NotFound):
        node_store.batch_get_tensor_into(["v", "missing"], [first, first.clone()])
    assert bool((first == 7.0).all())


@needs_daemon
def test_node_freed_and_reused_allocations_are_never_confused(node_store):
    """The daemon caches IPC mappings: after the client frees an allocation and gets new memory
    (often at the same address), what is stored must be the new data."""
    for i in range(4):
        seed()
        x = torch.randn(3 << 20, device="cuda")
        node_store.upsert_tensor("reuse", x)
        out = torch.empty_like(x)
        node_store.get_tensor_into("reuse", out)
        assert bits_equal(out, x), i
        expect = digest(x)
        del x, out
        torch.cuda.empty_cache()
        assert digest(node_store.get_tensor("reuse", as_torch=True)) == expect


@needs_daemon
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
def test_ipc_child_puts_parent_gets(node, node_store, dtype_name):
    q = CTX.Queue()
    numel = (5 << 20) + 3
    p = CTX.Process(target=tw.put_random_cuda, args=(node.url, "ipc/x", numel, dtype_name, q))
    p.start()
    status, child_digest, child_ipc = q.get(timeout=180)
    p.join(60)
    assert status == "ok", child_digest
    assert child_ipc
    out = torch.full((numel,), 7, device="cuda").to(getattr(torch, dtype_name))
    node_store.get_tensor_into("ipc/x", out)
    assert digest(out) == child_digest


@needs_daemon
def test_ipc_parent_puts_child_gets(node, node_store):
    seed()
    numel = 1 << 20
    t = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    node_store.put_tensor("ipc/y", t)
    q = CTX.Queue()
    p = CTX.Process(target=tw.get_into_cuda, args=(node.url, "ipc/y", numel, "bfloat16", q))
    p.start()
    status, child_digest, _ = q.get(timeout=180)
    p.join(60)
    assert status == "ok", child_digest
    assert child_digest == digest(t)


@pytest.mark.parametrize("where", ["embedded", "node"])
def test_pageable_copies_through_pinned_chunks_are_bit_exact(tmp_path, where):
    """Over the pinned quota, CUDA copies of two chunks or more go through the store's two
    pinned 32 MiB chunks: sizes that end mid-chunk, a batch, upsert and get_into."""
    if not mcs.connect().capabilities()["cuda_available"]:
        pytest.skip("the library cannot load the CUDA runtime here")
    seed()
    sizes = [(64 << 20) + 2, (96 << 20) + 4096 + 6, 130 << 20]  # bytes of int16 tensors
    tensors = [torch.randint(-(1 << 15), 1 << 15, (n // 2,), dtype=torch.int16, device="cuda")
               for n in sizes]

    def check(store):
        store.put_tensor("p/0", tensors[0])
        store.batch_put_tensor(["p/1", "p/2"], tensors[1:])
        store.upsert_tensor("p/0", tensors[2][: tensors[0].numel()].clone())
        outs = [torch.empty_like(t) for t in tensors]
        store.batch_get_tensor_into(["p/0", "p/1", "p/2"], outs)
        assert digest(outs[0]) == digest(tensors[2][: tensors[0].numel()])
        assert digest(outs[1]) == digest(tensors[1]) and digest(outs[2]) == digest(tensors[2])
        stats = store.tensor_stats()
        assert stats.get("pageable_copies", 0) >= 1, stats

    if where == "embedded":
        check(mcs.connect(pinned_quota_bytes=0))
        return
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    with start_node_daemon(tmp_path, segment_size="256MiB", num_segments=4,
                           pinned_quota_bytes=0) as daemon:
        s = mcs.connect(daemon.url)
        if not s.capabilities()["cuda_ipc_available"]:
            pytest.skip("CUDA IPC is not available here")
        s.put_tensor("p/0", tensors[0])
        outs = [torch.empty_like(t) for t in tensors]
        s.batch_put_tensor(["p/1", "p/2"], tensors[1:])
        s.batch_get_tensor_into(["p/0", "p/1", "p/2"], outs)
        for o, t in zip(outs, tensors):
            assert digest(o) == digest(t)
        s.close()


@pytest.mark.parametrize("where", ["embedded", "node"])
def test_pageable_batch_of_small_tensors_pipelines_across_items(tmp_path, where):
    """A batch of many small tensors over the pinned quota is cut into chunks across its items
    (a chunk holds pieces of several tensors, a tensor may straddle two chunks): bit-exact both
    ways, and it moved through the pinned chunks rather than one driver copy per tensor."""
    if not mcs.connect().capabilities()["cuda_available"]:
        pytest.skip("the library cannot load the CUDA runtime here")
    seed()
    rng = np.random.default_rng(7)
    sizes = [int(n) * 2 for n in rng.integers(1, 3 << 20, 48)]  # bytes; ~144 MiB in all
    sizes[5] = 2  # one element
    tensors = [torch.randint(-(1 << 15), 1 << 15, (n // 2,), dtype=torch.int16, device="cuda")
               for n in sizes]
    keys = [f"small/{i}" for i in range(len(tensors))]

    def check(store, chunks):
        before = chunks()
        store.batch_put_tensor(keys, tensors)
        outs = [torch.empty_like(t) for t in tensors]
        store.batch_get_tensor_into(keys, outs)
        for o, t in zip(outs, tensors):
            assert digest(o) == digest(t)
        # ~144 MiB each way through 32 MiB chunks: at least 4 chunks per direction.
        assert chunks() - before >= 8

    if where == "embedded":
        s = mcs.connect(pinned_quota_bytes=0)
        check(s, lambda: s.tensor_stats()["pageable_chunks"])
        return
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    with start_node_daemon(tmp_path, segment_size="256MiB", num_segments=4,
                           pinned_quota_bytes=0) as daemon:
        s = mcs.connect(daemon.url)
        if not s.capabilities()["cuda_ipc_available"]:
            pytest.skip("CUDA IPC is not available here")
        check(s, lambda: int(s.metrics()["tensor_pageable_chunks"]))
        s.close()
