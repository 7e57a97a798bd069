"""Many nodes on the real Mooncake Store (docs/design.md §6): a real mooncake_master on loopback,
clients from upstream's mooncake-transfer-engine wheel, this library's sparse layer on top.

Node A and node B are separate processes with their own Mooncake clients, segments and
addresses (127.0.0.1 and 127.0.0.2). Skipped when the upstream wheel is not installed."""

from __future__ import annotations

import multiprocessing as mp
import random

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse._upstream import parse_mooncake_url, upstream_available
from mooncake.sparse.testing import (find_mooncake_master, start_mooncake_master,
                                     start_python_node_daemon)

import upstream_workers as W

pytestmark = pytest.mark.skipif(not upstream_available(), reason="upstream Mooncake not installed")

CTX = mp.get_context("spawn")
NODE_A = {"local_hostname": "127.0.0.1", "segment_bytes": 64 << 20, "buffer_bytes": 16 << 20}
NODE_B = {"local_hostname": "127.0.0.2", "segment_bytes": 16 << 20, "buffer_bytes": 16 << 20}


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    try:
        find_mooncake_master()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with start_mooncake_master(tmp_path_factory.mktemp("master")) as m:
        yield m


@pytest.fixture(scope="module")
def node_a(master):
    """This process as node A: a client with its own segment (holds what it writes)."""
    return mcs.connect(master.url(**NODE_A))


def fresh_generation():
    base = random.randint(1, 1 << 40)
    return (base, base + 1)


def unique_key(prefix: str) -> str:
    return f"{prefix}{random.getrandbits(48):x}"


def recv(conn, timeout=120.0):
    assert conn.poll(timeout), "worker timed out"
    msg = conn.recv()
    assert msg[0] != "error", msg[1]
    return msg


# ---------------------------------------------------------------------------------------------
# URL parsing.
# ---------------------------------------------------------------------------------------------
def test_url_parsing():
    c = parse_mooncake_url("mooncake://10.0.0.5:50051?protocol=rdma&rdma_devices=mlx5_0"
                           "&local_hostname=10.0.0.7&segment_bytes=1024")
    assert (c.master, c.protocol, c.rdma_devices, c.local_hostname, c.segment_bytes) == (
        "10.0.0.5:50051", "rdma", "mlx5_0", "10.0.0.7", 1024)
    assert c.metadata == "http://10.0.0.5:8080/metadata"
    with pytest.raises(mcs.InvalidArgument):
        parse_mooncake_url("mooncake://host-without-port")
    with pytest.raises(mcs.InvalidArgument):
        parse_mooncake_url("mooncake://h:1?colour=blue")
    with pytest.raises(mcs.InvalidArgument):
        parse_mooncake_url("mooncake://h:1?segment_bytes=lots")
    assert c.pin_segment is True
    assert parse_mooncake_url("mooncake://h:1?pin_segment=0").pin_segment is False
    assert parse_mooncake_url("mooncake://h:1", pin_segment=False).pin_segment is False
    with pytest.raises(mcs.InvalidArgument, match="pin_segment"):
        parse_mooncake_url("mooncake://h:1?pin_segment=maybe")


def test_own_segment_holds_the_local_replicas(node_a):
    """The client's segment is memory the adapter created and upstream mounted: its bounds are
    known, every replica this client keeps lies inside, and it is page-locked exactly where
    CUDA is present (a CUDA read of a local replica is then one pinned copy)."""
    region = node_a.upstream.segment_region()
    assert region is not None
    address, nbytes, pinned = region
    assert nbytes == NODE_A["segment_bytes"] and address % 4096 == 0
    assert pinned is mcs.connect().capabilities()["cuda_available"]
    keys = [unique_key("segment.") for _ in range(3)]
    node_a.batch_put_tensor(keys, [np.arange(1000 * (i + 1), dtype=np.float32) for i in range(3)])
    for size, where in node_a.upstream.locate_tensors(keys):
        assert address <= where and where + size <= address + nbytes
    out = np.empty(2000, np.float32)
    node_a.get_tensor_into(keys[1], out)
    assert np.array_equal(out, np.arange(2000, dtype=np.float32))


def test_unreachable_master_is_unavailable():
    with pytest.raises(mcs.Unavailable):
        mcs.connect("mooncake://127.0.0.1:1?metadata=http://127.0.0.1:1/metadata")


