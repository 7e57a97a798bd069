"""Per-step helpers (mooncake.sparse.sync) and encode_update(global_offset=)."""

import logging
import threading
import time

import numpy as np
import pytest
import torch

import mooncake.sparse as mcs
from mooncake.sparse import layout as L

RULES = L.qwen3_moe_rules(num_kv_heads=2)


def shapes():
    s = {"model.layers.0.self_attn.q_proj.weight": (32, 16),
         "model.layers.0.self_attn.k_proj.weight": (8, 16),
         "model.layers.0.self_attn.o_proj.weight": (16, 32),
         "model.layers.0.input_layernorm.weight": (16,),
         "model.layers.0.mlp.gate.weight": (4, 16)}
    for e in range(4):
        s[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"] = (12, 16)
        s[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] = (16, 12)
    return s


def random_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in shapes().items()}


def perturb(state, density, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, w in state.items():
        mask = torch.rand(w.shape, generator=g) < density
        out[n] = torch.where(mask, (w.float() + 0.01 * torch.randn(w.shape, generator=g))
                             .to(torch.bfloat16), w)
    return out


def box(x, t):
    return x[tuple(slice(o, o + n) for o, n in zip(t.global_offset, t.local_shape))]


def inference_shards(plan, state):
    return {r: {t.tensor_id: box(state[t.tensor_id], t).clone() for t in plan.targets(r)}
            for r in range(plan.inference.world_size)}


# -- encode_update(global_offset=) -----------------------------------------------------------
def test_encode_update_global_offset_shifts_and_widens_indices():
    new = np.zeros((4, 5), np.float32)
    new[1, 2], new[3, 4] = 1.0, 2.0
    old = np.zeros_like(new)
    idx0, vals0 = mcs.encode_update(new, old)
    idx, vals = mcs.encode_update(new, old, global_offset=(10, 65533))
    np.testing.assert_array_equal(vals, vals0)
    np.testing.assert_array_equal(idx.astype(np.int64), idx0.astype(np.int64) + [10, 65533])
    assert idx.dtype == np.uint32  # 65533 + 4 no longer fits uint16
    assert mcs.encode_update(new, old, global_offset=(0, 0))[0].dtype == idx0.dtype
    # A shard committed with its offset reads back in place.
    store = mcs.connect()
    store.put_sparse_object("t", (20, 70000), idx, vals, global_offset=(10, 65533),
                            local_shape=(4, 5))
    tgt = mcs.Target("t", "r", "node0", {}, (11, 65535), (3, 3))
    obj, = store.read_sparse_objects(store.manifest((0, 1)), [tgt])
    w = np.zeros((3, 3), np.float32)
    mcs.apply_sparse_object(w, obj)
    assert w[0, 0] == 1.0 and w[2, 2] == 2.0 and w.sum() == 3.0
    with pytest.raises(mcs.InvalidArgument, match="dims"):
        mcs.encode_update(new, old, global_offset=(1,))
    with pytest.raises(mcs.InvalidArgument, match=">= 0"):
        mcs.encode_update(new, old, global_offset=(-1, 0))


def test_encode_update_global_offset_on_torch():
    new = torch.zeros(3, 3, dtype=torch.bfloat16)
    new[2, 1] = 1
    idx, vals = mcs.encode_update(new, torch.zeros_like(new), global_offset=(5, 7))
    assert idx.tolist() == [[7, 8]] and vals.dtype == torch.bfloat16


# -- trainer and inference sides -------------------------------------------------------------
def boxes_by_tensor(stats):
    out = {}
    for st in stats:
        for t in st.tensors:
            out.setdefault(t.tensor_id, []).append(t)
    return out


def step_all(syncs, state):
    """Every trainer rank commits, then rank 0 seals (what a barrier orders in a real run)."""
    stats = [s.step({x.tensor_id: state[x.tensor_id] for x in s.specs}) for s in syncs]
    syncs[0].seal()
    return stats


def assert_exact(plan, shards, state):
    for r, dests in shards.items():
        for t in plan.targets(r):
            assert torch.equal(dests[t.tensor_id].view(torch.int16),
                               box(state[t.tensor_id], t).contiguous().view(torch.int16)), (
                r, t.tensor_id)


@pytest.mark.parametrize("trainer, inference", [
    (mcs.ParallelLayout(ep=2, rules=L.expert_rules(), name="trainer"),
     mcs.ParallelLayout(tp=2, rules=RULES, name="inference")),
    (mcs.ParallelLayout(tp=2, rules=RULES, name="trainer"),  # partial sources
     mcs.ParallelLayout(ep=2, tp=2, dense_tp=4, rules=RULES, name="inference")),
])
def test_steps_overwrite_bit_exact(trainer, inference, caplog):
    store = mcs.connect()
    plan = mcs.SyncPlan(trainer, inference, shapes())
    state = random_state()
    syncs = [mcs.TrainerSync(store, plan, r) for r in range(trainer.world_size)]
    assert all(s.can_seal and s.skip_unchanged for s in syncs)
    for s in syncs:
        s.snapshot(state)
    shards = inference_shards(plan, state)
    for k in range(1, 4):
        old, state = state, perturb(state, 0.05, k)
        with caplog.at_level(logging.DEBUG, logger="mooncake.sparse"):
            stats = step_all(syncs, state)
        assert all(st.generation == (k - 1, k) for st in stats)
        assert sum(len(st.tensors) for st in stats) == len(plan.sources())
        split = set().union(*(s.split_tensors for s in syncs))
        for n, boxes in boxes_by_tensor(stats).items():
            changed = not torch.equal(old[n].view(torch.int16), state[n].view(torch.int16))
            # Whole or nothing: a changed tensor (or one split over ranks) has every box.
            assert all(t.committed == (changed or n in split) for t in boxes), n
            assert all(bool(t.source_ref) == t.committed for t in boxes)
        assert sum(st.nnz for st in stats) > 0
        for r, dests in shards.items():
            applied = mcs.apply_step(store, plan, r, dests, (k - 1, k), wait=True, timeout=5)
            assert len(applied.tensors) == len(plan.targets(r))
        assert_exact(plan, shards, state)
    assert store.latest_generation() == (2, 3)
    assert any("committed" in rec.message for rec in caplog.records)


def test_sync_step_from_shards_and_old_state():
    """A TP trainer's state dict holds only its shards; sync_step takes them as they are."""
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(tp=2, rules=RULES, name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    old = random_state()
    new = perturb(old, 0.1, 7)

    def shard_state(state, rank):
        return {s.tensor_id: box(state[s.tensor_id], s).clone() for s in plan.held(rank)}

    total = 0
    for rank in range(2):
        st = mcs.sync_step(store, plan, rank, shard_state(new, rank), shard_state(old, rank),
                           (0, 1))
        total += st.nnz
        for t in st.tensors:
            spec = next(s for s in plan.sources(rank) if s.tensor_id == t.tensor_id
                        and s.global_offset == t.global_offset)
            assert t.local_shape == spec.local_shape
    store.seal_generation((0, 1), plan.tensor_ids)
    dests = inference_shards(plan, old)[0]
    stats = mcs.apply_step(store, plan, 0, dests, (0, 1))
    assert stats.nnz == total
    for n, w in dests.items():
        assert torch.equal(w.view(torch.int16), new[n].view(torch.int16)), n
    with pytest.raises(mcs.InvalidArgument, match="expected the whole tensor"):
        mcs.sync_step(store, plan, 0, {n: w[:1] for n, w in new.items()}, old, (1, 2))


def test_scatter_add_snapshot_follows_the_inference_side():
    """With a threshold, sub-threshold changes stay in the snapshot's difference and are sent
    once they add up; the inference weights always equal the trainer's snapshot."""
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=RULES, name="trainer"),
                        mcs.ParallelLayout(tp=2, rules=RULES, name="inference"), shapes())
    state = {n: w.float() for n, w in random_state().items()}
    sync = mcs.TrainerSync(store, plan, 0, apply="scatter_add", threshold=1e-3)
    sync.snapshot(state)
    shards = inference_shards(plan, state)
    for k in range(1, 4):
        state = {n: w + 4e-4 * torch.ones_like(w) for n, w in state.items()}
        st = sync.step(state, seal=True)
        assert st.sealed
        assert (k < 3) == (st.nnz == 0)  # 3 x 4e-4 > 1e-3: sent at the third step
        assert (k < 3) == (st.committed == 0)  # nothing changed by more: nothing committed
        for r, dests in shards.items():
            mcs.apply_step(store, plan, r, dests, (k - 1, k), wait=True, timeout=5)
            for t in plan.targets(r):
                snap = sync._snapshot[t.tensor_id, (0,) * len(t.global_offset)]
                assert torch.equal(dests[t.tensor_id], box(snap, t))


