"""The tensor fast path of a Store (docs/design.md §5): put/get of whole tensors, CPU or CUDA,
and dense box reads (a rank reads only its box of a stored tensor into its shard).

Tensor objects use upstream Mooncake's format (a 304-byte ``TensorObjectHeader`` + layout,
then the C-contiguous data), so a tensor written by one is readable by the other.

* Host tensors: numpy arrays, CPU torch tensors, anything with the buffer protocol or DLPack.
* CUDA tensors: torch CUDA tensors (DLPack), or anything with ``__dlpack__`` /
  ``__cuda_array_interface__``. Copies are ordered after the caller's pending work on its
  stream (torch's current stream for torch tensors; the ``stream`` of the interface otherwise)
  and have completed when the call returns.
* Embedded store: the device-to-host copy of a put lands directly in the object's memory, and a
  get copies from the stored object straight into the destination (no staging buffer); object
  memory is pinned under ``pinned_quota_bytes``. Node daemon: a CUDA tensor travels as a CUDA
  IPC handle, the daemon copies between it and its segments.

Every call validates all of its tensors (dtype, shape, size, layout; for reads against the
stored header) before any byte moves: on error nothing was written. Tensors must stay alive and
must not be resized until the call returns.
"""

from __future__ import annotations

import operator
import os
import threading
from typing import Any, Iterable, Sequence

from . import _core
from ._arrays import torch_module
from ._errors import InvalidArgument

__all__ = ["TensorMixin", "encode_tensor_header", "decode_tensor_header", "TENSOR_HEADER_BYTES",
           "default_pinned_quota_bytes"]

TENSOR_HEADER_BYTES: int = _core.TENSOR_HEADER_BYTES

# numpy has no bfloat16 / float8: get_tensor returns those as torch tensors when torch is in use.
_TORCH_ONLY = {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2"}


def default_pinned_quota_bytes() -> int:
    """Pinned host bytes an embedded store may use for tensor objects: the
    MOONCAKE_SPARSE_PINNED_QUOTA environment variable (bytes; 0 disables pinning), else 4 GiB.
    Nothing is pinned until a tensor is stored, and only when CUDA is present."""
    value = os.environ.get("MOONCAKE_SPARSE_PINNED_QUOTA")
    if value is None or value == "":
        return 4 << 30
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"MOONCAKE_SPARSE_PINNED_QUOTA={value!r} is not a byte count") from None


def encode_tensor_header(dtype: str, shape: Sequence[int]) -> bytes:
    """The 304-byte header upstream Mooncake's put_tensor writes for a whole tensor."""
    return _core.encode_tensor_header(dtype, tuple(int(e) for e in shape))


def decode_tensor_header(data: bytes, object_bytes: int | None = None) -> dict[str, Any]:
    """Parses a tensor object's header (dtype, shape, layout, data_offset, nbytes, ...)."""
    return _core.decode_tensor_header(bytes(data), object_bytes)


def _key(key: Any, what: str = "key") -> str:
    """A key, exactly: str() would make None into the key "None"."""
    if not isinstance(key, str):
        raise InvalidArgument(f"{what} must be a str, got {key!r}")
    return key


