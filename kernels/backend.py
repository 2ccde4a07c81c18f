"""Choose the array namespace (NumPy or CuPy) and move arrays between host and device.

CuPy is an optional extra: it is imported lazily, so everything here works on a machine without it.
The choice is made by the ``GPUEST_DEVICE`` environment variable: ``auto`` (default: GPU when one is
usable), ``cpu`` or ``gpu`` (fail loudly when no GPU is usable).
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import Any, Literal

import numpy as np

DeviceChoice = Literal["auto", "cpu", "gpu"]


class GPUUnavailableError(RuntimeError):
    """A GPU was demanded but CuPy or a CUDA device is missing."""


@functools.cache
def _cupy_or_none() -> ModuleType | None:
    try:
        import cupy  # optional extra: imported lazily on purpose

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return cupy
    except Exception:  # ImportError, CUDA driver errors: no usable GPU either way
        return None


def gpu_available() -> bool:
    return _cupy_or_none() is not None


def requested_device() -> DeviceChoice:
    value = os.environ.get("GPUEST_DEVICE", "auto").strip().lower()
    if value not in ("auto", "cpu", "gpu"):
        raise ValueError(f"GPUEST_DEVICE must be auto, cpu or gpu, not {value!r}")
    return value  # type: ignore[return-value]


def get_namespace(device: DeviceChoice | None = None) -> ModuleType:
    """The array module to compute with: ``numpy`` or ``cupy``."""
    choice = device or requested_device()
    if choice == "cpu":
        return np
    cupy = _cupy_or_none()
    if cupy is None:
        if choice == "gpu":
            raise GPUUnavailableError("GPUEST_DEVICE=gpu but no CUDA device is usable through CuPy")
        return np
    return cupy


def namespace_of(*arrays: Any) -> ModuleType:
    """The namespace the given arrays live in (NumPy unless one of them is a CuPy array)."""
    cupy = _cupy_or_none()
    if cupy is not None:
        return cupy.get_array_module(*arrays)
    return np


def is_gpu(xp: ModuleType) -> bool:
    return xp is not np


def device_label(xp: ModuleType) -> str:
    """``"cpu"`` or the GPU's name, e.g. ``"NVIDIA H100 80GB HBM3"``."""
    if not is_gpu(xp):
        return "cpu"
    props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def to_numpy(array: Any) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)
    return get() if callable(get) else np.asarray(array)


def synchronize(xp: ModuleType) -> None:
    if is_gpu(xp):
        xp.cuda.Device().synchronize()