@pytest.mark.parametrize("sparse_past", [0, None])
def test_overwrite_snapshot_takes_the_committed_entries(monkeypatch, sparse_past):
    """Overwrite: after each step the snapshot holds the step's weights bit for bit (by the
    committed entries, or by a copy where that is cheaper: sparse_past=0 takes the entries for
    every tensor) and equals what the inference side applied; a tensor left unchanged keeps its
    snapshot."""
    from mooncake.sparse import sync as sync_module
    if sparse_past is not None:
        monkeypatch.setattr(sync_module, "_SPARSE_SNAPSHOT_BYTES", sparse_past)
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=RULES, name="trainer"),
                        mcs.ParallelLayout(tp=2, rules=RULES, name="inference"), shapes())
    state = random_state()
    sync = mcs.TrainerSync(store, plan, 0)
    sync.snapshot(state)
    shards = inference_shards(plan, state)
    names = sorted(state)
    for k in range(1, 4):
        state = {n: w.clone() for n, w in state.items()}
        for n in names[k % 2::2]:  # half of the tensors change each step
            w = state[n].view(-1)
            w[k::7] = (w[k::7].float() + 0.5).to(w.dtype)
        st = sync.step(state, seal=True)
        assert 0 < st.committed < len(names)
        for n, w in state.items():
            snap = sync._snapshot[n, (0,) * w.dim()]
            assert torch.equal(snap.view(torch.int16), w.view(torch.int16)), (n, k)
        for r, dests in shards.items():
            mcs.apply_step(store, plan, r, dests, (k - 1, k), wait=True, timeout=5)
            for t in plan.targets(r):
                snap = sync._snapshot[t.tensor_id, (0,) * len(t.global_offset)]
                assert torch.equal(dests[t.tensor_id], box(snap, t))


