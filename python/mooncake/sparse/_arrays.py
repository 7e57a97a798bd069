"""Conversions between the native core's raw arrays and numpy / torch values."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

# numpy has no bfloat16 / float8: the core hands those out as unsigned bit patterns.
_BIT_DTYPES = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def torch_module() -> Any | None:
    """torch if the application already imported it; never imports it eagerly."""
    return sys.modules.get("torch")


def values_out(raw: np.ndarray, dtype_name: str) -> Any:
    """Raw value array -> numpy array, or a torch tensor for dtypes numpy lacks (when torch is
    in use), else the bit pattern as unsigned integers."""
    if dtype_name in _BIT_DTYPES:
        torch = torch_module()
        if torch is not None:
            tdt = {
                "bfloat16": torch.bfloat16,
                "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
                "float8_e5m2": getattr(torch, "float8_e5m2", None),
            }[dtype_name]
            if tdt is not None:
                return torch.from_numpy(raw.copy()).view(tdt)
        return raw
    return raw


def as_core_array(x: Any) -> Any:
    """Objects the core borrows: numpy arrays, DLPack producers (torch), or sequences, in any
    layout (the core reads views through their strides). torch tensors must be on the CPU;
    they are detached here."""
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.requires_grad:
            x = x.detach()
        return x
    return x
