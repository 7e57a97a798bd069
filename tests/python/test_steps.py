"""A training run, not one step (docs/design.md §9): steps sealed with the model's tensor list,
unchanged tensors, waits, retention with leases, catch-up folds and namespaces, on the embedded
store and through the node daemon; and a multi-process run of a small model trained with AdamW,
with a reader killed and restarted mid-run that catches up in one read."""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse.testing import find_node_daemon, start_node_daemon

try:
    find_node_daemon()
    HAVE_DAEMON = True
except FileNotFoundError:
    HAVE_DAEMON = False
CTX = mp.get_context("spawn")


@pytest.fixture(params=["embedded", "node"])
def store_factory(request, tmp_path):
    if request.param == "embedded":
        shared = {}

        def make(namespace=""):
            # One embedded store per test; a namespace view of it is a second Store over the
            # same objects only through the daemon, so embedded tests use one namespace each.
            return shared.setdefault(namespace, mcs.connect(namespace=namespace))
        yield make
        return
    if not HAVE_DAEMON:
        pytest.skip("mooncake_sparse_node is not built")
    with start_node_daemon(tmp_path, segment_size="64MiB", num_segments=2) as daemon:
        handles = []

        def make(namespace=""):
            handles.append(mcs.connect(daemon.url, namespace=namespace))
            return handles[-1]
        yield make
        for h in handles:
            h.close()


def update(rng, w, frac=0.05):
    new = w.copy()
    m = rng.random(w.shape) < frac
    new[m] = rng.standard_normal(int(m.sum())).astype(w.dtype)
    return new


def targets_of(shapes, rank=0):
    return [mcs.Target(n, f"r{rank}/{n}", "node0", {}, (0,) * len(s), s)
            for n, s in shapes.items()]


SHAPES = {"a": (64, 32), "b": (40,), "norm": (32,)}


def run_steps(store, steps, rng, ref, changing=("a", "b"), every=None):
    every = every or {}
    for k in range(1, steps + 1):
        for n in changing:
            if k % every.get(n, 1):
                continue
            new = update(rng, ref[n])
            idx, vals = mcs.encode_update(new, ref[n])
            store.put_sparse_object(n, SHAPES[n], idx, vals, generation=(k - 1, k))
            ref[n] = new
        store.seal_generation((k - 1, k), list(SHAPES))


def fresh():
    return {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}


def test_unchanged_tensors_need_no_object_and_read_as_no_ops(store_factory):
    store = store_factory()
    rng = np.random.default_rng(0)
    ref, shard = fresh(), fresh()
    for k in range(1, 6):
        # "b" changes at steps 2 and 5 only; "norm" never: no object, and no StaleGeneration.
        run_steps_one = ["a"] + (["b"] if k in (2, 5) else [])
        for n in run_steps_one:
            new = update(rng, ref[n])
            idx, vals = mcs.encode_update(new, ref[n])
            store.put_sparse_object(n, SHAPES[n], idx, vals, generation=(k - 1, k))
            ref[n] = new
        store.seal_generation((k - 1, k), list(SHAPES))
        m = store.wait_generation((k - 1, k), timeout=5)
        assert m.sealed and set(m.unchanged) == set(SHAPES) - set(run_steps_one)
        objs = store.read_sparse_objects(m, targets_of(SHAPES))
        for t, o in zip(targets_of(SHAPES), objs):
            mcs.apply_sparse_object(shard[t.tensor_id], o)
            if t.tensor_id in m.unchanged:
                assert o.nnz == 0
        for n in SHAPES:
            assert np.array_equal(shard[n], ref[n]), (k, n)
    assert store.latest_generation() == (4, 5)


