"""One call per step on each side of a weight sync, on top of a SyncPlan (docs/design.md §9).

Step k of a run is generation (k - 1, k). Trainer rank `rank`, each step:

    sync = mcs.TrainerSync(store, plan, rank)
    sync.snapshot(state)                  # the weights the inference side starts from
    ...train...
    stats = sync.step(state)              # encode vs the snapshot, admit, commit what changed
    barrier()                             # every rank has committed step k
    if rank == 0:
        sync.seal()                       # seal step k with the model's full tensor list

Inference rank `rank`:

    views = mcs.engine_views(params, plan, rank, mcs.engines.qwen3_moe_names())
    reader = mcs.InferenceSync(store, plan, rank, views)
    stats = reader.update(k, timeout=60)  # waits for step k's seal, then one read and apply
                                          # (a fold of every step it missed: one read too)

or, one step at a time, mcs.apply_step(store, plan, rank, views, (k - 1, k), wait=True).

Unchanged tensors: a step commits only the tensors that changed; the seal lists every tensor, so
a reader's targets of an unchanged tensor read as empty objects (no-ops). A tensor split into
boxes is committed whole or not at all: a read needs the step's sources to cover each target
that reads them, so when any box of a tensor changed, every box of it is committed (unchanged
boxes as empty objects). The boxes of a tensor split over several trainer ranks are decided on
each rank alone, so by default they are always committed; TrainerSync.encode() +
commit(changed_anywhere=...) skips them too once the ranks share which tensors changed.

`state` maps tensor ids to the rank's tensors: each either the whole tensor or exactly the rank's
box of it (a TP shard); `views` maps tensor ids to destinations of each target's local shape,
possibly strided views into fused engine parameters (written in place, never copied).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import (TYPE_CHECKING, Callable, Collection, Iterable, Mapping, Sequence, Union,
                    cast)

import numpy as np

from . import _api, _core
from ._arrays import torch_module
from ._errors import Conflict, FailedPrecondition, InvalidArgument, NotFound, Unimplemented
from .layout import SourceSpec, SyncPlan

__all__ = ["TensorStats", "StepStats", "EncodedStep", "TrainerSync", "sync_step",
           "AppliedTensor", "ApplyStats", "apply_step", "InferenceSync"]

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Generation = tuple[int, int]
# A dense tensor: a torch tensor or numpy array (CPU; CUDA torch tensors for the GPU codec).
# torch is never imported for it: the name is only resolved by type checkers.
Tensor = Union["torch.Tensor", np.ndarray]
_TorchTensor = Union["torch.Tensor"]
# Where read objects go before they are applied: None (host), "cuda", "cuda:N" or a device.
Device = Union[str, "torch.device", None]
# A step's manifest: store.manifest / wait_generation's answer, or a list of its SourceInfo.
ManifestLike = Union[_api.Manifest, Sequence[_api.SourceInfo]]


@dataclasses.dataclass(frozen=True)
class TensorStats:
    """What one source box of a step came to on the trainer side."""

    tensor_id: str
    global_offset: tuple[int, ...]
    local_shape: tuple[int, ...]
    nnz: int
    bytes: int  # payload bytes committed (0 when not committed)
    committed: bool
    source_ref: str | None

    @property
    def unchanged(self) -> bool:
        return self.nnz == 0


@dataclasses.dataclass(frozen=True)
class StepStats:
    """One trainer rank's step: every box it owns, with totals."""

    generation: Generation
    rank: int
    tensors: list[TensorStats]
    encode_seconds: float
    commit_seconds: float
    sealed: bool = False  # this rank sealed the step

    @property
    def nnz(self) -> int:
        return sum(t.nnz for t in self.tensors)

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)

    @property
    def committed(self) -> int:
        return sum(t.committed for t in self.tensors)

    @property
    def skipped_unchanged(self) -> int:
        return sum(not t.committed for t in self.tensors)


