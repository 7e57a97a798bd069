"""The GPU side of the sparse codec (docs/design.md §1 src/cuda, issue: GPU encode and apply).

* ``encode_update(new, old)`` with CUDA tensors encodes on the device (no host round trip of
  the dense tensors) and returns device arrays: torch CUDA tensors when torch is in use,
  otherwise DLPack producers (``_core._DeviceArray``).
* ``apply_sparse_object(weight, obj)`` with a CUDA weight applies on the device, in place,
  ordered on the weight's current stream (torch) or the legacy default stream.
* ``read_sparse_objects(..., device="cuda:0")`` returns ``DeviceSparseObject``s whose indices
  and values live in GPU memory, ready for ``apply_sparse_object``.

Needs an extension built with the CUDA codec (``_core.HAS_GPU_CODEC``) and a usable device;
otherwise these raise Unimplemented / Unavailable, and everything else still works.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Any, Iterator

from . import _core
from ._arrays import torch_module
from ._errors import InvalidArgument, Unavailable, Unimplemented

__all__ = ["is_cuda", "DeviceSparseObject", "gpu_available"]


def gpu_available() -> bool:
    """True when this build has the GPU codec and a CUDA device is usable."""
    return bool(_core.HAS_GPU_CODEC) and bool(_core.gpu_available())


def is_cuda(x: Any) -> bool:
    """Whether `x` is an array in CUDA memory (torch CUDA tensor, DLPack producer on a CUDA
    device, __cuda_array_interface__ object, or a device array of this package)."""
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        return bool(x.is_cuda)
    if getattr(_core, "_DeviceArray", None) is not None and isinstance(x, _core._DeviceArray):
        return True
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None:
        try:
            return int(dev()[0]) in (2, 13)  # kDLCUDA, kDLCUDAManaged
        except Exception:  # noqa: BLE001 - not a usable producer
            return False
    return False


def _require() -> None:
    if not _core.HAS_GPU_CODEC:
        raise Unimplemented("this build of mooncake.sparse has no GPU codec (built without a "
                            "CUDA compiler); CUDA tensors cannot be encoded or applied here")
    if not _core.gpu_available():
        raise Unavailable("no usable CUDA device for the GPU codec")


def _device_index(device: Any) -> int:
    if isinstance(device, int):
        return device
    text = str(device)
    if text == "cuda":
        torch = torch_module()
        return int(torch.cuda.current_device()) if torch is not None else 0
    if text.startswith("cuda:"):
        try:
            return int(text[5:])
        except ValueError:
            pass
    raise InvalidArgument(f"device must be 'cuda', 'cuda:N' or an int, got {device!r}")


def _out(a: Any) -> Any:
    """A device array as a torch tensor (zero-copy through DLPack) when torch is in use. The
    capsule goes to torch's C++ importer directly: the array is complete, or being written on
    torch's current stream by the producing call (the GPU encode), and from_dlpack's Python-level
    stream handling would cost more than the rest of a small object's batch call."""
    torch = torch_module()
    if torch is None:
        return a
    from_capsule = getattr(getattr(torch, "_C", None), "_from_dlpack", None)
    return from_capsule(a.__dlpack__()) if from_capsule is not None else torch.from_dlpack(a)


def _capsules(xs: list[Any], destination: bool = False) -> tuple[list[Any], int | None]:
    """CUDA arrays as the core borrows them fastest (torch tensors as DLPack capsules of torch's
    C++ exporter, non-contiguous sources made contiguous on their stream), and the CUDA stream of
    the first one (torch's current stream of its device)."""
    from ._tensor import _prepare_all

    objects, streams = _prepare_all(xs, destination=destination)
    return objects, next((s for s in streams if s is not None), None)


def encode_updates_gpu(pairs: list[tuple[Any, Any]], apply: str, threshold: float,
                       tile_shape: Any) -> list[tuple[Any, Any]]:
    """Encodes CUDA (new, old) pairs on the device: the whole list in a few launches and one
    host sync per device, every result in one device allocation (per device)."""
    _require()
    for i, (new, old) in enumerate(pairs):
        if not is_cuda(old):
            raise InvalidArgument(f"pairs[{i}]: new is a CUDA tensor but old is not")
    by_device: dict[int, list[int]] = {}
    for i, (new, _) in enumerate(pairs):
        by_device.setdefault(_device_of(new), []).append(i)
    out: list[Any] = [None] * len(pairs)
    for items in by_device.values():
        news, stream = _capsules([pairs[i][0] for i in items])
        olds, _ = _capsules([pairs[i][1] for i in items])
        for i, coo in zip(items, encode_prepared(news, olds, stream, apply, threshold, tile_shape)):
            out[i] = coo
    return out


