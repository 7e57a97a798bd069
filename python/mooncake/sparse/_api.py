"""The public Python API of mooncake.sparse (docs/design.md §8)."""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
import os
import sys
import threading
from typing import Any, Iterable, Iterator, Mapping, Protocol, Sequence

# numpy before the native core: on an H200 host (torch 2.11, Python 3.12), loading the core
# first and then torch crashed torch's import; with numpy loaded first it did not.
import numpy  # noqa: F401  (isort: skip)

from . import _core
from ._arrays import as_core_array, values_out
from ._errors import (Conflict, Error, FailedPrecondition, InvalidArgument, NotFound,
                      Unimplemented, error_class)
from ._tensor import TensorMixin, default_pinned_quota_bytes
from . import _gpu

__all__ = [
    "Target",
    "TargetBatch",
    "Store",
    "connect",
    "default_store",
    "encode_update",
    "apply_sparse_object",
    "default_tile_shape",
]

SourceInfo = _core.SourceInfo
SparseObject = _core.SparseObject

# Values of dtypes numpy lacks (bfloat16) come out as torch tensors when torch is in use.
SparseObject.values = property(  # type: ignore[attr-defined]
    lambda self: values_out(self._values_raw, self.value_dtype),
    doc="Entry values ([nnz]); bfloat16 as a torch tensor when torch is imported, else uint16 bits.",
)


@dataclasses.dataclass(frozen=True)
class Target:
    """One inference-side consumer of one tensor: a rank's box in global coordinates."""

    tensor_id: str
    target_id: str
    node_id: str
    placement: Mapping[str, int]
    global_offset: Sequence[int]
    local_shape: Sequence[int]


class TargetBatch(Sequence[Target]):
    """A reader's targets converted once, for many reads: pass it to read_sparse_objects in
    place of a list. A rank's targets are the same at every step (a Kimi-K2 node reads about
    140,000 of them per step); a list is converted at every read, a batch only here. Its
    Targets are taken as they are now (a later change to a Target's placement or shape is not
    seen: make a new batch). Iterable, indexable and sized like the tuple of its targets."""

    __slots__ = ("_targets", "_core", "_parts")

    def __init__(self, targets: Iterable[Target]) -> None:
        self._targets = tuple(_targets(targets))
        self._core = _core._TargetBatch(self._targets)
        self._parts: dict[tuple[tuple[int, int], ...], list[TargetBatch]] = {}

    def _split(self, bounds: list[tuple[int, int]]) -> list[TargetBatch]:
        """Batches of the targets in `bounds` (consecutive ranges), converted once per split."""
        key = tuple(bounds)
        got = self._parts.get(key)
        if got is None:
            got = [TargetBatch(self._targets[lo:hi]) for lo, hi in bounds]
            self._parts = {key: got}  # a reader splits its batch one way
        return got

    def __len__(self) -> int:
        return len(self._targets)

    def __getitem__(self, i):  # type: ignore[override]
        return self._targets[i]

    def __iter__(self) -> Iterator[Target]:
        return iter(self._targets)

    def __repr__(self) -> str:
        return f"TargetBatch({len(self._targets)} targets)"


class _Backend(Protocol):
    """What a Store needs from a backend: `_core._Store`, one class whichever side does the
    work — `_core._Store(...)` in this process (embedded, or over a Python object store such as
    the upstream adapter), `_core._Store.connect(PATH, ...)` a DummyClient of the node daemon,
    whose caches serve every process of the node (`remote` tells them apart). Arguments arrive
    normalized by Store."""

    remote: bool

    def put_sparse_object(self, *args: Any) -> dict: ...
    def put_sparse_objects(self, updates: list, num_threads: int) -> list: ...
    def manifest(self, generation: tuple[int, int]) -> list: ...
    def read_sparse_objects(self, manifest: list, targets: list, strategy: str,
                            read_coalesce_gap: int, num_threads: int, *,
                            generation: tuple[int, int] | None = None,
                            unchanged: list[str] | None = None,
                            view_in_place: bool | None = None) -> list: ...
    def step_manifest(self, generation: tuple[int, int]) -> tuple[list, list, bool]: ...
    def wait_generation(self, generation: tuple[int, int],
                        timeout: float) -> tuple[list, list, bool]: ...
    def seal_generation(self, generation: tuple[int, int], tensor_ids: list[str]) -> None: ...
    def latest_generation(self) -> tuple[int, int] | None: ...
    def set_retention(self, keep_last: int) -> None: ...
    def retention(self) -> int: ...
    def record_anchor(self, generation: tuple[int, int], tensor_ids: list[str]) -> None: ...
    def latest_anchor(self) -> tuple[int, int] | None: ...
    def set_keep_anchors(self, keep_anchors: int) -> None: ...
    def admit(self, tensor_id: str, generation: tuple[int, int], placement_policy: str | None,
              source_placement: dict, writer_id: str) -> bool: ...
    def admit_batch(self, items: list) -> list: ...
    def current_generation(self, tensor_id: str) -> tuple[int, int] | None: ...
    def metrics(self) -> dict: ...
    def reset_metrics(self) -> None: ...
    def clear_caches(self) -> None: ...
    def store_counters(self) -> dict: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def disconnect(self) -> None: ...
    def _object_store(self) -> Any: ...


class Manifest(list):
    """The manifest of a step or of a fold of steps: a list of SourceInfo, plus

    - ``generation``: the step (k - 1, k), or the fold (j, k);
    - ``sealed``: whether the step (the fold's last step) is sealed;
    - ``unchanged``: the tensor ids the seal lists that have no source here (their targets
      read as empty objects, which apply as no-ops)."""

    generation: tuple[int, int]
    sealed: bool
    unchanged: tuple[str, ...]

    @classmethod
    def _of(cls, generation: tuple[int, int], parts: tuple[list, list, bool]) -> Manifest:
        sources, unchanged, sealed = parts
        m = cls(sources)
        m.generation = generation
        m.sealed = bool(sealed)
        m.unchanged = tuple(unchanged)
        return m

    def __repr__(self) -> str:
        return (f"<Manifest {self.generation} sources={len(self)} "
                f"unchanged={len(self.unchanged)} sealed={self.sealed}>")


