"""Engine name maps and destination views (mooncake.sparse.engines): updates land in place in
strided slices of fused vLLM/SGLang-style parameters, laid out as the engines load them."""

import numpy as np
import pytest
import torch

import mooncake.sparse as mcs
from mooncake.sparse import engines as EN
from mooncake.sparse import layout as L

H, HEADS, KV, HD, I, E, V = 16, 4, 2, 8, 12, 4, 100


def qwen_shapes():
    s = {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "model.norm.weight": (H,)}
    p = "model.layers.0"
    s.update({f"{p}.self_attn.q_proj.weight": (HEADS * HD, H),
              f"{p}.self_attn.k_proj.weight": (KV * HD, H),
              f"{p}.self_attn.v_proj.weight": (KV * HD, H),
              f"{p}.self_attn.o_proj.weight": (H, HEADS * HD),
              f"{p}.self_attn.q_norm.weight": (HD,), f"{p}.self_attn.k_norm.weight": (HD,),
              f"{p}.mlp.gate.weight": (E, H)})
    for e in range(E):
        s[f"{p}.mlp.experts.{e}.gate_proj.weight"] = (I, H)
        s[f"{p}.mlp.experts.{e}.up_proj.weight"] = (I, H)
        s[f"{p}.mlp.experts.{e}.down_proj.weight"] = (H, I)
    # A dense layer (Qwen3-MoE mlp_only_layers).
    s["model.layers.1.mlp.gate_proj.weight"] = (2 * I, H)
    s["model.layers.1.mlp.up_proj.weight"] = (2 * I, H)
    s["model.layers.1.mlp.down_proj.weight"] = (H, 2 * I)
    return s


def rows(x, r, n):
    k = x.shape[0] // n
    return x[r * k:(r + 1) * k]


def vllm_params(state, layout, rank):
    """Rank `rank`'s vLLM Qwen3-MoE parameters, built the way its loaders lay them out:
    QKVParallelLinear (q, k, v of this rank; KV heads replicated when fewer than TP ranks),
    MergedColumnParallelLinear (gate, up), FusedMoE w13 [E_local, 2 I_tp, H] / w2, vocab rows
    padded to 64 and split evenly."""
    ep_rank = rank // layout.tp
    tp, tp_rank = layout.dense_size, rank % layout.dense_size
    etp, etp_rank = layout.tp, rank % layout.tp
    p, a = "model.layers.0", "model.layers.0.self_attn"
    kv_part, kv_parts = (tp_rank, tp) if KV >= tp else (tp_rank // (tp // KV), KV)
    out = {
        f"{a}.qkv_proj.weight": torch.cat([
            rows(state[f"{a}.q_proj.weight"], tp_rank, tp),
            rows(state[f"{a}.k_proj.weight"], kv_part, kv_parts),
            rows(state[f"{a}.v_proj.weight"], kv_part, kv_parts)]),
        f"{a}.o_proj.weight": rows(state[f"{a}.o_proj.weight"].T, tp_rank, tp).T,
        f"{a}.q_norm.weight": state[f"{a}.q_norm.weight"],
        f"{a}.k_norm.weight": state[f"{a}.k_norm.weight"],
        f"{p}.mlp.gate.weight": state[f"{p}.mlp.gate.weight"],
        "model.norm.weight": state["model.norm.weight"],
        "model.layers.1.mlp.gate_up_proj.weight": torch.cat([
            rows(state["model.layers.1.mlp.gate_proj.weight"], tp_rank, tp),
            rows(state["model.layers.1.mlp.up_proj.weight"], tp_rank, tp)]),
        "model.layers.1.mlp.down_proj.weight":
            rows(state["model.layers.1.mlp.down_proj.weight"].T, tp_rank, tp).T,
    }
    experts = range(ep_rank * E // layout.ep, (ep_rank + 1) * E // layout.ep)
    out[f"{p}.mlp.experts.w13_weight"] = torch.stack([torch.cat([
        rows(state[f"{p}.mlp.experts.{e}.gate_proj.weight"], etp_rank, etp),
        rows(state[f"{p}.mlp.experts.{e}.up_proj.weight"], etp_rank, etp)]) for e in experts])
    out[f"{p}.mlp.experts.w2_weight"] = torch.stack([
        rows(state[f"{p}.mlp.experts.{e}.down_proj.weight"].T, etp_rank, etp).T
        for e in experts])
    per = 128 // tp  # V padded to 64 -> 128 rows
    for n in ("model.embed_tokens.weight", "lm_head.weight"):
        w = torch.full((per, H), -7.0, dtype=state[n].dtype)  # padding rows: sentinel
        lo, hi = min(tp_rank * per, V), min((tp_rank + 1) * per, V)
        w[:hi - lo] = state[n][lo:hi]
        out[n] = w
    return {k: v.contiguous() for k, v in out.items()}


def random_state(seed):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in qwen_shapes().items()}


LAYOUTS = {
    "TP2": mcs.ParallelLayout(tp=2, rules=L.qwen3_moe_rules(num_kv_heads=KV)),
    "TP4 (KV heads replicated)": mcs.ParallelLayout(tp=4, rules=L.qwen3_moe_rules(num_kv_heads=KV)),
    "EP2, attention TP2": mcs.ParallelLayout(ep=2, dense_tp=2,
                                             rules=L.qwen3_moe_rules(num_kv_heads=KV)),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_engine_param_shapes_are_the_engines(name):
    inference = LAYOUTS[name]
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=L.expert_rules(), name="trainer"), inference,
                        qwen_shapes())
    state = random_state(0)
    for rank in range(inference.world_size):
        params = vllm_params(state, inference, rank)
        need = mcs.engine_param_shapes(plan, rank, EN.qwen3_moe_names())
        assert need == {k: tuple(v.shape) for k, v in params.items()}
        boxes = mcs.engine_param_shapes(plan, rank, EN.qwen3_moe_names(), padded=False)
        per, r = need["lm_head.weight"][0], rank % inference.dense_size
        assert boxes["lm_head.weight"] == (min((r + 1) * per, V) - min(r * per, V), H)