def test_skip_unchanged_and_stats():
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=RULES, name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    state = random_state()
    sync = mcs.TrainerSync(store, plan, 0)
    sync.snapshot(state)
    new = dict(state)
    name = "model.layers.0.mlp.gate.weight"
    new[name] = state[name].clone()
    new[name][1, 3] += 1
    st = sync.step(new)
    assert st.committed == 1 and st.skipped_unchanged == len(plan.sources()) - 1
    assert not st.sealed
    (t,) = [t for t in st.tensors if t.committed]
    assert (t.tensor_id, t.nnz, t.unchanged) == (name, 1, False) and t.bytes > 0
    assert [s.tensor_id for s in store.manifest((0, 1))] == [name]
    assert sync.generation == (1, 2)
    # Read before the seal: the manifest lacks the unchanged tensors.
    dests = inference_shards(plan, state)[0]
    with pytest.raises(mcs.NotFound, match="not sealed"):
        mcs.apply_step(store, plan, 0, dests, (0, 1))
    sync.seal()
    m = store.manifest((0, 1))
    assert m.sealed and set(m.unchanged) == set(plan.tensor_ids) - {name}
    stats = mcs.apply_step(store, plan, 0, dests, (0, 1))
    assert stats.nnz == 1 and torch.equal(dests[name], new[name])
    # Every box committed when asked (unchanged ones as empty objects).
    every = mcs.TrainerSync(store, plan, 0, skip_unchanged=False, writer_id="every",
                            start_step=1)
    every.snapshot(new)
    st = every.step(new, seal=True)
    assert st.committed == len(plan.sources()) and st.nnz == 0 and st.sealed
    assert len(store.manifest((1, 2))) == len(plan.sources())