def _box_view(state: Mapping[str, Tensor], spec: SourceSpec, what: str) -> Tensor:
    """The spec's box of state[tensor_id]: the tensor itself when it is the box (a shard), a
    slice (a view) when it is the whole tensor."""
    try:
        x = state[spec.tensor_id]
    except KeyError:
        raise InvalidArgument(f"{what} has no tensor {spec.tensor_id!r}") from None
    shape = tuple(int(s) for s in x.shape)
    if shape == spec.local_shape:
        return x
    if shape == spec.global_shape:
        return x[tuple(slice(o, o + s) for o, s in zip(spec.global_offset, spec.local_shape))]
    raise InvalidArgument(f"{what}[{spec.tensor_id!r}] has shape {shape}; expected the whole "
                          f"tensor {spec.global_shape} or this rank's box {spec.local_shape} at "
                          f"{spec.global_offset}")


def _copy(x: Tensor) -> Tensor:
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().clone()
    return np.array(x, copy=True)


def _assign(dst: Tensor, src: Tensor) -> None:
    torch = torch_module()
    if torch is not None and isinstance(dst, torch.Tensor):
        dst.copy_(src.detach() if isinstance(src, torch.Tensor) else torch.as_tensor(src))
    else:  # a numpy destination (torch is not in use, or dst is not a torch tensor)
        cast(np.ndarray, dst)[...] = src


# An overwrite snapshot in host memory takes the committed entries past this many bytes, a copy
# of the new weights below (where the copy costs less than the entries' call).
_SPARSE_SNAPSHOT_BYTES = 64 << 10


def _overwrite_by_copy(snapshot: Tensor) -> bool:
    """Whether an overwrite commit updates `snapshot` by copying the new weights: on the GPU
    (one copy at device bandwidth costs less than the entries' several launches) and for small
    host tensors."""
    torch = torch_module()
    if torch is not None and isinstance(snapshot, torch.Tensor):
        return (snapshot.is_cuda
                or snapshot.numel() * snapshot.element_size() < _SPARSE_SNAPSHOT_BYTES)
    return cast(np.ndarray, snapshot).nbytes < _SPARSE_SNAPSHOT_BYTES


def _apply_local(snapshot: Tensor, idx: Tensor, vals: Tensor, offset: tuple[int, ...],
                 apply: str) -> None:
    """snapshot[idx - offset] = vals (overwrite) or += vals (scatter_add), with the same
    rounding as apply_sparse_object: the snapshot becomes what the inference side holds after
    the commit, touching only the committed entries."""
    torch = torch_module()
    if torch is not None and isinstance(idx, torch.Tensor):  # CUDA encode: torch throughout
        snap, delta = cast(_TorchTensor, snapshot), cast(_TorchTensor, vals)
        local = idx.to(torch.int64) - torch.tensor(offset, dtype=torch.int64, device=idx.device)
        snap.index_put_(tuple(local.T), delta.to(snap.dtype), accumulate=apply == "scatter_add")
        return
    local = (np.asarray(idx).astype(np.int64) - np.asarray(offset, dtype=np.int64)).astype(
        np.uint64)
    _core.apply_coo(_api.as_core_array(snapshot), local, _api.as_core_array(vals), apply)


def _can_seal(store: object) -> bool:
    return hasattr(store, "seal_generation")


@dataclasses.dataclass(frozen=True)
class _EncodedBox:
    spec: SourceSpec
    new: Tensor
    indices: Tensor
    values: Tensor

    @property
    def nnz(self) -> int:
        return int(self.values.shape[0])


@dataclasses.dataclass(frozen=True)
class EncodedStep:
    """One trainer rank's step, encoded and not committed yet (TrainerSync.encode): the updates
    of every box the rank owns.

    `changed` are the tensors with a changed box here. `split` are the tensors whose boxes other
    ranks own too: whether one of them changed is only known once the ranks have shared their
    `changed` sets (pass their union to TrainerSync.commit as changed_anywhere)."""

    generation: Generation
    rank: int
    boxes: tuple[_EncodedBox, ...]
    split: frozenset[str]
    encode_seconds: float

    @property
    def changed(self) -> frozenset[str]:
        return frozenset(b.spec.tensor_id for b in self.boxes if b.nnz)

    @property
    def nnz(self) -> int:
        return sum(b.nnz for b in self.boxes)


def _split_tensors(plan: SyncPlan, rank: int) -> frozenset[str]:
    """The tensors trainer `rank` owns a box of while another rank owns another box."""
    mine = {s.tensor_id for s in plan.sources(rank)}
    return frozenset(s.tensor_id for s in plan.sources() if s.tensor_id in mine
                     and s.owner != rank)


