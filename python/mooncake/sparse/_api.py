"""The public Python API of mooncake.sparse (docs/design.md §8)."""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Iterable, Mapping, Protocol, Sequence

from . import _core
from ._arrays import as_core_array, values_out
from ._errors import InvalidArgument, Unimplemented
from ._tensor import TensorMixin
from . import _gpu

__all__ = [
    "Target",
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


class _Backend(Protocol):
    """What a Store needs from a backend. Two implement it in the native core: `_core._Store`
    (embedded: everything in this process) and `_core._NodeStore` (a DummyClient of the node
    daemon, whose caches serve every process of the node). Arguments arrive normalized by Store."""

    def put_sparse_object(self, *args: Any) -> dict: ...
    def manifest(self, generation: tuple[int, int]) -> list: ...
    def read_sparse_objects(self, manifest: list, targets: list, strategy: str,
                            read_coalesce_gap: int, num_threads: int) -> list: ...
    def admit(self, tensor_id: str, generation: tuple[int, int], placement_policy: str | None,
              source_placement: dict, writer_id: str) -> bool: ...
    def current_generation(self, tensor_id: str) -> tuple[int, int] | None: ...
    def metrics(self) -> dict: ...
    def reset_metrics(self) -> None: ...
    def clear_caches(self) -> None: ...
    def store_counters(self) -> dict: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def _object_store(self) -> Any: ...


class Store(TensorMixin):
    """A handle on a store: the embedded one (connect()) or the node daemon
    (connect("unix:///PATH")). Both have the same methods and answers."""

    def __init__(
        self, *, node_id: str = "node0", capacity_bytes: int = 0, backend: _Backend | None = None,
        url: str | None = None, pinned_quota_bytes: int | None = None, upstream: Any = None,
    ) -> None:
        self._pinned_quota_bytes = pinned_quota_bytes  # tensor objects (_tensor.py); None: default
        self._core: _Backend = (
            backend if backend is not None
            else _core._Store(node_id=node_id, capacity_bytes=capacity_bytes)
        )
        self.url = url
        self._upstream = upstream  # mooncake://: the UpstreamObjectStore under the core

    @property
    def backend(self) -> _Backend:
        """The native backend (`_core._Store` or `_core._NodeStore`)."""
        return self._core

    @property
    def objects(self) -> Any:
        """The raw structured-object store under the sparse layer (put/get/stat/remove/list)."""
        return self._core._object_store()

    def capabilities(self) -> dict[str, Any]:
        """What this store can do here: backend, CUDA availability, pinned quota and use."""
        if isinstance(self._core, _core._Store):
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
        disconnect = getattr(self._core, "disconnect", None)
        if disconnect is not None:
            disconnect()

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
        if _gpu.is_cuda(indices):
            indices = _gpu.to_host(indices)  # e.g. from a GPU encode_update
        if _gpu.is_cuda(values):
            values = _gpu.to_host(values)
        result = self._core.put_sparse_object(
            tensor_id,
            tuple(global_shape),
            as_core_array(indices),
            as_core_array(values),
            dict(source_placement or {}),
            placement_policy,
            _generation(generation),
            apply,
            None if tile_shape is None else tuple(tile_shape),
            duplicates,
            None if global_offset is None else tuple(global_offset),
            None if local_shape is None else tuple(local_shape),
            hard_pin,
            num_threads,
        )
        return result if return_info else result["source_ref"]

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
            tensor_id, _generation(generation), placement_policy, dict(source_placement or {}), writer_id
        )

    def current_generation(self, tensor_id: str) -> tuple[int, int] | None:
        return self._core.current_generation(tensor_id)

    def manifest(self, generation: tuple[int, int]) -> list[SourceInfo]:
        """Every source object committed for `generation`."""
        return self._core.manifest(_generation(generation))

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
    ) -> list[Any]:
        """One target-local object per target, same order (docs/design.md §4 steps 1-8).
        strategy="full_source" is the baseline that GETs complete sources per target.
        device="cuda" / "cuda:N": the objects' indices and values are copied into that GPU's
        memory (DeviceSparseObject), ready for apply_sparse_object on CUDA weights."""
        objs = self._core.read_sparse_objects(
            list(manifest), list(targets), strategy, read_coalesce_gap, num_threads
        )
        return objs if device is None else _gpu.upload(objs, device)

    def metrics(self) -> dict[str, float]:
        """The §4 counters (source_objects_put, range_gets, full_gets, ...)."""
        return self._core.metrics()

    def reset_metrics(self) -> None:
        self._core.reset_metrics()

    def clear_caches(self) -> None:
        """Drops the node-local tile-index and range caches (the daemon's, for a node store)."""
        self._core.clear_caches()

    def store_counters(self) -> dict[str, int]:
        return self._core.store_counters()

    def list_keys(self, prefix: str = "") -> list[str]:
        return self._core.list_keys(prefix)

    # Module-level helpers, also reachable from a handle.
    @staticmethod
    def apply_sparse_object(weight: Any, obj: SparseObject, *, num_threads: int = 0) -> None:
        apply_sparse_object(weight, obj, num_threads=num_threads)

    @staticmethod
    def encode_update(new: Any, old: Any, **kwargs: Any) -> tuple[Any, Any]:
        return encode_update(new, old, **kwargs)