# ---------------------------------------------------------------------------------------------
# The ObjectStore contract on upstream.
# ---------------------------------------------------------------------------------------------
def test_objects_put_stat_read_upsert_remove(node_a):
    objs = node_a.objects
    key = unique_key("t/objects/")
    a = np.arange(24, dtype=np.uint16).reshape(6, 4)
    b = np.linspace(0, 1, 5, dtype=np.float32)
    objs.put(key, {"a": a, "b": b}, metadata=b"meta-1", checksum=True)
    info, members = objs.get(key)
    assert info["metadata"] == b"meta-1" and info["hard_pinned"] is False
    assert [m["name"] for m in info["members"]] == ["a", "b"]
    assert info["members"][0]["shape"] == (6, 4) and info["members"][0]["dtype"] == "uint16"
    assert info["members"][0]["checksum"] == objs.checksum(a)
    np.testing.assert_array_equal(members["a"], a)
    np.testing.assert_array_equal(members["b"], b)
    v1 = info["version"]

    with pytest.raises(mcs.Conflict):  # exclusive create
        objs.put(key, {"a": a}, metadata=b"other")
    assert objs.stat(key)["metadata"] == b"meta-1"

    old_token = node_a.upstream._head(key).token
    objs.put(key, {"c": np.zeros((0, 3), np.uint8)}, metadata=b"meta-2", mode="upsert",
             hard_pin=True)  # an empty member has no key upstream
    info2, members2 = objs.get(key)
    assert info2["version"] > v1 and info2["metadata"] == b"meta-2" and info2["hard_pinned"]
    assert members2["c"].shape == (0, 3)
    # The replaced version's member keys are gone from upstream.
    client = node_a.upstream.client
    assert client.is_exist(f"{key}#{old_token}/a") == 0

    objs.remove(key)
    with pytest.raises(mcs.NotFound):
        objs.stat(key)
    with pytest.raises(mcs.NotFound):
        objs.remove(key)


def test_objects_listing(node_a):
    objs = node_a.objects
    d = unique_key("t/list/") + "/"
    keys = [f"{d}k{i}" for i in range(70)]  # more than one probe window of slots
    for k in keys:
        objs.put(k, {"x": np.ones(3, np.uint8)})
    objs.put(d + "deeper/k", {"x": np.ones(3, np.uint8)})
    assert objs.list(d) == sorted(keys + [d + "deeper/k"])
    assert objs.list(d + "k1") == sorted(k for k in keys if k.startswith(d + "k1"))
    objs.remove(keys[5])
    assert keys[5] not in objs.list(d)
    with pytest.raises(mcs.Unimplemented):
        objs.list("t/")


def test_bad_input_leaves_upstream_unchanged(node_a):
    g = fresh_generation()
    name = unique_key("bad.")
    idx = np.array([[0, 0], [9, 9]], np.int64)  # (9, 9) is outside (4, 4)
    with pytest.raises(mcs.InvalidArgument):
        node_a.put_sparse_object(name, (4, 4), idx, np.ones(2, np.float32), generation=g)
    dup = np.array([[1, 1], [1, 1]], np.int64)
    with pytest.raises(mcs.InvalidArgument):
        node_a.put_sparse_object(name, (4, 4), dup, np.ones(2, np.float32), generation=g)
    assert node_a.manifest(g) == []
    assert node_a.current_generation(name) is None
    # A commit whose base is older than the tensor's last committed step is fenced.
    node_a.put_sparse_object(name, (4, 4), idx[:1], np.ones(1, np.float32), generation=g)
    with pytest.raises(mcs.StaleGeneration):
        node_a.put_sparse_object(name, (4, 4), idx[:1], np.ones(1, np.float32),
                                 generation=(g[0], g[1] + 1))
    assert node_a.current_generation(name) == g
    assert len(node_a.manifest(g)) == 1


