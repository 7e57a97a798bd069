"""One node, many processes: the node daemon (mooncake_sparse_node) and its DummyClients.

Every test runs a real daemon process (mooncake.sparse.testing.start_node_daemon) and talks to
it through mcs.connect("unix:///..."), from this process and from 'spawn' children."""

import multiprocessing as mp
import os
import signal
import socket
import stat
import struct
import time

import numpy as np
import pytest

import mooncake.sparse as mcs
import node_workers as nw
from conftest import dense_of, random_coo
from mooncake.sparse.testing import find_node_daemon, start_node_daemon, wait_prepared

try:
    find_node_daemon()
except FileNotFoundError as e:  # pragma: no cover - the wheel always ships it
    pytest.skip(str(e), allow_module_level=True)

GEN = (0, 1)
CTX = mp.get_context("spawn")


@pytest.fixture
def node(tmp_path):
    with start_node_daemon(tmp_path, segment_size="8MiB", num_segments=4) as daemon:
        yield daemon


@pytest.fixture
def store(node):
    s = mcs.connect(node.url)
    yield s
    s.close()


def join_all(procs, timeout=120):
    deadline = time.time() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.time()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} worker(s) hung"


def drain(queue, n, timeout=60):
    return [queue.get(timeout=timeout) for _ in range(n)]


def metrics_of(store):
    return store.metrics()


# ---------------------------------------------------------------------------------------------
# The daemon process and connect().
# ---------------------------------------------------------------------------------------------


def test_daemon_socket_is_private_and_removed_on_sigterm_and_sigint(tmp_path):
    with start_node_daemon(tmp_path / "a") as daemon:
        mode = stat.S_IMODE(os.stat(daemon.socket_path).st_mode)
        assert mode == 0o600
        mcs.connect(daemon.url).list_keys("")
        assert daemon.stop() == 0  # SIGTERM: clean exit
        assert not daemon.socket_path.exists()
    with start_node_daemon(tmp_path / "b", log_level="info") as daemon:
        daemon.process.send_signal(signal.SIGINT)
        assert daemon.process.wait(20) == 0
        assert not daemon.socket_path.exists()
        assert "shutting down" in daemon.log()


def test_daemon_reads_a_yaml_config_and_flags_win(tmp_path):
    config = tmp_path / "node.yaml"
    config.write_text("segment_size: 2MiB\ncapacity: 6MiB\nnode_id: rack7\nlog_level: info\n")
    with start_node_daemon(tmp_path, config=config, node_id="rack9") as daemon:
        caps = mcs.connect(daemon.url).capabilities()
        assert caps["shm_segments"] == 3 and caps["shm_capacity_bytes"] == 6 << 20
        assert caps["node_id"] == "rack9"  # the flag wins over the file
    bad = tmp_path / "bad.yaml"
    bad.write_text("no_such_key: 1\n")
    with pytest.raises(mcs.Unavailable, match="unknown configuration key"):
        with start_node_daemon(tmp_path / "bad", config=bad):
            pass