def test_multi_step_run_commits_only_the_changed_tensors():
    """Over eight steps only the router changes every step, the experts every third step and
    the rest never: no object is committed for a tensor in a step it did not change, and both
    inference layouts stay bit-exact."""
    store = mcs.connect()
    trainer = mcs.ParallelLayout(ep=2, rules=L.expert_rules(), name="trainer")
    plan = mcs.SyncPlan(trainer, mcs.ParallelLayout(ep=2, tp=2, dense_tp=4, rules=RULES,
                                                    name="inference"), shapes())
    tp1 = mcs.SyncPlan(trainer, mcs.ParallelLayout(rules=RULES, name="tp1"), shapes())
    state = random_state()
    syncs = [mcs.TrainerSync(store, plan, r) for r in range(2)]
    for s in syncs:
        s.snapshot(state)
    shards, whole = inference_shards(plan, state), inference_shards(tp1, state)
    router = "model.layers.0.mlp.gate.weight"
    experts = {n for n in shapes() if ".experts." in n}
    for k in range(1, 9):
        changing = {router} | (experts if k % 3 == 0 else set())
        nxt = perturb(state, 0.1, k)
        state = {n: nxt[n] if n in changing else state[n] for n in state}
        stats = step_all(syncs, state)
        committed = {t.tensor_id for st in stats for t in st.tensors if t.committed}
        assert committed == changing
        m = store.manifest((k - 1, k))
        assert m.sealed and {s.tensor_id for s in m} == changing
        assert set(m.unchanged) == set(plan.tensor_ids) - changing
        for r, dests in shards.items():
            st = mcs.apply_step(store, plan, r, dests, (k - 1, k), wait=True, timeout=5)
            assert all(a.nnz == 0 for a in st.tensors if a.tensor_id not in changing)
        assert_exact(plan, shards, state)
        mcs.apply_step(store, tp1, 0, whole[0], (k - 1, k), wait=True, timeout=5)
        assert_exact(tp1, whole, state)
    # Tensors never changed have no object in any step.
    never = set(plan.tensor_ids) - {router} - experts
    assert not any(s.tensor_id in never for k in range(1, 9) for s in store.manifest((k - 1, k)))


def test_reader_catches_up_over_several_steps_in_one_read():
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(tp=2, rules=RULES, name="trainer"),
                        mcs.ParallelLayout(tp=2, rules=RULES, name="inference"), shapes())
    state = random_state()
    syncs = [mcs.TrainerSync(store, plan, r) for r in range(2)]
    for s in syncs:
        s.snapshot(state)
    shards, late = inference_shards(plan, state), inference_shards(plan, state)
    readers = [mcs.InferenceSync(store, plan, r, shards[r]) for r in range(2)]
    late_readers = [mcs.InferenceSync(store, plan, r, late[r]) for r in range(2)]
    assert readers[0].update() is None  # nothing sealed yet
    states, per_step = [state], {r: 0 for r in range(2)}
    for k in range(1, 7):
        state = perturb(state, 0.03, 10 + k)
        states.append(state)
        step_all(syncs, state)
        for rd in readers:  # up to date every step
            st = rd.update(k, timeout=5)
            assert st.generation == (k - 1, k) and rd.step == k
            per_step[rd.rank] += st.nnz if k > 2 else 0
        assert_exact(plan, shards, state)
        if k == 2:
            for rd in late_readers:
                assert rd.update(2, timeout=5).generation == (0, 2)  # two steps, one read
            assert_exact(plan, late, states[2])
    calls = []
    real_read = store.read_sparse_objects
    store.read_sparse_objects = lambda *a, **kw: calls.append(a[0].generation) or real_read(
        *a, **kw)
    try:
        stats = [rd.update() for rd in late_readers]  # to the newest sealed step: (2, 6)
    finally:
        del store.read_sparse_objects
    assert calls == [(2, 6), (2, 6)] and all(st.generation == (2, 6) for st in stats)
    assert all(rd.step == 6 for rd in late_readers)
    assert_exact(plan, late, state)
    # One object per target, each coordinate once: fewer entries than the steps one by one.
    assert all(st.nnz < per_step[st.rank] for st in stats)
    assert late_readers[0].update() is None and late_readers[0].update(6) is None
    with pytest.raises(mcs.InvalidArgument, match="back"):
        late_readers[0].update(5)
    with pytest.raises(mcs.DeadlineExceeded):
        late_readers[0].update(7, timeout=0.05)
    # apply_step takes the fold too.
    again = inference_shards(plan, states[1])
    mcs.apply_step(store, plan, 1, again[1], (1, 6), wait=True, timeout=5)
    assert_exact(plan, {1: again[1]}, state)


SPLIT = "model.layers.0.self_attn.q_proj.weight"


