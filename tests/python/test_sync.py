"""Per-step helpers (mooncake.sparse.sync) and encode_update(global_offset=)."""

import logging

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
    for s in syncs:
        s.snapshot(state)
    shards = inference_shards(plan, state)
    for k in range(1, 4):
        state = perturb(state, 0.05, k)
        with caplog.at_level(logging.DEBUG, logger="mooncake.sparse"):
            stats = [s.step(state) for s in syncs]
        assert all(st.generation == (k - 1, k) for st in stats)
        assert sum(len(st.tensors) for st in stats) == len(plan.sources())
        assert all(t.committed and t.source_ref for st in stats for t in st.tensors)
        assert sum(st.nnz for st in stats) > 0
        for r, dests in shards.items():
            applied = mcs.apply_step(store, plan, r, dests, (k - 1, k))
            assert len(applied.tensors) == len(plan.targets(r))
            for t in plan.targets(r):
                assert torch.equal(dests[t.tensor_id].view(torch.int16),
                                   box(state[t.tensor_id], t).contiguous().view(torch.int16))
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
        st = sync.step(state)
        assert (k < 3) == (st.nnz == 0)  # 3 x 4e-4 > 1e-3: sent at the third step
        for r, dests in shards.items():
            mcs.apply_step(store, plan, r, dests, (k - 1, k))
            for t in plan.targets(r):
                snap = sync._snapshot[t.tensor_id, (0,) * len(t.global_offset)]
                assert torch.equal(dests[t.tensor_id], box(snap, t))


def test_skip_unchanged_and_stats():
    store = mcs.connect()
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=RULES, name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    state = random_state()
    sync = mcs.TrainerSync(store, plan, 0, skip_unchanged=True)
    sync.snapshot(state)
    new = dict(state)
    name = "model.layers.0.mlp.gate.weight"
    new[name] = state[name].clone()
    new[name][1, 3] += 1
    st = sync.step(new)
    assert st.committed == 1 and st.skipped_unchanged == len(plan.sources()) - 1
    (t,) = [t for t in st.tensors if t.committed]
    assert (t.tensor_id, t.nnz, t.unchanged) == (name, 1, False) and t.bytes > 0
    assert [s.tensor_id for s in store.manifest((0, 1))] == [name]
    assert sync.generation == (1, 2)


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
    bad = dict(dests)
    bad["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(32, 16, dtype=torch.bfloat16)
    with pytest.raises(mcs.InvalidArgument, match="target box"):
        mcs.apply_step(store, plan, 1, bad, (0, 1))


class SealingStore:
    """A store that seals steps (the §9 surface), recording the calls."""

    def __init__(self, inner):
        self.inner, self.sealed = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def seal_generation(self, generation, tensor_ids):
        self.sealed.append((tuple(generation), list(tensor_ids)))
        return "sealed"


def test_seal_with_the_complete_tensor_list():
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=RULES, name="trainer"),
                        mcs.ParallelLayout(rules=RULES, name="inference"), shapes())
    plain = mcs.TrainerSync(mcs.connect(), plan, 0)
    assert not plain.can_seal
    with pytest.raises(mcs.Unimplemented):
        plain.seal()
    store = SealingStore(mcs.connect())
    sync = mcs.TrainerSync(store, plan, 0)
    sync.snapshot(random_state())
    sync.step(random_state(1))
    assert sync.can_seal and sync.seal() == "sealed"
    assert store.sealed == [((0, 1), list(shapes()))]