def test_connect_without_a_daemon_is_unavailable(tmp_path, monkeypatch):
    with pytest.raises(mcs.Unavailable, match="not running"):
        mcs.connect(f"unix://{tmp_path}/nobody.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # "unix://": the default path
    with pytest.raises(mcs.Unavailable, match="mooncake-sparse/node.sock"):
        mcs.connect("unix://")
    with pytest.raises(mcs.InvalidArgument):
        mcs.connect(f"unix://{tmp_path}/x.sock", bogus=1)


def test_node_store_has_the_embedded_stores_methods(store):
    embedded = mcs.connect()
    for name in ("put_sparse_object", "manifest", "read_sparse_objects", "admit",
                 "current_generation", "metrics", "reset_metrics", "clear_caches", "list_keys",
                 "store_counters", "capabilities", "objects"):
        assert hasattr(store, name) and hasattr(embedded, name), name
    caps = store.capabilities()
    assert caps["backend"] == "node"
    assert caps["pinned_bytes"] + caps["pageable_bytes"] == caps["shm_capacity_bytes"]
    # Both ends are this machine: the daemon path has CUDA IPC exactly where this process does.
    assert caps["cuda_ipc_available"] is embedded.capabilities()["cuda_ipc_available"]
    assert len(caps["segments"]) == 4 and all(s["read_only"] for s in caps["segments"])


def test_reply_wait_polls_then_sleeps_as_configured(node):
    """A call polls the socket for its reply before sleeping (a thread that sleeps through a
    copy pays the core's wake-up latency); reply_spin_max=0 always sleeps. Every reply is
    counted once, as polled for or slept for."""
    t = np.arange(256 * 1024, dtype=np.float32)
    out = np.empty_like(t)
    for bad in ({"reply_spin_max": -1.0}, {"reply_spin": float("nan")}):
        with pytest.raises(mcs.InvalidArgument, match=next(iter(bad))):
            mcs.connect(node.url, **bad)
    # A poll window of 2 s per call: a reply of a 1 MiB copy comes within it on any machine, so
    # the polled case cannot depend on how fast this one is (the default window is 200 us).
    for options, polled in (({"reply_spin_max": 0.0, "reply_spin": 2.0}, False),
                            ({"reply_spin_max": 2.0, "reply_spin": 2.0}, True)):
        s = mcs.connect(node.url, **options)
        try:
            for i in range(20):
                s.put_tensor(f"spin/{polled}/{i}", t, hard_pin=False)  # a scratch copy
                s.get_tensor_into(f"spin/{polled}/{i}", out)
            np.testing.assert_array_equal(out, t)
            st = s._core.client_stats()
            assert st["replies_spun"] + st["replies_slept"] == st["calls"]
            # Calls are timed on both sides (the daemon's clocks are of all its connections);
            # no device commit ran.
            m = s.metrics()
            assert m["requests_tensor_put"] >= 20 and m["requests_tensor_get"] >= 20
            assert m["request_tensor_put_seconds"] > 0 and m["request_tensor_get_seconds"] > 0
            assert st["call_seconds"] > 0
            assert st["device_commit_gather_seconds"] == 0
            if polled:
                assert st["replies_spun"] == st["calls"] > 0
            else:
                assert st["replies_spun"] == 0 and st["replies_slept"] == st["calls"]
        finally:
            s.close()


def test_node_store_answers_like_the_embedded_store(store, rng):
    embedded = mcs.connect()
    shape = (512, 768)
    idx, vals = random_coo(rng, shape, 6000)
    targets = [mcs.Target("w", f"n/r{e * 2 + t}", "node0", {"ep": e, "tp": t},
                          (t * 256, 0), (256, 768)) for e in range(2) for t in range(2)]
    results = {}
    for name, s in (("node", store), ("embedded", embedded)):
        info = s.put_sparse_object("w", shape, idx, vals, placement_policy="replicate(ep)",
                                   generation=GEN, return_info=True)
        again = s.put_sparse_object("w", shape, idx, vals, placement_policy="replicate(ep)",
                                    generation=GEN, return_info=True)
        assert info["created"] and not again["created"]
        assert again["source_ref"] == info["source_ref"]
        assert s.current_generation("w") == GEN
        s.reset_metrics()
        manifest = s.manifest(GEN)
        objs = s.read_sparse_objects(manifest, targets)
        results[name] = (info, [(o.target_id, o.nnz, o.indices.copy(), o._values_raw.copy(),
                                 o.tile_ptr.copy()) for o in objs], s.metrics())
    assert results["node"][0] == results["embedded"][0]
    for a, b in zip(results["node"][1], results["embedded"][1]):
        assert a[0] == b[0] and a[1] == b[1]
        for x, y in zip(a[2:], b[2:]):
            np.testing.assert_array_equal(x, y)
    for key in ("range_gets", "range_bytes_read", "full_gets", "index_gets",
                "target_objects_published", "target_bytes", "fanout_bytes"):
        assert results["node"][2][key] == results["embedded"][2][key], key
    ref = dense_of(shape, idx, vals)
    objs = store.read_sparse_objects(store.manifest(GEN), targets)
    for obj, t in zip(objs, targets):
        shard = np.zeros(t.local_shape, np.float32)
        mcs.apply_sparse_object(shard, obj)
        np.testing.assert_array_equal(shard, ref[t.global_offset[0]:t.global_offset[0] + 256])
    # Errors map to the same classes.
    with pytest.raises(mcs.StaleGeneration):  # its base is older than the tensor's head
        store.put_sparse_object("w", shape, idx, vals, placement_policy="replicate(ep)",
                                generation=(GEN[0], GEN[1] + 1))
    with pytest.raises(mcs.Conflict):
        store.put_sparse_object("w", shape, idx, vals * 2, placement_policy="replicate(ep)",
                                generation=GEN)
    with pytest.raises(mcs.InvalidArgument):
        store.put_sparse_object("bad", shape, idx + 10000, vals, generation=GEN)
    with pytest.raises(mcs.NotFound):
        store.objects.stat("nope")


def test_results_are_zero_copy_views_that_hold_their_lease(store, rng):
    shape = (256, 256)
    idx, vals = random_coo(rng, shape, 3000)
    store.put_sparse_object("z", shape, idx, vals, generation=GEN)
    t = mcs.Target("z", "r0", "node0", {}, (0, 0), shape)
    (obj,) = store.read_sparse_objects(store.manifest(GEN), [t])
    indices = obj.indices
    assert not indices.flags.writeable and not indices.flags.owndata
    with pytest.raises(ValueError):
        indices[0, 0] = 1
    assert metrics_of(store)["shm_leases"] == 1
    del obj
    assert metrics_of(store)["shm_leases"] == 1  # the array still holds the lease
    ref = dense_of(shape, idx, vals)
    assert np.array_equal(np.sort(ref[tuple(indices.T.astype(np.int64))]), np.sort(vals))
    del indices
    store.list_keys("")  # any call sends queued releases
    assert metrics_of(store)["shm_leases"] == 0


def test_clear_caches_and_reset_metrics_reach_the_daemon(store, rng):
    shape = (256, 256)
    idx, vals = random_coo(rng, shape, 1000)
    store.put_sparse_object("c", shape, idx, vals, generation=GEN)
    t = mcs.Target("c", "r0", "node0", {}, (0, 0), shape)
    store.read_sparse_objects(store.manifest(GEN), [t])
    store.reset_metrics()
    store.read_sparse_objects(store.manifest(GEN), [t])
    m = store.metrics()
    assert m["range_gets"] == 0 and m["cache_hits"] >= 1
    store.clear_caches()
    store.reset_metrics()
    store.read_sparse_objects(store.manifest(GEN), [t])
    assert store.metrics()["range_gets"] == 1


def test_a_sealed_steps_manifest_is_read_by_naming_the_step(node, store, rng):
    # A sealed step's manifest exactly as this daemon returned it: the read names the step and
    # the daemon reads with its own manifest of it (the same, a sealed step's never changes).
    # A list of other entries, or the manifest from another connection, is sent as it is.
    shape = (256, 384)
    ids = ["a", "b", "c"]
    for name in ids:
        idx, vals = random_coo(rng, shape, 2000)
        store.put_sparse_object(name, shape, idx, vals, generation=GEN)
    store.seal_generation(GEN, ids + ["u"])  # "u" unchanged: its targets read as empty
    targets = [mcs.Target(n, f"r/{n}/{i}", "node0", {}, (0, 128 * i), (256, 128))
               for n in ids + ["u"] for i in range(3)]
    man = store.manifest(GEN)
    assert man.sealed and man.unchanged == ("u",)

    def contents(objs):
        return [(o.target_id, o.nnz, np.asarray(o.indices).tobytes(),
                 np.asarray(o.values).tobytes()) for o in objs]

    steps = store.metrics()["step_reads"]
    by_step = contents(store.read_sparse_objects(man, targets))
    assert store.metrics()["step_reads"] == steps + 1
    other = mcs.connect(node.url)
    sent = contents(other.read_sparse_objects(man, targets))  # not this connection's manifest
    copied = mcs.Manifest._of(GEN, (list(reversed(man)), man.unchanged, True))
    reordered = contents(store.read_sparse_objects(copied, targets))
    assert store.metrics()["step_reads"] == steps + 1
    assert by_step == sent == reordered
    assert [n for _, n, _, _ in by_step][-3:] == [0, 0, 0]  # "u"
    # A sealed manifest of fewer entries is its own: its reads never take the step's.
    part = mcs.Manifest._of(GEN, (man[:2], man.unchanged, True))
    objs = store.read_sparse_objects(part, targets[:6])
    assert store.metrics()["step_reads"] == steps + 1
    assert contents(objs) == by_step[:6]
    # The step freed by retention: NotFound, whichever way the read goes.
    store.set_retention(1)
    for name in ids:
        idx, vals = random_coo(rng, shape, 100)
        store.put_sparse_object(name, shape, idx, vals, generation=(1, 2))
    store.seal_generation((1, 2), ids)
    with pytest.raises(mcs.NotFound):
        store.read_sparse_objects(man, targets)
    with pytest.raises(mcs.NotFound):
        other.read_sparse_objects(man, targets)
    other.close()


def test_a_daemon_that_reads_in_place_builds_the_same_targets(tmp_path, rng):
    shape = (384, 256)
    idx, vals = random_coo(rng, shape, 4000)
    t = [mcs.Target("w", f"r{i}", "node0", {}, (0, 64 * i), (384, 64)) for i in range(4)]
    embedded = mcs.connect()
    embedded.put_sparse_object("w", shape, idx, vals, generation=GEN)
    want = embedded.read_sparse_objects(embedded.manifest(GEN), t)
    with start_node_daemon(tmp_path / "in_place", read_in_place="true") as daemon:
        s = mcs.connect(daemon.url)
        s.put_sparse_object("w", shape, idx, vals, generation=GEN)
        man = s.manifest(GEN)
        s.reset_metrics()
        per_read = []
        for _ in range(2):
            got = s.read_sparse_objects(man, t)
            for a, b in zip(want, got):
                assert a.nnz == b.nnz
                np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))
                assert np.asarray(a.values).tobytes() == np.asarray(b.values).tobytes()
            per_read.append(s.metrics())
        # Viewed in both reads, nothing cached.
        first, both = per_read
        assert first["range_gets"] >= len(t) and both["range_gets"] == 2 * first["range_gets"]
        assert both["range_cache_hits"] == 0 and both["full_gets"] == 0
        with pytest.raises(mcs.InvalidArgument, match="read_in_place"):
            s.read_sparse_objects(man, t, view_in_place=True)
        del got
        s.close()