def test_split_tensor_with_one_box_changed():
    """q_proj is split over two TP trainer ranks and only rank 0's box changes: both boxes are
    committed (rank 1's empty), so that targets over rank 1's box still find their sources."""
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(tp=2, rules=RULES, name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    owners = {s.owner for s in plan.sources() if s.tensor_id == SPLIT}
    assert owners == {0, 1}
    state = random_state()
    syncs = [mcs.TrainerSync(store, plan, r) for r in range(2)]
    for s in syncs:
        s.snapshot(state)
        assert SPLIT in s.split_tensors
    shards = inference_shards(plan, state)
    new = dict(state)
    new[SPLIT] = state[SPLIT].clone()
    new[SPLIT][0, :3] += 1  # row 0: in rank 0's box only

    # Each rank alone: the split tensors are committed whole, changed or not.
    stats = step_all(syncs, new)
    q = boxes_by_tensor(stats)[SPLIT]
    assert [t.committed for t in q] == [True, True] and sorted(t.nnz for t in q) == [0, 3]
    split = syncs[0].split_tensors | syncs[1].split_tensors
    committed = {t.tensor_id for st in stats for t in st.tensors if t.committed}
    assert committed == split  # the complete tensors did not change: skipped
    mcs.apply_step(store, plan, 0, shards[0], (0, 1), wait=True, timeout=5)
    assert_exact(plan, shards, new)

    # The ranks share what changed: the unchanged split tensors are skipped too.
    newer = dict(new)
    newer[SPLIT] = new[SPLIT].clone()
    newer[SPLIT][-1, 0] += 1  # last row: rank 1's box only
    encoded = [s.encode(newer) for s in syncs]
    assert [sorted(e.changed) for e in encoded] == [[], [SPLIT]]
    union = set().union(*(e.changed for e in encoded))
    stats = [s.commit(e, changed_anywhere=union) for s, e in zip(syncs, encoded)]
    # The boxes of a split tensor are not admitted (a seal could not pair their admissions with
    # commits); a second writer of a box with other values is refused by the commit.
    dup = mcs.TrainerSync(store, plan, 1, writer_id="dup", start_step=1)
    dup.snapshot(new)
    other = dict(newer)
    other[SPLIT] = new[SPLIT].clone()
    other[SPLIT][-1, 1] += 1
    with pytest.raises(mcs.Conflict):
        # Told what changed anywhere, like the real ranks, so that it commits only that box.
        dup.commit(dup.encode(other), changed_anywhere=union)
    syncs[0].seal()
    committed = [(t.tensor_id, t.nnz) for st in stats for t in st.tensors if t.committed]
    assert sorted(committed) == [(SPLIT, 0), (SPLIT, 1)]
    m = store.manifest((1, 2))
    assert len(m) == 2 and set(m.unchanged) == set(plan.tensor_ids) - {SPLIT}
    mcs.apply_step(store, plan, 0, shards[0], (1, 2), wait=True, timeout=5)
    assert_exact(plan, shards, newer)
    # Both steps in one fold read.
    fresh = inference_shards(plan, state)
    mcs.apply_step(store, plan, 0, fresh[0], (0, 2))
    assert_exact(plan, fresh, newer)


def test_a_split_tensor_committed_in_part_is_not_readable():
    """Why a split tensor is committed whole: a step with one box of it leaves the targets
    over the other box without a source."""
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(tp=2, rules=RULES, name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    spec = next(s for s in plan.sources(0) if s.tensor_id == SPLIT)
    w = box(random_state()[SPLIT], spec)
    idx, vals = mcs.encode_update(w, torch.zeros_like(w), global_offset=spec.global_offset)
    store.put_sparse_object(SPLIT, spec.global_shape, idx, vals, generation=(0, 1),
                            **spec.put_kwargs())
    store.seal_generation((0, 1), plan.tensor_ids)
    with pytest.raises(mcs.NotFound):
        mcs.apply_step(store, plan, 0, inference_shards(plan, random_state())[0], (0, 1))


def test_seal_retries_while_a_writer_has_not_committed():
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(ep=2, rules=L.expert_rules(), name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    state = random_state()
    syncs = [mcs.TrainerSync(store, plan, r) for r in range(2)]
    for s in syncs:
        s.snapshot(state)
    new = perturb(state, 0.2, 3)
    syncs[0].step(new)
    encoded = syncs[1].encode(new)
    spec = encoded.boxes[0].spec  # rank 1 admitted for one box, not committed yet
    assert store.admit(spec.tensor_id, (0, 1), spec.admit_policy, spec.admit_placement,
                       syncs[1].writer_id)
    with pytest.raises(mcs.FailedPrecondition, match="has not committed"):
        syncs[0].seal()
    errors = []

    def seal():
        try:
            syncs[0].seal((0, 1), timeout=10)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=seal)
    th.start()
    time.sleep(0.1)
    syncs[1].commit(encoded)
    th.join(10)
    assert not th.is_alive() and not errors
    assert store.latest_generation() == (0, 1)
    with pytest.raises(mcs.FailedPrecondition, match="sealed already"):
        syncs[0].seal(timeout=1)  # not retried
    with pytest.raises(mcs.Conflict):  # a late commit into the sealed step is refused
        mcs.sync_step(store, plan, 0, perturb(new, 0.2, 4), new, (0, 1), writer_id="late")


def test_second_writer_of_a_box_conflicts():
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=RULES, name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    state = random_state()
    a = mcs.TrainerSync(store, plan, 0, writer_id="a")
    b = mcs.TrainerSync(store, plan, 0, writer_id="b")
    a.snapshot(state)
    b.snapshot(state)
    a.step(perturb(state, 0.1, 1))
    with pytest.raises(mcs.Conflict, match="another writer"):
        b.step(perturb(state, 0.1, 1))


def test_step_before_snapshot_and_missing_destinations():
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=RULES, name="trainer"),
                        mcs.ParallelLayout(tp=2, rules=RULES, name="inference"), shapes())
    with pytest.raises(mcs.InvalidArgument, match="snapshot"):
        mcs.TrainerSync(store, plan, 0).step(random_state())
    dests = inference_shards(plan, random_state())[1]
    with pytest.raises(mcs.InvalidArgument, match="no destination"):
        mcs.apply_step(store, plan, 1, {k: v for k, v in list(dests.items())[1:]}, (0, 1))
    with pytest.raises(mcs.InvalidArgument, match="no destination"):
        mcs.InferenceSync(store, plan, 1, {k: v for k, v in list(dests.items())[1:]})
    bad = dict(dests)
    bad["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(32, 16, dtype=torch.bfloat16)
    with pytest.raises(mcs.InvalidArgument, match="target box"):
        mcs.apply_step(store, plan, 1, bad, (0, 1))


class SealingStore:
    """A store that seals steps, recording the calls."""

    def __init__(self, inner):
        self.inner, self.sealed = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def seal_generation(self, generation, tensor_ids):
        self.sealed.append((tuple(generation), list(tensor_ids)))
        self.inner.seal_generation(generation, tensor_ids)


class NoStepsStore:
    """A store-like object without the step lifecycle (no seal_generation, wait_generation)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        if name in ("seal_generation", "wait_generation"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_seal_with_the_complete_tensor_list():
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=RULES, name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    assert mcs.TrainerSync(mcs.connect(), plan, 0).can_seal
    store = SealingStore(mcs.connect())
    sync = mcs.TrainerSync(store, plan, 0)
    sync.snapshot(random_state())
    sync.step(random_state(1))
    assert sync.can_seal
    sync.seal()
    assert store.sealed == [((0, 1), list(shapes()))]
    assert store.inner.wait_generation((0, 1), timeout=0).sealed


def test_store_without_steps_commits_every_box():
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=RULES, name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    store = NoStepsStore(mcs.connect())
    sync = mcs.TrainerSync(store, plan, 0)
    assert not sync.can_seal and not sync.skip_unchanged
    state = random_state()
    sync.snapshot(state)
    new = dict(state)
    name = "model.layers.0.mlp.gate.weight"
    new[name] = state[name].clone()
    new[name][0, 0] += 1
    st = sync.step(new)
    assert st.committed == len(plan.sources()) and st.nnz == 1
    with pytest.raises(mcs.Unimplemented):
        sync.seal()
    with pytest.raises(mcs.Unimplemented):
        sync.step(new, seal=True)
    dests = inference_shards(plan, state)[0]
    mcs.apply_step(store, plan, 0, dests, (0, 1))  # every tensor has its (maybe empty) source
    assert torch.equal(dests[name], new[name])
    with pytest.raises(mcs.Unimplemented):
        mcs.apply_step(store, plan, 0, dests, (0, 1), wait=True)