def _encode(specs: Sequence[SourceSpec], new_of: Callable[[SourceSpec], Tensor],
            old_of: Callable[[SourceSpec], Tensor], generation: Generation, rank: int,
            split: frozenset[str], *, apply: str, threshold: float) -> EncodedStep:
    t0 = time.perf_counter()
    news = [new_of(spec) for spec in specs]
    # Every box in one encode_updates (on the GPU: a few launches for the whole step), then the
    # indices of partial boxes moved to the tensor's coordinates.
    coos = _api.encode_updates([(new, old_of(spec)) for spec, new in zip(specs, news)],
                               apply=apply, threshold=threshold)
    boxes = []
    for spec, new, (idx, vals) in zip(specs, news, coos):
        if any(spec.global_offset):
            idx = _api._offset_indices(idx, tuple(spec.global_offset),
                                       tuple(int(e) for e in new.shape))
        boxes.append(_EncodedBox(spec, new, idx, vals))
    return EncodedStep(generation, rank, tuple(boxes), split, time.perf_counter() - t0)


def _tensors_to_commit(step: EncodedStep, skip_unchanged: bool,
                       changed_anywhere: Collection[str] | None) -> set[str]:
    """A tensor is committed whole (every box, the unchanged ones as empty objects) or not at
    all: skipped only when none of its boxes changed, on any rank. A tensor split over ranks
    is committed unless `changed_anywhere` (the union of every rank's changed tensors) says
    that no rank changed it."""
    every = {b.spec.tensor_id for b in step.boxes}
    if not skip_unchanged:
        return every
    out = set(step.changed)
    if changed_anywhere is None:
        out |= every & step.split
    else:
        out |= every & set(changed_anywhere)
    return out


def _commit(store: _api.Store, step: EncodedStep, *, apply: str, skip_unchanged: bool,
            changed_anywhere: Collection[str] | None, writer_id: str,
            after_commit: Callable[[_EncodedBox], None] | None) -> StepStats:
    generation, rank = step.generation, step.rank
    commit = _tensors_to_commit(step, skip_unchanged, changed_anywhere)
    out: list[TensorStats | None] = []
    pending: list[_EncodedBox] = []
    for box in step.boxes:
        spec = box.spec
        if spec.tensor_id not in commit:
            logger.debug("step %s rank %d: %s at %s unchanged, not committed", generation, rank,
                         spec.tensor_id, spec.global_offset)
            out.append(TensorStats(spec.tensor_id, spec.global_offset, spec.local_shape, 0, 0,
                                   False, None))
            continue
        pending.append(box)
        out.append(None)  # filled in below, in box order
    # Admitted only when it commits: a seal waits for every admitted writer's commit. A box of
    # a split tensor is not admitted: the seal pairs each admission with a commit of the same
    # logical key, which the boxes of a tensor share, while their admissions are one per box
    # (owner(shard)) and would never be paired. Its writer is the plan's owner of the box; a
    # second writer of it with other values is refused by the commit (Conflict). Every
    # admission of the step in one call (through the node daemon, one request).
    admit = [b.spec for b in pending if b.spec.complete]
    if admit:
        items = [{"tensor_id": s.tensor_id, "generation": generation,
                  "placement_policy": s.admit_policy, "source_placement": s.admit_placement,
                  "writer_id": writer_id} for s in admit]
        if hasattr(store, "admit_batch"):
            admitted = store.admit_batch(items)
        else:  # a store-like object with admit() only
            admitted = [store.admit(**it) for it in items]
        for spec, ok in zip(admit, admitted):
            if isinstance(ok, Exception):
                raise ok
            if not ok:
                raise Conflict(f"tensor {spec.tensor_id!r} box {spec.global_offset} of step "
                               f"{generation}: another writer than {writer_id!r} is admitted "
                               "for it (two trainers with the same rank?)")
    # Every box of the step in one batch commit.
    t0 = time.perf_counter()
    results = store.put_sparse_objects(
        [{"tensor_id": b.spec.tensor_id, "global_shape": b.spec.global_shape,
          "indices": b.indices, "values": b.values, "generation": generation, "apply": apply,
          **b.spec.put_kwargs()} for b in pending]) if pending else []
    commit_s = time.perf_counter() - t0
    first_error: Exception | None = None
    slots = iter(i for i, o in enumerate(out) if o is None)
    for box, info, slot in zip(pending, results, slots):
        spec = box.spec
        if not isinstance(info, dict):
            first_error = first_error or info
            out[slot] = TensorStats(spec.tensor_id, spec.global_offset, spec.local_shape,
                                    box.nnz, 0, False, None)
            continue
        if after_commit is not None:  # only once committed: a failed commit keeps the base
            after_commit(box)
        logger.debug("step %s rank %d: committed %s at %s, nnz=%d, %d bytes (%s)", generation,
                     rank, spec.tensor_id, spec.global_offset, box.nnz, info["bytes"],
                     spec.placement_policy)
        out[slot] = TensorStats(spec.tensor_id, spec.global_offset, spec.local_shape, box.nnz,
                                int(info["bytes"]), True, str(info["source_ref"]))
    if first_error is not None:
        raise first_error
    stats = StepStats(generation, rank, [o for o in out if o is not None], step.encode_seconds,
                      commit_s)
    logger.debug("step %s rank %d: %d boxes, %d committed, %d unchanged skipped, nnz=%d, "
                 "%d bytes", generation, rank, len(out), stats.committed,
                 stats.skipped_unchanged, stats.nnz, stats.bytes)
    return stats