# ---------------------------------------------------------------------------------------------
# Many processes.
# ---------------------------------------------------------------------------------------------


def test_eight_readers_read_each_unique_range_once_for_the_node(node):
    """8 ranks (EP2 x TP4) each read their own targets of one non-EP weight and of the experts
    they host, at the same time. Node dedup: each unique range is one physical read."""
    nw.commit_scenario(node.url)
    store = mcs.connect(node.url)
    store.reset_metrics()
    barrier = CTX.Barrier(8)
    results = CTX.Queue()
    procs = [CTX.Process(target=nw.dedup_reader, args=(node.url, e, t, barrier, results))
             for e in range(nw.EP) for t in range(nw.TP)]
    for p in procs:
        p.start()
    out = drain(results, len(procs), timeout=120)
    join_all(procs)
    for r in out:
        assert r["ok"], r.get("error", r)
        assert r["zero_copy"]
    m = store.metrics()
    # Unique ranges for the node: 4 TP boxes of the shared weight (each read by both EP
    # replicas) + 4 TP boxes of each of the 4 experts (each read by one rank).
    unique = nw.TP + nw.TP * len(nw.EXPERTS)
    requested = nw.EP * nw.TP + nw.TP * len(nw.EXPERTS)
    assert m["range_gets"] == unique
    assert m["range_gets"] + m["range_cache_hits"] + m["single_flight_waits"] == requested
    # Every source's tile index was cached by the daemon as it committed it: none is read.
    assert m["index_gets"] == 0
    assert m["index_cache_hits"] >= 1 + len(nw.EXPERTS)
    assert m["full_gets"] == 0
    # Every entry of every object read exactly once for the node.
    entries = nw.SHARED[2] + sum(e[2] for e in nw.EXPERTS)
    assert m["range_bytes_read"] == entries * (2 * 2 + 4)
    assert m["target_objects_published"] == requested
    # While the per-process requests add up to more: the shared weight twice.
    assert sum(r["requested_bytes"] for r in out) > m["range_bytes_read"]