def _keys_and_tensors(keys: Any, tensors: Any) -> tuple[list[str], list[Any]]:
    """A batch's keys and tensors as lists of equal length. A str is refused as `keys` (it
    would be taken as one key per character), and an array as `tensors` (one per row)."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise InvalidArgument(f"keys must be a list of str, got {keys!r}")
    if _is_array(tensors) or not isinstance(tensors, Iterable):
        raise InvalidArgument(
            f"tensors must be a list of tensors, got {type(tensors).__name__} (for one tensor, "
            "pass [tensor])")
    keys = [_key(k, f"keys[{i}]") for i, k in enumerate(keys)]
    tensors = list(tensors)
    if len(keys) != len(tensors):
        raise InvalidArgument(f"{len(keys)} keys but {len(tensors)} tensors")
    return keys, tensors


_INT64_MAX = (1 << 63) - 1


def _box_origins(offsets: Any, n: int) -> list[list[int]]:
    """`global_offsets` of a batch of `n` as the core takes them: [] for none, else one list of
    ints per item ([] for an item given None: its whole tensor)."""
    if offsets is None:
        return []
    if isinstance(offsets, (str, bytes)) or not isinstance(offsets, Iterable):
        raise InvalidArgument(f"global_offsets must be a list of offsets, got {offsets!r}")
    offsets = list(offsets)
    if len(offsets) != n:
        raise InvalidArgument(f"{n} keys but {len(offsets)} global offsets")
    return [_box_origin(o, f"global_offsets[{i}]") for i, o in enumerate(offsets)]


def _box_origin(offset: Any, what: str) -> list[int]:
    if offset is None:
        return []
    if isinstance(offset, (str, bytes)) or not isinstance(offset, Iterable):
        raise InvalidArgument(f"{what} must be a sequence of ints, got {offset!r}")
    out = []
    for c in offset:
        if isinstance(c, bool):
            raise InvalidArgument(f"{what} must be a sequence of ints, got {offset!r}")
        try:
            c = operator.index(c)
        except TypeError:
            raise InvalidArgument(f"{what} must be a sequence of ints, got {offset!r}") from None
        if c < 0:
            raise InvalidArgument(f"{what} {tuple(offset)} has a negative coordinate")
        if c > _INT64_MAX:
            raise InvalidArgument(f"{what} {tuple(offset)} lies outside any tensor")
        out.append(c)
    if not out:
        raise InvalidArgument(f"{what} is empty (a box of a tensor of rank >= 1 has an offset "
                              "per dimension; pass None for the whole tensor)")
    return out


def _is_array(x: Any) -> bool:
    return (hasattr(x, "__dlpack__") or hasattr(x, "__array_interface__")
            or hasattr(x, "__cuda_array_interface__"))


def _prepare_all(tensors: Sequence[Any], destination: bool = False
                 ) -> tuple[list[Any], list[int | None]]:
    """(objects the core borrows, CUDA stream of each to order on — torch's current stream of
    its device — or None). torch tensors go as DLPack capsules made by torch's C++ exporter
    (their memory stays alive with the capsule); Tensor.__dlpack__'s Python-level checks would
    cost a quarter of a batch of hundreds of small tensors. Tensors with torch's negation or
    conjugation bit go as they are: the core resolves (sources) or refuses (destinations) them.
    A non-contiguous CUDA source is made contiguous on its stream (its data moves anyway);
    host views go as they are, copied through their strides by the core."""
    tensors = tensors if type(tensors) is list else list(tensors)
    if torch_module() is None:
        return tensors, [None] * len(tensors)  # no torch tensor among them
    # One call to the core for the whole list (no Python-level call per tensor).
    objects, streams, _ = _core._torch_prepare(tensors, destination)
    return objects, streams


def _as_output(dtype: str, raw: Any, as_torch: bool | None) -> Any:
    torch = torch_module()
    if as_torch is None:
        as_torch = dtype in _TORCH_ONLY and torch is not None
    if not as_torch:
        return raw
    if torch is None:
        import torch  # noqa: F811 - explicitly requested
    t = torch.from_numpy(raw)
    if dtype in _TORCH_ONLY:
        tdt = getattr(torch, _TORCH_ONLY[dtype], None)
        if tdt is None:
            raise InvalidArgument(f"this torch has no {dtype}")
        t = t.view(tdt)
    return t


class TensorMixin:
    """The tensor methods of mooncake.sparse.Store (mixed in; uses ``self._core``)."""

    _tensor_lock = threading.Lock()

    def _tensors(self) -> Any:
        core = self.__dict__.get("_tensor_core")
        if core is None:
            with TensorMixin._tensor_lock:
                core = self.__dict__.get("_tensor_core")
                if core is None:
                    quota = getattr(self, "_pinned_quota_bytes", None)
                    core = _core._TensorStore(
                        self._core, default_pinned_quota_bytes() if quota is None else int(quota))
                    self.__dict__["_tensor_core"] = core
        return core

    def _put(self, keys: Sequence[str], tensors: Sequence[Any], mode: str, hard_pin: bool) -> None:
        keys, tensors = _keys_and_tensors(keys, tensors)
        objects, streams = _prepare_all(tensors)
        self._tensors().put(keys, objects, streams, mode, bool(hard_pin))

    def put_tensor(self, key: str, tensor: Any, *, hard_pin: bool = True) -> None:
        """Stores `tensor` (CPU or CUDA, any layout: a view is gathered into C order as it is copied)
        under a NEW key.

        The tensor stays readable until it is removed or replaced (hard pin); ``hard_pin=False``
        lets the store evict it under memory pressure. Keys under ``mcs/`` are reserved for
        the sparse object layer (InvalidArgument).

        Raises Conflict when the key exists, InvalidArgument for a bad tensor, ResourceExhausted,
        Unimplemented for a CUDA tensor where CUDA is unavailable."""
        self._put([_key(key)], [tensor], "create", hard_pin)

    def upsert_tensor(self, key: str, tensor: Any, *, hard_pin: bool = True) -> None:
        """Creates or replaces `key` (readers see the old tensor or the new one, never a mix)."""
        self._put([_key(key)], [tensor], "upsert", hard_pin)

    def batch_put_tensor(self, keys: Sequence[str], tensors: Sequence[Any], *,
                         hard_pin: bool = True) -> None:
        """put_tensor of many tensors; the whole batch becomes visible at once, or nothing."""
        self._put(keys, tensors, "create", hard_pin)

    def batch_upsert_tensor(self, keys: Sequence[str], tensors: Sequence[Any], *,
                            hard_pin: bool = True) -> None:
        """upsert_tensor of many tensors; the whole batch becomes visible at once."""
        self._put(keys, tensors, "upsert", hard_pin)

    def get_tensor(self, key: str, *, as_torch: bool | None = None) -> Any:
        """A new host copy of the stored tensor: a numpy array, or a CPU torch tensor when
        `as_torch` is True (default: only for dtypes numpy lacks — bfloat16, float8 — when torch
        is imported; without torch those come back as their unsigned-integer bit patterns).

        Raises NotFound, InvalidArgument (not a tensor object)."""
        dtype, raw = self._tensors().get(_key(key))
        return _as_output(dtype, raw, as_torch)

    def get_tensor_into(self, key: str, tensor: Any, *,
                        global_offset: Sequence[int] | None = None) -> None:
        """Copies the stored tensor into `tensor` (CPU or CUDA), whose dtype and shape must match
        the stored ones and which must be writable. A destination may be any view (sliced,
        transposed, Fortran order) whose elements do not overlap, on the host or on the GPU: it
        is written in place (a CUDA view by 2-D copies at the PCIe rate when it is rows of one
        contiguous run, such as a TP slice ``w[:, a:b]``; a transposed one is gathered on the
        host first), the rest of its parent untouched. Big-endian numpy arrays and torch tensors
        with the negation bit are refused (they would be written in the wrong representation).

        With `global_offset` (one int per dimension) it is a dense box read: `tensor` receives
        the box ``stored[offset[0]:offset[0] + tensor.shape[0], ...]`` of the stored tensor
        (the same rank and dtype; the box must lie inside the stored shape), and only the box's
        bytes are read — a TP rank reading its shard of a full weight, e.g. rows
        ``global_offset=(512, 0)`` or columns ``global_offset=(0, 256)`` of an anchor.

        Raises NotFound, InvalidArgument (mismatch, a negative offset or a box outside the
        stored shape; `tensor` is left untouched)."""
        offsets = None if global_offset is None else [global_offset]
        self.batch_get_tensor_into([_key(key)], [tensor], global_offsets=offsets)

    def batch_get_tensor_into(self, keys: Sequence[str], tensors: Sequence[Any], *,
                              global_offsets: Sequence[Sequence[int] | None] | None = None
                              ) -> None:
        """get_tensor_into of many tensors, read from one state of the store; every item is
        checked before any destination is written. `global_offsets`: one box offset per item
        (None for an item: its whole tensor), as get_tensor_into's `global_offset`."""
        keys, tensors = _keys_and_tensors(keys, tensors)
        origins = _box_origins(global_offsets, len(keys))
        objects, streams = _prepare_all(tensors, destination=True)
        self._tensors().get_into(keys, objects, streams, origins)

    def tensor_info(self, key: str) -> dict[str, Any]:
        """The stored header of `key`: dtype, shape, nbytes, layout, version, ..."""
        return self._tensors().stat(_key(key))

    def tensor_stats(self) -> dict[str, int]:
        """Counters of this handle's tensor calls (tensors/bytes put and read, CUDA copies and how
        many of them ran against pinned store memory)."""
        return self._tensors().stats()

    def _tensor_capabilities(self) -> dict[str, Any]:
        return self._tensors().capabilities()