def test_fold_of_steps_equals_applying_each_step(store_factory):
    store = store_factory()
    rng = np.random.default_rng(1)
    ref = fresh()
    run_steps(store, 9, rng, ref, every={"b": 3})
    # A reader at step 2 reads (2, 9) once: the latest value per coordinate.
    at2 = fresh()
    for k in (1, 2):
        for t, o in zip(targets_of(SHAPES), store.read_sparse_objects(
                store.manifest((k - 1, k)), targets_of(SHAPES))):
            mcs.apply_sparse_object(at2[t.tensor_id], o)
    fold = store.manifest((2, 9))
    assert fold.sealed and fold.generation == (2, 9) and fold.unchanged == ("norm",)
    objs = store.read_sparse_objects(fold, targets_of(SHAPES))
    for t, o in zip(targets_of(SHAPES), objs):
        mcs.apply_sparse_object(at2[t.tensor_id], o)
    for n in SHAPES:
        assert np.array_equal(at2[n], ref[n]), n
    # Fewer entries than the steps' sum: each coordinate once.
    per_step = sum(s.nnz for k in range(3, 10) for s in store.manifest((k - 1, k))
                   if s.tensor_id == "a")
    assert objs[0].nnz < per_step


def test_scatter_add_fold_sums(store_factory):
    store = store_factory()
    shape = (16, 8)
    w = np.zeros(shape, np.float32)
    for k in range(1, 5):
        idx = np.array([[1, 2], [3, 4], [k, k]], np.int64)
        vals = np.array([1.0, 2.0, 4.0], np.float32) * k  # exact sums in float32
        store.put_sparse_object("acc", shape, idx, vals, generation=(k - 1, k),
                                apply="scatter_add")
        store.seal_generation((k - 1, k), ["acc"])
    (o,) = store.read_sparse_objects(store.manifest((0, 4)),
                                     [mcs.Target("acc", "r0", "node0", {}, (0, 0), shape)])
    mcs.apply_sparse_object(w, o)
    expect = np.zeros(shape, np.float32)
    for k in range(1, 5):
        expect[1, 2] += k
        expect[3, 4] += 2 * k
        expect[k, k] += 4 * k
    assert np.array_equal(w, expect)


def test_step_errors_leave_everything_intact(store_factory):
    store = store_factory()
    idx, vals = np.array([[0, 0]], np.int64), np.array([1.0], np.float32)
    store.put_sparse_object("a", SHAPES["a"], idx, vals, generation=(0, 1))
    with pytest.raises(mcs.InvalidArgument, match="not in the list"):
        store.seal_generation((0, 1), ["b"])
    with pytest.raises(mcs.InvalidArgument, match="not a step"):
        store.seal_generation((0, 2), ["a"])
    # An admitted writer that has not committed blocks the seal.
    assert store.admit("b", (0, 1), None, None, "w1")
    with pytest.raises(mcs.FailedPrecondition, match="has not committed"):
        store.seal_generation((0, 1), ["a", "b"])
    store.put_sparse_object("b", SHAPES["b"], np.array([[3]], np.int64),
                            np.array([2.0], np.float32), generation=(0, 1))
    store.seal_generation((0, 1), ["a", "b"])
    with pytest.raises(mcs.FailedPrecondition, match="sealed already"):
        store.seal_generation((0, 1), ["a", "b"])
    with pytest.raises(mcs.Conflict, match="sealed"):
        store.put_sparse_object("norm", SHAPES["norm"], np.array([[1]], np.int64), vals,
                                generation=(0, 1))
    # An identical retry of a committed source still succeeds (idempotent).
    before = store.metrics()["idempotent_commits"]
    store.put_sparse_object("a", SHAPES["a"], idx, vals, generation=(0, 1))
    assert store.metrics()["idempotent_commits"] == before + 1
    with pytest.raises(mcs.DeadlineExceeded) as e:
        store.wait_generation((1, 2), timeout=0.05)
    assert isinstance(e.value, TimeoutError)
    with pytest.raises(mcs.NotFound):
        store.manifest((0, 3))  # step 2 and 3 are not sealed
    with pytest.raises(mcs.InvalidArgument):
        store.set_retention(-1)
    with pytest.raises(mcs.InvalidArgument):
        store.wait_generation((0, 1), timeout=float("nan"))
    assert len(store.manifest((0, 1))) == 2 and store.latest_generation() == (0, 1)