def encode_prepared(news: list[Any], olds: list[Any], stream: Any, apply: str, threshold: float,
                    tile_shape: Any) -> list[tuple[Any, Any]]:
    """encode_updates_gpu of pairs of one device, as _capsules prepares them."""
    _require()
    shape = None if tile_shape is None else tuple(tile_shape)
    if torch_module() is None:
        raw = _core._gpu_encode_updates(news, olds, apply, float(threshold), shape, stream)
        return [(_out(idx), _out(vals)) for idx, vals, _, _, _ in raw]
    # torch: each run of members that lie back to back is imported once and split into the
    # items' views (one import per member would cost more than the encode's launches). The call
    # returns while its last kernels run on torch's current stream, so that these imports
    # overlap them; the results are then ordered as any torch op's are.
    index_runs, value_runs = _core._gpu_encode_runs(news, olds, apply, float(threshold), shape,
                                                    stream)
    idx: list[Any] = [None] * len(news)
    out: list[Any] = [None] * len(news)
    with _no_collection():
        for arr, sizes, which in index_runs:
            for k, part in zip(which, _out(arr).split(sizes)):
                idx[k] = part
        for arr, sizes, which in value_runs:
            for k, part in zip(which, _out(arr).split(sizes)):
                out[k] = (idx[k], part)
    return out


def encode_update_gpu(new: Any, old: Any, apply: str, threshold: float,
                      tile_shape: Any) -> tuple[Any, Any]:
    return encode_updates_gpu([(new, old)], apply, threshold, tile_shape)[0]


def _device_of(x: Any) -> int:
    dev = getattr(x, "device", None)
    index = getattr(dev, "index", None)
    if index is not None:
        return int(index)
    if isinstance(dev, int):
        return dev
    probe = getattr(x, "__dlpack_device__", None)
    return int(probe()[1]) if probe is not None else 0


_side_streams: dict[int, Any] = {}


def side_stream(device: Any) -> Any:
    """A torch stream of `device` of this module's own (one per device, kept): where
    put_sparse_updates commits a part while the next one encodes on the current stream."""
    torch = torch_module()
    index = torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    s = _side_streams.get(index)
    if s is None:
        s = _side_streams.setdefault(index, torch.cuda.Stream(index))
    return s


def stream_for_commit(values: list[Any]) -> int:
    """The stream a commit's device-to-host copies are ordered on: torch's current stream of the
    first CUDA member's device (the stream that produced it), else the legacy default stream."""
    torch = torch_module()
    for v in values:
        if torch is not None and isinstance(v, torch.Tensor) and v.is_cuda:
            return int(torch.cuda.current_stream(v.device).cuda_stream)
    return 0


def to_host(x: Any) -> Any:
    """A host copy of a CUDA array (for put_sparse_object of device-encoded updates)."""
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, _core._DeviceArray):
        return x.to_host()
    get = getattr(x, "get", None)  # cupy
    if callable(get):
        return get()
    raise InvalidArgument(f"cannot copy {type(x).__name__} from the GPU; pass a host array")


class DeviceSparseObject:
    """A target-local sparse object whose indices and values live in GPU memory
    (read_sparse_objects(..., device=...)); other attributes are the host object's. One of a
    batch (the read's or the upload's `_core._DeviceObjects`), whose members it takes lazily:
    a node's step reads hundreds of thousands of them, and the batch apply never converts
    their members to Python objects."""

    __slots__ = ("_batch", "_i", "_h")

    def __init__(self, batch: Any, i: int) -> None:
        self._batch = batch
        self._i = i
        self._h = None

    @property
    def _host(self) -> Any:
        h = self._h
        if h is None:
            h = self._h = self._batch.host(self._i)
        return h

    @property
    def _indices_dev(self) -> Any:
        return self._batch.indices(self._i)

    @property
    def _values_dev(self) -> Any:
        return self._batch.values(self._i)

    @property
    def indices(self) -> Any:
        return _out(self._indices_dev)

    @property
    def values(self) -> Any:
        return _out(self._values_dev)

    @property
    def device(self) -> int:
        return int(self._indices_dev.device)

    def __getattr__(self, name: str) -> Any:
        if name in DeviceSparseObject.__slots__:  # not set (yet): no host to ask
            raise AttributeError(name)
        return getattr(self._host, name)

    def __repr__(self) -> str:
        host = self._host
        return (f"<DeviceSparseObject {host.target_id} {host.tensor_id} "
                f"nnz={host.nnz} cuda:{self.device}>")


