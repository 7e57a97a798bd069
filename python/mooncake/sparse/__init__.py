"""mooncake.sparse: sparse RL weight updates on Mooncake Store.

    import mooncake.sparse as mcs
    store = mcs.connect()                 # embedded store
    ref = store.put_sparse_object(...)    # one global COO object per tensor update
    objs = store.read_sparse_objects(store.manifest((0, 1)), targets)
    mcs.apply_sparse_object(shard, objs[0])
"""

from __future__ import annotations

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
from ._errors import (
    Conflict,
    DataLoss,
    Error,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
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


put_sparse_object.__doc__ = Store.put_sparse_object.__doc__
read_sparse_objects.__doc__ = Store.read_sparse_objects.__doc__
manifest.__doc__ = Store.manifest.__doc__

__all__ = [
    "Conflict",
    "DataLoss",
    "Error",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "ResourceExhausted",
    "SourceInfo",
    "SparseObject",
    "StaleGeneration",
    "Store",
    "Target",
    "Unavailable",
    "Unimplemented",
    "apply_sparse_object",
    "connect",
    "default_store",
    "default_tile_shape",
    "encode_update",
    "manifest",
    "metrics",
    "put_sparse_object",
    "read_sparse_objects",
]