def test_untouched_tensor_commits_a_later_step_and_stale_base_is_refused(store_factory):
    store = store_factory()
    idx, vals = np.array([[0]], np.int64), np.array([1.0], np.float32)
    store.put_sparse_object("b", SHAPES["b"], idx, vals, generation=(0, 1))
    store.put_sparse_object("b", SHAPES["b"], idx, vals * 2, generation=(5, 6))  # skipped 2..5
    with pytest.raises(mcs.StaleGeneration):
        store.put_sparse_object("b", SHAPES["b"], idx, vals * 3, generation=(3, 4))


def test_wait_is_woken_by_a_seal_of_another_thread(store_factory):
    store = store_factory()
    got = {}

    def wait():
        got["m"] = store.wait_generation((0, 1), timeout=10)
        got["t"] = time.monotonic()

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.2)
    sealed_at = time.monotonic()
    store.seal_generation((0, 1), ["norm"])
    th.join(10)
    assert got["m"].unchanged == ("norm",)
    assert got["t"] - sealed_at < 1.0


def test_retention_frees_old_steps_and_keeps_memory_bounded(store_factory):
    store = store_factory()
    store.set_retention(3)
    rng = np.random.default_rng(2)
    ref = fresh()
    counts = []
    for k in range(1, 61):
        run_steps_k = {"a": update(rng, ref["a"])}
        idx, vals = mcs.encode_update(run_steps_k["a"], ref["a"])
        store.put_sparse_object("a", SHAPES["a"], idx, vals, generation=(k - 1, k))
        ref["a"] = run_steps_k["a"]
        store.seal_generation((k - 1, k), list(SHAPES))
        counts.append(len(store.list_keys("mcs/src/a/")))
    assert max(counts) <= 4 and counts[-1] == 3
    assert len(store.manifest((57, 60))) == 3
    with pytest.raises(mcs.NotFound, match="retention"):
        store.manifest((50, 60))
    assert store.retention() == 3


def test_namespaces_keep_runs_apart(store_factory):
    a, b = store_factory("run-a"), store_factory("run-b")
    idx, vals = np.array([[0, 0]], np.int64), np.array([1.0], np.float32)
    a.put_sparse_object("a", SHAPES["a"], idx, vals, generation=(0, 1))
    b.put_sparse_object("a", SHAPES["a"], idx, vals * 5, generation=(0, 1))  # no Conflict
    a.seal_generation((0, 1), ["a"])
    assert a.latest_generation() == (0, 1) and b.latest_generation() is None
    with pytest.raises(mcs.DeadlineExceeded):
        b.wait_generation((0, 1), timeout=0.05)
    b.set_retention(1)
    assert a.retention() == 0
    with pytest.raises(mcs.InvalidArgument):
        mcs.connect(namespace="bad/name")


# ---------------------------------------------------------------------------------------------
# A multi-process run through the daemon: trainer + two TP readers, one killed and restarted.
# ---------------------------------------------------------------------------------------------


class Inbox:
    """The messages of the trainer's and the readers' queues; an error from either fails."""

    def __init__(self, trainer_q, reader_q):
        self.queues = {"trainer": trainer_q, "reader": reader_q}
        self.got = {"trainer": [], "reader": []}

    def until(self, who, pred, timeout):
        end = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < end:
            box = self.got[who]
            for m in box[seen:]:
                if pred(m):
                    return
            seen = len(box)
            for name, q in self.queues.items():
                try:
                    msg = q.get(timeout=0.05)
                except queue.Empty:
                    continue
                if msg[0] == "error":
                    raise AssertionError(f"{name}: {msg[1]}")
                self.got[name].append(msg)
        raise AssertionError(f"timed out waiting for the {who}; last: {self.got[who][-3:]}")


