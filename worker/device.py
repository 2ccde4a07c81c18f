"""The device a worker advertises: on the job's and chunk's rows (``device``), in its log and so in /metrics;
and what the worker process keeps on it between runs of one job (``job_cache``)."""

from __future__ import annotations

import os
from types import ModuleType

from kernels.backend import device_label, is_numpy
from kernels.context import JobCache

# The inputs one job's runs in this process share (a fanned-out job's chunk, then its finish, on this worker):
# a worker runs one job or chunk at a time, so one cache per process.
job_cache = JobCache()


def worker_device(xp: ModuleType) -> str:
    """The kernel's device label and, on a GPU, which GPU of its host: the number ``CUDA_VISIBLE_DEVICES``
    pins the worker to (one worker per GPU: ``gpuest serve --gpus N``) and the GPU's PCI bus id, which stays
    true inside a container where every worker's GPU is device 0, e.g.
    ``NVIDIA H100 80GB HBM3 (GPU 1, PCI 0000:1B:00.0)``. A result's own ``device`` stays the label
    (:func:`kernels.context.run_kind` stamps it)."""
    label = device_label(xp)
    if is_numpy(xp):
        return label
    where = []
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if pinned:
        where.append(f"GPU {pinned}")
    bus = _pci_bus_id(xp)
    if bus:
        where.append(f"PCI {bus}")
    return f"{label} ({', '.join(where)})" if where else label


def _pci_bus_id(xp: ModuleType) -> str | None:
    try:
        return str(xp.cuda.Device().pci_bus_id)
    except Exception:  # a driver without the attribute: the label and the pinned number still say enough
        return None
