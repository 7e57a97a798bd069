"""Trainer (Hugging Face) tensor names -> inference-engine parameters, and the destination views
into them that apply_step writes in place.

Engines fuse and stack what a Hugging Face checkpoint keeps apart: vLLM and SGLang load
``q_proj``/``k_proj``/``v_proj`` into one ``qkv_proj`` (rows: this rank's q heads, then its k
heads, then its v heads), ``gate_proj``/``up_proj`` into ``gate_up_proj`` (gate rows first), and
the routed experts of a layer into FusedMoE's ``w13_weight [E_local, 2 * I_local, H]`` (per
expert: gate rows, then up rows) and ``w2_weight [E_local, H, I_local]``, indexed by the
expert's local id on its EP rank. A NameRule says where one trainer tensor's box lands; since
every rank holds its own part of each fused member, the offset of a member inside a fused
parameter is the sum of the earlier members' local extents on this rank.

    views = engine_views(dict(model.named_parameters()), plan, rank, qwen3_moe_names())
    apply_step(store, plan, rank, views, generation, wait=True)   # or InferenceSync

The views are slices (narrow / select) of the parameters: no parameter is copied.

Where the maps and layouts come from (the engines' published sources):

- vLLM ``vllm/model_executor/models/qwen3_moe.py`` and ``deepseek_v2.py`` (``load_weights``:
  ``stacked_params_mapping`` q/k/v -> ``qkv_proj`` shards "q", "k", "v", gate/up ->
  ``gate_up_proj`` shards 0, 1; for MLA with a q LoRA rank, q_a_proj / kv_a_proj_with_mqa ->
  ``fused_qkv_a_proj`` shards 0, 1, a MergedColumnParallelLinear with TP disabled, i.e.
  replicated; routed experts through ``make_expert_params_mapping``: ``experts.{e}.gate_proj``
  / ``up_proj`` -> ``experts.w13_weight`` shards w1 / w3, ``down_proj`` -> ``experts.w2_weight``).
- vLLM ``vllm/model_executor/layers/fused_moe/layer.py``: ``w13_weight`` is
  ``[E_local, 2 * I_local, H]`` and ``w2_weight`` ``[E_local, H, I_local]``; the weight loader
  narrows w1 (gate) into the first half of dim 1 and w3 (up) into the second, each the
  checkpoint's rows ``[I_local * tp_rank, I_local * (tp_rank + 1))``, and w2 on its input dim;
  with EP, ``determine_expert_map`` ("linear") gives EP rank r a contiguous block of experts,
  the first ``E % ep`` ranks one more (ParallelLayout's "linear"; releases before the
  placement strategies gave the last rank the remainder instead), and "round_robin" experts
  r, r + ep, ... . With ``--enable-expert-parallel`` the experts are not TP-split: vLLM
  ``--tp N --enable-expert-parallel`` is ParallelLayout(ep=N, tp=1, dense_tp=N).
- vLLM ``vllm/model_executor/layers/linear.py``: QKVParallelLinear puts q at row 0, k at
  ``num_heads_local * head_dim``, v after it, k/v of rank r being KV head block
  ``r // (tp / num_kv_heads)`` when heads are fewer than ranks (replicated); column-parallel
  weights split dim 0, RowParallelLinear splits dim 1 (its bias is not split).
- vLLM ``vllm/model_executor/layers/vocab_parallel_embedding.py``: the vocabulary is padded to
  a multiple of ``DEFAULT_VOCAB_PADDING_SIZE = 64``, each TP rank holds ``padded / tp`` rows,
  the real rows ``[min(r * per, V), min((r + 1) * per, V))`` first and zeros after them, even
  at TP 1; embed_tokens and lm_head alike (layout.qwen3_moe_rules' ``tp_pad``).
- SGLang ``python/sglang/srt/models/qwen3_moe.py`` (same stacked mapping and FusedMoE names as
  vLLM), ``python/sglang/srt/models/deepseek_v2.py`` (``fused_qkv_a_proj_with_mqa``, a
  ReplicatedLinear ``[q_lora_rank + kv_lora_rank + qk_rope_head_dim, H]`` loaded as
  ``torch.cat([q_a_proj, kv_a_proj_with_mqa])`` on dim 0),
  ``python/sglang/srt/layers/moe/fused_moe_triton/layer.py`` (w13 gate-then-up, the same
  shapes; EP rank r hosts experts ``[r * E / ep, (r + 1) * E / ep)``, E divisible by ep; the
  experts are TP-split over ``tp / ep`` ranks) and
  ``python/sglang/srt/layers/vocab_parallel_embedding.py`` (the same padding to 64).

Not covered: SGLang's shared-experts fusion (DeepSeek's shared experts loaded as extra slots
of ``w13_weight`` / ``w2_weight``; run SGLang with ``--disable-shared-experts-fusion``),
quantized checkpoints, and kernels that reorder w13 (some FlashInfer/TRT-LLM MoE backends load
up before gate).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Literal, Mapping, Sequence

from ._errors import InvalidArgument
from .layout import SyncPlan
from .sync import Tensor

__all__ = ["NameRule", "EngineSlot", "EngineNameMap", "engine_views", "engine_param_shapes",
           "qwen3_moe_names", "deepseek_v3_names"]

logger = logging.getLogger(__name__)

Engine = Literal["vllm", "sglang"]


@dataclasses.dataclass(frozen=True)
class NameRule:
    """Trainer tensors whose names match `pattern` (in full) land in engine parameter `param`.

    `param` and `members` are str.format templates over the pattern's named groups.
    - `members`: the trainer tensors fused into `param`, concatenated along `dim` in this order
      (the matched name must be one of them); empty: the parameter holds this tensor alone.
    - `stacked_experts`: the parameter stacks the rank's experts on dim 0 ([E_local, ...]); the
      pattern's ``expert`` group selects the expert's local slot.
    - `padded`: the parameter may be larger than the tensor's box (vocabulary padding): the box
      is its leading part.
    """

    pattern: str
    param: str
    members: tuple[str, ...] = ()
    dim: int = 0
    stacked_experts: bool = False
    padded: bool = False
    regex: re.Pattern[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern))
        object.__setattr__(self, "members", tuple(self.members))
        if self.stacked_experts and "expert" not in self.regex.groupindex:
            raise InvalidArgument(f"NameRule {self.pattern!r}: stacked_experts needs an "
                                  "'expert' group in the pattern")


@dataclasses.dataclass(frozen=True)
class EngineSlot:
    """Where one trainer tensor lands: `param`[local expert slot][..., members[position] part
    on `dim`, ...]."""

    param: str
    members: tuple[str, ...]
    position: int
    dim: int
    expert: int | None
    padded: bool


class EngineNameMap:
    """An ordered list of NameRules; the first match wins. Names no rule matches keep their
    name (the engine parameter has the trainer's name and exactly its box)."""

    def __init__(self, rules: Sequence[NameRule]) -> None:
        self.rules = tuple(rules)

    def __call__(self, name: str) -> EngineSlot:
        for rule in self.rules:
            m = rule.regex.fullmatch(name)
            if m is None:
                continue
            groups = m.groupdict()
            param = rule.param.format(**groups)
            members = tuple(t.format(**groups) for t in rule.members) or (name,)
            if name not in members:
                raise InvalidArgument(f"NameRule {rule.pattern!r}: {name!r} is not one of its "
                                      f"fused members {members}")
            expert = int(groups["expert"]) if rule.stacked_experts else None
            return EngineSlot(param, members, members.index(name), rule.dim, expert, rule.padded)
        return EngineSlot(name, (name,), 0, 0, None, False)


def _select(x: Tensor, index: int) -> Tensor:
    return x[index]


def _narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    return x[(slice(None),) * dim + (slice(start, start + length),)]


def engine_views(params: Mapping[str, Tensor], plan: SyncPlan, rank: int,
                 name_map: EngineNameMap) -> dict[str, Tensor]:
    """tensor id -> a view of the engine parameter region that holds inference `rank`'s box of
    it, for every target of the rank: destinations for apply_step (or, at start-up, for copying
    the initial weights in). Views only: writing them writes the parameters.

    Raises InvalidArgument when a parameter or a fused member's target is missing, or the views
    would not have the targets' shapes (a map or layout that does not describe the engine)."""
    targets = {t.tensor_id: t for t in plan.targets(rank)}
    out: dict[str, Tensor] = {}
    for tid, t in targets.items():
        slot = name_map(tid)
        local = tuple(t.local_shape)
        if slot.dim >= len(local):
            raise InvalidArgument(f"{tid!r}: fused dim {slot.dim} outside its shape {local}")
        absent = [m for m in slot.members if m not in targets]
        if absent:
            raise InvalidArgument(f"inference rank {rank}: fused member(s) {absent} of "
                                  f"{slot.param!r} have no target on this rank (a name map "
                                  "for another variant of the model?)")
        start = sum(int(targets[m].local_shape[slot.dim]) for m in slot.members[:slot.position])
        if slot.param not in params:
            raise InvalidArgument(f"inference rank {rank}: engine has no parameter "
                                  f"{slot.param!r} (for {tid!r})")
        view = params[slot.param]
        if slot.expert is not None:
            view = _select(view, plan.local_expert_index(slot.expert))
        view = _narrow(view, slot.dim, start, local[slot.dim])
        if slot.padded:
            for d, n in enumerate(local):
                if d != slot.dim and int(view.shape[d]) > n:
                    view = _narrow(view, d, 0, n)
        shape = tuple(int(s) for s in view.shape)
        if shape != local:
            raise InvalidArgument(
                f"inference rank {rank}: {tid!r} -> {slot.param!r}"
                f"{'' if slot.expert is None else f'[{plan.local_expert_index(slot.expert)}]'} "
                f"at {start} on dim {slot.dim} gives shape {shape}, the target box is {local} "
                f"(parameter shape {tuple(int(s) for s in params[slot.param].shape)})")
        out[tid] = view
        logger.debug("inference rank %d: %s -> %s%s rows %d:%d of dim %d, shape %s", rank, tid,
                     slot.param, "" if slot.expert is None
                     else f"[{plan.local_expert_index(slot.expert)}]", start,
                     start + local[slot.dim], slot.dim, local)
    logger.debug("inference rank %d: %d destination views into %d engine parameters", rank,
                 len(out), len({name_map(t).param for t in out}))
    return out


def _padded_extent(plan: SyncPlan, tid: str, dim: int) -> int | None:
    """The rows per rank an engine allocates on `dim` for a vocabulary-padded tensor (the
    padded size split evenly over the ranks that split it), or None when it is not padded."""
    rule, expert = plan.inference.rule_for(tid)
    if rule.tp_dim != dim or rule.tp_pad <= 1:
        return None
    size = plan.shapes[tid][dim]
    padded = -(-size // rule.tp_pad) * rule.tp_pad
    per_expert = expert is not None or rule.expert_dim is not None
    parts = plan.inference.tp if per_expert else plan.inference.dense_size
    return padded // parts


def engine_param_shapes(plan: SyncPlan, rank: int, name_map: EngineNameMap, *,
                        padded: bool = True) -> dict[str, tuple[int, ...]]:
    """The shape of each engine parameter of inference `rank` that holds its targets: compare
    with the engine's own parameters to check a name map, or allocate engine-style parameters
    in tests. `padded`: vocabulary-padded parameters (NameRule.padded, with a TensorRule
    tp_pad) get the rows the engine allocates, ``ceil(V / pad) * pad / tp`` (vLLM and SGLang
    pad to 64), not only the rows of the rank's box; the box is their leading part. A rank
    whose rows are all padding has no target of the tensor, so no entry here."""
    targets = {t.tensor_id: t for t in plan.targets(rank)}
    shapes: dict[str, list[int]] = {}
    for tid, t in targets.items():
        slot = name_map(tid)
        fused = [int(targets[m].local_shape[slot.dim]) for m in slot.members if m in targets]
        shape = list(t.local_shape)
        shape[slot.dim] = sum(fused)
        if padded and slot.padded:
            for d in range(len(shape)):
                rows = _padded_extent(plan, tid, d)
                if rows is not None:
                    shape[d] = rows
        if slot.expert is not None:
            shape = [len(plan.local_experts(rank))] + shape
        prev = shapes.setdefault(slot.param, shape)
        if prev != shape:
            raise InvalidArgument(f"engine parameter {slot.param!r}: {tid!r} needs shape "
                                  f"{tuple(shape)}, another member {tuple(prev)}")
    logger.debug("inference rank %d: %d engine parameters for %d targets", rank, len(shapes),
                 len(targets))
    return {k: tuple(v) for k, v in shapes.items()}


# ---------------------------------------------------------------------------------------------
# Model families. Names as the engines publish them: vLLM (vllm/model_executor/models/
# qwen3_moe.py, deepseek_v2.py; FusedMoE in vllm/model_executor/layers/fused_moe/layer.py) and
# SGLang (python/sglang/srt/models/qwen3_moe.py, deepseek_v2.py). Both keep the trainer's names
# for what they do not fuse.
# ---------------------------------------------------------------------------------------------
def _common_rules(shared: str) -> list[NameRule]:
    rules = [
        NameRule(r"(?P<p>.*\.mlp\.experts)\.(?P<expert>\d+)\.(gate|up)_proj\.weight",
                 "{p}.w13_weight",
                 ("{p}.{expert}.gate_proj.weight", "{p}.{expert}.up_proj.weight"),
                 stacked_experts=True),
        NameRule(r"(?P<p>.*\.mlp\.experts)\.(?P<expert>\d+)\.down_proj\.weight", "{p}.w2_weight",
                 stacked_experts=True),
        NameRule(r"(?P<p>.*\.mlp)\.(gate|up)_proj\.weight", "{p}.gate_up_proj.weight",
                 ("{p}.gate_proj.weight", "{p}.up_proj.weight")),
        NameRule(r"(?P<n>model\.embed_tokens|lm_head)\.weight", "{n}.weight", padded=True),
    ]
    shared_rule = NameRule(rf"(?P<p>.*\.mlp\.{shared})\.(gate|up)_proj\.weight",
                           "{p}.gate_up_proj.weight",
                           ("{p}.gate_proj.weight", "{p}.up_proj.weight"))
    rules.insert(2, shared_rule)
    return rules


def _check_engine(engine: str) -> None:
    if engine not in ("vllm", "sglang"):
        raise InvalidArgument(f"unknown engine {engine!r} (expected 'vllm' or 'sglang')")


def qwen3_moe_names(engine: Engine = "vllm") -> EngineNameMap:
    """Qwen3-MoE (and Qwen2-MoE's shared_expert) on vLLM or SGLang, which name them alike:
    qkv_proj (q, k, v), gate_up_proj (gate, up) of dense MLPs, FusedMoE w13_weight / w2_weight;
    norms (incl. q_norm / k_norm), the router (mlp.gate), o_proj and down_proj keep their names;
    embed_tokens / lm_head rows are padded (vocabulary-parallel). Qwen2-MoE's
    ``shared_expert_gate`` keeps its name too."""
    _check_engine(engine)
    return EngineNameMap([
        NameRule(r"(?P<p>.*\.self_attn)\.[qkv]_proj\.(?P<w>weight|bias)", "{p}.qkv_proj.{w}",
                 ("{p}.q_proj.{w}", "{p}.k_proj.{w}", "{p}.v_proj.{w}")),
        *_common_rules("shared_expert"),
    ])


def deepseek_v3_names(engine: Engine = "vllm", *, q_lora: bool = True) -> EngineNameMap:
    """DeepSeek-V2/V3 and Kimi-K2 on vLLM or SGLang: with a q LoRA rank (`q_lora`, as in
    DeepSeek-V2/V3 and Kimi-K2), q_a_proj and kv_a_proj_with_mqa are fused (replicated, q_a rows
    first) into vLLM's ``fused_qkv_a_proj`` / SGLang's ``fused_qkv_a_proj_with_mqa``; without
    one (``q_lora_rank: null``, e.g. DeepSeek-V2-Lite) both engines keep a column-parallel
    ``q_proj`` and a replicated ``kv_a_proj_with_mqa`` under their names. shared_experts' and
    dense layers' gate/up go into gate_up_proj; routed experts into FusedMoE w13_weight /
    w2_weight. q_b_proj, kv_b_proj, o_proj, the layernorms, the router and its
    e_score_correction_bias keep their names.

    Both engines derive further tensors from kv_b_proj after loading (the absorbed MLA
    matrices): after an update of kv_b_proj, run the engine's post-load processing of it.
    SGLang: with shared-experts fusion off (``--disable-shared-experts-fusion``)."""
    _check_engine(engine)
    rules = _common_rules("shared_experts")
    if q_lora:
        fused = "fused_qkv_a_proj" if engine == "vllm" else "fused_qkv_a_proj_with_mqa"
        rules.insert(0, NameRule(r"(?P<p>.*\.self_attn)\.(q_a_proj|kv_a_proj_with_mqa)\.weight",
                                 "{p}." + fused + ".weight",
                                 ("{p}.q_a_proj.weight", "{p}.kv_a_proj_with_mqa.weight")))
    return EngineNameMap(rules)