class Store(TensorMixin):
    """A handle on a store: the embedded one (connect()) or the node daemon
    (connect("unix:///PATH")). Both have the same methods and answers."""

    def __init__(
        self, *, node_id: str = "node0", capacity_bytes: int = 0, backend: _Backend | None = None,
        url: str | None = None, pinned_quota_bytes: int | None = None, upstream: Any = None,
        namespace: str = "",
    ) -> None:
        # Tensor objects (_tensor.py) and, on the embedded store, source objects each may pin
        # this much host memory; None: default_pinned_quota_bytes().
        self._pinned_quota_bytes = pinned_quota_bytes
        self.namespace = _str(namespace, "namespace")
        if backend is None:
            quota = default_pinned_quota_bytes() if pinned_quota_bytes is None else pinned_quota_bytes
            backend = _core._Store(node_id=node_id, capacity_bytes=capacity_bytes,
                                   name_space=self.namespace,
                                   pinned_quota_bytes=_int(quota, "pinned_quota_bytes", minimum=0))
        self._core: _Backend = backend
        self.url = url
        self._upstream = upstream  # mooncake://: the UpstreamObjectStore under the core

    @property
    def backend(self) -> _Backend:
        """The native backend (a `_core._Store`)."""
        return self._core

    @property
    def objects(self) -> Any:
        """The raw structured-object store under the sparse layer (put/get/stat/remove/list)."""
        return self._core._object_store()

    def capabilities(self) -> dict[str, Any]:
        """What this store can do here: backend, CUDA availability, pinned quota and use."""
        if not self._core.remote:
            kind = "embedded" if self._upstream is None else "mooncake"
            return {"backend": kind, **self._tensor_capabilities()}
        m = self._core.metrics()
        caps: dict[str, Any] = {"backend": "node", "url": self.url}
        # pinning_complete: the daemon pins and pre-faults its segments in the background;
        # until then pinned_bytes grows towards pinned_target_bytes (0 when it cannot pin).
        for key in ("cuda_available", "cuda_ipc_available", "pinning_complete"):
            caps[key] = bool(m.get(key, 0))
        for key in ("cuda_devices", "pinned_quota_bytes", "pinned_bytes", "pageable_bytes",
                    "pinned_target_bytes", "pin_failures", "prefaulted_bytes",
                    "prefault_target_bytes", "shm_segments", "shm_capacity_bytes"):
            caps[key] = int(m.get(key, 0))
        caps.update(self._core.hello())
        tensor_caps = self._tensor_capabilities()
        caps["cuda_ipc_available"] = tensor_caps["cuda_ipc_available"]  # both ends can
        caps["tensor_backend"] = tensor_caps["tensor_backend"]
        caps["cuda_detail"] = tensor_caps["cuda_detail"]
        return caps

    def close(self) -> None:
        """Drops the connection of a node-daemon store (its leases are released once no
        returned object uses them any more); a later call reconnects. No-op when embedded."""
        self._core.disconnect()

    @property
    def upstream(self) -> Any:
        """mooncake:// stores: the upstream adapter (its ``client`` is upstream's
        MooncakeDistributedStore, e.g. for upstream's own get_tensor); None otherwise."""
        return self._upstream

    def __repr__(self) -> str:
        return f"<mooncake.sparse.Store {self.url or 'embedded'}>"

    # -- commit side ---------------------------------------------------------------------------
    def put_sparse_object(
        self,
        tensor_id: str,
        global_shape: Sequence[int],
        indices: Any,
        values: Any,
        source_placement: Mapping[str, int] | None = None,
        placement_policy: str | None = None,
        generation: tuple[int, int] = (0, 1),
        apply: str = "overwrite",
        *,
        tile_shape: Sequence[int] | None = None,
        duplicates: str = "error",
        global_offset: Sequence[int] | None = None,
        local_shape: Sequence[int] | None = None,
        hard_pin: bool = True,
        num_threads: int = 0,
        return_info: bool = False,
    ) -> Any:
        """Validates, encodes (sort by tile, tile index, narrow indices, checksums) and commits
        ONE source object; returns its source_ref (or, with return_info=True, a dict with
        source_ref, created, nnz and bytes). Idempotent for an identical retry (created=False).

        Raises InvalidArgument, StaleGeneration, Conflict, ResourceExhausted; on error the
        store is unchanged."""
        if _gpu.is_cuda(indices) or _gpu.is_cuda(values):
            # e.g. from a GPU encode_update: a batch of one, whose members the store copies
            # from the device into pinned memory on the producing stream.
            if _core.HAS_GPU_CODEC:
                update = dict(tensor_id=tensor_id, global_shape=global_shape, indices=indices,
                              values=values, source_placement=source_placement,
                              placement_policy=placement_policy, generation=generation,
                              apply=apply, tile_shape=tile_shape, duplicates=duplicates,
                              global_offset=global_offset, local_shape=local_shape,
                              hard_pin=hard_pin, num_threads=num_threads)
                r = self.put_sparse_objects([update], num_threads=num_threads)[0]
                if isinstance(r, Error):
                    raise r
                return r if return_info else r["source_ref"]
            indices = _gpu.to_host(indices) if _gpu.is_cuda(indices) else indices
            values = _gpu.to_host(values) if _gpu.is_cuda(values) else values
        result = self._core.put_sparse_object(
            _str(tensor_id, "tensor_id"),
            _shape(global_shape, "global_shape"),
            as_core_array(indices),
            as_core_array(values),
            _placement(source_placement, "source_placement"),
            _str(placement_policy, "placement_policy", optional=True),
            _generation(generation),
            _str(apply, "apply"),
            _shape(tile_shape, "tile_shape", optional=True),
            _str(duplicates, "duplicates"),
            _shape(global_offset, "global_offset", optional=True),
            _shape(local_shape, "local_shape", optional=True),
            bool(hard_pin),
            _int(num_threads, "num_threads", minimum=0),
        )
        return result if return_info else result["source_ref"]

    def put_sparse_objects(self, updates: Iterable[Mapping[str, Any]], *,
                           num_threads: int = 0) -> list[dict[str, Any] | Error]:
        """Commits a batch of source objects (a step's updates) in one call: each update is a
        dict of put_sparse_object's keyword arguments (tensor_id, global_shape, indices,
        values required). Returns one entry per update, same order: the dict that
        put_sparse_object(..., return_info=True) returns, or the typed error (an Error instance,
        not raised) of an update that failed. A bad update fails alone and leaves nothing of
        itself behind; the others commit. Updates are validated and encoded in parallel
        (`num_threads`, 0: every hardware thread) and committed together."""
        import numpy as np

        batch: list[Any] = []
        on_device: list[Any] = []
        torch = sys.modules.get("torch")
        tensor = torch.Tensor if torch is not None else None
        capsule = getattr(getattr(torch, "_C", None), "_to_dlpack", None) if torch else None
        gpu = _core.HAS_GPU_CODEC
        ndarray = np.ndarray
        # A step commits tens of thousands of updates: the common members are told apart by
        # exact type, without the generic checks. numpy arrays go as they are; so do torch
        # tensors when this build has the GPU codec: the core takes them through torch's C++
        # exporter (CUDA members copied from the device on torch's current stream of theirs).
        direct = (ndarray, tensor) if gpu and tensor is not None else (ndarray,)
        torch_members = False
        for u in updates:
            if type(u) is dict:
                idx, vals = u.get("indices"), u.get("values")
                ti, tv = type(idx), type(vals)
                if ti in direct and tv in direct:
                    torch_members = torch_members or ti is tensor or tv is tensor
                    batch.append(u)
                    continue
                # Without the GPU codec, host tensors that need no detach go as they are too:
                # the copy below would hand the core the same objects.
                if ti is tensor and tv is tensor and tensor is not None \
                        and not idx.is_cuda and not vals.is_cuda \
                        and not idx.requires_grad and not vals.requires_grad:
                    batch.append(u)
                    continue
            elif not isinstance(u, Mapping):
                batch.append(u)  # the core names what is wrong with it
                continue
            # numpy arrays go as they are; anything else (torch) through as_core_array, in a
            # copy of the update (the caller's dict is never changed). CUDA members go as they
            # are: the store copies them all from the device in a few large copies (a batch
            # encoded on the GPU lies in one allocation).
            u = dict(u)
            for k in ("indices", "values"):
                if k not in u:
                    continue
                v = u[k]
                if type(v) is tensor:
                    if not v.is_cuda:
                        u[k] = v.detach() if v.requires_grad else v
                        continue
                    if not gpu:
                        u[k] = _gpu.to_host(v)
                        continue
                    if not v.is_contiguous():
                        v = v.contiguous()  # on its stream: the bytes move anyway
                    on_device.append(v)
                    # torch's C++ exporter (no Python checks) for what it exports as it is:
                    # conjugate and negative views go through as_core_array's checks
                    if capsule is not None and not v.is_complex() and not v.is_neg():
                        u[k] = capsule(v.detach() if v.requires_grad else v)
                    else:
                        u[k] = as_core_array(v)
                    continue
                if _gpu.is_cuda(v):
                    if not gpu:
                        v = _gpu.to_host(v)
                    else:
                        if tensor is not None and isinstance(v, tensor) and not v.is_contiguous():
                            v = v.contiguous()
                        on_device.append(v)
                        if capsule is not None and tensor is not None and isinstance(v, tensor) \
                                and not v.is_conj() and not v.is_neg():
                            v = capsule(v.detach())
                u[k] = as_core_array(v)
            batch.append(u)
        # The stream of the copies from the device: torch's current stream of the first CUDA
        # member's device (the core finds it where torch tensors went to it as they are).
        if on_device:
            stream = _gpu.stream_for_commit(on_device)
        else:
            stream = None if torch_members else 0
        raw = self._core.put_sparse_objects(batch, _int(num_threads, "num_threads", minimum=0),
                                            stream)
        return [r if isinstance(r, dict) else error_class(r[0])(r[1]) for r in raw]

    def put_sparse_updates(self, updates: Iterable[Mapping[str, Any]], *, threshold: float = 0.0,
                           parts: int = 1, num_threads: int = 0
                           ) -> tuple[list[dict[str, Any] | Error], list[tuple[Any, Any] | None]]:
        """Encodes and commits a step's updates in one call: each update is a dict of
        put_sparse_object's keyword arguments with `new` and `old` (the dense tensors, or the
        trainer's box of one at `global_offset`) in place of `indices` and `values`.

        Returns (results, coo), both one entry per update in order: results as
        put_sparse_objects returns them (the commit's dict, or the typed error of an update
        that failed alone), coo the update's (indices, values) as encode_updates returns them
        (global coordinates for a box), or None where the encode itself refused the pair.

        parts > 1 takes CUDA pairs on one device in that many consecutive parts: the GPU
        encodes part i + 1 on the current stream while part i is checked and copied into the
        store on a side stream. Measured on an H100 host (benchmarks/results/
        2026-12-05-h100-pipelined) a step in four parts took longer than in one, each part
        paying the batch's fixed costs again: one part is the default. Host pairs, and pairs of
        several devices, are encoded in one encode_updates and committed in one
        put_sparse_objects."""
        updates = updates if type(updates) is list else list(updates)
        parts = _int(parts, "parts", minimum=1)
        threshold = _real(threshold, "threshold")
        n = len(updates)
        # (The commit names what else is wrong with an update, in its result.)
        for i, u in enumerate(updates):
            if type(u) is not dict and not isinstance(u, Mapping):
                raise InvalidArgument(f"updates[{i}] is not a mapping")
            if "new" not in u or "old" not in u:
                raise InvalidArgument(f"updates[{i}] has no 'new' and 'old'")
            if "indices" in u or "values" in u:
                raise InvalidArgument(f"updates[{i}] has indices or values: put_sparse_updates "
                                      "encodes them from 'new' and 'old'")
        results: list[Any] = [None] * n
        coos: list[tuple[Any, Any] | None] = [None] * n
        if n == 0:
            return results, coos

        def encode(lo: int, hi: int) -> None:
            # Consecutive updates of one apply mode and tile shape encode together; a batch the
            # encode refuses is encoded update by update, so that a bad pair fails alone.
            i = lo
            while i < hi:
                key = (updates[i].get("apply", "overwrite"), updates[i].get("tile_shape"))
                j = i + 1
                while j < hi and (updates[j].get("apply", "overwrite"),
                                  updates[j].get("tile_shape")) == key:
                    j += 1
                pairs = [(updates[k]["new"], updates[k]["old"]) for k in range(i, j)]
                try:
                    got = encode_updates(pairs, apply=key[0], threshold=threshold,
                                         tile_shape=key[1])
                except Error:
                    if j - i == 1:
                        raise
                    got = []
                    for k in range(i, j):
                        try:
                            got += encode_updates([pairs[k - i]], apply=key[0],
                                                  threshold=threshold, tile_shape=key[1])
                        except Error as e:
                            got.append(e)
                for k, c in zip(range(i, j), got):
                    if isinstance(c, Error):
                        results[k] = c
                        continue
                    offset = updates[k].get("global_offset")
                    if offset is not None and any(int(o) for o in offset):
                        new = updates[k]["new"]
                        c = (_offset_indices(c[0], _shape(offset, "global_offset"),
                                             tuple(int(e) for e in new.shape)), c[1])
                    coos[k] = c
                i = j

        def commit(lo: int, hi: int) -> None:
            todo = [k for k in range(lo, hi) if coos[k] is not None]
            batch = []
            for k in todo:
                u = dict(updates[k])  # the caller's dict is never changed
                del u["new"], u["old"]
                u["indices"], u["values"] = coos[k]
                batch.append(u)
            if not batch:
                return
            for k, r in zip(todo, self.put_sparse_objects(batch, num_threads=num_threads)):
                results[k] = r

        def single_encode(k: int) -> None:
            try:
                encode(k, k + 1)
            except Error as e:
                results[k] = e

        bounds = _pipeline_parts(updates, parts)
        if len(bounds) < 2:
            try:
                encode(0, n)
            except Error:
                for k in range(n):
                    single_encode(k)
            commit(0, n)
            return results, coos
        import concurrent.futures

        import torch
        device = updates[0]["new"].device
        current = torch.cuda.current_stream(device)
        side = _gpu.side_stream(device)

        def commit_on_side(lo: int, hi: int) -> None:
            with torch.cuda.stream(side):
                commit(lo, hi)

        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mcs-commit") as pool:
            pending: list[Any] = []
            try:
                for lo, hi in bounds:
                    try:
                        encode(lo, hi)
                    except Error:
                        for k in range(lo, hi):
                            single_encode(k)
                    # The part's commit waits on the GPU for its encode only; the next part's
                    # encode goes on while it runs.
                    side.wait_stream(current)
                    pending.append(pool.submit(commit_on_side, lo, hi))
            finally:
                concurrent.futures.wait(pending)
        for f in pending:
            f.result()
        # Anything the caller queues next on its stream comes after the commits' kernels.
        current.wait_stream(side)
        return results, coos

    def admit(
        self,
        tensor_id: str,
        generation: tuple[int, int],
        placement_policy: str | None,
        source_placement: Mapping[str, int] | None,
        writer_id: str,
    ) -> bool:
        """Single-owner admission: exactly one writer of a logical key gets True."""
        return self._core.admit(
            _str(tensor_id, "tensor_id"), _generation(generation),
            _str(placement_policy, "placement_policy", optional=True),
            _placement(source_placement, "source_placement"), _str(writer_id, "writer_id")
        )

    def admit_batch(self, items: Iterable[Mapping[str, Any]]) -> list[bool | Error]:
        """admit() of every item (a dict of admit's keyword arguments: tensor_id, generation,
        writer_id required; placement_policy, source_placement optional) in one call (through
        the node daemon, one request): per item in order, True when this writer got the key,
        False when another writer holds it, or the item's typed error (an Error instance, not
        raised) when its arguments are bad."""
        batch = []
        for i, it in enumerate(items):
            if type(it) is not dict and not isinstance(it, Mapping):
                raise InvalidArgument(f"items[{i}] is not a mapping")
            if not it.keys() <= _ADMIT_KEYS:
                unknown = sorted(set(it) - _ADMIT_KEYS)
                raise InvalidArgument(f"items[{i}] has unknown keys {unknown}")
            try:
                batch.append((it["tensor_id"], it["generation"], it.get("placement_policy"),
                              it.get("source_placement"), it["writer_id"]))
            except KeyError as e:
                raise InvalidArgument(f"items[{i}] has no {e.args[0]!r}") from None
        raw = self._core.admit_batch(batch)
        return [r if isinstance(r, bool) else error_class(r[0])(r[1]) for r in raw]

    def current_generation(self, tensor_id: str) -> tuple[int, int] | None:
        return self._core.current_generation(_str(tensor_id, "tensor_id"))

    def manifest(self, generation: tuple[int, int]) -> Manifest:
        """The manifest of a step (every source object committed for it; a sealed step also
        names the tensors it left unchanged), or, for (j, k) with k > j + 1, the fold of the
        sealed steps j+1..k: reading it gives per target the latest value of every coordinate
        the steps changed (overwrite) or their sum (scatter_add). A fold reaching past
        retention raises NotFound."""
        return Manifest._of(_generation(generation),
                            self._core.step_manifest(_generation(generation)))

    # -- steps of a training run (docs/design.md §9) ------------------------------------------
    def seal_generation(self, generation: tuple[int, int], tensor_ids: Iterable[str]) -> None:
        """Seals step k = generation (k - 1, k): `tensor_ids` is the model's complete list of
        tensors; those with no source committed for the step are unchanged (their targets read
        as empty objects). Call once per step, from one writer, after every admitted writer has
        committed. Raises FailedPrecondition (sealed already, or an admitted writer has not
        committed) and InvalidArgument (a committed tensor missing from the list). Then frees
        what retention no longer keeps."""
        if isinstance(tensor_ids, (str, bytes)):
            raise InvalidArgument("tensor_ids must be a list of tensor ids, not one string")
        ids = [_str(t, "tensor id") for t in tensor_ids]
        self._core.seal_generation(_generation(generation), ids)

    def wait_generation(self, generation: tuple[int, int],
                        timeout: float | None = None) -> Manifest:
        """Blocks until the step (or the last step of a fold) is sealed and returns its
        manifest. timeout: seconds (None waits for ever); past it, raises DeadlineExceeded
        (also a TimeoutError)."""
        t = -1.0 if timeout is None else _seconds(timeout, "timeout", allow_zero=True)
        g = _generation(generation)
        return Manifest._of(g, self._core.wait_generation(g, t))

    def latest_generation(self) -> tuple[int, int] | None:
        """The newest sealed step, or None."""
        return self._core.latest_generation()

    def set_retention(self, keep_last: int, *, keep_anchors: int | None = None) -> None:
        """Keeps the last `keep_last` sealed steps (0 keeps every step) and frees older ones:
        their source objects, manifests and cached ranges. A step a reader holds a lease on
        (a read in progress) is never freed: raises FailedPrecondition, changing nothing, when
        the new retention would free one now. keep_anchors: how many of the newest anchors
        to keep (default 1)."""
        self._core.set_retention(_int(keep_last, "keep_last", minimum=0))
        if keep_anchors is not None:
            self._core.set_keep_anchors(_int(keep_anchors, "keep_anchors", minimum=1))

    def retention(self) -> int:
        """The retention in force (0: every step is kept)."""
        return self._core.retention()

    # -- anchors: full weights of a step, read by box -----------------------------------------
    def put_anchor(self, generation: tuple[int, int], tensors: Mapping[str, Any]) -> None:
        """Stores the full weights of sealed step `generation` as tensor objects (upstream's
        tensor format; CPU or CUDA tensors, as put_tensor takes them), one per tensor id, and
        records the anchor. A reader past retention, or starting up, reads its own box of the
        newest anchor (read_anchor) and then the fold from the anchor's step. Retention keeps
        the newest `keep_anchors` anchors (set_retention). Raises NotFound (the step is not
        sealed) and FailedPrecondition (the step has an anchor already)."""
        g = _generation(generation)
        if not isinstance(tensors, Mapping) or not tensors:
            raise InvalidArgument("tensors must be a non-empty mapping of tensor id -> tensor")
        ids = [_str(t, "tensor id") for t in tensors]
        keys = [_core.anchor_key(self.namespace, g, t) for t in ids]
        try:
            self.batch_put_tensor(keys, list(tensors.values()))  # all or nothing
        except Conflict:
            raise FailedPrecondition(f"step {g} has an anchor already") from None
        try:
            self._core.record_anchor(g, ids)
        except BaseException:
            for k in keys:  # an anchor that is not recorded leaves nothing behind
                try:
                    self.objects.remove(k)
                except NotFound:
                    pass
            raise

    def latest_anchor(self) -> tuple[int, int] | None:
        """The newest step with an anchor, or None."""
        return self._core.latest_anchor()

    def read_anchor(self, generation: tuple[int, int], targets: Iterable[Target],
                    destinations: Sequence[Any]) -> None:
        """Reads each target's box of the anchor of `generation` straight into its destination
        (CPU or CUDA, any strides; shape = the target's local_shape): a dense box read, only
        the box's bytes. Then read the fold (anchor step, newest) to catch up."""
        g = _generation(generation)
        ts = _targets(targets)
        dests = list(destinations)
        if len(dests) != len(ts):
            raise InvalidArgument(f"{len(ts)} targets but {len(dests)} destinations")
        keys = [_core.anchor_key(self.namespace, g, t.tensor_id) for t in ts]
        self.batch_get_tensor_into(keys, dests, global_offsets=[t.global_offset for t in ts])

    # -- read side -----------------------------------------------------------------------------
    def read_sparse_objects(
        self,
        manifest: Sequence[SourceInfo],
        targets: Iterable[Target],
        *,
        strategy: str = "sparse",
        read_coalesce_gap: int = -1,
        num_threads: int = 0,
        device: Any = None,
        view_in_place: bool | None = None,
    ) -> list[Any]:
        """One target-local object per target, same order (docs/design.md §4 steps 1-8).
        targets: Targets, or a TargetBatch of them (converted once for every read of a run).
        strategy="full_source" is the baseline that GETs complete sources per target.
        device="cuda" / "cuda:N": the objects' indices and values are copied into that GPU's
        memory (DeviceSparseObject), ready for apply_sparse_object on CUDA weights.
        view_in_place=True (the embedded store): targets are built straight from the stored
        bytes, without copying the planned ranges out first and without the node range cache
        (range_cache_hits stays 0; range_gets counts the ranges viewed, per call). Through the
        node daemon its --read_in_place setting decides (passing it raises InvalidArgument);
        a mooncake:// store ignores it. A device read on the embedded store views in place
        unless view_in_place=False, and is built on the GPU: each unique range is copied into
        device memory once (read straight from the store's page-locked memory by the GPU when
        the store is pinned), then every target is filtered and rebased there. Through the
        node daemon a device read is built on the GPU too: the daemon plans it, and copies
        each unique range once from its segments into this process's GPU memory (CUDA IPC;
        without it, through this process's read-only mapping of the segments); such objects
        carry no tile index (num_tiles 0: apply needs none) and their host members cannot be
        read (their indices and values are device arrays)."""
        if view_in_place is not None and not isinstance(view_in_place, bool):
            raise InvalidArgument(f"view_in_place must be a bool or None, got {view_in_place!r}")
        embedded = self.url is None and self._upstream is None
        if device is not None and view_in_place is None and embedded:
            view_in_place = True
        step = manifest if isinstance(manifest, Manifest) else None
        sources, ts = _manifest(manifest), _read_targets(targets)
        strategy = _str(strategy, "strategy")
        read_coalesce_gap = _int(read_coalesce_gap, "read_coalesce_gap", minimum=-1)
        num_threads = _int(num_threads, "num_threads", minimum=0)
        generation = None if step is None else step.generation
        unchanged = [] if step is None else list(step.unchanged)
        node = bool(self._core.remote)
        if (device is not None and strategy == "sparse"
                and ((embedded and view_in_place) or (node and view_in_place is None))):
            # Planned here (by the node daemon, which then copies the ranges into this
            # process's GPU memory itself), filtered and rebased on the GPU (None: a fold,
            # which is merged on the host, or a daemon that cannot hand out its ranges).
            objs = _gpu.read_on_device(self._core, sources, ts, strategy, read_coalesce_gap,
                                       num_threads, generation, unchanged, device)
            if objs is not None:
                return objs
        objs = self._core.read_sparse_objects(
            sources, ts, strategy, read_coalesce_gap, num_threads,
            generation=generation, unchanged=unchanged, view_in_place=view_in_place,
        )
        return objs if device is None else _gpu.upload(objs, device, self._core)

    def apply_sparse_updates(self, manifest: Sequence[SourceInfo], targets: Iterable[Target],
                             weights: Sequence[Any], *, parts: int = 1,
                             strategy: str = "sparse", num_threads: int = 0) -> list[int]:
        """Reads the targets' objects of a step and applies them into `weights` (one per target,
        of its local shape, possibly strided views of larger engine tensors): what
        read_sparse_objects then apply_sparse_objects do, in one call. Returns the entries
        applied per target.

        CUDA weights on one device are read on the GPU (read_sparse_objects(device=...)).
        parts > 1 reads them in that many consecutive parts: part i + 1 is read, its ranges
        copied into device memory on a side stream, while part i applies on the current stream
        (measured slower than one part on an H100 host, as put_sparse_updates' parts). Every
        weight's shape is checked before anything is applied. An error once a part has been
        applied (the store lost mid-call) leaves the parts before it at the new step: overwrite
        is idempotent, so applying the step again completes it; a step whose sources
        scatter_add is read in one part."""
        ts = targets if isinstance(targets, TargetBatch) else list(targets)
        weights = weights if type(weights) is list else list(weights)
        parts = _int(parts, "parts", minimum=1)
        if len(weights) != len(ts):
            raise InvalidArgument(f"{len(weights)} weights but {len(ts)} targets")
        device = _one_cuda_device(weights)
        n = len(ts)
        if device is None or n == 0:
            objs = self.read_sparse_objects(manifest, ts, strategy=strategy,
                                            num_threads=num_threads)
            apply_sparse_objects(weights, objs, num_threads=num_threads)
            return [int(o.nnz) for o in objs]
        if parts > 1 and any(s.apply != "overwrite" for s in _manifest(manifest)):
            parts = 1  # not idempotent: one part, all or nothing
        parts = min(parts, n)
        bounds = [(n * p // parts, n * (p + 1) // parts) for p in range(parts)]
        if len(bounds) == 1:
            objs = self.read_sparse_objects(manifest, ts, strategy=strategy,
                                            num_threads=num_threads, device=device)
            apply_sparse_objects(weights, objs)
            return [int(o.nnz) for o in objs]
        # Every shape before the first part applies (one part's apply checks its own).
        for i, (t, w) in enumerate(zip(ts, weights)):
            if not isinstance(t, Target):
                raise InvalidArgument(f"targets[{i}] is not a Target")
            if w.shape != t.local_shape and tuple(w.shape) != tuple(t.local_shape):
                raise InvalidArgument(f"weights[{i}] shape {tuple(w.shape)} != target "
                                      f"{t.target_id!r} local shape {tuple(t.local_shape)}")
        import torch
        current = torch.cuda.current_stream(device)
        side = _gpu.side_stream(device)
        pieces = ts._split(bounds) if isinstance(ts, TargetBatch) else [
            ts[lo:hi] for lo, hi in bounds]
        kept: list[Any] = []  # every part's objects, alive until the side stream is ordered
        nnz: list[int] = []
        try:
            side.wait_stream(current)  # the weights as the caller left them
            for (lo, hi), piece in zip(bounds, pieces):
                with torch.cuda.stream(side):
                    objs = self.read_sparse_objects(manifest, piece, strategy=strategy,
                                                    num_threads=num_threads, device=device)
                current.wait_stream(side)
                apply_sparse_objects(weights[lo:hi], objs)
                kept.append(objs)
                nnz += [int(o.nnz) for o in objs]
        finally:
            # The parts' device memory is freed on the side stream: after the applies.
            side.wait_stream(current)
            del kept
        return nnz

    def metrics(self) -> dict[str, float]:
        """The §4 counters (source_objects_put, range_gets, full_gets, ...)."""
        return self._core.metrics()

    def reset_metrics(self) -> None:
        self._core.reset_metrics()

    def clear_caches(self) -> None:
        """Drops the node-local tile-index and range caches and the manifests kept of sealed
        steps (the daemon's, for a node store)."""
        self._core.clear_caches()

    def store_counters(self) -> dict[str, int]:
        return self._core.store_counters()

    def list_keys(self, prefix: str = "") -> list[str]:
        return self._core.list_keys(_str(prefix, "prefix"))

    # Module-level helpers, also reachable from a handle.
    @staticmethod
    def apply_sparse_object(weight: Any, obj: SparseObject, *, num_threads: int = 0) -> None:
        apply_sparse_object(weight, obj, num_threads=num_threads)

    @staticmethod
    def encode_update(new: Any, old: Any, **kwargs: Any) -> tuple[Any, Any]:
        return encode_update(new, old, **kwargs)


_ADMIT_KEYS = frozenset({"tensor_id", "generation", "placement_policy", "source_placement",
                         "writer_id"})


def _one_cuda_device(weights: list) -> Any:
    """The torch device of `weights` when every one is a torch CUDA tensor on that device (and
    this build has the GPU codec), else None."""
    torch = sys.modules.get("torch")
    if not weights or torch is None or not _core.HAS_GPU_CODEC:
        return None
    tensor = torch.Tensor
    device = None
    for w in weights:
        if not isinstance(w, tensor) or not w.is_cuda:
            return None
        if device is None:
            device = w.device
        elif w.device != device:
            return None
    return device


def _pipeline_parts(updates: list, parts: int) -> list[tuple[int, int]]:
    """put_sparse_updates' parts: `parts` consecutive ranges of updates of about equal dense
    bytes, or one range unless every pair is a torch CUDA tensor pair on one device (and this
    build has the GPU codec)."""
    n = len(updates)
    if parts == 1 or not _core.HAS_GPU_CODEC or sys.modules.get("torch") is None:
        return [(0, n)]
    tensor = sys.modules["torch"].Tensor
    sizes = []
    device = None
    for u in updates:
        new, old = u["new"], u["old"]
        if not (isinstance(new, tensor) and isinstance(old, tensor) and new.is_cuda
                and old.is_cuda):
            return [(0, n)]
        if device is None:
            device = new.device
        if new.device != device or old.device != device:
            return [(0, n)]
        sizes.append(new.numel() * new.element_size())
    return _split_by_bytes(sizes, parts)


def _split_by_bytes(sizes: list[int], parts: int) -> list[tuple[int, int]]:
    """At most `parts` consecutive, non-empty ranges of items covering all of them, each ending
    at the first item where the running total reaches its share of the whole."""
    n, total = len(sizes), sum(sizes)
    parts = min(parts, n)
    if parts < 2:
        return [(0, n)]
    bounds, lo, acc = [], 0, 0
    for k, b in enumerate(sizes):
        acc += b
        if len(bounds) < parts - 1 and acc * parts >= total * (len(bounds) + 1) and k + 1 < n:
            bounds.append((lo, k + 1))
            lo = k + 1
    bounds.append((lo, n))
    return bounds


def _int(value: Any, what: str, *, minimum: int | None = None) -> int:
    """An integer argument, exactly: int() would also take 0.9 (-> 0) and "1" (-> 1)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgument(f"{what} must be an int, got {value!r}")
    out = operator.index(value)
    if minimum is not None and out < minimum:
        raise InvalidArgument(f"{what} must be >= {minimum}, got {out}")
    return out


def _real(value: Any, what: str) -> float:
    """A real-number argument, exactly: float() would also take the str "0.5"."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{what} must be a real number, got {value!r}")
    return float(value)


def _generation(g: Any) -> tuple[int, int]:
    """(base, delta) of non-negative ints that fit uint64."""
    if isinstance(g, (str, bytes)) or not isinstance(g, Sequence) or len(g) != 2:
        raise InvalidArgument(f"generation must be a (base, delta) pair of ints, got {g!r}")
    base, delta = (_int(e, "generation", minimum=0) for e in g)
    if max(base, delta) >= 1 << 64:
        raise InvalidArgument(f"generation {g!r} does not fit in 64 bits")
    return base, delta


def _str(value: Any, what: str, *, optional: bool = False) -> str | None:
    """A str argument, exactly: str() would make None into the id "None"."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {value!r}")
    return value


def _shape(value: Any, what: str, *, optional: bool = False) -> tuple[int, ...] | None:
    """A shape-like argument: a sequence of ints (not a bare int, str or None)."""
    if value is None and optional:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidArgument(f"{what} must be a sequence of ints, got {value!r}")
    return tuple(_int(e, what) for e in value)


def _manifest(manifest: Any) -> list[SourceInfo]:
    if manifest is None or isinstance(manifest, (str, bytes)) or not hasattr(manifest, "__iter__"):
        raise InvalidArgument(
            f"manifest must be a list of SourceInfo (from store.manifest()), got {manifest!r}")
    # Each entry is checked to be a SourceInfo by the core, which reads the list.
    return list(manifest)


def _placement(value: Any, what: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{what} must be a dict of axis name -> ordinal, got {value!r}")
    return {_str(k, f"{what} axis"): _int(v, f"{what}[{k!r}]") for k, v in value.items()}


def _targets(targets: Any) -> list[Any]:
    if targets is None or isinstance(targets, (str, bytes)) or not hasattr(targets, "__iter__"):
        raise InvalidArgument(f"targets must be an iterable of Target, got {targets!r}")
    return list(targets)


def _read_targets(targets: Any) -> Any:
    """A read's targets as the binding takes them: a TargetBatch's converted ones, or a list."""
    return targets._core if isinstance(targets, TargetBatch) else _targets(targets)


# Longest timeout taken (about 31 years): beyond it the milliseconds would not fit int64.
_MAX_SECONDS = 1e9


def _seconds(value: Any, what: str, *, allow_zero: bool) -> float:
    """A duration in seconds: a finite real number, > 0 (or >= 0 with allow_zero)."""
    out = _real(value, what)
    if not math.isfinite(out) or out < 0 or (out == 0 and not allow_zero) or out > _MAX_SECONDS:
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(f"{what} must be a finite number of seconds {bound} "
                              f"(at most {_MAX_SECONDS:g}), got {value!r}")
    return out


_default_lock = threading.Lock()
_default: Store | None = None


def default_store() -> Store:
    """The process-wide embedded store behind the module-level functions."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Store()
        return _default


def connect(url: str | None = None, **kwargs: Any) -> Store:
    """A store handle.

    - None: a new embedded store (in-process, no daemon, no network); kwargs node_id,
      capacity_bytes.
    - "unix:///PATH": the node daemon (mooncake_sparse_node) listening at PATH ("unix://":
      at its default path, mooncake.sparse.node.default_socket_path()); kwargs
      connect_timeout and call_timeout (seconds), client_name, initial_buffer_bytes,
      planned_read_targets (the most targets a read's plan asks the daemon for in one request,
      default 16384; a device read of more is read in groups of at most as many), reply_spin (seconds any call polls for its reply before sleeping; default 0.0002; a
      tensor call polls longer, for as long as its bytes take at 8 GB/s) and reply_spin_max
      (the most seconds a call polls; 0 never polls; default 0.02). Raises
      Unavailable when no daemon runs there. A call that loses the daemon raises Unavailable
      and the next call reconnects (e.g. to a restarted daemon).
    - "mooncake://HOST:PORT?protocol=tcp&metadata=URL&local_hostname=H&segment_bytes=N":
      upstream Mooncake Store (its mooncake_master at HOST:PORT, a client of its own in this
      process that contributes segment_bytes of memory, default 512 MiB); the same options are
      accepted as kwargs. Needs the mooncake-transfer-engine wheel. See docs/multi_node.md.

    namespace="NAME" (any URL): keeps this run's tensor ids, steps, seals and retention apart
    from other runs sharing the store (letters, digits, '_', '.', '-'; default "")."""
    namespace = _str(kwargs.pop("namespace", ""), "namespace")
    if url is None or url in ("", "embedded", "embedded://"):
        return Store(namespace=namespace, **kwargs)
    if url.startswith("unix://"):
        path = url[len("unix://"):]
        if not path:
            from .node import default_socket_path

            path = default_socket_path()  # where mooncake_sparse_node listens by default
        unknown = set(kwargs) - {"connect_timeout", "call_timeout", "client_name",
                                 "initial_buffer_bytes", "reply_spin_max", "reply_spin",
                                 "planned_read_targets"}
        if unknown:
            raise InvalidArgument(f"unknown option(s) for a node store: {sorted(unknown)}")
        kwargs.setdefault("client_name", f"pid {os.getpid()}")
        for key in ("connect_timeout", "call_timeout"):
            if key in kwargs:
                kwargs[key] = _seconds(kwargs[key], key, allow_zero=False)
        for key in ("reply_spin_max", "reply_spin"):
            if kwargs.get(key) is not None:
                kwargs[key] = _seconds(kwargs[key], key, allow_zero=True)
        if "initial_buffer_bytes" in kwargs:
            kwargs["initial_buffer_bytes"] = _int(kwargs["initial_buffer_bytes"],
                                                  "initial_buffer_bytes", minimum=0)
        if "planned_read_targets" in kwargs:
            kwargs["planned_read_targets"] = _int(kwargs["planned_read_targets"],
                                                  "planned_read_targets", minimum=1)
            if kwargs["planned_read_targets"] > 1 << 20:  # the protocol's items per list
                raise InvalidArgument("planned_read_targets must be <= 1048576, got "
                                      f"{kwargs['planned_read_targets']}")
        kwargs["client_name"] = _str(kwargs["client_name"], "client_name")
        return Store(backend=_core._Store.connect(path, name_space=namespace, **kwargs),
                     url=url, namespace=namespace)
    if url.startswith("mooncake://"):
        from ._upstream import UpstreamObjectStore, parse_mooncake_url
        config = parse_mooncake_url(url, **kwargs)
        objects = UpstreamObjectStore.connect(config)
        return Store(backend=_core._Store(node_id=config.node_id, object_store=objects,
                                          name_space=namespace),
                     url=url, upstream=objects, namespace=namespace)
    raise InvalidArgument(f"unknown store URL {url!r} (expected None, unix:///PATH or mooncake://HOST:PORT)")


def encode_update(
    new: Any,
    old: Any,
    *,
    apply: str = "overwrite",
    threshold: float = 0.0,
    tile_shape: Sequence[int] | None = None,
    num_threads: int = 0,
    global_offset: Sequence[int] | None = None,
) -> tuple[Any, Any]:
    """Dense (new, old) -> global COO (indices [nnz, ndim] narrowest unsigned dtype, values).

    overwrite: coordinates whose bits differ, with the new values (bit-exact);
    scatter_add: new - old where |new - old| > threshold. The result is already sorted by tile,
    so put_sparse_object takes it without sorting. CUDA tensors (2-D bf16/fp16/fp32) are
    encoded on the GPU and the result stays there (torch CUDA tensors).

    global_offset: (new, old) are one box of a larger tensor (a trainer's shard) starting at
    this offset; the indices come back in the larger tensor's coordinates, ready for
    put_sparse_object(..., global_offset=global_offset, local_shape=new.shape)."""
    offset = _shape(global_offset, "global_offset", optional=True)
    shape: tuple[int, ...] = ()
    if offset is not None:
        import numpy as np

        shape = tuple(int(s) for s in new.shape) if hasattr(new, "shape") else np.shape(new)
        if len(offset) != len(shape):
            raise InvalidArgument(f"global_offset {offset} has {len(offset)} dims; the tensors "
                                  f"have {len(shape)}")
        if min(offset, default=0) < 0:
            raise InvalidArgument(f"global_offset {offset} must be >= 0")
    if _gpu.is_cuda(new):
        idx, vals = _gpu.encode_update_gpu(new, old, _str(apply, "apply"),
                                           _real(threshold, "threshold"), tile_shape)
        return _offset_indices(idx, offset, shape), vals
    idx, vals, dtype_name = _core.encode_update(
        as_core_array(new),
        as_core_array(old),
        _str(apply, "apply"),
        _real(threshold, "threshold"),
        _shape(tile_shape, "tile_shape", optional=True),
        _int(num_threads, "num_threads", minimum=0),
    )
    idx, vals = _host_coo_out(idx, values_out(vals, dtype_name), new)
    return _offset_indices(idx, offset, shape), vals


def _offset_indices(idx: Any, offset: tuple[int, ...] | None, shape: Sequence[int]) -> Any:
    """Local COO indices + a box offset, in the narrowest unsigned dtype that holds the global
    coordinates (numpy), or int64 (torch: its unsigned types lack arithmetic)."""
    if offset is None or not any(offset):
        return idx
    bound = max((int(s) + o for s, o in zip(shape, offset)), default=0)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(idx, torch.Tensor):
        return idx.to(torch.int64) + torch.tensor(offset, dtype=torch.int64, device=idx.device)
    import numpy as np

    dtype = next(t for t in (np.uint16, np.uint32, np.uint64) if bound <= np.iinfo(t).max + 1)
    return np.asarray(idx).astype(dtype) + np.asarray(offset, dtype=dtype)


def apply_sparse_objects(weights: Sequence[Any], objs: Sequence[SparseObject], *,
                         num_threads: int = 0) -> None:
    """Applies a step's target objects to their weights in one call: objs[i] to weights[i]
    (each as apply_sparse_object; weights may be strided views of larger tensors). Host weights
    apply side by side on up to `num_threads` threads (0: every hardware thread); weights that
    share memory apply in list order. CUDA weights apply on the GPU. Shapes are checked for
    every host pair before any host weight is written; a pair that fails in its apply (say, a
    dtype mismatch) leaves its weight unchanged, and its error is raised once the others are
    applied."""
    weights = weights if type(weights) is list else list(weights)
    objs = objs if type(objs) is list else list(objs)
    if len(weights) != len(objs):
        raise InvalidArgument(f"{len(weights)} weights but {len(objs)} objects")
    if weights and _core.HAS_GPU_CODEC and sys.modules.get("torch") is not None:
        # A rank's step: torch CUDA weights of one device and objects of a device read, taken
        # by the core in one pass (anything else: the general path below).
        dests, streams, device = _core._torch_prepare(weights, True)
        if device >= 0 and _core._gpu_apply_objects(dests, objs, streams[0]):
            return
    cuda = [i for i, w in enumerate(weights) if _gpu.is_cuda(w)]
    for i in cuda:
        if not isinstance(objs[i], (SparseObject, _gpu.DeviceSparseObject)):
            raise InvalidArgument(f"objs[{i}] must be a SparseObject (from read_sparse_objects), "
                                  f"got {objs[i]!r}")
    if cuda:
        _gpu.apply_gpu_batch([weights[i] for i in cuda], [objs[i] for i in cuda])
    if len(cuda) == len(weights):
        return
    on_gpu = set(cuda)
    host = [i for i in range(len(weights)) if i not in on_gpu]
    host_objs = [objs[i]._host if isinstance(objs[i], _gpu.DeviceSparseObject) else objs[i]
                 for i in host]
    _core.apply_sparse_objects([as_core_array(weights[i]) for i in host], host_objs,
                               _int(num_threads, "num_threads", minimum=0))


def encode_updates(
    pairs: Iterable[tuple[Any, Any]],
    *,
    apply: str = "overwrite",
    threshold: float = 0.0,
    tile_shape: Sequence[int] | None = None,
    num_threads: int = 0,
) -> list[tuple[Any, Any]]:
    """encode_update for a step's tensors in one call: one (indices, values) per (new, old)
    pair, same order. Host pairs encode side by side on up to `num_threads` threads (0: every
    hardware thread); CUDA pairs encode on the GPU. With torch inputs, indices and values come
    back as torch tensors."""
    pairs = pairs if type(pairs) is list else list(pairs)
    if pairs and _core.HAS_GPU_CODEC and sys.modules.get("torch") is not None:
        # A step's torch CUDA pairs on one device, taken by the core in one pass each side
        # (anything else: the general path below).
        try:
            news = [new for new, _ in pairs]
            olds = [old for _, old in pairs]
        except (TypeError, ValueError):
            news = olds = None
        if news is not None:
            new_objs, streams, device = _core._torch_prepare(news, False)
            if device >= 0:
                old_objs, _, old_device = _core._torch_prepare(olds, False)
                if old_device == device:
                    return _gpu.encode_prepared(new_objs, old_objs, streams[0],
                                                _str(apply, "apply"),
                                                _real(threshold, "threshold"), tile_shape)
    pairs = [tuple(p) for p in pairs]
    for i, p in enumerate(pairs):
        if len(p) != 2:
            raise InvalidArgument(f"pairs[{i}] is not a (new, old) pair")
    out: list[Any] = [None] * len(pairs)
    host = [i for i, (new, _) in enumerate(pairs) if not _gpu.is_cuda(new)]
    if len(host) < len(pairs):
        on_gpu = [i for i, (new, _) in enumerate(pairs) if _gpu.is_cuda(new)]
        encoded = _gpu.encode_updates_gpu([pairs[i] for i in on_gpu], _str(apply, "apply"),
                                          _real(threshold, "threshold"), tile_shape)
        for i, coo in zip(on_gpu, encoded):
            out[i] = coo
    if host:
        raw = _core.encode_updates([as_core_array(pairs[i][0]) for i in host],
                                   [as_core_array(pairs[i][1]) for i in host],
                                   _str(apply, "apply"), _real(threshold, "threshold"),
                                   _shape(tile_shape, "tile_shape", optional=True),
                                   _int(num_threads, "num_threads", minimum=0))
        for i, (idx, vals, dtype_name) in zip(host, raw):
            out[i] = _host_coo_out(idx, values_out(vals, dtype_name), pairs[i][0])
    return out


def _host_coo_out(idx: Any, vals: Any, like: Any) -> tuple[Any, Any]:
    """A host COO as the caller's arrays are: torch tensors for torch inputs (no copy), else
    numpy arrays."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        if not isinstance(idx, torch.Tensor):
            idx = torch.from_numpy(idx)
        if not isinstance(vals, torch.Tensor):
            vals = torch.from_numpy(vals)
    return idx, vals


def apply_sparse_object(weight: Any, obj: SparseObject, *, num_threads: int = 0) -> None:
    """Applies a target-local object to `weight` in place (numpy array or torch tensor of the
    object's local shape and value dtype): W[idx] = v (overwrite, bit-exact) or W[idx] += v
    (scatter_add). A CUDA weight is updated on the GPU, on its current stream; `obj` may then
    also be a DeviceSparseObject (read_sparse_objects(..., device=...))."""
    if not isinstance(obj, (SparseObject, _gpu.DeviceSparseObject)):
        raise InvalidArgument(f"obj must be a SparseObject (from read_sparse_objects), got {obj!r}")
    if _gpu.is_cuda(weight):
        _gpu.apply_gpu(weight, obj)
        return
    if isinstance(obj, _gpu.DeviceSparseObject):
        obj = obj._host
    _core.apply_sparse_object(as_core_array(weight), obj, _int(num_threads, "num_threads",
                                                                 minimum=0))


def default_tile_shape(shape: Sequence[int]) -> tuple[int, ...]:
    return _core.default_tile_shape(tuple(shape))