def _seal(store: _api.Store, generation: Generation, tensor_ids: list[str], timeout: float,
          who: str) -> None:
    if not _can_seal(store):
        raise Unimplemented("this store has no seal_generation")
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            store.seal_generation(generation, tensor_ids)
            logger.debug("%s: sealed step %s with %d tensors", who, generation, len(tensor_ids))
            return
        except FailedPrecondition as e:  # sealed already, past retention, or a writer pending
            if "has not committed" not in str(e) or time.monotonic() + delay > deadline:
                raise
            logger.debug("%s: step %s not sealable yet (%s), retrying", who, generation, e)
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def sync_step(store: _api.Store, plan: SyncPlan, rank: int, new_state: Mapping[str, Tensor],
              old_state: Mapping[str, Tensor], generation: Generation, *,
              apply: str = "overwrite", threshold: float = 0.0,
              skip_unchanged: bool | None = None, writer_id: str | None = None) -> StepStats:
    """Encodes (encode_update, in global coordinates), admits (store.admit) and commits
    (store.put_sparse_object) the boxes trainer `rank` owns in `plan`, from `new_state` against
    `old_state` (each maps tensor ids to the whole tensor or to this rank's box of it).

    skip_unchanged: commit nothing for a tensor none of whose boxes changed (see the module
    docstring: a tensor split over ranks is always committed here). Default: True when the
    store seals steps (seal_generation), whose seal then lists the skipped tensors as
    unchanged; else every box is committed, unchanged ones as empty objects (no-ops). Sealing
    the step is the caller's: once every rank has committed, one of them seals it.

    The boxes are committed in one put_sparse_objects batch. Raises Conflict when another
    writer is admitted for a box, and the first error of the batch (StaleGeneration,
    InvalidArgument, Conflict for a sealed step, ...) once the other boxes are committed (each a
    valid commit of the step: a retry of the step is idempotent for them)."""
    specs = plan.sources(rank)
    gen = _api._generation(generation)
    step = _encode(specs, lambda s: _box_view(new_state, s, "new_state"),
                   lambda s: _box_view(old_state, s, "old_state"), gen, rank,
                   _split_tensors(plan, rank), apply=apply, threshold=threshold)
    skip = _can_seal(store) if skip_unchanged is None else bool(skip_unchanged)
    return _commit(store, step, apply=apply, skip_unchanged=skip, changed_anywhere=None,
                   writer_id=writer_id or f"trainer/rank{rank}", after_commit=None)


