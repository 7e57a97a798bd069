"""Parallel layouts: which rank holds which box of which tensor, on the trainer and on the
inference side, and from a pair of them the source placements and the targets.

    rules = mcs.layout.qwen3_moe_rules(num_kv_heads=4)
    trainer = mcs.ParallelLayout(ep=2, rules=rules, name="trainer")
    inference = mcs.ParallelLayout(ep=1, tp=2, rules=rules, name="inference")
    plan = mcs.SyncPlan(trainer, inference, {name: p.shape for name, p in model.named_parameters()})
    plan.sources(rank)   # what trainer `rank` encodes and commits (box, placement, policy)
    plan.targets(rank)   # the Targets of inference `rank`, for read_sparse_objects

The placement model (docs/design.md §3): a routed expert's tensor is committed under
`owner(expert)` with `{"expert": e}`, and the inference rank that hosts expert e asks for it with
`"expert": e` in its target placement, so the two sides may use different EP sizes (an
`owner(ep)` over EP-rank ordinals would only match when both sides share one EP size). Every
other tensor is committed under `replicate(ep)` (or no policy for boxes of stacked experts): it
matches every target and the boxes decide the rest. SyncPlan checks, for every tensor, that the
trainer's boxes tile it exactly and that each target is covered exactly once by the sources it
matches; an inconsistent pair of descriptions raises InvalidArgument instead of reading nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from typing import Literal, Mapping, Sequence

from ._api import Target
from ._errors import InvalidArgument

__all__ = [
    "TensorRule",
    "ParallelLayout",
    "RankBox",
    "SourceSpec",
    "SyncPlan",
    "expert_rules",
    "qwen3_moe_rules",
    "deepseek_v3_rules",
    "stable_hash",
]

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]

_EXPERT_GROUP = "expert"


@dataclasses.dataclass(frozen=True)
class TensorRule:
    """How the tensors whose names match `pattern` (a regular expression, matched in full) are
    laid out. The first matching rule of a layout applies.

    - A named group ``(?P<expert>\\d+)`` in `pattern` makes them routed-expert tensors; the group
      is the expert id. One EP rank hosts each expert (ParallelLayout.expert_placement).
    - `tp_dim`: the dimension split across TP ranks: 0 for a column-parallel Linear weight
      ``[out, in]`` (and its bias), 1 for a row-parallel one; None replicates the tensor.
    - `tp_units`: the split dimension is made of this many equal units (attention heads). With
      fewer units than TP ranks each unit is replicated over tp/units consecutive ranks, as the
      engines do with GQA key/value heads. None: no unit constraint beyond an even split.
    - `tp_pad`: the split dimension is padded up to a multiple of this before it is split evenly
      (vocabulary-parallel embeddings and LM heads, padded to 64 rows by vLLM and SGLang); the
      last ranks' boxes are then shorter, possibly empty.
    - `expert_dim`: stacked experts: the tensor holds every expert along this dimension
      (``[E, out, in]``); EP is then a box on it (policy none, the boxes decide).
    """

    pattern: str
    tp_dim: int | None = None
    tp_units: int | None = None
    tp_pad: int = 1
    expert_dim: int | None = None
    regex: re.Pattern[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            regex = re.compile(self.pattern)
        except re.error as e:
            raise InvalidArgument(f"TensorRule pattern {self.pattern!r}: {e}") from None
        object.__setattr__(self, "regex", regex)
        if self.per_expert and self.expert_dim is not None:
            raise InvalidArgument(f"TensorRule {self.pattern!r}: a per-expert tensor (an "
                                  f"'{_EXPERT_GROUP}' group) cannot also stack experts")
        for what, v in (("tp_dim", self.tp_dim), ("expert_dim", self.expert_dim)):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise InvalidArgument(f"TensorRule {self.pattern!r}: {what} must be an int >= 0")
        if self.tp_dim is not None and self.tp_dim == self.expert_dim:
            raise InvalidArgument(f"TensorRule {self.pattern!r}: tp_dim and expert_dim are both "
                                  f"{self.tp_dim}")
        if self.tp_units is not None and self.tp_units < 1:
            raise InvalidArgument(f"TensorRule {self.pattern!r}: tp_units must be >= 1")
        if self.tp_pad < 1:
            raise InvalidArgument(f"TensorRule {self.pattern!r}: tp_pad must be >= 1")
        if self.tp_units is not None and self.tp_pad != 1:
            raise InvalidArgument(f"TensorRule {self.pattern!r}: tp_units and tp_pad exclude "
                                  "each other")

    @property
    def per_expert(self) -> bool:
        return _EXPERT_GROUP in self.regex.groupindex


@dataclasses.dataclass(frozen=True)
class RankBox:
    """The box of one tensor that one rank holds (global coordinates)."""

    rank: int
    global_offset: Shape
    local_shape: Shape

    @property
    def empty(self) -> bool:
        return any(s == 0 for s in self.local_shape)


@dataclasses.dataclass(frozen=True)
class ParallelLayout:
    """One side's parallel layout: `ep` x `tp` ranks, rank = ep_rank * tp + tp_rank.

    - Routed-expert tensors: expert e lives on one EP rank (`expert_placement`: "linear", the
      engines' default, gives EP rank r a contiguous block of experts, the first E % ep ranks one
      more; "round_robin" gives it experts r, r + ep, ...), replicated or TP-split over its `tp`
      ranks.
    - Every other tensor is split over `dense_tp` consecutive ranks (rank % dense_tp), default
      `tp`: replicated over EP groups, as with data-parallel attention. Set dense_tp = ep * tp for
      engines whose attention is TP over all ranks while the experts use EP (SGLang --tp 8 --ep 4
      is ParallelLayout(ep=4, tp=2, dense_tp=8); vLLM --tp 8 --enable-expert-parallel is
      ParallelLayout(ep=8, tp=1, dense_tp=8)).
    - `num_experts`: routed experts per layer; None infers it from the tensor names.
    - Targets are named "{node}/rank{rank}", node "{node_prefix}{rank // ranks_per_node}"
      (every rank on "{node_prefix}0" when ranks_per_node is None).
    """

    ep: int = 1
    tp: int = 1
    rules: Sequence[TensorRule] = ()
    dense_tp: int | None = None
    num_experts: int | None = None
    expert_placement: Literal["linear", "round_robin"] = "linear"
    ranks_per_node: int | None = None
    node_prefix: str = "node"
    name: str = "layout"

    def __post_init__(self) -> None:
        for what, v in (("ep", self.ep), ("tp", self.tp)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgument(f"{self.name}: {what} must be an int >= 1, got {v!r}")
        object.__setattr__(self, "rules", tuple(self.rules))
        for r in self.rules:
            if not isinstance(r, TensorRule):
                raise InvalidArgument(f"{self.name}: rules must be TensorRules, got {r!r}")
        d = self.dense_tp
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1
                              or self.world_size % d):
            raise InvalidArgument(f"{self.name}: dense_tp={d!r} must divide the world size "
                                  f"{self.world_size} (ep={self.ep} x tp={self.tp})")
        if self.expert_placement not in ("linear", "round_robin"):
            raise InvalidArgument(f"{self.name}: expert_placement must be 'linear' or "
                                  f"'round_robin', got {self.expert_placement!r}")
        if self.num_experts is not None and self.num_experts < self.ep:
            raise InvalidArgument(f"{self.name}: {self.num_experts} experts cannot spread over "
                                  f"ep={self.ep} ranks")
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise InvalidArgument(f"{self.name}: ranks_per_node must be >= 1")

    # -- ranks ---------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.ep * self.tp

    @property
    def dense_size(self) -> int:
        return self.tp if self.dense_tp is None else self.dense_tp

    def coords(self, rank: int) -> tuple[int, int]:
        """(ep_rank, tp_rank) of `rank`."""
        self._check_rank(rank)
        return rank // self.tp, rank % self.tp

    def node_id(self, rank: int) -> str:
        self._check_rank(rank)
        node = 0 if self.ranks_per_node is None else rank // self.ranks_per_node
        return f"{self.node_prefix}{node}"

    def target_id(self, rank: int) -> str:
        return f"{self.node_id(rank)}/rank{rank}"

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise InvalidArgument(f"{self.name}: rank {rank!r} is outside [0, {self.world_size})")

    # -- experts -------------------------------------------------------------------------------
    def experts_of(self, ep_rank: int, num_experts: int) -> list[int]:
        """The global expert ids EP rank `ep_rank` hosts, in local order."""
        if self.expert_placement == "round_robin":
            return list(range(ep_rank, num_experts, self.ep))
        base, extra = divmod(num_experts, self.ep)
        start = ep_rank * base + min(ep_rank, extra)
        return list(range(start, start + base + (1 if ep_rank < extra else 0)))

    def expert_owner(self, expert: int, num_experts: int) -> int:
        """The EP rank that hosts `expert`."""
        if not 0 <= expert < num_experts:
            raise InvalidArgument(f"{self.name}: expert {expert} is outside [0, {num_experts})")
        if self.expert_placement == "round_robin":
            return expert % self.ep
        base, extra = divmod(num_experts, self.ep)
        if expert < extra * (base + 1):
            return expert // (base + 1)
        return extra + (expert - extra * (base + 1)) // base

    def local_expert_index(self, expert: int, num_experts: int) -> int:
        """Where `expert` sits in its EP rank's stacked expert parameters ([E_local, ...])."""
        owner = self.expert_owner(expert, num_experts)
        return self.experts_of(owner, num_experts).index(expert)

    # -- tensors -------------------------------------------------------------------------------
    def rule_for(self, name: str) -> tuple[TensorRule, int | None]:
        """The first rule matching `name`, and the expert id its name carries (or None)."""
        for rule in self.rules:
            m = rule.regex.fullmatch(name)
            if m is not None:
                if rule.per_expert:
                    return rule, int(m.group(_EXPERT_GROUP))
                return rule, None
        raise InvalidArgument(f"{self.name}: no rule matches tensor {name!r} (add a TensorRule, "
                              "e.g. TensorRule('.*') for replicated tensors)")

    def boxes(self, name: str, shape: Sequence[int], num_experts: int | None) -> list[RankBox]:
        """Every rank's box of tensor `name` (ranks that hold none are left out), by rank."""
        shape = tuple(int(s) for s in shape)
        rule, expert = self.rule_for(name)
        for what, d in (("tp_dim", rule.tp_dim), ("expert_dim", rule.expert_dim)):
            if d is not None and d >= len(shape):
                raise InvalidArgument(f"{self.name}: tensor {name!r} of shape {shape} has no "
                                      f"dimension {d} ({what} of rule {rule.pattern!r})")
        if (expert is not None or rule.expert_dim is not None) and num_experts is None:
            raise InvalidArgument(f"{self.name}: tensor {name!r} is an expert tensor but the "
                                  "number of experts is unknown (set num_experts)")
        out: list[RankBox] = []
        for rank in range(self.world_size):
            ep_rank, tp_rank = self.coords(rank)
            offset, local = [0] * len(shape), list(shape)
            if expert is not None:
                assert num_experts is not None
                if self.expert_owner(expert, num_experts) != ep_rank:
                    continue
                split_rank, split_size = tp_rank, self.tp
            elif rule.expert_dim is not None:
                assert num_experts is not None
                d = rule.expert_dim
                if shape[d] != num_experts:
                    raise InvalidArgument(f"{self.name}: stacked expert tensor {name!r} has "
                                          f"{shape[d]} entries on dim {d}, not {num_experts}")
                ids = self.experts_of(ep_rank, num_experts)
                if not ids:
                    continue
                if ids != list(range(ids[0], ids[0] + len(ids))):
                    raise InvalidArgument(f"{self.name}: stacked expert tensor {name!r} needs "
                                          "contiguous experts per EP rank (expert_placement="
                                          "'linear')")
                offset[d], local[d] = ids[0], len(ids)
                split_rank, split_size = tp_rank, self.tp
            else:
                split_rank, split_size = rank % self.dense_size, self.dense_size
            if rule.tp_dim is not None and split_size > 1:
                d = rule.tp_dim
                offset[d], local[d] = _split(name, rule, shape[d], split_size, split_rank,
                                             self.name)
            box = RankBox(rank, tuple(offset), tuple(local))
            if not box.empty:
                out.append(box)
        return out