@pytest.mark.skipif(not HAVE_DAEMON, reason="mooncake_sparse_node is not built")
def test_training_run_with_a_reader_restarted_mid_run(tmp_path):
    pytest.importorskip("torch")
    import step_workers as sw

    steps, keep_last, ns = 200, 30, "adamw-run"
    with start_node_daemon(tmp_path / "d", segment_size="64MiB", num_segments=2) as daemon:
        tq, rq = CTX.Queue(), CTX.Queue()
        positions = CTX.Array("q", [0] * sw.TP)
        trainer = CTX.Process(target=sw.trainer,
                              args=(daemon.url, ns, steps, keep_last, tq, positions))
        state = [str(tmp_path / f"reader{r}.npz") for r in range(sw.TP)]
        # Reader 0 reads every step in turn (each one checked); reader 1 folds when behind.
        readers = [CTX.Process(target=sw.reader,
                               args=(daemon.url, ns, r, 1, steps, state[r], rq, positions,
                                     r == 1))
                   for r in range(sw.TP)]
        for p in readers:
            p.start()
        trainer.start()
        inbox = Inbox(tq, rq)
        # Reader 1 dies (SIGKILL) once it has applied step 60. The trainer goes on MAX_LEAD
        # steps past where it died (and waits there, as for a slow rollout worker); then it
        # restarts from its saved shards.
        inbox.until("reader", lambda m: m[0] == "step" and m[1] == 1 and m[2] >= 60, 300)
        readers[1].kill()
        readers[1].join(30)
        died_at = int(np.load(state[1])["__step__"])
        positions[1] = died_at
        inbox.until("trainer", lambda m: m[0] == "step" and m[1] >= died_at + sw.MAX_LEAD, 300)
        readers[1] = CTX.Process(target=sw.reader,
                                 args=(daemon.url, ns, 1, 1, steps, state[1], rq, positions))
        readers[1].start()
        inbox.until("trainer", lambda m: m[0] == "done", 600)
        done = set()
        inbox.until("reader", lambda m: m[0] == "done" and (done.add(m[1]) or len(done) == sw.TP),
                    600)
        trainer.join(60)
        for p in readers:
            p.join(60)
        tmsgs, rmsgs = inbox.got["trainer"], inbox.got["reader"]

        expected = {m[1]: m[2] for m in tmsgs if m[0] == "step"}
        assert len(expected) == steps
        checked = 0
        for m in rmsgs:
            if m[0] == "step":
                _, rank, k, d = m
                assert d == expected[k][rank], f"rank {rank} differs at step {k}"
                checked += 1
        # Every step compared bit for bit (reader 0), and every step reader 1 landed on.
        assert sorted(m[2] for m in rmsgs if m[0] == "step" and m[1] == 0) == list(
            range(1, steps + 1))
        assert checked > steps
        # The restarted reader caught up in one read from where it died. The killed process
        # may have sent a catch-up from the same step before its state file was saved (killed
        # between the two); the restarted one's comes after it in the queue.
        restarts = [m for m in rmsgs if m[0] == "caught_up" and m[1] == 1 and m[2] == died_at]
        assert restarts and restarts[-1][3] - died_at >= sw.MAX_LEAD, (
            died_at, [m for m in rmsgs if m[0] == "caught_up"])
        # Unchanged tensors never got an object; the bias only every 10th step.
        committed = [m[3] for m in tmsgs if m[0] == "step"]
        assert all("norm" not in c for c in committed)
        assert sum("bias" in c for c in committed) <= steps // 10
        # Store bounded: at most keep_last (+1 being sealed) steps of w_up sources remain.
        (source_count,) = [m[1] for m in tmsgs if m[0] == "done"]
        assert source_count <= keep_last + 1