class TrainerSync:
    """A trainer rank's side of the sync: keeps the snapshot of the boxes it owns (the weights
    the inference side holds), and commits one step per call to step().

    Steps are numbered from `start_step`: the first step() commits generation
    (start_step, start_step + 1). After each commit the snapshot takes the committed entries
    (overwritten, or with apply="scatter_add" added with the same rounding): it follows what the
    inference side holds, so that changes below `threshold` accumulate until they are sent
    instead of being lost, and a step touches only the entries it commits.

    skip_unchanged: commit nothing for tensors that did not change (see the module docstring for
    tensors split into boxes). Default: True when the store seals steps; a store without
    seal_generation gets every box committed, unchanged ones as empty objects.

    Sealing: each step is sealed once, by one rank, after every rank has committed it, with
    plan.tensor_ids (the model's complete list). With one trainer rank, step(state, seal=True).
    With several, a barrier between the ranks' step() and the designated rank's seal() (e.g.
    rank 0): without it, a rank that has not admitted its first box yet is missed by the seal
    and its commit is then refused (Conflict: the step is sealed)."""

    def __init__(self, store: _api.Store, plan: SyncPlan, rank: int, *, apply: str = "overwrite",
                 threshold: float = 0.0, skip_unchanged: bool | None = None,
                 writer_id: str | None = None, start_step: int = 0) -> None:
        plan.trainer._check_rank(rank)
        self.store = store
        self.plan = plan
        self.rank = rank
        self.apply = apply
        self.threshold = threshold
        self.skip_unchanged = _can_seal(store) if skip_unchanged is None else bool(skip_unchanged)
        self.writer_id = writer_id or f"trainer/rank{rank}"
        self.step_index = int(start_step)
        self._specs = plan.sources(rank)
        self._split = _split_tensors(plan, rank)
        self._snapshot: dict[tuple[str, tuple[int, ...]], Tensor] | None = None

    @property
    def specs(self) -> list[SourceSpec]:
        """The boxes this rank owns, encodes and commits."""
        return list(self._specs)

    @property
    def split_tensors(self) -> frozenset[str]:
        """The tensors of which this rank owns a box and other ranks own the other boxes."""
        return self._split

    def snapshot(self, state: Mapping[str, Tensor]) -> None:
        """Copies this rank's owned boxes of `state`: the base of the next step's update."""
        self._snapshot = {(s.tensor_id, s.global_offset): _copy(_box_view(state, s, "state"))
                          for s in self._specs}
        logger.debug("trainer rank %d: snapshot of %d boxes", self.rank, len(self._snapshot))

    @property
    def generation(self) -> Generation:
        """The generation the next step() commits."""
        return (self.step_index, self.step_index + 1)

    def encode(self, state: Mapping[str, Tensor], *,
               generation: Generation | None = None) -> EncodedStep:
        """Encodes the change of this rank's owned boxes from the snapshot to `state`, commits
        nothing (commit() does). For skipping unchanged tensors split over ranks: share
        `encoded.changed` between the ranks (e.g. all_gather_object) and pass the union to
        commit(encoded, changed_anywhere=...)."""
        if self._snapshot is None:
            raise InvalidArgument("TrainerSync.step before snapshot(): call snapshot(state) with "
                                  "the weights the inference side starts from")
        gen = self.generation if generation is None else _api._generation(generation)
        snap = self._snapshot
        return _encode(self._specs, lambda s: _box_view(state, s, "state"),
                       lambda s: snap[s.tensor_id, s.global_offset], gen, self.rank,
                       self._split, apply=self.apply, threshold=self.threshold)

    def commit(self, encoded: EncodedStep, *, changed_anywhere: Iterable[str] | None = None,
               seal: bool = False, seal_timeout: float = 0.0) -> StepStats:
        """Admits and commits an encoded step, then makes its state the snapshot; the step
        counter moves past its generation. changed_anywhere: the tensors changed on any rank
        (the union of every rank's encoded.changed); None: unknown, so the tensors split over
        ranks are committed. seal: then seal the step (see seal())."""
        if encoded.rank != self.rank:
            raise InvalidArgument(f"rank {self.rank} cannot commit rank {encoded.rank}'s step")
        snap = self._snapshot
        assert snap is not None

        def update_snapshot(box: _EncodedBox) -> None:
            # What the inference side applies: the committed entries (added, with scatter_add:
            # changes below the threshold accumulate), or for overwrite the new weights where
            # copying them costs less (they are then equal).
            old = snap[box.spec.tensor_id, box.spec.global_offset]
            if self.apply == "overwrite" and _overwrite_by_copy(old):
                _assign(old, box.new)
            elif box.nnz:
                _apply_local(old, box.indices, box.values, box.spec.global_offset, self.apply)

        stats = _commit(self.store, encoded, apply=self.apply,
                        skip_unchanged=self.skip_unchanged,
                        changed_anywhere=None if changed_anywhere is None
                        else frozenset(changed_anywhere),
                        writer_id=self.writer_id, after_commit=update_snapshot)
        self.step_index = encoded.generation[1]
        if seal:
            self.seal(encoded.generation, timeout=seal_timeout)
            stats = dataclasses.replace(stats, sealed=True)
        return stats

    def step(self, state: Mapping[str, Tensor], *, generation: Generation | None = None,
             seal: bool = False, seal_timeout: float = 0.0) -> StepStats:
        """Commits the change of this rank's owned boxes from the snapshot to `state` (the
        tensors that changed, see skip_unchanged), then makes `state` the snapshot.
        `generation` defaults to self.generation; the step counter then moves past it.
        seal=True: then seals the step (the designated rank only; see the class docstring)."""
        return self.commit(self.encode(state, generation=generation), seal=seal,
                           seal_timeout=seal_timeout)

    @property
    def can_seal(self) -> bool:
        """Whether the store seals steps (the Store does; a store-like object may not)."""
        return _can_seal(self.store)

    def seal(self, generation: Generation | None = None, *, timeout: float = 0.0) -> None:
        """Seals a step with the model's complete tensor list (plan.tensor_ids); default the
        step last committed. One rank seals, after every rank's step() returned.

        The store raises FailedPrecondition while a writer admitted for the step has not
        committed; this retries that for up to `timeout` seconds (0: once), then raises it.
        Also FailedPrecondition: the step is sealed already or past retention. Raises
        Unimplemented when the store cannot seal steps."""
        gen = (self.step_index - 1, self.step_index) if generation is None else \
            _api._generation(generation)
        _seal(self.store, gen, self.plan.tensor_ids, float(timeout), f"trainer rank {self.rank}")


