"""Layouts -> sources and targets (mooncake.sparse.layout): every inference rank gets each
coordinate it needs exactly once, for several (trainer, inference) pairs, and inconsistent
descriptions are refused."""

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse import layout as L

H, I, E = 16, 12, 8  # hidden, expert intermediate, experts


def moe_shapes(experts=E, kv_rows=8, vocab=100):
    s = {"model.embed_tokens.weight": (vocab, H), "lm_head.weight": (vocab, H),
         "model.norm.weight": (H,)}
    for layer in range(2):
        p = f"model.layers.{layer}"
        s[f"{p}.self_attn.q_proj.weight"] = (32, H)
        s[f"{p}.self_attn.k_proj.weight"] = (kv_rows, H)
        s[f"{p}.self_attn.v_proj.weight"] = (kv_rows, H)
        s[f"{p}.self_attn.o_proj.weight"] = (H, 32)
        s[f"{p}.input_layernorm.weight"] = (H,)
        s[f"{p}.mlp.gate.weight"] = (experts, H)
        for e in range(experts):
            s[f"{p}.mlp.experts.{e}.gate_proj.weight"] = (I, H)
            s[f"{p}.mlp.experts.{e}.up_proj.weight"] = (I, H)
            s[f"{p}.mlp.experts.{e}.down_proj.weight"] = (H, I)
    return s


RULES = L.qwen3_moe_rules(num_kv_heads=2)

PAIRS = {
    "EP8->EP4xTP2": (mcs.ParallelLayout(ep=8, rules=L.expert_rules(), name="trainer"),
                     mcs.ParallelLayout(ep=4, tp=2, rules=RULES, name="inference")),
    "EP2->EP1xTP2": (mcs.ParallelLayout(ep=2, rules=L.expert_rules(), name="trainer"),
                     mcs.ParallelLayout(ep=1, tp=2, rules=RULES, name="inference")),
    "TP4->TP2": (mcs.ParallelLayout(tp=4, rules=RULES, name="trainer"),
                 mcs.ParallelLayout(tp=2, rules=RULES, name="inference")),
    "EP2xTP2->EP4,attnTP4": (mcs.ParallelLayout(ep=2, tp=2, rules=RULES, name="trainer"),
                             mcs.ParallelLayout(ep=4, dense_tp=4, rules=RULES, name="inference")),
    "EP4xTP2,attnTP8->EP2xTP2 round robin": (
        mcs.ParallelLayout(ep=4, tp=2, dense_tp=8, rules=RULES, name="trainer"),
        mcs.ParallelLayout(ep=2, tp=2, rules=RULES, expert_placement="round_robin",
                           name="inference")),
    "TP1->TP4 (kv heads replicated)": (mcs.ParallelLayout(rules=RULES, name="trainer"),
                                        mcs.ParallelLayout(tp=4, rules=RULES, name="inference")),
}