def test_single_process_round_trip_and_idempotence(node_a):
    g = fresh_generation()
    old, new = W.weights(7, (300, 200), 0.03)
    idx, vals = mcs.encode_update(new, old)
    name = unique_key("rt.")
    info = node_a.put_sparse_object(name, old.shape, idx, vals, generation=g, return_info=True)
    assert info["created"]
    again = node_a.put_sparse_object(name, old.shape, idx, vals, generation=g, return_info=True)
    assert not again["created"] and again["source_ref"] == info["source_ref"]
    with pytest.raises(mcs.Conflict):
        node_a.put_sparse_object(name, old.shape, idx, vals * 2, generation=g)
    manifest = node_a.manifest(g)
    targets = [mcs.Target(name, f"n/r{i}", "n", {}, (0, 100 * i), (300, 100)) for i in range(2)]
    for t, obj in zip(targets, node_a.read_sparse_objects(manifest, targets)):
        shard = np.ascontiguousarray(old[:, t.global_offset[1]:t.global_offset[1] + 100])
        mcs.apply_sparse_object(shard, obj)
        assert shard.tobytes() == np.ascontiguousarray(new[:, t.global_offset[1]:t.global_offset[1] + 100]).tobytes()
    m = node_a.metrics()
    assert m["full_gets"] == 0 and m["range_gets"] >= 2


def test_admission_across_processes(master, node_a):
    url = master.url(local_hostname="127.0.0.3", segment_bytes=0)
    conns, procs = [], []
    for i in range(4):
        parent, child = CTX.Pipe()
        p = CTX.Process(target=W.admit, args=(url, f"writer-{i}", child))
        p.start()
        conns.append(parent)
        procs.append(p)
    won = [recv(c)[1] for c in conns]
    for p in procs:
        p.join(30)
    assert sum(won) == 1, won


# ---------------------------------------------------------------------------------------------
# Tensor interop with upstream's own put_tensor / get_tensor.
# ---------------------------------------------------------------------------------------------
def test_tensor_interop_both_ways(node_a):
    torch = pytest.importorskip("torch")
    client = node_a.upstream.client
    ours = unique_key("tensor.ours.")
    t = torch.randn(300, 70).to(torch.bfloat16)
    node_a.put_tensor(ours, t)
    theirs_view = client.get_tensor(ours)
    assert theirs_view.dtype == torch.bfloat16 and torch.equal(theirs_view, t)

    theirs = unique_key("tensor.theirs.")
    u = torch.randn(33, 17)
    assert client.put_tensor(theirs, u) == 0
    out = torch.empty(33, 17)
    node_a.get_tensor_into(theirs, out)
    assert out.numpy().tobytes() == u.numpy().tobytes()
    got = node_a.get_tensor(theirs)
    assert np.asarray(got).tobytes() == u.numpy().tobytes()

    with pytest.raises(mcs.Conflict):
        node_a.put_tensor(ours, t)
    with pytest.raises(mcs.InvalidArgument):
        node_a.get_tensor_into(theirs, torch.empty(3, 3))
    node_a.upsert_tensor(ours, u)
    assert torch.equal(client.get_tensor(ours), u)

    keys = [unique_key("tensor.batch.") for _ in range(4)]
    node_a.batch_put_tensor(keys, [u + i for i in range(4)])
    outs = [torch.empty(33, 17) for _ in keys]
    node_a.batch_get_tensor_into(keys, outs)
    assert all(torch.equal(o, u + i) for i, o in enumerate(outs))


def test_tensor_box_reads(node_a):
    """Dense box reads of an anchor on mooncake://, of our objects and of upstream's own."""
    torch = pytest.importorskip("torch")
    client = node_a.upstream.client
    ours = unique_key("tensor.box.ours.")
    w = torch.randn(1024, 1024)
    node_a.put_tensor(ours, w)
    rows, cols = torch.empty(512, 1024), torch.empty(1024, 256)
    before = node_a.store_counters()
    node_a.batch_get_tensor_into([ours, ours], [rows, cols],
                                 global_offsets=[(512, 0), (0, 256)])
    assert rows.numpy().tobytes() == w[512:].numpy().tobytes()
    assert cols.numpy().tobytes() == w[:, 256:512].contiguous().numpy().tobytes()
    # Only the boxes cross the network (and each header twice), never the whole 4 MiB object.
    after = node_a.store_counters()
    assert after["member_bytes"] == before["member_bytes"]
    assert after["range_bytes"] - before["range_bytes"] == (rows.nbytes + cols.nbytes
                                                            + 2 * 2 * 304)
    theirs = unique_key("tensor.box.theirs.")
    u = torch.randn(8, 64, 32).to(torch.bfloat16)
    assert client.put_tensor(theirs, u) == 0
    shard = torch.empty(8, 16, 32, dtype=torch.bfloat16)
    node_a.get_tensor_into(theirs, shard, global_offset=(0, 48, 0))
    assert torch.equal(shard, u[:, 48:])
    before = shard.clone()
    with pytest.raises(mcs.InvalidArgument, match="outside"):
        node_a.get_tensor_into(theirs, shard, global_offset=(0, 49, 0))
    assert torch.equal(shard, before)