@dataclasses.dataclass(frozen=True)
class AppliedTensor:
    tensor_id: str
    nnz: int


@dataclasses.dataclass(frozen=True)
class ApplyStats:
    generation: Generation  # the step (k - 1, k), or the fold (j, k) applied in one read
    rank: int
    tensors: list[AppliedTensor]
    read_seconds: float
    apply_seconds: float

    @property
    def nnz(self) -> int:
        return sum(t.nnz for t in self.tensors)


def _check_dests(plan: SyncPlan, rank: int, dests: Mapping[str, Tensor]) -> list[_api.Target]:
    targets = plan.targets(rank)
    missing = [t.tensor_id for t in targets if t.tensor_id not in dests]
    if missing:
        raise InvalidArgument(f"inference rank {rank}: no destination for {len(missing)} "
                              f"tensor(s), e.g. {missing[:3]}")
    for t in targets:
        shape = tuple(int(s) for s in dests[t.tensor_id].shape)
        if shape != tuple(t.local_shape):
            raise InvalidArgument(f"inference rank {rank}: destination of {t.tensor_id!r} has "
                                  f"shape {shape}, its target box {tuple(t.local_shape)}")
    return targets


def _apply(store: _api.Store, targets: Sequence[_api.Target], rank: int,
           dests: Mapping[str, Tensor], gen: Generation, manifest: ManifestLike | None,
           wait: bool, timeout: float | None, strategy: str, device: Device) -> ApplyStats:
    t0 = time.perf_counter()
    if manifest is None:
        if wait:
            if not hasattr(store, "wait_generation"):
                raise Unimplemented("this store has no wait_generation")
            manifest = store.wait_generation(gen, timeout=timeout)  # type: ignore[attr-defined]
        else:
            manifest = store.manifest(gen)
    if isinstance(manifest, _api.Manifest) and not manifest.sealed:
        have = {s.tensor_id for s in manifest}
        absent = [t.tensor_id for t in targets if t.tensor_id not in have]
        if absent:
            raise NotFound(f"step {gen} is not sealed and has no source for {len(absent)} "
                           f"tensor(s), e.g. {absent[:3]}: wait for its seal "
                           "(apply_step(..., wait=True)) or commit every tensor")
    weights = [dests[t.tensor_id] for t in targets]
    objs = store.read_sparse_objects(manifest, targets, strategy=strategy, device=device)
    t1 = time.perf_counter()
    _api.apply_sparse_objects(weights, objs)
    applied = [AppliedTensor(t.tensor_id, int(obj.nnz)) for t, obj in zip(targets, objs)]
    t2 = time.perf_counter()
    stats = ApplyStats(gen, rank, applied, t1 - t0, t2 - t1)
    logger.debug("step %s inference rank %d: %d targets, nnz=%d, read %.3f s, apply %.3f s", gen,
                 rank, len(targets), stats.nnz, stats.read_seconds, stats.apply_seconds)
    return stats


