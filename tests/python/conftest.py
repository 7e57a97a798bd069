import numpy as np
import pytest

import mooncake.sparse as mcs


@pytest.fixture
def store():
    return mcs.connect()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def random_coo(rng, shape, nnz):
    """nnz unique random coordinates in `shape` and float32 values."""
    total = int(np.prod(shape))
    flat = rng.choice(total, size=min(nnz, total), replace=False)
    idx = np.stack(np.unravel_index(flat, shape), axis=1).astype(np.int64)
    vals = rng.standard_normal(len(flat)).astype(np.float32)
    return idx, vals


def dense_of(shape, idx, vals, dtype=np.float32):
    w = np.zeros(shape, dtype=dtype)
    if len(idx):
        w[tuple(idx.T)] = vals
    return w


def snapshot(store):
    return (store.list_keys(""), {k: v for k, v in store.metrics().items() if not k.endswith("seconds")})
