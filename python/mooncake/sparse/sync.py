"""One call per step on each side of a weight sync, on top of a SyncPlan.

Trainer rank `rank`, each step:

    sync = mcs.TrainerSync(store, plan, rank)
    sync.snapshot(state)                  # the weights the inference side starts from
    ...train...
    stats = sync.step(state)              # encode vs the snapshot, admit, commit: step k = (k-1, k)

Inference rank `rank`:

    views = mcs.engine_views(params, plan, rank, mcs.engines.qwen3_moe_names())
    stats = mcs.apply_step(store, plan, rank, views, generation=(k - 1, k))

`state` maps tensor ids to the rank's tensors: each either the whole tensor or exactly the rank's
box of it (a TP shard); `views` maps tensor ids to destinations of each target's local shape,
possibly strided views into fused engine parameters (written in place, never copied).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Mapping, Sequence

from . import _api, _core
from ._arrays import torch_module
from ._errors import Conflict, InvalidArgument, Unimplemented
from .layout import SourceSpec, SyncPlan

__all__ = ["TensorStats", "StepStats", "TrainerSync", "sync_step", "AppliedTensor",
           "ApplyStats", "apply_step"]

logger = logging.getLogger("mooncake.sparse")

Generation = tuple[int, int]
# A dense tensor: a torch tensor or numpy array (CPU; CUDA torch tensors for the GPU codec).
Tensor = Any


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
    import numpy as np

    return np.array(x, copy=True)


def _assign(dst: Tensor, src: Tensor) -> None:
    torch = torch_module()
    if torch is not None and isinstance(dst, torch.Tensor):
        dst.copy_(src.detach() if isinstance(src, torch.Tensor) else torch.as_tensor(src))
    else:
        dst[...] = src


def _add_local(snapshot: Tensor, idx: Tensor, vals: Tensor, offset: tuple[int, ...]) -> None:
    """snapshot[idx - offset] += vals, with the same rounding as apply_sparse_object."""
    import numpy as np

    torch = torch_module()
    if torch is not None and isinstance(idx, torch.Tensor):  # CUDA encode
        local = idx.to(torch.int64) - torch.tensor(offset, dtype=torch.int64, device=idx.device)
        snapshot.index_put_(tuple(local.T), vals.to(snapshot.dtype), accumulate=True)
        return
    local = (np.asarray(idx).astype(np.int64) - np.asarray(offset, dtype=np.int64)).astype(
        np.uint64)
    _core.apply_coo(_api.as_core_array(snapshot), local, _api.as_core_array(vals), "scatter_add")


def _commit_boxes(store: _api.Store, specs: Sequence[SourceSpec],
                  new_of: Callable[[SourceSpec], Tensor], old_of: Callable[[SourceSpec], Tensor],
                  generation: Generation, rank: int, *, apply: str, threshold: float,
                  skip_unchanged: bool, writer_id: str,
                  after_commit: Callable[[SourceSpec, Tensor, Tensor, Tensor], None] | None
                  ) -> StepStats:
    out: list[TensorStats] = []
    encode_s = commit_s = 0.0
    for spec in specs:
        new = new_of(spec)
        t0 = time.perf_counter()
        idx, vals = _api.encode_update(new, old_of(spec), apply=apply, threshold=threshold,
                                       global_offset=spec.global_offset)
        encode_s += time.perf_counter() - t0
        nnz = int(vals.shape[0])
        if nnz == 0 and skip_unchanged:
            logger.debug("step %s rank %d: %s at %s unchanged, not committed", generation, rank,
                         spec.tensor_id, spec.global_offset)
            out.append(TensorStats(spec.tensor_id, spec.global_offset, spec.local_shape, 0, 0,
                                   False, None))
            continue
        # Admitted only when it commits: a seal waits for every admitted writer's commit.
        if not store.admit(spec.tensor_id, generation, spec.admit_policy, spec.admit_placement,
                           writer_id):
            raise Conflict(f"tensor {spec.tensor_id!r} box {spec.global_offset} of step "
                           f"{generation}: another writer than {writer_id!r} is admitted for it "
                           "(two trainers with the same rank?)")
        t0 = time.perf_counter()
        info = store.put_sparse_object(spec.tensor_id, spec.global_shape, idx, vals,
                                       generation=generation, apply=apply, return_info=True,
                                       **spec.put_kwargs())  # type: ignore[arg-type]
        commit_s += time.perf_counter() - t0
        if after_commit is not None:  # only once committed: a failed commit keeps the base
            after_commit(spec, new, idx, vals)
        logger.debug("step %s rank %d: committed %s at %s, nnz=%d, %d bytes (%s)", generation,
                     rank, spec.tensor_id, spec.global_offset, nnz, info["bytes"],
                     spec.placement_policy)
        out.append(TensorStats(spec.tensor_id, spec.global_offset, spec.local_shape, nnz,
                               int(info["bytes"]), True, str(info["source_ref"])))
    stats = StepStats(generation, rank, out, encode_s, commit_s)
    logger.debug("step %s rank %d: %d boxes, %d committed, %d unchanged skipped, nnz=%d, "
                 "%d bytes", generation, rank, len(out), stats.committed,
                 stats.skipped_unchanged, stats.nnz, stats.bytes)
    return stats


def sync_step(store: _api.Store, plan: SyncPlan, rank: int, new_state: Mapping[str, Tensor],
              old_state: Mapping[str, Tensor], generation: Generation, *,
              apply: str = "overwrite", threshold: float = 0.0, skip_unchanged: bool = False,
              writer_id: str | None = None) -> StepStats:
    """Encodes (encode_update, in global coordinates), admits (store.admit) and commits
    (store.put_sparse_object) every box trainer `rank` owns in `plan`, from `new_state` against
    `old_state` (each maps tensor ids to the whole tensor or to this rank's box of it).

    skip_unchanged: leave out boxes with no change (nnz == 0). Only for a store whose steps are
    sealed (seal_generation): elsewhere a reader's manifest would lack those tensors, and the
    tensors' next commit would not extend their generation chain. By default an unchanged box is
    committed as an empty object (applies as a no-op).

    Raises Conflict when another writer is admitted for a box, and what put_sparse_object
    raises (StaleGeneration, InvalidArgument, ...)."""
    specs = plan.sources(rank)
    return _commit_boxes(
        store, specs, lambda s: _box_view(new_state, s, "new_state"),
        lambda s: _box_view(old_state, s, "old_state"), _api._generation(generation), rank,
        apply=apply, threshold=threshold, skip_unchanged=skip_unchanged,
        writer_id=writer_id or f"trainer/rank{rank}", after_commit=None)


class TrainerSync:
    """A trainer rank's side of the sync: keeps the snapshot of the boxes it owns (the weights
    the inference side holds), and commits one step per call to step().

    Steps are numbered from `start_step`: the first step() commits generation
    (start_step, start_step + 1). With apply="scatter_add" the snapshot follows what the
    inference side computes (old + the committed deltas, with the same rounding), so that changes
    below `threshold` accumulate instead of being lost."""

    def __init__(self, store: _api.Store, plan: SyncPlan, rank: int, *, apply: str = "overwrite",
                 threshold: float = 0.0, skip_unchanged: bool = False,
                 writer_id: str | None = None, start_step: int = 0) -> None:
        plan.trainer._check_rank(rank)
        self.store = store
        self.plan = plan
        self.rank = rank
        self.apply = apply
        self.threshold = threshold
        self.skip_unchanged = skip_unchanged
        self.writer_id = writer_id or f"trainer/rank{rank}"
        self.step_index = int(start_step)
        self._specs = plan.sources(rank)
        self._snapshot: dict[tuple[str, tuple[int, ...]], Tensor] | None = None

    @property
    def specs(self) -> list[SourceSpec]:
        """The boxes this rank owns, encodes and commits."""
        return list(self._specs)

    def snapshot(self, state: Mapping[str, Tensor]) -> None:
        """Copies this rank's owned boxes of `state`: the base of the next step's update."""
        self._snapshot = {(s.tensor_id, s.global_offset): _copy(_box_view(state, s, "state"))
                          for s in self._specs}
        logger.debug("trainer rank %d: snapshot of %d boxes", self.rank, len(self._snapshot))

    @property
    def generation(self) -> Generation:
        """The generation the next step() commits."""
        return (self.step_index, self.step_index + 1)

    def step(self, state: Mapping[str, Tensor], *,
             generation: Generation | None = None) -> StepStats:
        """Commits the change of this rank's owned boxes from the snapshot to `state`, then
        makes `state` the snapshot. `generation` defaults to self.generation; the step counter
        then moves past it."""
        if self._snapshot is None:
            raise InvalidArgument("TrainerSync.step before snapshot(): call snapshot(state) with "
                                  "the weights the inference side starts from")
        gen = self.generation if generation is None else _api._generation(generation)
        snap = self._snapshot

        def update_snapshot(spec: SourceSpec, new: Tensor, idx: Tensor, vals: Tensor) -> None:
            old = snap[spec.tensor_id, spec.global_offset]
            if self.apply == "scatter_add":
                if int(vals.shape[0]):
                    _add_local(old, idx, vals, spec.global_offset)
            else:
                _assign(old, new)

        stats = _commit_boxes(
            self.store, self._specs, lambda s: _box_view(state, s, "state"),
            lambda s: snap[s.tensor_id, s.global_offset], gen, self.rank, apply=self.apply,
            threshold=self.threshold, skip_unchanged=self.skip_unchanged,
            writer_id=self.writer_id, after_commit=update_snapshot)
        self.step_index = gen[1]
        return stats

    @property
    def can_seal(self) -> bool:
        return hasattr(self.store, "seal_generation")

    def seal(self, generation: Generation | None = None) -> object:
        """Seals a step with the model's complete tensor list (plan.tensor_ids); default the
        step last committed. One rank seals, after every rank's step() returned. Raises
        Unimplemented when the store cannot seal steps."""
        if not self.can_seal:
            raise Unimplemented("this store has no seal_generation")
        gen = (self.step_index - 1, self.step_index) if generation is None else generation
        logger.debug("trainer rank %d: sealing step %s with %d tensors", self.rank, gen,
                     len(self.plan.tensor_ids))
        return self.store.seal_generation(gen, self.plan.tensor_ids)  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class AppliedTensor:
    tensor_id: str
    nnz: int


@dataclasses.dataclass(frozen=True)
class ApplyStats:
    generation: Generation
    rank: int
    tensors: list[AppliedTensor]
    read_seconds: float
    apply_seconds: float

    @property
    def nnz(self) -> int:
        return sum(t.nnz for t in self.tensors)


def apply_step(store: _api.Store, plan: SyncPlan, rank: int, dests: Mapping[str, Tensor],
               generation: Generation, *, manifest: Any = None, wait: bool = False,
               timeout: float | None = None, strategy: str = "sparse",
               device: Any = None) -> ApplyStats:
    """Reads step `generation` for inference `rank` (its plan targets, one read) and applies it
    in place into `dests` (tensor id -> destination of the target's local shape: a tensor, or a
    strided view into a fused engine parameter, see engine_views).

    manifest: the step's manifest when the caller has it; else store.manifest(generation), or,
    with wait=True, store.wait_generation(generation, timeout) (a store that seals steps).
    device: passed to read_sparse_objects (e.g. "cuda" to upload before applying).

    Raises InvalidArgument when a destination is missing or has the wrong shape (before anything
    is applied), NotFound when the manifest lacks a tensor of the targets."""
    gen = _api._generation(generation)
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
    t0 = time.perf_counter()
    if manifest is None:
        if wait:
            if not hasattr(store, "wait_generation"):
                raise Unimplemented("this store has no wait_generation")
            manifest = store.wait_generation(gen, timeout=timeout)  # type: ignore[attr-defined]
        else:
            manifest = store.manifest(gen)
    objs = store.read_sparse_objects(manifest, targets, strategy=strategy, device=device)
    t1 = time.perf_counter()
    applied = []
    for t, obj in zip(targets, objs):
        _api.apply_sparse_object(dests[t.tensor_id], obj)
        applied.append(AppliedTensor(t.tensor_id, int(obj.nnz)))
    t2 = time.perf_counter()
    stats = ApplyStats(gen, rank, applied, t1 - t0, t2 - t1)
    logger.debug("step %s inference rank %d: %d targets, nnz=%d, read %.3f s, apply %.3f s", gen,
                 rank, len(targets), stats.nnz, stats.read_seconds, stats.apply_seconds)
    return stats