# ---------------------------------------------------------------------------------------------
# The cross-node update.
# ---------------------------------------------------------------------------------------------
def test_cross_node_update_each_unique_range_crosses_once(master, tmp_path):
    generation = fresh_generation()
    seed = random.randint(0, 1 << 30)

    parent_a, child_a = CTX.Pipe()
    trainer = CTX.Process(target=W.trainer, args=(master.url(**NODE_A), generation, seed, child_a))
    trainer.start()
    try:
        _, committed, _ = recv(parent_a)
        assert committed > 0

        with start_python_node_daemon(tmp_path, master.url(**NODE_B), node_id="nodeB") as node_b:
            # Four inference processes on node B (EP2 x TP2), concurrently.
            conns, procs = [], []
            for ep in range(W.EP):
                for tp in range(W.TP):
                    parent, child = CTX.Pipe()
                    p = CTX.Process(target=W.inference_rank,
                                    args=(node_b.url, "nodeB", generation, seed, ep, tp, child))
                    p.start()
                    conns.append(parent)
                    procs.append(p)
            try:
                results = [recv(c) for c in conns]
            except AssertionError as e:
                raise AssertionError(f"{e}\n--- node B daemon log (tail) ---\n"
                                     + "\n".join(node_b.log().splitlines()[-40:])) from None
            for p in procs:
                p.join(60)
            assert all(r[1] for r in results), "a rank's weights differ from the trainer's"
            assert all(r[2] == 1 + W.EP for r in results)

            b = mcs.connect(node_b.url)
            m = b.metrics()
            assert m["sparse_store_remote"] == 1
            assert m["full_gets"] == 0 and m["dense_fallbacks"] == 0
            crossed = m["sparse_store_range_bytes"]
            # Every byte the sparse layer read came across from node A, once: what crossed is
            # exactly what the planner's unique ranges asked for.
            assert crossed == m["range_bytes_read"] > 0
            assert m["sparse_store_range_reads"] >= m["range_gets"]

            # The same distinct boxes read by ONE process from cold caches cross the same bytes:
            # the four processes (two of each shared box) did not fetch anything twice.
            b.clear_caches()
            b.reset_metrics()
            before = b.metrics()["sparse_store_range_bytes"]
            distinct = []
            for ep in range(W.EP):
                for tp in range(W.TP):
                    for t in W.targets_of("nodeB", ep, tp):
                        key = (t.tensor_id, tuple(t.global_offset), tuple(t.local_shape))
                        if key not in {(d.tensor_id, tuple(d.global_offset), tuple(d.local_shape)) for d in distinct}:
                            distinct.append(t)
            b.read_sparse_objects(b.manifest(generation), distinct)
            again = b.metrics()["sparse_store_range_bytes"] - before
            assert again == crossed

            # And a rank that reads again later is served by the node's caches: nothing crosses.
            before = b.metrics()["sparse_store_range_bytes"]
            b.read_sparse_objects(b.manifest(generation), W.targets_of("nodeB", 0, 0))
            assert b.metrics()["sparse_store_range_bytes"] == before

            # Node B holds every box of the layer, so each committed entry crossed exactly once
            # (four processes, shared boxes, no full-object GET).
            full = sum(s.nnz * s.entry_bytes for s in b.manifest(generation))
            assert crossed == full
    finally:
        if trainer.is_alive():
            parent_a.send("stop")
            trainer.join(30)
        if trainer.is_alive():
            trainer.kill()


# ---------------------------------------------------------------------------------------------
# A training run across nodes (docs/design.md §9): seals on node A wake a reader on node B,
# retention frees old steps (and the listing tables of their directories), folds catch up.
# ---------------------------------------------------------------------------------------------


