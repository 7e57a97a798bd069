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

from typing import Any

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


def _stream_of(x: Any) -> int | None:
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor) and x.is_cuda:
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    return None


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
    """A device array as a torch tensor (zero-copy through DLPack) when torch is in use."""
    torch = torch_module()
    return torch.from_dlpack(a) if torch is not None else a


def _contiguous(x: Any) -> Any:
    """A torch view made contiguous (on its current stream): the encoder reads flat memory and
    reads every element anyway. Other arrays go as they are (the core refuses strided ones)."""
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor) and not x.is_contiguous():
        return x.contiguous()
    return x


def encode_update_gpu(new: Any, old: Any, apply: str, threshold: float,
                      tile_shape: Any) -> tuple[Any, Any]:
    _require()
    if not is_cuda(old):
        raise InvalidArgument("new is a CUDA tensor but old is not")
    new, old = _contiguous(new), _contiguous(old)
    idx, vals, _, _, _ = _core._gpu_encode_update(
        new, old, apply, float(threshold), None if tile_shape is None else tuple(tile_shape),
        _stream_of(new))
    return _out(idx), _out(vals)


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
    (read_sparse_objects(..., device=...)); other attributes are the host object's."""

    def __init__(self, host: Any, indices: Any, values: Any) -> None:
        self._host = host
        self._indices_dev = indices
        self._values_dev = values

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
        return getattr(self._host, name)

    def __repr__(self) -> str:
        return (f"<DeviceSparseObject {self._host.target_id} {self._host.tensor_id} "
                f"nnz={self._host.nnz} cuda:{self.device}>")


def upload(objs: list, device: Any) -> list:
    _require()
    index = _device_index(device)
    torch = torch_module()
    stream = int(torch.cuda.current_stream(index).cuda_stream) if torch is not None else 0
    out = []
    for o in objs:
        idx, vals = _core._gpu_upload(o, index, stream)
        out.append(DeviceSparseObject(o, idx, vals))
    return out


def apply_gpu(weight: Any, obj: Any) -> None:
    """`weight` may be a strided view (``w[:, a:b]``, ``w.t()``, ``w[::2]``): it is updated
    where it lies, the rest of its parent untouched. Overlapping views (expand) are refused."""
    _require()
    shape = tuple(int(e) for e in weight.shape)
    if shape != tuple(obj.local_shape):
        raise InvalidArgument(f"weight shape {shape} != object local shape {tuple(obj.local_shape)}")
    if len(shape) == 1:
        # The kernel takes 2-D weights: a vector is row 0 of a [1, n] view of itself, and its
        # indices gain a zero row coordinate (built on the host; the call uploads them).
        import numpy as np

        torch = torch_module()
        if torch is None or not isinstance(weight, torch.Tensor):
            raise InvalidArgument("GPU apply of a 1-D weight takes a torch tensor")
        if isinstance(obj, DeviceSparseObject):
            flat, vals = np.asarray(obj._indices_dev.to_host()).reshape(-1), obj._values_dev
        else:
            flat, vals = np.asarray(obj.indices).reshape(-1), obj.values
        idx = np.zeros((flat.shape[0], 2), dtype=flat.dtype)
        idx[:, 1] = flat
        weight = weight.unsqueeze(0)
    elif len(shape) != 2:
        raise InvalidArgument(f"GPU apply takes 1-D or 2-D weights, got shape {shape}; apply a "
                              "3-D parameter through 2-D views of it (one per leading index)")
    elif isinstance(obj, DeviceSparseObject):
        idx, vals = obj._indices_dev, obj._values_dev
    else:
        index = _device_index(getattr(weight, "device", 0))
        idx, vals = _core._gpu_upload(obj, index, _stream_of(weight) or 0)
    _core._gpu_apply(weight, idx, vals, obj.apply, _stream_of(weight))