def _generation(g: Any) -> tuple[int, int]:
    try:
        base, delta = g
        return int(base), int(delta)
    except (TypeError, ValueError):
        raise InvalidArgument(f"generation must be a (base, delta) pair, got {g!r}") from None


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
    - "unix:///PATH": the node daemon (mooncake_sparse_node) listening at PATH; kwargs
      connect_timeout and call_timeout (seconds), client_name, initial_buffer_bytes,
      reply_spin_max (seconds a tensor call may poll for its reply before sleeping; 0 never
      polls; default 0.02). Raises
      Unavailable when no daemon runs there. A call that loses the daemon raises Unavailable
      and the next call reconnects (e.g. to a restarted daemon).
    - "mooncake://HOST:PORT?protocol=tcp&metadata=URL&local_hostname=H&segment_bytes=N":
      upstream Mooncake Store (its mooncake_master at HOST:PORT, a client of its own in this
      process that contributes segment_bytes of memory, default 512 MiB); the same options are
      accepted as kwargs. Needs the mooncake-transfer-engine wheel. See docs/multi_node.md."""
    if url is None or url in ("", "embedded", "embedded://"):
        return Store(**kwargs)
    if url.startswith("unix://"):
        path = url[len("unix://"):]
        if not path:
            raise InvalidArgument(f"store URL {url!r} names no socket path (unix:///PATH)")
        unknown = set(kwargs) - {"connect_timeout", "call_timeout", "client_name",
                                 "initial_buffer_bytes", "reply_spin_max"}
        if unknown:
            raise InvalidArgument(f"unknown option(s) for a node store: {sorted(unknown)}")
        kwargs.setdefault("client_name", f"pid {os.getpid()}")
        return Store(backend=_core._NodeStore(path, **kwargs), url=url)
    if url.startswith("mooncake://"):
        from ._upstream import UpstreamObjectStore, parse_mooncake_url
        config = parse_mooncake_url(url, **kwargs)
        objects = UpstreamObjectStore.connect(config)
        return Store(backend=_core._Store(node_id=config.node_id, object_store=objects), url=url,
                     upstream=objects)
    raise InvalidArgument(f"unknown store URL {url!r} (expected None, unix:///PATH or mooncake://HOST:PORT)")


def encode_update(
    new: Any,
    old: Any,
    *,
    apply: str = "overwrite",
    threshold: float = 0.0,
    tile_shape: Sequence[int] | None = None,
    num_threads: int = 0,
) -> tuple[Any, Any]:
    """Dense (new, old) -> global COO (indices [nnz, ndim] narrowest unsigned dtype, values).

    overwrite: coordinates whose bits differ, with the new values (bit-exact);
    scatter_add: new - old where |new - old| > threshold. The result is already sorted by tile,
    so put_sparse_object takes it without sorting. CUDA tensors (2-D bf16/fp16/fp32) are
    encoded on the GPU and the result stays there (torch CUDA tensors)."""
    if _gpu.is_cuda(new):
        return _gpu.encode_update_gpu(new, old, apply, threshold, tile_shape)
    idx, vals, dtype_name = _core.encode_update(
        as_core_array(new),
        as_core_array(old),
        apply,
        float(threshold),
        None if tile_shape is None else tuple(tile_shape),
        num_threads,
    )
    return idx, values_out(vals, dtype_name)


def apply_sparse_object(weight: Any, obj: SparseObject, *, num_threads: int = 0) -> None:
    """Applies a target-local object to `weight` in place (numpy array or torch tensor of the
    object's local shape and value dtype): W[idx] = v (overwrite, bit-exact) or W[idx] += v
    (scatter_add). A CUDA weight is updated on the GPU, on its current stream; `obj` may then
    also be a DeviceSparseObject (read_sparse_objects(..., device=...))."""
    if _gpu.is_cuda(weight):
        _gpu.apply_gpu(weight, obj)
        return
    if isinstance(obj, _gpu.DeviceSparseObject):
        obj = obj._host
    _core.apply_sparse_object(as_core_array(weight), obj, num_threads)


def default_tile_shape(shape: Sequence[int]) -> tuple[int, ...]:
    return _core.default_tile_shape(tuple(shape))