@contextmanager
def _no_collection() -> Iterator[None]:
    """Python's cyclic collector paused while a batch call makes one object per item (a step's
    targets or encoded members: tens of thousands, each counting towards the next collection,
    and a collection of the older generations walks every object of the process: about 0.5 us
    per item made beside a few hundred thousand live objects). Restored as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _objects(batch: Any) -> list:
    with _no_collection():
        return [DeviceSparseObject(batch, i) for i in range(len(batch))]


def upload(objs: list, device: Any, store: Any = None) -> list:
    """Target objects onto a GPU: every object's indices and values in one device allocation,
    moved by one host-to-device copy; objects read through the node daemon (`store`, its
    backend) are copied there by the daemon from its memory, by CUDA IPC."""
    _require()
    index = _device_index(device)
    torch = torch_module()
    stream = int(torch.cuda.current_stream(index).cuda_stream) if torch is not None else 0
    return _objects(_core._gpu_upload_batch(list(objs), index, stream, store))


def read_on_device(store: Any, sources: list, targets: list, strategy: str,
                   read_coalesce_gap: int, num_threads: int, generation: Any,
                   unchanged: list, device: Any) -> list | None:
    """read_sparse_objects on the embedded store, built on the GPU: the read's unique ranges
    copied into device memory once, every target filtered and rebased there, all targets' members
    in one device allocation. None where the store does not plan the read this way (a fold of
    several steps): the caller reads on the host and uploads."""
    _require()
    index = _device_index(device)
    torch = torch_module()
    stream = int(torch.cuda.current_stream(index).cuda_stream) if torch is not None else 0
    batch = _core._gpu_read_sparse_objects(store, sources, targets, strategy, read_coalesce_gap,
                                           num_threads, generation, unchanged, index, stream)
    return None if batch is None else _objects(batch)


def apply_gpu_batch(weights: list[Any], objs: list[Any]) -> None:
    """Applies objs[i] to CUDA weights[i] in a few launches per device (one check of every
    coordinate first: an out-of-range one leaves every weight unchanged). Weights may be strided
    views of rank 1 to 3 (a TP slice of a fused parameter, one expert of a stacked one); weights
    that share memory apply in list order. Host objects are uploaded together first."""
    _require()
    if len(weights) != len(objs):
        raise InvalidArgument(f"{len(weights)} weights but {len(objs)} objects")
    # Device objects onto torch weights of one device (a rank's step): the core reads the
    # objects and checks the shapes itself, a step applies hundreds of thousands.
    if weights:
        dests, stream = _capsules(weights, destination=True)
        if _core._gpu_apply_objects(dests, objs, stream):
            return
    # One pass per object, reading what it needs once.
    torch = torch_module()
    tensor = torch.Tensor if torch is not None else ()
    by_device: dict[int, list[int]] = {}
    hosts = [o._host if isinstance(o, DeviceSparseObject) else o for o in objs]
    for i, w in enumerate(weights):
        local = hosts[i].local_shape
        if tuple(w.shape) != local:
            raise InvalidArgument(f"weights[{i}] shape {tuple(int(e) for e in w.shape)} != "
                                  f"object local shape {tuple(local)}")
        device = w.get_device() if isinstance(w, tensor) else _device_of(w)
        items = by_device.get(device)
        if items is None:
            by_device[device] = [i]
        else:
            items.append(i)
    for device, items in by_device.items():
        host = [i for i in items if not isinstance(objs[i], DeviceSparseObject)]
        uploaded = dict(zip(host, upload([objs[i] for i in host], device))) if host else {}
        idx, vals = [], []
        for i in items:
            o = uploaded.get(i, objs[i]) if host else objs[i]
            idx.append(o._indices_dev)
            vals.append(o._values_dev)
        dests, stream = _capsules([weights[i] for i in items], destination=True)
        _core._gpu_apply_batch(dests, idx, vals, [hosts[i].apply for i in items], stream)


def apply_gpu(weight: Any, obj: Any) -> None:
    """`weight` may be a strided view (``w[:, a:b]``, ``w.t()``, ``w[::2]``, ``w13[e]``): it is
    updated where it lies, the rest of its parent untouched. Overlapping views (expand) are
    refused."""
    apply_gpu_batch([weight], [obj])