def expected_box(layout, name, shape, rank, num_experts):
    """The box `rank` should hold, computed independently of ParallelLayout.boxes."""
    ep_rank, tp_rank = rank // layout.tp, rank % layout.tp
    rule, expert = layout.rule_for(name)
    if expert is not None:
        per = num_experts // layout.ep
        owner = (expert % layout.ep if layout.expert_placement == "round_robin"
                 else expert // per)
        if owner != ep_rank:
            return None
        n, r = layout.tp, tp_rank
    else:
        n, r = layout.dense_size, rank % layout.dense_size
    off, loc = [0] * len(shape), list(shape)
    if rule.tp_dim is not None and n > 1:
        d, size = rule.tp_dim, shape[rule.tp_dim]
        if rule.tp_pad > 1:
            padded = -(-size // rule.tp_pad) * rule.tp_pad
            lo, hi = min(r * padded // n, size), min((r + 1) * padded // n, size)
        elif rule.tp_units is not None and rule.tp_units < n:
            unit = size // rule.tp_units
            lo = (r * rule.tp_units // n) * unit
            hi = lo + unit
        else:
            lo, hi = r * size // n, (r + 1) * size // n
        off[d], loc[d] = lo, hi - lo
    if 0 in loc:
        return None
    return tuple(off), tuple(loc)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_targets_are_the_boxes_each_rank_needs(pair):
    trainer, inference = PAIRS[pair]
    shapes = moe_shapes()
    plan = mcs.SyncPlan(trainer, inference, shapes)
    assert plan.num_experts == E
    for rank in range(inference.world_size):
        got = {t.tensor_id: (tuple(t.global_offset), tuple(t.local_shape))
               for t in plan.targets(rank)}
        want = {n: b for n, s in shapes.items()
                for b in [expected_box(inference, n, s, rank, E)] if b is not None}
        assert got == want, rank
        for t in plan.targets(rank):
            assert t.target_id == f"node0/rank{rank}"
            if ".experts." in t.tensor_id:
                assert t.placement["expert"] == int(t.tensor_id.split(".experts.")[1].split(".")[0])
    # Every source is owned by one of its holders, and never by "owner(ep)".
    for s in plan.sources():
        assert s.owner in s.holders
        assert s.placement_policy in ("owner(expert)", "replicate(ep)")
    assert sorted(plan.tensor_ids) == sorted(shapes)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_reading_every_target_gives_each_coordinate_exactly_once(pair):
    """Commit every source box of random tensors as scatter_add from zeros (every entry
    nonzero), read every target, add into zeros: each shard equals its slice only if every
    coordinate came exactly once."""
    trainer, inference = PAIRS[pair]
    shapes = moe_shapes()
    plan = mcs.SyncPlan(trainer, inference, shapes)
    rng = np.random.default_rng(0)
    full = {n: (rng.standard_normal(s).astype(np.float32) + 5.0) for n, s in shapes.items()}
    store = mcs.connect()
    owners = set()
    for rank in range(trainer.world_size):
        for s in plan.sources(rank):
            owners.add((s.tensor_id, s.global_offset))
            box = full[s.tensor_id][tuple(slice(o, o + n) for o, n in
                                          zip(s.global_offset, s.local_shape))]
            idx, vals = mcs.encode_update(box, np.zeros_like(box), apply="scatter_add",
                                          global_offset=s.global_offset)
            assert store.admit(s.tensor_id, (0, 1), s.admit_policy, s.admit_placement,
                               f"trainer/rank{rank}")
            store.put_sparse_object(s.tensor_id, s.global_shape, idx, vals,
                                    generation=(0, 1), apply="scatter_add", **s.put_kwargs())
    assert len(owners) == len(plan.sources())  # one writer per box
    manifest = store.manifest((0, 1))
    for rank in range(inference.world_size):
        targets = plan.targets(rank)
        for t, obj in zip(targets, store.read_sparse_objects(manifest, targets)):
            w = np.zeros(t.local_shape, np.float32)
            mcs.apply_sparse_object(w, obj)
            ref = full[t.tensor_id][tuple(slice(o, o + n) for o, n in
                                          zip(t.global_offset, t.local_shape))]
            np.testing.assert_array_equal(w, ref, err_msg=f"{pair} rank {rank} {t.tensor_id}")


def test_trainer_tp_boxes_are_partial_sources_with_their_own_admission():
    plan = mcs.SyncPlan(mcs.ParallelLayout(tp=2, rules=RULES, name="trainer"),
                        mcs.ParallelLayout(tp=4, rules=RULES, name="inference"), moe_shapes())
    q = [s for s in plan.sources() if s.tensor_id == "model.layers.0.self_attn.q_proj.weight"]
    assert [(s.global_offset, s.local_shape, s.owner) for s in q] == \
        [((0, 0), (16, H), 0), ((16, 0), (16, H), 1)]
    assert [s.admit_placement for s in q] == [{"shard": 0}, {"shard": 1}]
    assert all(s.admit_policy == "owner(shard)" and not s.complete for s in q)
    norm = [s for s in plan.sources() if s.tensor_id == "model.norm.weight"]
    assert len(norm) == 1 and norm[0].complete and norm[0].holders == (0, 1)
    assert norm[0].admit_policy == "replicate(ep)"


def test_replicated_tensors_spread_their_owners():
    plan = mcs.SyncPlan(mcs.ParallelLayout(ep=4, rules=L.expert_rules(), name="trainer"),
                        mcs.ParallelLayout(ep=2, rules=L.expert_rules(), name="inference"),
                        moe_shapes())
    owners = {s.owner for s in plan.sources() if ".experts." not in s.tensor_id}
    assert len(owners) > 1
    # Stable: the same owner on every construction (every rank computes the same plan).
    again = mcs.SyncPlan(plan.trainer, plan.inference, moe_shapes())
    assert [s.owner for s in again.sources()] == [s.owner for s in plan.sources()]
    assert L.stable_hash("") == 0xCBF29CE484222325


def test_stacked_experts_are_boxes_on_the_expert_dim():
    shapes = {"layers.0.experts.w13": (E, 2 * I, H), "layers.0.experts.w2": (E, H, I),
              "layers.0.router": (E, H)}
    rules = [L.TensorRule(r".*\.w13", tp_dim=1, expert_dim=0),
             L.TensorRule(r".*\.w2", tp_dim=2, expert_dim=0), L.TensorRule(".*")]
    plan = mcs.SyncPlan(mcs.ParallelLayout(ep=4, rules=rules, name="trainer"),
                        mcs.ParallelLayout(ep=2, tp=2, rules=rules, name="inference"), shapes)
    w13 = [s for s in plan.sources() if s.tensor_id.endswith("w13")]
    assert [(s.global_offset, s.local_shape, s.placement_policy) for s in w13] == \
        [((2 * k, 0, 0), (2, 2 * I, H), None) for k in range(4)]
    t = {x.tensor_id: x for x in plan.targets(3)}
    assert t["layers.0.experts.w13"].global_offset == (4, I, 0)
    assert t["layers.0.experts.w13"].local_shape == (4, I, H)
    assert t["layers.0.experts.w2"].global_offset == (4, 0, I // 2)


def test_uneven_linear_expert_placement():
    lay = mcs.ParallelLayout(ep=3, rules=L.expert_rules(), name="x")
    assert [lay.experts_of(r, 8) for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [lay.expert_owner(e, 8) for e in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert lay.local_expert_index(7, 8) == 1
    rr = mcs.ParallelLayout(ep=3, rules=L.expert_rules(), expert_placement="round_robin")
    assert rr.experts_of(1, 8) == [1, 4, 7] and rr.local_expert_index(4, 8) == 1


# -- inconsistent descriptions ---------------------------------------------------------------
def test_expert_on_one_side_only_is_refused():
    """The trainer commits experts under owner(expert); an inference layout that does not know
    they are experts would ask without an "expert" ordinal and silently get nothing."""
    trainer = mcs.ParallelLayout(ep=2, rules=L.expert_rules(), name="trainer")
    inference = mcs.ParallelLayout(tp=2, rules=[L.TensorRule(".*")], name="inference")
    with pytest.raises(mcs.InvalidArgument,
                       match=r"experts\.0\.gate_proj.*covered 0 of .*owner\(expert\)"):
        mcs.SyncPlan(trainer, inference, moe_shapes())


def test_expert_ids_that_disagree_are_refused():
    trainer = mcs.ParallelLayout(ep=2, rules=[L.TensorRule(r".*\.experts\.(?P<expert>\d+)\..*"),
                                              L.TensorRule(".*")], name="trainer")
    # The inference side numbers experts by layer * E + e: another id for the same tensor.
    shapes = {"l.1.experts.0.w": (4, 4), "l.1.experts.1.w": (4, 4)}
    inference = mcs.ParallelLayout(rules=[L.TensorRule(r"l\.(?P<expert>\d+)\.experts\..*"),
                                          L.TensorRule(".*")], name="inference", num_experts=2)
    with pytest.raises(mcs.InvalidArgument, match="covered 0"):
        mcs.SyncPlan(dataclass_replace(trainer, num_experts=2), inference, shapes)


def dataclass_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


@pytest.mark.parametrize("make, match", [
    (lambda: mcs.SyncPlan(mcs.ParallelLayout(ep=2, rules=L.expert_rules(), num_experts=8),
                          mcs.ParallelLayout(rules=L.expert_rules(), num_experts=4),
                          moe_shapes()), "disagree on the number of experts"),
    (lambda: mcs.SyncPlan(mcs.ParallelLayout(rules=[L.TensorRule(r".*\.experts\..*")]),
                          mcs.ParallelLayout(), moe_shapes()), "no rule matches"),
    (lambda: mcs.SyncPlan(mcs.ParallelLayout(tp=3, rules=RULES, name="trainer"),
                          mcs.ParallelLayout(rules=RULES), moe_shapes()),
     "does not split into 3 TP parts"),
    (lambda: mcs.SyncPlan(mcs.ParallelLayout(tp=4, rules=L.qwen3_moe_rules(num_kv_heads=3)),
                          mcs.ParallelLayout(rules=RULES), moe_shapes(kv_rows=9)),
     "cannot be replicated evenly"),
    (lambda: mcs.ParallelLayout(ep=2, tp=2, dense_tp=3), "dense_tp=3 must divide"),
    (lambda: mcs.ParallelLayout(ep=0), "ep must be an int >= 1"),
    (lambda: L.TensorRule(r"(?P<expert>\d+)", expert_dim=0), "cannot also stack"),
    (lambda: L.TensorRule(r".*", tp_dim=1, expert_dim=1), "tp_dim and expert_dim"),
    (lambda: L.TensorRule(r"("), "pattern"),
    (lambda: mcs.SyncPlan(mcs.ParallelLayout(rules=[L.TensorRule(".*", tp_dim=2)]),
                          mcs.ParallelLayout(rules=RULES), moe_shapes()), "has no dimension 2"),
    (lambda: mcs.SyncPlan(mcs.ParallelLayout(ep=3, rules=[L.TensorRule(".*", expert_dim=0)],
                                             expert_placement="round_robin"),
                          mcs.ParallelLayout(rules=[L.TensorRule(".*")]),
                          {"w": (6, 4)}), "contiguous experts"),
])
def test_inconsistent_descriptions_raise(make, match):
    with pytest.raises(mcs.InvalidArgument, match=match):
        make()


def test_rank_out_of_range():
    plan = mcs.SyncPlan(*PAIRS["EP2->EP1xTP2"], moe_shapes())
    with pytest.raises(mcs.InvalidArgument, match="outside"):
        plan.targets(2)
    with pytest.raises(mcs.InvalidArgument, match="outside"):
        plan.sources(-1)


def test_nodes():
    lay = mcs.ParallelLayout(ep=2, tp=4, ranks_per_node=4, node_prefix="host")
    assert [lay.target_id(r) for r in (0, 3, 4, 7)] == \
        ["host0/rank0", "host0/rank3", "host1/rank4", "host1/rank7"]