def test_admission_race_across_processes_has_exactly_one_winner(node):
    n = 8
    barrier = CTX.Barrier(n)
    results = CTX.Queue()
    procs = [CTX.Process(target=nw.admit_racer, args=(node.url, f"writer{i}", barrier, results))
             for i in range(n)]
    for p in procs:
        p.start()
    out = drain(results, n)
    join_all(procs)
    for r in out:
        assert "error" not in r, r["error"]
    winners = [r for r in out if r["won"]]
    assert len(winners) == 1
    assert winners[0]["again"]  # the winner's retry is admitted again
    assert all(not r["again"] for r in out if not r["won"])


def test_concurrent_writers_and_readers(node):
    writers, count = 3, 6
    results = CTX.Queue()
    deadline = time.time() + 90
    procs = [CTX.Process(target=nw.sparse_writer, args=(node.url, w, count, results))
             for w in range(writers)]
    procs += [CTX.Process(target=nw.sparse_reader, args=(node.url, writers, count, deadline, results))
              for _ in range(2)]
    for p in procs:
        p.start()
    out = drain(results, len(procs), timeout=120)
    join_all(procs)
    for r in out:
        assert r["ok"], r
    store = mcs.connect(node.url)
    assert len(store.manifest(GEN)) == writers * count


def test_sigkill_of_a_writer_during_upserts_never_shows_a_torn_object(node):
    key = "hot"
    ready, stop = CTX.Event(), CTX.Event()
    results = CTX.Queue()
    writer = CTX.Process(target=nw.upsert_writer, args=(node.url, key, 4 << 20, 1, ready))
    writer.start()
    assert ready.wait(60)
    readers = [CTX.Process(target=nw.object_reader, args=(node.url, key, stop, results))
               for _ in range(2)]
    for r in readers:
        r.start()
    for delay in (0.3, 0.05, 0.2):
        time.sleep(delay)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        # The object is whole: the old version or a newer one.
        store = mcs.connect(node.url)
        meta, members = store.backend.lease_object(key)
        tag = int(meta)
        assert np.all(members["a"] == tag) and np.all(members["b"] == tag)
        del members
        store.close()
        writer = CTX.Process(target=nw.upsert_writer, args=(node.url, key, 4 << 20, tag + 1000, ready))
        ready.clear()
        writer.start()
        assert ready.wait(60)
    time.sleep(0.2)
    stop.set()
    out = drain(results, len(readers))
    os.kill(writer.pid, signal.SIGKILL)
    join_all(readers + [writer])
    for r in out:
        assert "error" not in r, r["error"]
        assert r["torn"] == 0
        assert r["reads"] > 0
    # Killed clients' buffers and leases are reclaimed with their connections.
    store = mcs.connect(node.url)
    deadline = time.time() + 10
    while time.time() < deadline:
        m = store.metrics()
        if m["connections_active"] == 1 and m["shm_leases"] == 0:
            break
        time.sleep(0.05)
    assert m["connections_active"] == 1
    assert m["shm_leases"] == 0
    assert m["shm_in_place_upserts"] + m["shm_realloc_upserts"] > 0


