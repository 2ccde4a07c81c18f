"""The only owner of device dispatch: which array namespace to compute with, which one arrays live in, and
the move back to the host.

Kernels never test ``xp is np`` or ``isinstance(a, np.ndarray)`` themselves: they ask :func:`is_numpy`
(namespace in hand) or :func:`array_namespace` (arrays in hand), and copy to the host with :func:`to_host`
(the pattern of SciPy's ``scipy/_lib/_array_api.py`` and scikit-learn's ``utils/_array_api.py``).

CuPy is an optional extra: it is imported lazily, so everything here works on a machine without it.
The worker's choice is made by the ``GPUEST_DEVICE`` environment variable: ``auto`` (default: GPU when
one is usable), ``cpu`` or ``gpu`` (fail loudly when no GPU is usable).
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
    """The array module to compute with (``numpy`` or ``cupy``) for a device choice, by default the
    ``GPUEST_DEVICE`` setting. Only the run context's maker calls this: runners get ``ctx.xp``."""
    choice = device or requested_device()
    if choice == "cpu":
        return np
    cupy = _cupy_or_none()
    if cupy is None:
        if choice == "gpu":
            raise GPUUnavailableError("GPUEST_DEVICE=gpu but no CUDA device is usable through CuPy")
        return np
    return cupy


def array_namespace(*arrays: Any) -> ModuleType:
    """The namespace the given arrays live in: CuPy if any of them is a CuPy array, else NumPy.
    ``None`` and Python scalars are ignored."""
    cupy = _cupy_or_none()
    if cupy is not None and any(isinstance(array, cupy.ndarray) for array in arrays):
        return cupy
    return np


def is_numpy(xp: ModuleType) -> bool:
    """True for the host (NumPy) namespace: the one test of "which backend" in the code base."""
    return xp is np


def device_label(xp: ModuleType) -> str:
    """``"cpu"`` or the GPU's name, e.g. ``"NVIDIA H100 80GB HBM3"``."""
    if is_numpy(xp):
        return "cpu"
    props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def to_host(array: Any) -> np.ndarray:
    """A NumPy array of ``array`` (a CuPy array is copied from the device; a NumPy one is returned as is)."""
    if isinstance(array, np.ndarray):
        return array
    cupy = _cupy_or_none()
    if cupy is not None and isinstance(array, cupy.ndarray):
        return array.get()
    return np.asarray(array)  # lists, scalars, pandas objects (whose .get is a dict-style lookup)


def synchronize(xp: ModuleType) -> None:
    """Wait for the device's queued work (a no-op on NumPy): timings are read after it."""
    if not is_numpy(xp):
        xp.cuda.Device().synchronize()