def apply_step(store: _api.Store, plan: SyncPlan, rank: int, dests: Mapping[str, Tensor],
               generation: Generation, *, manifest: ManifestLike | None = None,
               wait: bool = False, timeout: float | None = None, strategy: str = "sparse",
               device: Device = None) -> ApplyStats:
    """Reads step `generation` for inference `rank` (its plan targets, one read) and applies it
    in place into `dests` (tensor id -> destination of the target's local shape: a tensor, or a
    strided view into a fused engine parameter, see engine_views).

    generation: a step (k - 1, k), or (j, k) with k > j + 1 for a reader whose weights are at
    step j: the fold of the sealed steps j+1..k, applied in one read (InferenceSync tracks j).
    manifest: the step's manifest when the caller has it; else, with wait=True,
    store.wait_generation(generation, timeout) (blocks until the step is sealed; None waits for
    ever; DeadlineExceeded past it), or store.manifest(generation).
    device: passed to read_sparse_objects (e.g. "cuda" to upload before applying).

    Raises InvalidArgument when a destination is missing or has the wrong shape (before anything
    is applied), NotFound when the manifest lacks a tensor of the targets (a step read before
    its seal that left tensors unchanged; a fold past retention)."""
    gen = _api._generation(generation)
    targets = _check_dests(plan, rank, dests)
    return _apply(store, targets, rank, dests, gen, manifest, wait, timeout, strategy, device)


class InferenceSync:
    """An inference rank's side of the sync: its destinations (see apply_step) and the step
    their weights are at. update() brings them to a later step in one read, however many steps
    behind they are (the fold of the steps missed: per coordinate the latest value, or the sum
    for scatter_add; every step of the fold must still be kept by the store's retention)."""

    def __init__(self, store: _api.Store, plan: SyncPlan, rank: int,
                 dests: Mapping[str, Tensor], *, step: int = 0, strategy: str = "sparse",
                 device: Device = None) -> None:
        self.store = store
        self.plan = plan
        self.rank = rank
        self.dests = dests
        self.step = _api._int(step, "step", minimum=0)  # the step the weights are at
        self.strategy = strategy
        self.device = device
        self._targets = _api.TargetBatch(_check_dests(plan, rank, dests))  # converted once

    def update(self, to_step: int | None = None, *,
               timeout: float | None = None) -> ApplyStats | None:
        """Applies steps self.step+1 .. to_step in one read (the generation (self.step,
        to_step)), then self.step = to_step.

        to_step None: up to the newest sealed step (store.latest_generation()), without
        waiting; returns None when there is none newer. Given: waits until step to_step is
        sealed (timeout seconds, None for ever; DeadlineExceeded past it); returns None when
        the weights are at to_step already. Raises InvalidArgument for a step behind the
        weights, NotFound when the fold reaches past the store's retention."""
        if to_step is None:
            latest = self.store.latest_generation()
            if latest is None or latest[1] <= self.step:
                return None
            k, wait = latest[1], False
        else:
            k, wait = _api._int(to_step, "to_step", minimum=0), True
            if k < self.step:
                raise InvalidArgument(f"inference rank {self.rank} is at step {self.step}; "
                                      f"cannot update back to step {k}")
            if k == self.step:
                return None
        stats = _apply(self.store, self._targets, self.rank, self.dests, (self.step, k), None,
                       wait, timeout, self.strategy, self.device)
        self.step = k
        return stats