def test_anchors_bring_a_reader_past_retention_back(store_factory):
    store = store_factory()
    store.set_retention(3, keep_anchors=1)
    rng = np.random.default_rng(5)
    ref = fresh()
    history = [dict(ref)]
    for k in range(1, 13):
        new = update(rng, ref["a"])
        idx, vals = mcs.encode_update(new, ref["a"])
        store.put_sparse_object("a", SHAPES["a"], idx, vals, generation=(k - 1, k))
        ref["a"] = new
        store.seal_generation((k - 1, k), list(SHAPES))
        history.append(dict(ref))
        if k in (5, 10):  # the trainer anchors every 5 steps
            store.put_anchor((k - 1, k), ref)
    assert store.latest_anchor() == (9, 10)
    # The anchor of step 5 went with retention (keep_anchors=1): its tensor objects too.
    with pytest.raises(mcs.NotFound):
        store.get_tensor(mcs._core.anchor_key(store.namespace, (4, 5), "a"))
    # A reader at step 2 is past retention: told to read the anchor, then the fold.
    with pytest.raises(mcs.NotFound, match="anchor of step"):
        store.manifest((2, 12))
    # Its own TP half of the anchor, read by box straight into its shard, then one fold.
    targets = [mcs.Target("a", "r1", "node0", {}, (32, 0), (32, 32)),
               mcs.Target("norm", "r1n", "node0", {}, (0,), (32,))]
    shards = [np.empty((32, 32), np.float32), np.empty((32,), np.float32)]
    store.read_anchor(store.latest_anchor(), targets, shards)
    assert np.array_equal(shards[0], history[10]["a"][32:])
    for t, s, o in zip(targets, shards, store.read_sparse_objects(store.manifest((10, 12)),
                                                                  targets)):
        mcs.apply_sparse_object(s, o)
    assert np.array_equal(shards[0], ref["a"][32:]) and np.array_equal(shards[1], ref["norm"])
    with pytest.raises(mcs.FailedPrecondition):
        store.put_anchor((9, 10), ref)
    with pytest.raises(mcs.NotFound, match="not sealed"):
        store.put_anchor((12, 13), ref)
    with pytest.raises(mcs.NotFound):  # nothing of the refused anchor stayed
        store.get_tensor(mcs._core.anchor_key(store.namespace, (12, 13), "a"))


@pytest.mark.skipif(not HAVE_DAEMON, reason="mooncake_sparse_node is not built")
def test_ten_thousand_steps_on_a_fixed_size_daemon(tmp_path):
    """A 10,000-step run on a 64 MiB daemon: retention and anchors keep the store bounded; a
    reader that catches up every 4 steps with one fold stays bit-exact, and a reader starting
    from each anchor gets the trainer's weights."""
    with start_node_daemon(tmp_path) as daemon:  # 4 segments of 16 MiB
        s = mcs.connect(daemon.url)
        s.set_retention(4, keep_anchors=1)
        rng = np.random.default_rng(0)
        w = np.zeros((256, 256), np.float32)
        shard = w.copy()
        target = [mcs.Target("w", "r0", "node0", {}, (0, 0), w.shape)]
        keys, used = [], []
        for k in range(1, 10001):
            new = w.copy()
            m = rng.random(w.shape) < 0.01
            new[m] = rng.standard_normal(int(m.sum())).astype(np.float32)
            idx, vals = mcs.encode_update(new, w)
            w = new
            s.put_sparse_object("w", w.shape, idx, vals, generation=(k - 1, k))
            s.seal_generation((k - 1, k), ["w", "norm"])
            if k % 4 == 0:
                (o,) = s.read_sparse_objects(s.manifest((k - 4, k)), target)
                mcs.apply_sparse_object(shard, o)
                assert np.array_equal(shard, w), k
            if k % 1000 == 0:
                s.put_anchor((k - 1, k), {"w": w, "norm": np.ones(256, np.float32)})
                fresh_reader = np.empty((128, 256), np.float32)  # its TP half
                s.read_anchor(s.latest_anchor(),
                              [mcs.Target("w", "r1", "node0", {}, (128, 0), (128, 256))],
                              [fresh_reader])
                assert np.array_equal(fresh_reader, w[128:])
            if k % 250 == 0:
                keys.append(len(s.list_keys("mcs/")) + len(s.list_keys("mcs-anchor/")))
                used.append(s.metrics()["shm_used_bytes"])
        assert len(set(keys[4:])) == 1  # from the first anchor on, the same objects count
        assert max(used) < 4 << 20
        assert s.metrics()["shm_evicted_bytes"] == 0
        assert len(s.list_keys("mcs-anchor/")) == 2  # one anchor (w, norm) kept
        s.close()