def test_training_run_across_nodes_with_retention_and_catch_up(master, node_a):
    ns = unique_key("run")
    seed, steps, keep = random.randint(0, 1 << 30), 12, 4
    ref = W.run_weights(seed, steps)
    trainer = mcs.connect(master.url(**NODE_A), namespace=ns)
    trainer.set_retention(keep)
    parent, child = CTX.Pipe()
    reader = CTX.Process(target=W.step_reader,
                         args=(master.url(**NODE_B), ns, seed, steps, 1, child))
    reader.start()
    try:
        reader_at = recv(parent, timeout=180)[1]
        for k in range(1, steps + 1):
            while reader_at < k - 2:  # the trainer stays within 2 steps of its reader
                reader_at = recv(parent)[1]
            idx, vals = mcs.encode_update(ref[k]["w"], ref[k - 1]["w"])
            trainer.put_sparse_object("w", W.RUN_SHAPES["w"], idx, vals, generation=(k - 1, k))
            trainer.seal_generation((k - 1, k), list(W.RUN_SHAPES))
        msg = recv(parent, timeout=180)
        while msg[0] == "at":
            msg = recv(parent, timeout=180)
        assert msg[1], "node B's shard differs from the trainer's weights"
    finally:
        reader.join(60)
    assert trainer.latest_generation() == (steps - 1, steps)
    # A reader at step 9 catches up to 12 in one read (here, on node A).
    shard = ref[9]["w"].copy()
    fold = trainer.manifest((9, steps))
    assert fold.unchanged == ("norm",)
    (obj,) = trainer.read_sparse_objects(
        fold, [mcs.Target("w", "a/0", "nodeA", {}, (0, 0), W.RUN_SHAPES["w"])])
    mcs.apply_sparse_object(shard, obj)
    assert np.array_equal(shard, ref[steps]["w"])
    with pytest.raises(mcs.NotFound, match="retention"):
        trainer.manifest((2, steps))
    # Freed steps leave nothing behind: no manifest entries, no slot tables of their
    # directories, no source objects.
    objs = trainer.objects
    for k in range(1, steps - keep + 1):
        tag = f"{k - 1}-{k}"
        assert objs.list(f"mcs/manifest@{ns}/{tag}/") == []
        assert node_a.upstream.client.is_exist(f"mcs-slots/mcs/manifest@{ns}/{tag}/#0") != 1
        assert node_a.upstream.client.is_exist(f"mcs/seal@{ns}/steps/{tag}") != 1
    kept = objs.list(f"mcs/manifest@{ns}/{steps - 1}-{steps}/")
    assert len(kept) == 1
    # An anchor of the last step, read by box (a TP half), then nothing left to fold.
    trainer.put_anchor((steps - 1, steps), ref[steps])
    assert trainer.latest_anchor() == (steps - 1, steps)
    half = np.empty((W.RUN_SHAPES["w"][0] // 2, W.RUN_SHAPES["w"][1]), np.float32)
    trainer.read_anchor((steps - 1, steps),
                        [mcs.Target("w", "a/1", "nodeA", {}, (half.shape[0], 0), half.shape)],
                        [half])
    assert np.array_equal(half, ref[steps]["w"][half.shape[0]:])


# ---------------------------------------------------------------------------------------------
# Tensors across nodes through the node daemons (docs/multi_node.md, "Tensors across nodes"):
# two daemons on the master, each with its own Mooncake client and segment; a tensor put
# through node A's daemon lives in A's segment and node B's daemon reads it by TransferEngine.
# ---------------------------------------------------------------------------------------------
DAEMON_A = {"local_hostname": "127.0.0.1", "segment_bytes": 64 << 20, "buffer_bytes": 16 << 20}
DAEMON_B = {"local_hostname": "127.0.0.2", "segment_bytes": 16 << 20, "buffer_bytes": 16 << 20}


@pytest.fixture(scope="module")
def daemons(master, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("daemons")
    with start_python_node_daemon(tmp, master.url(**DAEMON_A), node_id="nodeA") as a, \
            start_python_node_daemon(tmp, master.url(**DAEMON_B), node_id="nodeB") as b:
        yield a, b


def tensor_counts(store):
    m = store.metrics()
    return (m["tensor_store_local_views"], m["tensor_store_remote_views"],
            m["tensor_store_batch_transfers"])


def test_tensor_put_on_a_get_on_b(daemons):
    torch = pytest.importorskip("torch")
    a, b = (mcs.connect(d.url) for d in daemons)
    key = unique_key("xnode.")
    t = torch.randn(257, 129).to(torch.bfloat16)
    a.put_tensor(key, t)
    local0, remote0, batches0 = tensor_counts(b)
    out = torch.empty_like(t)
    b.get_tensor_into(key, out)
    assert out.view(torch.int16).numpy().tobytes() == t.view(torch.int16).numpy().tobytes()
    # B's read took A's replica over the network: one remote view, one transfer.
    local1, remote1, batches1 = tensor_counts(b)
    assert (local1 - local0, remote1 - remote0, batches1 - batches0) == (0, 1, 1)
    # get_tensor (a zero-copy lease of B's segments) and the stored header.
    assert torch.equal(b.get_tensor(key, as_torch=True), t)
    # A's own read is local: its replica is in A's own segment, read in place.
    local_a, remote_a, _ = tensor_counts(a)
    again = torch.empty_like(t)
    a.get_tensor_into(key, again)
    assert torch.equal(again, t)
    assert tensor_counts(a)[:2] == (local_a + 1, remote_a)
    with pytest.raises(mcs.Conflict):
        b.put_tensor(key, t)
    with pytest.raises(mcs.InvalidArgument):
        b.get_tensor_into(key, torch.empty(3, 3, dtype=torch.bfloat16))
    with pytest.raises(mcs.NotFound):
        b.get_tensor_into(unique_key("xnode.missing."), out)


def test_tensor_upsert_on_a_seen_by_b(daemons):
    torch = pytest.importorskip("torch")
    a, b = (mcs.connect(d.url) for d in daemons)
    key = unique_key("xnode.upsert.")
    a.put_tensor(key, torch.zeros(64, 32))
    out = torch.empty(64, 32)
    b.get_tensor_into(key, out)
    assert torch.equal(out, torch.zeros(64, 32))
    w = torch.randn(64, 32)
    a.upsert_tensor(key, w)
    b.get_tensor_into(key, out)
    assert torch.equal(out, w)
    # A new shape: B's destination must follow the stored header.
    a.upsert_tensor(key, torch.arange(12, dtype=torch.int32).reshape(3, 4))
    with pytest.raises(mcs.InvalidArgument):
        b.get_tensor_into(key, out)
    small = torch.empty(3, 4, dtype=torch.int32)
    b.get_tensor_into(key, small)
    assert torch.equal(small, torch.arange(12, dtype=torch.int32).reshape(3, 4))


def test_tensor_interop_with_upstream_get_tensor_on_b(master, daemons):
    """Upstream's own client on node B reads what node A's daemon put, and node B's daemon
    reads what upstream's own client put."""
    torch = pytest.importorskip("torch")
    from mooncake.store import MooncakeDistributedStore

    a, b = (mcs.connect(d.url) for d in daemons)
    theirs_client = MooncakeDistributedStore()
    assert theirs_client.setup("127.0.0.2", master.metadata, 16 << 20, 16 << 20, "tcp", "",
                               master.address) == 0
    try:
        ours = unique_key("xnode.ours.")
        t = torch.randn(100, 33)
        a.put_tensor(ours, t)
        assert torch.equal(theirs_client.get_tensor(ours), t)

        theirs = unique_key("xnode.theirs.")
        u = torch.randn(17, 5).to(torch.bfloat16)
        assert theirs_client.put_tensor(theirs, u) == 0
        for store in (b, a):
            out = torch.empty(17, 5, dtype=torch.bfloat16)
            store.get_tensor_into(theirs, out)
            assert torch.equal(out, u)
    finally:
        theirs_client.close()


def test_tensor_batches_cross_as_one_transfer(daemons):
    torch = pytest.importorskip("torch")
    a, b = (mcs.connect(d.url) for d in daemons)
    keys = [unique_key("xnode.batch.") for _ in range(8)]
    ts = [torch.randn(32 + i, 16) for i in range(len(keys))]
    before_a = a.metrics()["tensor_store_batch_transfers"]
    a.batch_put_tensor(keys, ts)
    assert a.metrics()["tensor_store_batch_transfers"] - before_a == 1
    outs = [torch.empty_like(t) for t in ts]
    local0, remote0, batches0 = tensor_counts(b)
    b.batch_get_tensor_into(keys, outs)
    assert all(torch.equal(o, t) for o, t in zip(outs, ts))
    local1, remote1, batches1 = tensor_counts(b)
    assert (local1 - local0, remote1 - remote0, batches1 - batches0) == (0, len(keys), 1)
    # A batch upsert is one transfer too, and B sees every new value.
    a.batch_upsert_tensor(keys, [t * 2 for t in ts])
    b.batch_get_tensor_into(keys, outs)
    assert all(torch.equal(o, t * 2) for o, t in zip(outs, ts))
    # A create batch with one existing key writes nothing.
    fresh = unique_key("xnode.batch.fresh.")
    with pytest.raises(mcs.Conflict):
        a.batch_put_tensor([fresh, keys[0]], [ts[0], ts[0]])
    with pytest.raises(mcs.NotFound):
        b.get_tensor_into(fresh, torch.empty_like(ts[0]))


def test_killed_daemon_gives_a_typed_error_not_a_hang(master, daemons, tmp_path):
    torch = pytest.importorskip("torch")
    import threading
    import time

    _, node_b = daemons
    b = mcs.connect(node_b.url)
    key = unique_key("xnode.killed.")
    t = torch.randn(128, 64)
    with start_python_node_daemon(tmp_path, master.url(local_hostname="127.0.0.3",
                                                       segment_bytes=16 << 20,
                                                       buffer_bytes=16 << 20),
                                  node_id="nodeC") as c_daemon:
        mcs.connect(c_daemon.url).put_tensor(key, t)
        out = torch.empty_like(t)
        b.get_tensor_into(key, out)
        assert torch.equal(out, t)
        c_daemon.process.kill()
        c_daemon.process.wait(30)
    result: list[BaseException | None] = []

    def read():
        try:
            b.get_tensor_into(key, torch.empty_like(t))
            result.append(None)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            result.append(e)

    start = time.monotonic()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(90)
    assert not reader.is_alive(), "the read of a killed node's tensor hangs"
    assert isinstance(result[0], (mcs.Unavailable, mcs.NotFound)), result[0]
    assert time.monotonic() - start < 90
    # The daemon on B still serves.
    other = unique_key("xnode.after.")
    b.put_tensor(other, t)
    out = torch.empty_like(t)
    b.get_tensor_into(other, out)
    assert torch.equal(out, t)


def test_cuda_tensors_across_nodes(daemons):
    """CUDA tensors on both ends: A's daemon copies the caller's tensor out by CUDA IPC, B's
    daemon lands A's replica in its registered memory and copies it into the caller's GPU
    tensor by CUDA IPC (no staging in either client). Skipped without CUDA."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    a, b = (mcs.connect(d.url) for d in daemons)
    if not b.capabilities()["cuda_ipc_available"]:
        pytest.skip("no CUDA IPC between this process and the daemons")
    keys = [unique_key("xnode.cuda.") for _ in range(3)]
    ts = [torch.randn(512, 256 + i, device="cuda").to(torch.bfloat16) for i in range(3)]
    a.batch_put_tensor(keys, ts)
    outs = [torch.empty_like(t) for t in ts]
    local0, remote0, batches0 = tensor_counts(b)
    copies0 = b.metrics()["tensor_cuda_copies"]
    b.batch_get_tensor_into(keys, outs)
    torch.cuda.synchronize()
    assert all(torch.equal(o.view(torch.int16), t.view(torch.int16)) for o, t in zip(outs, ts))
    local1, remote1, batches1 = tensor_counts(b)
    assert (local1 - local0, remote1 - remote0, batches1 - batches0) == (0, len(keys), 1)
    assert b.metrics()["tensor_cuda_copies"] - copies0 >= len(keys)
    # On node A the replicas are local: read in place, no transfer, and copied to the GPU in
    # one pinned copy (A's segment is page-locked), not through the pageable pipeline.
    local_a, remote_a, _ = tensor_counts(a)
    m0 = a.metrics()
    again = torch.empty_like(ts[0])
    a.get_tensor_into(keys[0], again)
    torch.cuda.synchronize()
    assert torch.equal(again.view(torch.int16), ts[0].view(torch.int16))
    assert tensor_counts(a)[:2] == (local_a + 1, remote_a)
    m1 = a.metrics()
    assert m1["tensor_pinned_copies"] - m0["tensor_pinned_copies"] == 1
    assert m1["tensor_pageable_copies"] == m0["tensor_pageable_copies"]
