"""The device warm-up of a worker that computes on a GPU: CuPy's on-disk cache of compiled kernels, and the
kernel variants jobs commonly use compiled before the first job."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import structlog

from kernels import backend, cuda
from kernels.backend import GPUUnavailableError

log = structlog.get_logger("gpuest.worker")

# CuPy's on-disk cache of compiled kernels, under the data directory: a restarted worker loads them.
CUDA_CACHE_DIR_NAME = "cuda-cache"


def warm_up_gpu(cache_dir: Path) -> None:
    """On a worker that computes on a GPU: keep compiled kernels in ``cache_dir`` (before anything compiles),
    then compile every kernel variant jobs commonly use, so the first job pays no NVRTC compile. A failed
    warm-up is logged and the worker serves anyway: its jobs then compile on demand. Nothing runs on CPU."""
    try:
        xp = backend.get_namespace()
    except (GPUUnavailableError, ValueError):
        return  # no usable device: every job fails with the reason, there is nothing to warm
    if backend.is_numpy(xp):
        return
    if not os.environ.get("CUPY_CACHE_DIR"):  # an operator's own cache directory wins
        cuda.use_disk_cache(cache_dir)
    started = time.perf_counter()
    try:
        modules = cuda.warm_up()
    except Exception:
        log.error("kernel warm-up failed; jobs compile their kernels on demand", traceback=traceback.format_exc())
        return
    log.info("kernels warmed up", modules=modules, seconds=round(time.perf_counter() - started, 3),
             cache_dir=str(cache_dir))