def test_sigkill_of_a_writer_during_commits_leaves_only_whole_objects(tmp_path):
    with start_node_daemon(tmp_path, segment_size="16MiB", num_segments=8) as node:
        _sigkill_during_commits(node)


def _sigkill_during_commits(node):
    ready = CTX.Event()
    for delay in (0.0, 0.15, 0.4):
        ready.clear()
        w = CTX.Process(target=nw.commit_writer, args=(node.url, f"k{delay}", ready))
        w.start()
        assert ready.wait(60)
        time.sleep(delay)
        if w.is_alive():
            os.kill(w.pid, signal.SIGKILL)
        w.join()
    store = mcs.connect(node.url)
    # A killed writer's last request may still be running in the daemon (a commit is its
    # source, manifest entry and head, written in turn); its connection ends only after it.
    deadline = time.time() + 30
    while store.metrics()["connections_active"] != 1 and time.time() < deadline:
        time.sleep(0.05)
    assert store.metrics()["connections_active"] == 1
    manifest = store.manifest(GEN)
    sources = [k for k in store.list_keys("mcs/src/")]
    heads = store.list_keys("mcs/head/")
    # Every committed source has its manifest entry and head, and reads back completely.
    assert len(manifest) == len(sources) == len(heads) >= 3
    shape = (2048, 1024)
    ref = dense_of(shape, *nw.coo(7, shape, 200000))
    for src in manifest[:3]:
        t = mcs.Target(src.tensor_id, "r0", "node0", {"ep": 0}, (0, 0), shape)
        (obj,) = store.read_sparse_objects([src], [t])
        got = np.zeros(shape, np.float32)
        mcs.apply_sparse_object(got, obj)
        np.testing.assert_array_equal(got, ref)


