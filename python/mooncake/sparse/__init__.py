"""mooncake.sparse: sparse RL weight updates on Mooncake Store.

    import mooncake.sparse as mcs
    store = mcs.connect()                 # embedded store
    ref = store.put_sparse_object(...)    # one global COO object per tensor update
    objs = store.read_sparse_objects(store.manifest((0, 1)), targets)
    mcs.apply_sparse_object(shard, objs[0])
"""

from __future__ import annotations


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
    SourceInfo,
    SparseObject,
    Store,
    Target,
    apply_sparse_object,
    connect,
    default_store,
    default_tile_shape,
    encode_update,
)
from ._tensor import TENSOR_HEADER_BYTES, decode_tensor_header, encode_tensor_header
from ._gpu import DeviceSparseObject, gpu_available
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
    ResourceExhausted,
    StaleGeneration,
    Unavailable,
    Unimplemented,
)

__version__ = "0.1.0"


def put_sparse_object(*args, **kwargs):  # noqa: D103 - documented on Store
    return default_store().put_sparse_object(*args, **kwargs)


def read_sparse_objects(*args, **kwargs):  # noqa: D103
    return default_store().read_sparse_objects(*args, **kwargs)


def manifest(*args, **kwargs):  # noqa: D103
    return default_store().manifest(*args, **kwargs)


def metrics():  # noqa: D103
    return default_store().metrics()


def put_tensor(key, tensor, **kwargs):  # noqa: D103 - documented on Store
    return default_store().put_tensor(key, tensor, **kwargs)


def batch_put_tensor(keys, tensors, **kwargs):  # noqa: D103
    return default_store().batch_put_tensor(keys, tensors, **kwargs)


def upsert_tensor(key, tensor, **kwargs):  # noqa: D103
    return default_store().upsert_tensor(key, tensor, **kwargs)


def batch_upsert_tensor(keys, tensors, **kwargs):  # noqa: D103
    return default_store().batch_upsert_tensor(keys, tensors, **kwargs)


def get_tensor(key, **kwargs):  # noqa: D103
    return default_store().get_tensor(key, **kwargs)


def get_tensor_into(key, tensor):  # noqa: D103
    return default_store().get_tensor_into(key, tensor)


def batch_get_tensor_into(keys, tensors):  # noqa: D103
    return default_store().batch_get_tensor_into(keys, tensors)


for _f in (put_tensor, batch_put_tensor, upsert_tensor, batch_upsert_tensor, get_tensor,
           get_tensor_into, batch_get_tensor_into):
    _f.__doc__ = getattr(Store, _f.__name__).__doc__
del _f

put_sparse_object.__doc__ = Store.put_sparse_object.__doc__
read_sparse_objects.__doc__ = Store.read_sparse_objects.__doc__
manifest.__doc__ = Store.manifest.__doc__

__all__ = [
    "Conflict",
    "DataLoss",
    "DeviceSparseObject",
    "Error",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "SourceInfo",
    "SparseObject",
    "StaleGeneration",
    "Store",
    "Target",
    "Unavailable",
    "Unimplemented",
    "TENSOR_HEADER_BYTES",
    "apply_sparse_object",
    "batch_get_tensor_into",
    "batch_put_tensor",
    "batch_upsert_tensor",
    "decode_tensor_header",
    "encode_tensor_header",
    "get_tensor",
    "get_tensor_into",
    "gpu_available",
    "put_tensor",
    "upsert_tensor",
    "connect",
    "default_store",
    "default_tile_shape",
    "encode_update",
    "manifest",
    "metrics",
    "put_sparse_object",
    "read_sparse_objects",
]
