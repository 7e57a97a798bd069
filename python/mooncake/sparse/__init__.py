"""mooncake.sparse: sparse RL weight updates on Mooncake Store.

    import mooncake.sparse as mcs
    store = mcs.connect()                 # embedded store
    ref = store.put_sparse_object(...)    # one global COO object per tensor update
    objs = store.read_sparse_objects(store.manifest((0, 1)), targets)
    mcs.apply_sparse_object(shard, objs[0])
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence


def _preload_upstream() -> None:
    """Loads upstream Mooncake's store module (when its wheel is installed) before this
    package's native core. Both carry glog; in the other order upstream's client setup crashed
    on a host whose glog differed from the one this core was built against. 40 ms, once;
    MOONCAKE_SPARSE_NO_UPSTREAM_PRELOAD=1 skips it."""
    import importlib.util
    import os

    if os.environ.get("MOONCAKE_SPARSE_NO_UPSTREAM_PRELOAD") == "1":
        return
    try:
        if importlib.util.find_spec("mooncake.store") is not None:
            import mooncake.store  # noqa: F401
    except Exception:  # noqa: BLE001 - an unusable upstream install only disables mooncake://
        pass


_preload_upstream()

from ._api import (
    Manifest,
    SourceInfo,
    SparseObject,
    Store,
    Target,
    TargetBatch,
    apply_sparse_object,
    apply_sparse_objects,
    connect,
    default_store,
    default_tile_shape,
    encode_update,
    encode_updates,
)
from ._tensor import TENSOR_HEADER_BYTES, decode_tensor_header, encode_tensor_header
from ._gpu import DeviceSparseObject, gpu_available
from ._core import host_memory, trim_host_memory
from ._errors import (
    Conflict,
    DataLoss,
    Error,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    DeadlineExceeded,
    ResourceExhausted,
    StaleGeneration,
    Unavailable,
    Unimplemented,
)

__version__ = "0.1.0"


# Module-level calls on the default embedded store, with the Store methods' signatures spelled
# out so that type checkers and help() see them.
def put_sparse_object(
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
) -> str | dict[str, Any]:
    return default_store().put_sparse_object(
        tensor_id, global_shape, indices, values, source_placement, placement_policy,
        generation, apply, tile_shape=tile_shape, duplicates=duplicates,
        global_offset=global_offset, local_shape=local_shape, hard_pin=hard_pin,
        num_threads=num_threads, return_info=return_info)


def put_sparse_objects(updates: Iterable[Mapping[str, Any]], *,
                       num_threads: int = 0) -> list[dict[str, Any] | Error]:
    return default_store().put_sparse_objects(updates, num_threads=num_threads)


def read_sparse_objects(
    manifest: Sequence[SourceInfo],
    targets: Iterable[Target],
    *,
    strategy: str = "sparse",
    read_coalesce_gap: int = -1,
    num_threads: int = 0,
    device: Any = None,
    view_in_place: bool | None = None,
) -> list[Any]:
    return default_store().read_sparse_objects(
        manifest, targets, strategy=strategy, read_coalesce_gap=read_coalesce_gap,
        num_threads=num_threads, device=device, view_in_place=view_in_place)


def manifest(generation: tuple[int, int]) -> Manifest:
    return default_store().manifest(generation)


def seal_generation(generation: tuple[int, int], tensor_ids: Iterable[str]) -> None:
    default_store().seal_generation(generation, tensor_ids)


def wait_generation(generation: tuple[int, int], timeout: float | None = None) -> Manifest:
    return default_store().wait_generation(generation, timeout)


def latest_generation() -> tuple[int, int] | None:
    return default_store().latest_generation()


def set_retention(keep_last: int) -> None:
    default_store().set_retention(keep_last)


def metrics() -> dict[str, float]:
    return default_store().metrics()


def put_tensor(key: str, tensor: Any, *, hard_pin: bool = True) -> None:
    default_store().put_tensor(key, tensor, hard_pin=hard_pin)


def batch_put_tensor(keys: Sequence[str], tensors: Sequence[Any], *,
                     hard_pin: bool = True) -> None:
    default_store().batch_put_tensor(keys, tensors, hard_pin=hard_pin)


def upsert_tensor(key: str, tensor: Any, *, hard_pin: bool = True) -> None:
    default_store().upsert_tensor(key, tensor, hard_pin=hard_pin)


def batch_upsert_tensor(keys: Sequence[str], tensors: Sequence[Any], *,
                        hard_pin: bool = True) -> None:
    default_store().batch_upsert_tensor(keys, tensors, hard_pin=hard_pin)


def get_tensor(key: str, *, as_torch: bool | None = None) -> Any:
    return default_store().get_tensor(key, as_torch=as_torch)


def get_tensor_into(key: str, tensor: Any, *,
                    global_offset: Sequence[int] | None = None) -> None:
    default_store().get_tensor_into(key, tensor, global_offset=global_offset)


def batch_get_tensor_into(keys: Sequence[str], tensors: Sequence[Any], *,
                          global_offsets: Sequence[Sequence[int] | None] | None = None) -> None:
    default_store().batch_get_tensor_into(keys, tensors, global_offsets=global_offsets)


for _f in (put_sparse_object, read_sparse_objects, manifest, seal_generation, wait_generation,
           latest_generation, set_retention, metrics, put_tensor,
           batch_put_tensor, upsert_tensor, batch_upsert_tensor, get_tensor, get_tensor_into,
           batch_get_tensor_into):
    _f.__doc__ = getattr(Store, _f.__name__).__doc__
del _f

__all__ = [
    "Conflict",
    "DataLoss",
    "DeviceSparseObject",
    "Error",
    "Manifest",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "DeadlineExceeded",
    "ResourceExhausted",
    "SourceInfo",
    "SparseObject",
    "StaleGeneration",
    "Store",
    "Target",
    "TargetBatch",
    "Unavailable",
    "Unimplemented",
    "TENSOR_HEADER_BYTES",
    "apply_sparse_object",
    "apply_sparse_objects",
    "batch_get_tensor_into",
    "batch_put_tensor",
    "batch_upsert_tensor",
    "decode_tensor_header",
    "encode_tensor_header",
    "get_tensor",
    "get_tensor_into",
    "gpu_available",
    "host_memory",
    "trim_host_memory",
    "put_tensor",
    "upsert_tensor",
    "connect",
    "default_store",
    "default_tile_shape",
    "encode_update",
    "encode_updates",
    "manifest",
    "metrics",
    "put_sparse_object",
    "put_sparse_objects",
    "read_sparse_objects",
    "seal_generation",
    "wait_generation",
    "latest_generation",
    "set_retention",
]

# Layouts, per-step sync of a state dict, engine parameters (layout.py, sync.py, engines.py).
from . import engines, layout  # noqa: E402
from .engines import EngineNameMap, NameRule, engine_param_shapes, engine_views  # noqa: E402
from .layout import ParallelLayout, SourceSpec, SyncPlan, TensorRule  # noqa: E402
from .sync import ApplyStats, StepStats, TensorStats, TrainerSync, apply_step, sync_step  # noqa: E402

__all__ += [
    "ApplyStats",
    "EngineNameMap",
    "NameRule",
    "ParallelLayout",
    "SourceSpec",
    "StepStats",
    "SyncPlan",
    "TensorRule",
    "TensorStats",
    "TrainerSync",
    "apply_step",
    "engine_param_shapes",
    "engine_views",
    "engines",
    "layout",
    "sync_step",
]

from .sync import EncodedStep, InferenceSync  # noqa: E402

__all__ += ["EncodedStep", "InferenceSync"]