def test_daemon_restart_with_client_reconnect(node):
    store = mcs.connect(node.url, call_timeout=5.0)
    store.objects.put("before", {"a": np.arange(10)})
    stop, connected, reconnected = CTX.Event(), CTX.Event(), CTX.Event()
    results = CTX.Queue()
    looper = CTX.Process(target=nw.looping_reader,
                         args=(node.url, stop, results, connected, reconnected))
    looper.start()
    connected.wait(60)  # the worker's start (a new interpreter) may take seconds on a busy host
    node.kill()  # in-flight and later calls fail with Unavailable, never hang
    time.sleep(0.5)
    with pytest.raises(mcs.Unavailable):
        store.list_keys("")
    node.start()
    reconnected.wait(60)
    stop.set()
    (r,) = drain(results, 1)
    join_all([looper])
    assert "error" not in r, r["error"]
    assert set(r["errors"]) <= {"Unavailable"}, r["errors"]
    assert r["errors"].get("Unavailable", 0) > 0
    assert r["ok_after_error"] > 0  # reconnected to the new daemon by itself
    # This process's handle reconnects too; the new daemon starts empty.
    assert store.list_keys("") == []
    store.objects.put("after", {"a": np.arange(3)})
    assert store.list_keys("") == ["after"]


def test_quota_exhaustion_is_resource_exhausted_and_changes_nothing(tmp_path, rng):
    with start_node_daemon(tmp_path, segment_size="1MiB", num_segments=2) as daemon:
        store = mcs.connect(daemon.url)
        shape = (4096, 4096)
        small_idx, small_vals = random_coo(rng, (512, 512), 20000)
        store.put_sparse_object("small", (512, 512), small_idx, small_vals, generation=GEN)
        keys = store.list_keys("")
        idx, vals = random_coo(rng, shape, 300000)  # ~2.4 MB of members: over a segment
        with pytest.raises(mcs.ResourceExhausted):
            store.put_sparse_object("big", shape, idx, vals, generation=GEN)
        assert store.list_keys("") == keys
        # Raw objects over the quota: the same.
        with pytest.raises(mcs.ResourceExhausted):
            store.objects.put("blob", {"a": np.zeros(3 << 18, np.uint64)})
        assert store.list_keys("") == keys
        # The store still works.
        t = mcs.Target("small", "r0", "node0", {}, (0, 0), (512, 512))
        (obj,) = store.read_sparse_objects(store.manifest(GEN), [t])
        assert obj.nnz == 20000


# ---------------------------------------------------------------------------------------------
# Hostile clients.
# ---------------------------------------------------------------------------------------------

MAGIC = 0x5053434D


def frame(msg_type, payload=b"", request_id=1, magic=MAGIC, version=1, length=None, flags=0):
    n = len(payload) if length is None else length
    return struct.pack("<IHHQII", magic, version, msg_type, request_id, n, flags) + payload