# The parameters vLLM allocates for the small Qwen3-MoE config above (H=16, 4 heads of 8, 2 KV
# heads, experts of I=12, a dense layer of 2I, V=100), per layout, every rank alike; read off
# vLLM's qwen3_moe.py, fused_moe/layer.py, linear.py and vocab_parallel_embedding.py:
#   embed_tokens / lm_head: pad_vocab_size(100, 64) = 128 rows, 128 / tp per rank;
#   qkv_proj: (heads / tp + 2 * max(1, kv / tp)) * head_dim rows; o_proj: [H, heads*hd / tp];
#   w13_weight: [E_local, 2 * I / moe_tp, H]; w2_weight: [E_local, H, I / moe_tp];
#   with --enable-expert-parallel the experts are whole (moe_tp = 1) and E_local = E / ep.
def shape_table(tp, ep, moe_tp):
    p, a = "model.layers.0", "model.layers.0.self_attn"
    kv_local = max(1, KV // tp)
    return {
        "model.embed_tokens.weight": (128 // tp, H), "lm_head.weight": (128 // tp, H),
        "model.norm.weight": (H,),
        f"{a}.qkv_proj.weight": ((HEADS // tp + 2 * kv_local) * HD, H),
        f"{a}.o_proj.weight": (H, HEADS * HD // tp),
        f"{a}.q_norm.weight": (HD,), f"{a}.k_norm.weight": (HD,),
        f"{p}.mlp.gate.weight": (E, H),
        f"{p}.mlp.experts.w13_weight": (E // ep, 2 * I // moe_tp, H),
        f"{p}.mlp.experts.w2_weight": (E // ep, H, I // moe_tp),
        "model.layers.1.mlp.gate_up_proj.weight": (2 * 2 * I // tp, H),
        "model.layers.1.mlp.down_proj.weight": (H, 2 * I // tp),
    }


SHAPE_TABLE = {
    "TP2": shape_table(tp=2, ep=1, moe_tp=2),
    "TP4 (KV heads replicated)": shape_table(tp=4, ep=1, moe_tp=4),
    "EP2, attention TP2": shape_table(tp=2, ep=2, moe_tp=1),
}


def test_shape_table_for_a_small_config():
    assert SHAPE_TABLE["TP2"]["model.layers.0.self_attn.qkv_proj.weight"] == (32, H)
    assert SHAPE_TABLE["TP4 (KV heads replicated)"][
        "model.layers.0.self_attn.qkv_proj.weight"] == (24, H)
    assert SHAPE_TABLE["EP2, attention TP2"]["model.layers.0.mlp.experts.w13_weight"] == (
        2, 24, H)
    trainer = mcs.ParallelLayout(rules=L.expert_rules(), name="trainer")
    for name, table in SHAPE_TABLE.items():
        inference = LAYOUTS[name]
        plan = mcs.SyncPlan(trainer, inference, qwen_shapes())
        for rank in range(inference.world_size):
            for engine in ("vllm", "sglang"):
                got = mcs.engine_param_shapes(plan, rank, EN.qwen3_moe_names(engine))
                assert got == table, (name, rank, engine)


@pytest.mark.parametrize("vocab,tp,rows", [
    (100, 1, [(0, 100)]),                                  # padded to 128 even at TP 1
    (100, 2, [(0, 64), (64, 100)]),
    (100, 4, [(0, 32), (32, 64), (64, 96), (96, 100)]),
    (70, 4, [(0, 32), (32, 64), (64, 70), None]),         # the last rank: padding only
    (128, 2, [(0, 64), (64, 128)]),
])
def test_vocabulary_padding(vocab, tp, rows):
    """vocab_parallel_embedding.py: pad_vocab_size(V, 64) rows split evenly over TP; rank r
    holds rows [min(r*per, V), min((r+1)*per, V)) first, zeros after them. The view of a rank
    is the leading part of its padded parameter; updates never touch the padding rows."""
    shapes = {"model.embed_tokens.weight": (vocab, H), "lm_head.weight": (vocab, H)}
    rules = L.qwen3_moe_rules(num_kv_heads=KV)
    inference = mcs.ParallelLayout(tp=tp, rules=rules)
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=rules), inference, shapes)
    per = -(-vocab // 64) * 64 // tp
    g = torch.Generator().manual_seed(1)
    old = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    new = {n: w + 1 for n, w in old.items()}
    store = mcs.connect()
    sync = mcs.TrainerSync(store, plan, 0)
    sync.snapshot(old)
    sync.step(new, seal=True)
    for rank, want in enumerate(rows):
        targets = {t.tensor_id: t for t in plan.targets(rank)}
        need = mcs.engine_param_shapes(plan, rank, EN.qwen3_moe_names())
        if want is None:
            assert not targets and not need
            continue
        lo, hi = want
        assert need == {n: (per, H) for n in shapes}
        assert tuple(targets["lm_head.weight"].global_offset) == (lo, 0)
        assert tuple(targets["lm_head.weight"].local_shape) == (hi - lo, H)
        params = {n: torch.full((per, H), -7.0) for n in shapes}
        for n in shapes:
            params[n][:hi - lo] = old[n][lo:hi]
        views = mcs.engine_views(params, plan, rank, EN.qwen3_moe_names())
        for n in shapes:
            assert views[n].data_ptr() == params[n].data_ptr()
            assert views[n].shape == (hi - lo, H)
        mcs.apply_step(store, plan, rank, views, (0, 1))
        for n in shapes:
            assert torch.equal(params[n][:hi - lo], new[n][lo:hi])
            assert params[n][hi - lo:].eq(-7.0).all()  # padding rows untouched


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_updates_land_in_fused_engine_parameters_in_place(name):
    inference = LAYOUTS[name]
    plan = mcs.SyncPlan(mcs.ParallelLayout(ep=2, rules=L.expert_rules(), name="trainer"),
                        inference, qwen_shapes())
    old, new = random_state(0), random_state(0)
    g = torch.Generator().manual_seed(5)
    for n, w in new.items():
        mask = torch.rand(w.shape, generator=g) < 0.1
        new[n] = torch.where(mask, -w, w)
    store = mcs.connect()
    for r in range(2):
        sync = mcs.TrainerSync(store, plan, r)
        sync.snapshot(old)
        sync.step(new)
    sync.seal()  # after every rank's step: unchanged tensors read as no-ops
    for rank in range(inference.world_size):
        params = vllm_params(old, inference, rank)
        ptrs = {k: (v.data_ptr(), v.data_ptr() + v.numel() * v.element_size())
                for k, v in params.items()}
        views = mcs.engine_views(params, plan, rank, EN.qwen3_moe_names())
        for tid, v in views.items():  # views, not copies
            slot = EN.qwen3_moe_names()(tid)
            lo, hi = ptrs[slot.param]
            assert lo <= v.data_ptr() < hi, tid
        qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
        k_view = views["model.layers.0.self_attn.k_proj.weight"]
        assert k_view.data_ptr() == qkv[HEADS * HD // inference.dense_size:].data_ptr()
        stats = mcs.apply_step(store, plan, rank, views, (0, 1))
        assert stats.nnz > 0
        want = vllm_params(new, inference, rank)
        for k in params:
            assert torch.equal(params[k].view(torch.int16), want[k].view(torch.int16)), (rank, k)
        # Padding rows of the vocabulary-parallel parameters stay as they were.
        assert params["lm_head.weight"].float().eq(-7.0).sum() == want["lm_head.weight"].float(
        ).eq(-7.0).sum()


def test_expert_views_are_strided_slices_of_w13():
    inference = LAYOUTS["TP2"]
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=L.expert_rules()), inference, qwen_shapes())
    params = vllm_params(random_state(0), inference, 1)
    views = mcs.engine_views(params, plan, 1, EN.qwen3_moe_names())
    w13 = params["model.layers.0.mlp.experts.w13_weight"]
    up2 = views["model.layers.0.mlp.experts.2.up_proj.weight"]
    assert up2.shape == (I // 2, H)
    assert up2.data_ptr() == w13[2, I // 2:].data_ptr()
    down3 = views["model.layers.0.mlp.experts.3.down_proj.weight"]
    assert down3.data_ptr() == params["model.layers.0.mlp.experts.w2_weight"][3].data_ptr()


def test_numpy_parameters():
    inference = mcs.ParallelLayout(tp=2, rules=L.qwen3_moe_rules(num_kv_heads=KV))
    shapes = {k: v for k, v in qwen_shapes().items() if "self_attn" in k}
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=L.expert_rules()), inference, shapes)
    need = mcs.engine_param_shapes(plan, 0, EN.qwen3_moe_names())
    params = {k: np.zeros(s, np.float32) for k, s in need.items()}
    views = mcs.engine_views(params, plan, 0, EN.qwen3_moe_names())
    views["model.layers.0.self_attn.v_proj.weight"][...] = 1.0
    qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv[-KV // 2 * HD:].min() == 1.0 and qkv[:-KV // 2 * HD].max() == 0.0


def test_deepseek_v3_names():
    vllm, sglang = EN.deepseek_v3_names("vllm"), EN.deepseek_v3_names("sglang")
    a = "model.layers.3.self_attn"
    assert vllm(f"{a}.kv_a_proj_with_mqa.weight").param == f"{a}.fused_qkv_a_proj.weight"
    s = sglang(f"{a}.kv_a_proj_with_mqa.weight")
    assert s.param == f"{a}.fused_qkv_a_proj_with_mqa.weight" and s.position == 1
    m = "model.layers.3.mlp"
    assert (vllm(f"{m}.shared_experts.up_proj.weight").param
            == f"{m}.shared_experts.gate_up_proj.weight")
    ex = vllm(f"{m}.experts.200.up_proj.weight")
    assert (ex.param, ex.expert, ex.position) == (f"{m}.experts.w13_weight", 200, 1)
    for keep in (f"{a}.kv_b_proj.weight", f"{a}.q_b_proj.weight", f"{a}.o_proj.weight",
                 f"{m}.gate.weight", f"{m}.gate.e_score_correction_bias",
                 f"{a}.kv_a_layernorm.weight"):
        assert vllm(keep).param == keep and sglang(keep).param == keep
    down = "model.layers.0.mlp.down_proj.weight"
    assert vllm(down).param == down
    q = EN.qwen3_moe_names("sglang")("model.layers.0.self_attn.k_proj.bias")
    assert (q.param, q.position) == ("model.layers.0.self_attn.qkv_proj.bias", 1)
    with pytest.raises(mcs.InvalidArgument, match="unknown engine"):
        EN.deepseek_v3_names("trt")


def test_deepseek_v3_layout_and_views():
    shapes = {"model.layers.0.self_attn.q_a_proj.weight": (24, H),
              "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (8 + 4, H),
              "model.layers.0.self_attn.q_b_proj.weight": (HEADS * 12, 24),
              "model.layers.0.self_attn.kv_b_proj.weight": (HEADS * 16, 8),
              "model.layers.0.self_attn.o_proj.weight": (H, HEADS * 8),
              "model.layers.0.mlp.shared_experts.gate_proj.weight": (I, H),
              "model.layers.0.mlp.shared_experts.up_proj.weight": (I, H),
              "model.layers.0.mlp.shared_experts.down_proj.weight": (H, I),
              "model.layers.0.mlp.gate.e_score_correction_bias": (E,)}
    rules = L.deepseek_v3_rules()
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=rules), mcs.ParallelLayout(tp=2, rules=rules),
                        shapes)
    # deepseek_v2.py (vLLM and SGLang): the fused q_a / kv_a projection is replicated,
    # [q_lora_rank + kv_lora_rank + qk_rope_head_dim, H] = [24 + 8 + 4, H]; q_b_proj and
    # kv_b_proj are column-parallel (heads / tp), o_proj row-parallel, shared experts' gate/up
    # a MergedColumnParallelLinear [2 * I / tp, H].
    a, m = "model.layers.0.self_attn", "model.layers.0.mlp"
    for engine, fused in (("vllm", "fused_qkv_a_proj"), ("sglang", "fused_qkv_a_proj_with_mqa")):
        need = mcs.engine_param_shapes(plan, 1, EN.deepseek_v3_names(engine))
        assert need == {
            f"{a}.{fused}.weight": (36, H),
            f"{a}.q_b_proj.weight": (HEADS // 2 * 12, 24),
            f"{a}.kv_b_proj.weight": (HEADS // 2 * 16, 8),
            f"{a}.o_proj.weight": (H, HEADS // 2 * 8),
            f"{m}.shared_experts.gate_up_proj.weight": (I, H),
            f"{m}.shared_experts.down_proj.weight": (H, I // 2),
            f"{m}.gate.e_score_correction_bias": (E,)}, engine
    # q_a rows first, then kv_a's.
    params = {k: torch.zeros(s) for k, s in need.items()}
    views = mcs.engine_views(params, plan, 1, EN.deepseek_v3_names("sglang"))
    fused_w = params[f"{a}.fused_qkv_a_proj_with_mqa.weight"]
    assert views[f"{a}.q_a_proj.weight"].data_ptr() == fused_w.data_ptr()
    assert views[f"{a}.kv_a_proj_with_mqa.weight"].data_ptr() == fused_w[24:].data_ptr()


def test_deepseek_without_q_lora():
    """q_lora_rank null (DeepSeek-V2-Lite): a column-parallel q_proj and a replicated
    kv_a_proj_with_mqa, each under its own name, in both engines."""
    a = "model.layers.0.self_attn"
    shapes = {f"{a}.q_proj.weight": (HEADS * 12, H),
              f"{a}.kv_a_proj_with_mqa.weight": (8 + 4, H),
              f"{a}.kv_b_proj.weight": (HEADS * 16, 8)}
    rules = L.deepseek_v3_rules()
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=rules), mcs.ParallelLayout(tp=2, rules=rules),
                        shapes)
    for engine in ("vllm", "sglang"):
        names = EN.deepseek_v3_names(engine, q_lora=False)
        assert mcs.engine_param_shapes(plan, 0, names) == {
            f"{a}.q_proj.weight": (HEADS // 2 * 12, H),
            f"{a}.kv_a_proj_with_mqa.weight": (12, H),
            f"{a}.kv_b_proj.weight": (HEADS // 2 * 16, 8)}
    params = {k: torch.zeros(v) for k, v in mcs.engine_param_shapes(plan, 0, names).items()}
    assert len(mcs.engine_views(params, plan, 0, names)) == 3
    with pytest.raises(mcs.InvalidArgument, match="fused member.*q_a_proj"):
        mcs.engine_views(params, plan, 0, EN.deepseek_v3_names("vllm"))  # the q LoRA map


def test_views_that_do_not_fit_raise():
    inference = LAYOUTS["TP2"]
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=L.expert_rules()), inference, qwen_shapes())
    params = vllm_params(random_state(0), inference, 0)
    missing = {k: v for k, v in params.items() if "qkv" not in k}
    with pytest.raises(mcs.InvalidArgument, match="no parameter.*qkv_proj"):
        mcs.engine_views(missing, plan, 0, EN.qwen3_moe_names())
    wrong = dict(params)
    wrong["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(H, HEADS * HD)  # unsplit
    with pytest.raises(mcs.InvalidArgument, match="o_proj.*gives shape"):
        mcs.engine_views(wrong, plan, 0, EN.qwen3_moe_names())


def test_non_contiguous_views_are_written_in_place():
    """A map that fuses on dim 1 gives column slices (strided views); apply_step writes them
    where they lie and leaves the rest of the parameter alone."""
    shapes = {"a.w": (6, 5), "b.w": (6, 3)}
    rules = [L.TensorRule(r".*", tp_dim=0)]
    plan = mcs.SyncPlan(mcs.ParallelLayout(rules=rules), mcs.ParallelLayout(tp=2, rules=rules),
                        shapes)
    names = EN.EngineNameMap([EN.NameRule(r"(?P<n>a|b)\.w", "ab", ("a.w", "b.w"), dim=1)])
    assert mcs.engine_param_shapes(plan, 1, names) == {"ab": (3, 8)}
    old = {n: torch.zeros(s) for n, s in shapes.items()}
    new = {n: torch.arange(float(np.prod(s))).reshape(s) + 1 for n, s in shapes.items()}
    store = mcs.connect()
    sync = mcs.TrainerSync(store, plan, 0)
    sync.snapshot(old)
    sync.step(new, seal=True)
    big = torch.full((2, 3, 9), -1.0)  # the parameter is itself a strided slice of a buffer
    params = {"ab": big[1, :, 1:]}
    views = mcs.engine_views(params, plan, 1, names)
    assert not views["b.w"].is_contiguous()
    mcs.apply_step(store, plan, 1, views, (0, 1))
    assert torch.equal(big[1, :, 1:6], new["a.w"][3:])
    assert torch.equal(big[1, :, 6:], new["b.w"][3:])
    assert big[0].eq(-1).all() and big[1, :, 0].eq(-1).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_updates_land_in_fused_engine_parameters_on_the_gpu(name):
    """The same as on the host, into CUDA engine parameters: objects uploaded to the GPU
    (device="cuda") and applied through strided views of the fused parameters, in place."""
    inference = LAYOUTS[name]
    plan = mcs.SyncPlan(mcs.ParallelLayout(ep=2, rules=L.expert_rules(), name="trainer"),
                        inference, qwen_shapes())
    old, new = random_state(0), random_state(0)
    g = torch.Generator().manual_seed(6)
    for n, w in new.items():
        mask = torch.rand(w.shape, generator=g) < 0.1
        new[n] = torch.where(mask, -w, w)
    store = mcs.connect()
    for r in range(2):
        sync = mcs.TrainerSync(store, plan, r)
        sync.snapshot(old)
        sync.step(new)
    sync.seal()
    for rank in range(inference.world_size):
        params = {k: v.cuda() for k, v in vllm_params(old, inference, rank).items()}
        ptrs = {k: v.data_ptr() for k, v in params.items()}
        views = mcs.engine_views(params, plan, rank, EN.qwen3_moe_names())
        stats = mcs.apply_step(store, plan, rank, views, (0, 1), device="cuda")
        assert stats.nnz > 0
        torch.cuda.synchronize()
        want = vllm_params(new, inference, rank)
        for k in params:
            assert params[k].data_ptr() == ptrs[k]  # written in place
            assert torch.equal(params[k].cpu().view(torch.int16), want[k].view(torch.int16)), (rank, k)



def test_helpers_are_typed_and_log_to_module_loggers(caplog):
    """Every public function and method of the adapter modules has annotations for all its
    parameters and its return, none of them Any; what they do goes to their module's logger
    (a child of "mooncake.sparse") at debug level."""
    import inspect
    import logging

    from mooncake.sparse import sync as S
    for mod in (L, S, EN):
        for name in mod.__all__:
            obj = getattr(mod, name)
            funcs = [obj] if inspect.isfunction(obj) else [
                f for k, f in vars(obj).items() if inspect.isfunction(f)
                and (not k.startswith("_") or k == "__init__")] if inspect.isclass(obj) else []
            for f in funcs:
                sig = inspect.signature(f)
                for p in sig.parameters.values():
                    if p.name == "self":
                        continue
                    assert p.annotation is not inspect.Parameter.empty, (name, f, p.name)
                    assert "Any" not in str(p.annotation), (name, f, p.name)
                assert sig.return_annotation is not inspect.Signature.empty, (name, f)
                assert "Any" not in str(sig.return_annotation), (name, f)
    inference = LAYOUTS["TP2"]
    with caplog.at_level(logging.DEBUG, logger="mooncake.sparse"):
        plan = mcs.SyncPlan(mcs.ParallelLayout(rules=L.expert_rules()), inference,
                            qwen_shapes())
        mcs.engine_views(vllm_params(random_state(0), inference, 0), plan, 0,
                         EN.qwen3_moe_names())
    names = {r.name for r in caplog.records if r.levelno == logging.DEBUG}
    assert {"mooncake.sparse.layout", "mooncake.sparse.engines"} <= names