def _split(name: str, rule: TensorRule, size: int, parts: int, part: int,
           who: str) -> tuple[int, int]:
    """(start, length) of TP part `part` of `parts` of a dimension of `size`."""
    where = f"{who}: tensor {name!r} dim {rule.tp_dim} of size {size}"
    if rule.tp_pad > 1:
        padded = -(-size // rule.tp_pad) * rule.tp_pad
        if padded % parts:
            raise InvalidArgument(f"{where}, padded to {padded}, does not split into {parts} "
                                  f"TP parts (rule {rule.pattern!r})")
        per = padded // parts
        start = min(part * per, size)
        return start, min(size, start + per) - start
    units = size if rule.tp_units is None else rule.tp_units
    if units == 0 or size % units:
        raise InvalidArgument(f"{where} is not made of {units} equal units (rule "
                              f"{rule.pattern!r})")
    unit = size // units
    if units >= parts:
        if units % parts:
            raise InvalidArgument(f"{where} ({units} units) does not split into {parts} TP "
                                  f"parts (rule {rule.pattern!r})")
        per = units // parts
        return part * per * unit, per * unit
    if parts % units:
        raise InvalidArgument(f"{where}: {units} units cannot be replicated evenly over {parts} "
                              f"TP ranks (rule {rule.pattern!r})")
    return (part // (parts // units)) * unit, unit


def stable_hash(text: str) -> int:
    """64-bit FNV-1a of the UTF-8 bytes: the same spread of owners as the C++ planner's
    StableHash, identical on every rank and run."""
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """One source object of a step: one box of one tensor, encoded and committed by `owner`.

    `holders` are every trainer rank that holds the same box (replicas); the owner is picked
    among them by a stable hash of the tensor id, so shared weights spread over the ranks.
    `shard` numbers the tensor's boxes (0 .. num_shards - 1)."""

    tensor_id: str
    global_shape: Shape
    global_offset: Shape
    local_shape: Shape
    source_placement: Mapping[str, int]
    placement_policy: str | None
    owner: int
    holders: tuple[int, ...]
    shard: int
    num_shards: int

    @property
    def complete(self) -> bool:
        """True when the box is the whole tensor."""
        return self.num_shards == 1

    @property
    def admit_policy(self) -> str | None:
        """The policy of the admission key: the commit's own for a complete tensor; for one box
        of several, `owner(shard)`, so that each box has its own single writer. A seal pairs
        each admission with a commit of the same key, which the boxes of a tensor do not have
        (they share the commit's key): TrainerSync and sync_step admit complete tensors only."""
        return self.placement_policy if self.complete else "owner(shard)"

    @property
    def admit_placement(self) -> Mapping[str, int]:
        return self.source_placement if self.complete else {"shard": self.shard}

    def put_kwargs(self) -> dict[str, object]:
        """put_sparse_object's placement keywords for this source (and its box, when partial)."""
        out: dict[str, object] = {"source_placement": dict(self.source_placement),
                                  "placement_policy": self.placement_policy}
        if not self.complete:
            out.update(global_offset=self.global_offset, local_shape=self.local_shape)
        return out


def _policy_matches(policy: str | None, source: Mapping[str, int],
                    target: Mapping[str, int]) -> bool:
    """docs/design.md §3: owner(AXIS) matches the same ordinal on AXIS; the rest match all."""
    if policy is None or not policy.startswith("owner("):
        return True
    axis = policy[len("owner("):-1].strip()
    return axis in source and axis in target and source[axis] == target[axis]


def _volume(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _overlap(a_off: Sequence[int], a_shape: Sequence[int], b_off: Sequence[int],
             b_shape: Sequence[int]) -> int:
    v = 1
    for ao, asz, bo, bsz in zip(a_off, a_shape, b_off, b_shape):
        lo, hi = max(ao, bo), min(ao + asz, bo + bsz)
        if hi <= lo:
            return 0
        v *= hi - lo
    return v


class SyncPlan:
    """A (trainer layout, inference layout) pair over one model's tensors (`shapes`: name ->
    global shape, e.g. ``{n: p.shape for n, p in model.named_parameters()}``).

    Built once; checks that both descriptions agree (raises InvalidArgument naming the tensor,
    the rank and the reason otherwise): the trainer's boxes of every tensor tile it exactly, and
    each inference target is covered exactly once by the sources its placement matches."""

    def __init__(self, trainer: ParallelLayout, inference: ParallelLayout,
                 shapes: Mapping[str, Sequence[int]], *, check: bool = True) -> None:
        self.trainer = trainer
        self.inference = inference
        self.shapes: dict[str, Shape] = {str(k): tuple(int(s) for s in v)
                                         for k, v in shapes.items()}
        self.num_experts = self._resolve_num_experts()
        self._sources: dict[str, list[SourceSpec]] = {}
        self._targets: dict[int, list[Target]] = {r: [] for r in range(inference.world_size)}
        for name, shape in self.shapes.items():
            self._sources[name] = self._plan_sources(name, shape)
            for box in inference.boxes(name, shape, self.num_experts):
                self._targets[box.rank].append(self._target(name, box))
        if check:
            self.check()
        logger.debug("sync plan: %d tensors, %d sources, trainer %s ep=%d tp=%d dense_tp=%d -> "
                     "inference %s ep=%d tp=%d dense_tp=%d, %d targets", len(self.shapes),
                     sum(len(v) for v in self._sources.values()), trainer.name, trainer.ep,
                     trainer.tp, trainer.dense_size, inference.name, inference.ep, inference.tp,
                     inference.dense_size, sum(len(v) for v in self._targets.values()))

    # -- queries -------------------------------------------------------------------------------
    @property
    def tensor_ids(self) -> list[str]:
        """Every tensor of the model, in `shapes` order (the list a step is sealed with)."""
        return list(self.shapes)

    def sources(self, rank: int | None = None) -> list[SourceSpec]:
        """The sources trainer `rank` owns (encodes and commits); every source when None."""
        if rank is not None:
            self.trainer._check_rank(rank)
        return [s for specs in self._sources.values() for s in specs
                if rank is None or s.owner == rank]

    def held(self, rank: int) -> list[SourceSpec]:
        """Every source box trainer `rank` holds, owned or a replica."""
        self.trainer._check_rank(rank)
        return [s for specs in self._sources.values() for s in specs if rank in s.holders]

    def targets(self, rank: int) -> list[Target]:
        """The targets of inference `rank`, one per tensor it holds a box of, in tensor order."""
        self.inference._check_rank(rank)
        return list(self._targets[rank])

    def local_expert_index(self, expert: int) -> int:
        """Where inference expert `expert` sits in its rank's stacked expert parameters."""
        if self.num_experts is None:
            raise InvalidArgument("the model has no expert tensors")
        return self.inference.local_expert_index(expert, self.num_experts)

    def local_experts(self, rank: int) -> list[int]:
        """The global expert ids inference `rank` hosts, in local order."""
        if self.num_experts is None:
            return []
        return self.inference.experts_of(self.inference.coords(rank)[0], self.num_experts)

    # -- construction --------------------------------------------------------------------------
    def _resolve_num_experts(self) -> int | None:
        given = [(lay.name, lay.num_experts) for lay in (self.trainer, self.inference)
                 if lay.num_experts is not None]
        if len({n for _, n in given}) > 1:
            raise InvalidArgument(f"the layouts disagree on the number of experts: {given}")
        if given:
            return given[0][1]
        ids = [e for lay in (self.trainer, self.inference) for name in self.shapes
               for e in [lay.rule_for(name)[1]] if e is not None]
        if not ids:
            stacked = [self.shapes[n][r.expert_dim] for lay in (self.trainer, self.inference)
                       for n in self.shapes for r in [lay.rule_for(n)[0]]
                       if r.expert_dim is not None]
            return stacked[0] if stacked else None
        return max(ids) + 1

    def _plan_sources(self, name: str, shape: Shape) -> list[SourceSpec]:
        rule, expert = self.trainer.rule_for(name)
        by_box: dict[tuple[Shape, Shape], list[int]] = {}
        for box in self.trainer.boxes(name, shape, self.num_experts):
            by_box.setdefault((box.global_offset, box.local_shape), []).append(box.rank)
        if expert is not None:
            policy: str | None = "owner(expert)"
            base: dict[str, int] = {"expert": expert}
        elif rule.expert_dim is not None:
            policy, base = None, {}
        else:
            policy, base = "replicate(ep)", {}
        n = len(by_box)
        h = stable_hash(name)
        out = []
        for k, ((offset, local), holders) in enumerate(sorted(by_box.items())):
            placement = dict(base) if n == 1 else {**base, "shard": k}
            out.append(SourceSpec(name, shape, offset, local, placement, policy,
                                  holders[h % len(holders)], tuple(holders), k, n))
        return out

    def _target(self, name: str, box: RankBox) -> Target:
        ep_rank, tp_rank = self.inference.coords(box.rank)
        placement = {"ep": ep_rank, "tp": tp_rank}
        expert = self.inference.rule_for(name)[1]
        if expert is not None:
            placement["expert"] = expert
        return Target(name, self.inference.target_id(box.rank), self.inference.node_id(box.rank),
                      placement, box.global_offset, box.local_shape)

    # -- checks --------------------------------------------------------------------------------
    def check(self) -> None:
        """Raises InvalidArgument unless every tensor is tiled exactly by the trainer's boxes and
        every inference target is covered exactly once by the sources it matches."""
        for name, shape in self.shapes.items():
            specs = self._sources[name]
            total = sum(_volume(s.local_shape) for s in specs)
            for i, a in enumerate(specs):
                for b in specs[i + 1:]:
                    if _overlap(a.global_offset, a.local_shape, b.global_offset, b.local_shape):
                        raise InvalidArgument(
                            f"{self.trainer.name}: tensor {name!r}: boxes at {a.global_offset} "
                            f"and {b.global_offset} overlap")
            if total != _volume(shape):
                raise InvalidArgument(f"{self.trainer.name}: tensor {name!r} of shape {shape}: "
                                      f"the ranks' boxes cover {total} of {_volume(shape)} "
                                      "entries")
        for rank, targets in self._targets.items():
            for t in targets:
                self._check_target(rank, t)

    def _check_target(self, rank: int, t: Target) -> None:
        covered = 0
        for s in self._sources[t.tensor_id]:
            ov = _overlap(s.global_offset, s.local_shape, t.global_offset, t.local_shape)
            if ov and _policy_matches(s.placement_policy, s.source_placement, t.placement):
                covered += ov
        want = _volume(t.local_shape)
        if covered == want:
            return
        policies = sorted({f"{s.placement_policy} {dict(s.source_placement)}"
                           for s in self._sources[t.tensor_id]})
        raise InvalidArgument(
            f"tensor {t.tensor_id!r}: {self.inference.name} rank {rank} box "
            f"{tuple(t.global_offset)}+{tuple(t.local_shape)} with placement {dict(t.placement)} "
            f"is covered {covered} of {want} entries by the {self.trainer.name}'s sources "
            f"({'; '.join(policies)}): an owner(AXIS) source only matches targets with the same "
            "ordinal on AXIS, so both layouts must agree on which tensors are experts and on "
            "their expert ids")


# ---------------------------------------------------------------------------------------------
# Rules of common model families (Hugging Face names), from the engines' TP conventions:
# column-parallel q/k/v, gate/up and MLA up-projections split on dim 0; row-parallel o_proj and
# down_proj on dim 1; vocabulary-parallel embeddings and LM heads padded to 64 rows; routers,
# norms and MLA down-projections replicated. vLLM and SGLang shard these tensors the same way.
# ---------------------------------------------------------------------------------------------
EXPERT_PATTERN = r".*\.experts\.(?P<expert>\d+)\..*"


def expert_rules(expert_pattern: str = EXPERT_PATTERN) -> list[TensorRule]:
    """Per-expert tensors whole on their EP rank, everything else replicated: the layout of a
    trainer that uses EP (and data parallelism) but no TP."""
    return [TensorRule(expert_pattern), TensorRule(r".*")]


def qwen3_moe_rules(num_kv_heads: int | None = None, *, vocab_pad: int = 64) -> list[TensorRule]:
    """Qwen3-MoE (also Qwen2-MoE, whose shared_expert follows the dense MLP rules).
    `num_kv_heads`: the model's key/value heads (replicated over TP ranks beyond that count)."""
    return [
        TensorRule(r"(model\.embed_tokens|lm_head)\.weight", tp_dim=0, tp_pad=vocab_pad),
        TensorRule(r".*\.self_attn\.q_proj\.(weight|bias)", tp_dim=0),
        TensorRule(r".*\.self_attn\.[kv]_proj\.(weight|bias)", tp_dim=0, tp_units=num_kv_heads),
        TensorRule(r".*\.self_attn\.o_proj\.weight", tp_dim=1),
        TensorRule(r".*\.mlp\.experts\.(?P<expert>\d+)\.(gate|up)_proj\.weight", tp_dim=0),
        TensorRule(r".*\.mlp\.experts\.(?P<expert>\d+)\.down_proj\.weight", tp_dim=1),
        TensorRule(r".*\.mlp\.(shared_expert\.)?(gate|up)_proj\.weight", tp_dim=0),
        TensorRule(r".*\.mlp\.(shared_expert\.)?down_proj\.weight", tp_dim=1),
        TensorRule(r".*"),  # norms (incl. q_norm / k_norm), routers
    ]


def deepseek_v3_rules(*, vocab_pad: int = 64) -> list[TensorRule]:
    """DeepSeek-V2/V3 and Kimi-K2 (DeepseekV3ForCausalLM): MLA attention, dense first layers,
    routed experts plus shared experts."""
    return [
        TensorRule(r"(model\.embed_tokens|lm_head)\.weight", tp_dim=0, tp_pad=vocab_pad),
        TensorRule(r".*\.self_attn\.(q_proj|q_b_proj|kv_b_proj)\.weight", tp_dim=0),
        TensorRule(r".*\.self_attn\.o_proj\.weight", tp_dim=1),
        TensorRule(r".*\.mlp\.experts\.(?P<expert>\d+)\.(gate|up)_proj\.weight", tp_dim=0),
        TensorRule(r".*\.mlp\.experts\.(?P<expert>\d+)\.down_proj\.weight", tp_dim=1),
        TensorRule(r".*\.mlp\.(shared_experts\.)?(gate|up)_proj\.weight", tp_dim=0),
        TensorRule(r".*\.mlp\.(shared_experts\.)?down_proj\.weight", tp_dim=1),
        # q_a_proj, kv_a_proj_with_mqa, layernorms, router weight and e_score_correction_bias
        TensorRule(r".*"),
    ]