def raw_socket(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(5)
    s.connect(str(path))
    return s


def hello_payload():
    name = b"raw"
    return struct.pack("<II", 1, os.getpid()) + struct.pack("<I", len(name)) + name


def test_malformed_and_truncated_messages_never_take_the_daemon_down(node, rng):
    attacks = [
        b"",                                    # empty packet
        b"\x00" * 7,                            # shorter than a header
        frame(1, magic=0xDEADBEEF),             # bad magic
        frame(1, version=9),                    # bad version
        frame(999),                             # unknown type
        frame(10, flags=1),                     # reserved flags
        frame(1, hello_payload(), length=10 ** 9),  # length beyond the limit
        frame(1, hello_payload())[:-3],         # truncated Hello
    ]
    for attack in attacks:
        s = raw_socket(node.socket_path)
        try:
            s.send(attack)
            try:
                s.recv(1 << 16)
            except OSError:
                pass
        finally:
            s.close()
    # A session that says Hello, then sends malformed payloads of every request type.
    s = raw_socket(node.socket_path)
    s.send(frame(1, hello_payload()))
    s.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
    for msg_type in (5, 10, 11, 13, 14, 15, 16, 18, 20, 30, 32, 34, 36, 38, 40, 2, 4):
        junk = bytes(rng.integers(0, 256, size=int(rng.integers(0, 64)), dtype=np.uint8))
        s.send(frame(msg_type, junk, request_id=msg_type))
        reply = s.recv(1 << 16)
        assert len(reply) >= 24
        magic, _, rtype, rid, _, _ = struct.unpack("<IHHQII", reply[:24])
        assert magic == MAGIC and rid == msg_type
    # Huge counts in an otherwise valid-looking ReadRanges.
    s.send(frame(14, struct.pack("<I", 0xFFFFFFFF), request_id=77))
    assert struct.unpack("<IHHQII", s.recv(1 << 16)[:24])[3] == 77
    s.close()
    assert node.alive()
    store = mcs.connect(node.url)
    store.objects.put("still", {"a": np.arange(4)})
    assert store.list_keys("") == ["still"]
    m = store.metrics()
    assert m["protocol_errors"] >= 4
    assert m["request_errors"] >= 15


# ---------------------------------------------------------------------------------------------
# Peers that hold on to the daemon; background preparation of the segments.
# ---------------------------------------------------------------------------------------------


def closed_within(sock, seconds):
    """True when the daemon closes `sock` within `seconds` (EOF or reset)."""
    sock.settimeout(seconds)
    try:
        while True:
            if sock.recv(1 << 16) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_stalled_frames_and_idle_peers_are_closed(tmp_path):
    with start_node_daemon(tmp_path, frame_timeout="300ms", idle_timeout="1s") as daemon:
        store = mcs.connect(daemon.url)
        stalled = raw_socket(daemon.socket_path)
        stalled.send(frame(1, hello_payload()))
        stalled.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
        # A header announcing 32 MiB and one packet of it: the rest never comes.
        stalled.send(frame(10, b"\0" * 60000, request_id=2, length=32 << 20))
        silent = raw_socket(daemon.socket_path)  # never says Hello
        idle = raw_socket(daemon.socket_path)
        idle.send(frame(1, hello_payload()))
        idle.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
        assert closed_within(stalled, 5)
        assert closed_within(silent, 5)
        assert closed_within(idle, 5)
        time.sleep(1.5)  # a real client holds its buffer: never closed for idling
        assert store.list_keys("") == []
        assert store._core.client_stats()["connects"] == 1
        m = store.metrics()
        assert m["frame_timeouts"] == 1 and m["idle_closes"] == 2


def test_idle_sockets_do_not_lock_out_clients_at_max_connections(tmp_path):
    with start_node_daemon(tmp_path, max_connections=4) as daemon:
        idle = []
        for _ in range(4):
            s = raw_socket(daemon.socket_path)
            s.send(frame(1, hello_payload()))
            s.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
            idle.append(s)
            time.sleep(0.05)  # distinct idle ages: idle[0] is the longest idle, not a tie
        store = mcs.connect(daemon.url)
        store.objects.put("in", {"a": np.arange(4)})
        assert store.list_keys("") == ["in"]
        assert closed_within(idle[0], 5)  # the longest idle made room
        assert store.metrics()["connections_evicted"] == 1
        for s in idle:
            s.close()


def test_daemon_memory_is_not_writable_by_a_same_uid_peer(tmp_path):
    """The daemon is non-dumpable: its /proc/<pid>/mem belongs to root, so a peer running as
    the daemon's uid cannot open it. As root the daemon and the peer run as nobody (from a
    copy of the binary that nobody may execute)."""
    import shutil
    import subprocess
    import tempfile

    uid = os.geteuid()
    as_uid = 65534 if uid == 0 else uid

    def drop():
        if uid == 0:
            os.setgid(65534)
            os.setuid(65534)

    d = tempfile.mkdtemp(prefix="mcs-dump-")
    os.chmod(d, 0o777)
    sock = os.path.join(d, "node.sock")
    binary = shutil.copy(find_node_daemon(), os.path.join(d, "mooncake_sparse_node"))
    os.chmod(binary, 0o755)
    p = subprocess.Popen([binary, f"--socket_path={sock}", "--segment_size=2MiB",
                          "--num_segments=1", "--log_level=warning"], preexec_fn=drop)
    try:
        deadline = time.time() + 20
        while not os.path.exists(sock):
            assert p.poll() is None, "the daemon exited"
            assert time.time() < deadline, "the daemon did not listen"
            time.sleep(0.02)
        mem = f"/proc/{p.pid}/mem"
        assert os.stat(mem).st_uid == 0 != as_uid
        peer = subprocess.run(["/bin/sh", "-c", 'exec 3<>"$1"', "sh", mem],
                              preexec_fn=drop, capture_output=True, text=True)
        assert peer.returncode != 0 and "ermission denied" in peer.stderr, peer.stderr
    finally:
        p.terminate()
        p.wait(20)
        shutil.rmtree(d, ignore_errors=True)


def test_the_in_process_server_is_not_dumpable(tmp_path):
    if not mcs._core.HAS_NODE_SERVER:
        pytest.skip("no in-process node server in this build")
    results = CTX.Queue()
    proc = CTX.Process(target=nw.in_process_server_dumpable,
                       args=(str(tmp_path / "inproc.sock"), results))
    proc.start()
    status, before, after = results.get(timeout=60)
    join_all([proc])
    assert status == "ok", before
    assert (before, after) == (1, 0)


def test_capabilities_report_background_preparation(tmp_path):
    with start_node_daemon(tmp_path, segment_size="4MiB", num_segments=2,
                           pinned_quota_bytes="6MiB") as daemon:
        store = mcs.connect(daemon.url)
        caps = store.capabilities()
        for key in ("pinning_complete", "pinned_target_bytes", "prefaulted_bytes",
                    "prefault_target_bytes", "pin_failures"):
            assert key in caps, key
        deadline = time.time() + 20
        while not caps["pinning_complete"]:
            assert time.time() < deadline
            time.sleep(0.02)
            caps = store.capabilities()
        assert caps["prefaulted_bytes"] == caps["prefault_target_bytes"] == 8 << 20
        assert caps["pinned_bytes"] == caps["pinned_target_bytes"]
        if not caps["cuda_available"]:
            assert caps["pinned_target_bytes"] == 0 and caps["pinned_bytes"] == 0
        else:
            assert caps["pinned_target_bytes"] == 6 << 20


def test_wait_prepared_returns_once_the_segments_are_prepared(tmp_path):
    # What the benchmarks wait for before their first step: a daemon of a running job has long
    # prepared its segments.
    with start_node_daemon(tmp_path, segment_size="4MiB", num_segments=2) as daemon:
        store = mcs.connect(daemon.url)
        waited = wait_prepared(store, timeout=20)
        assert waited is not None and 0 <= waited < 20
        assert store.metrics()["pinning_complete"] == 1
        assert wait_prepared(store, timeout=0) is None  # not asked to wait
    assert wait_prepared(mcs.connect(), timeout=5) is None  # the embedded store prepares nothing


# A harness that starts a daemon and then dies without stopping it (SIGKILL: the OOM killer, a
# CI timeout) takes the daemon with it: start_node_daemon passes --exit_with_parent.
HARNESS = """\
import sys, time
from mooncake.sparse.testing import start_node_daemon
with start_node_daemon(sys.argv[1]) as d:
    print(d.pid, flush=True)
    time.sleep(600)
"""


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by its new parent) has exited too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_daemon_stops_when_its_harness_is_killed(tmp_path):
    import subprocess
    import sys

    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(tmp_path / "h")],
                               stdout=subprocess.PIPE, text=True)
    try:
        pid = int(harness.stdout.readline())
        assert _alive(pid)
        harness.kill()
        harness.wait(30)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the daemon outlived its harness"
        assert not (tmp_path / "h" / "node.sock").exists()  # it shut down cleanly
    finally:
        if harness.poll() is None:
            harness.kill()
