"""Large host arrays to the device through a small ring of pinned staging buffers.

``cupy.asarray`` of a NumPy array first copies the whole array into a pinned buffer of CuPy's pinned pool (its
size rounded up to a power of two), then to the device. For the uploaded tables of the paper's largest size
(4.7 GB) a fresh worker thus pins gigabytes of host memory anew in its first job (about 1.2 s on the lent
H100 machine), and the host copy runs on one core (0.57 s on every later job). Here an array goes in chunks of
``CHUNK_BYTES`` through ``SLOTS`` pinned buffers held for the life of the process (allocated at worker
warm-up by :func:`reserve`): one thread per buffer copies a chunk into it (NumPy releases the GIL) and
queues its device copy on the buffer's own stream, so the host copies run side by side and overlap the
transfers. The bytes arrive unchanged: this is a copy, with no arithmetic.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kernels.backend import array_namespace, is_numpy, to_host

CHUNK_BYTES = 64 << 20
SLOTS = 4
# Smaller arrays go through cupy.asarray (a few pinned megabytes of CuPy's pool, paid once at warm-up).
MIN_RING_BYTES = 16 << 20


@dataclass
class _Slot:
    """One pinned staging buffer, the stream of its device copies, and the event of its last copy."""

    buffer: Any
    host: np.ndarray  # the buffer as bytes
    stream: Any
    done: Any = None


@dataclass
class _Ring:
    slots: list[_Slot]
    pool: ThreadPoolExecutor
    lock: threading.Lock


_RINGS: dict[tuple[int, int], _Ring] = {}
_RINGS_LOCK = threading.Lock()


def _ring(cp: ModuleType, chunk_bytes: int) -> _Ring:
    key = (cp.cuda.Device().id, chunk_bytes)
    with _RINGS_LOCK:
        ring = _RINGS.get(key)
        if ring is None:
            slots = []
            for _ in range(SLOTS):
                buffer = cp.cuda.alloc_pinned_memory(chunk_bytes)
                host = np.frombuffer(buffer, dtype=np.uint8, count=chunk_bytes)
                slots.append(_Slot(buffer, host, cp.cuda.Stream(non_blocking=True)))
            ring = _Ring(slots, ThreadPoolExecutor(SLOTS, thread_name_prefix="sccs-h2d"), threading.Lock())
            _RINGS[key] = ring
    return ring


def reserve(cp: ModuleType, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Allocate (pin) this device's staging buffers now: the worker's warm-up calls it."""
    _ring(cp, chunk_bytes)


def _copy_chunks(cp: ModuleType, device: int, slot: _Slot, source: np.ndarray, target: int,
                 chunks: list[tuple[int, int]]) -> None:
    with cp.cuda.Device(device):
        for start, stop in chunks:
            if slot.done is not None:
                slot.done.synchronize()  # the buffer's previous chunk has reached the device
            size = stop - start
            np.copyto(slot.host[:size], source[start:stop])
            cp.cuda.runtime.memcpyAsync(target + start, slot.buffer.ptr, size, cp.cuda.runtime.memcpyHostToDevice,
                                        slot.stream.ptr)
            slot.done = slot.stream.record()


def to_device(xp: ModuleType, array: Any, chunk_bytes: int = CHUNK_BYTES, min_bytes: int = MIN_RING_BYTES) -> Any:
    """``array`` in the namespace ``xp``: NumPy returns it as an ndarray; CuPy copies a host array of at least
    ``min_bytes`` through the staging ring (smaller ones and device arrays as ``cupy.asarray``)."""
    if is_numpy(xp):
        return to_host(array)
    if not is_numpy(array_namespace(array)):  # on the device already
        return xp.asarray(array)
    host = np.ascontiguousarray(array)
    if host.nbytes < max(min_bytes, 1):
        return xp.asarray(host)
    out = xp.empty(host.shape, dtype=host.dtype)
    # The ring's streams do not follow the current stream: let work queued there on this memory finish first.
    xp.cuda.get_current_stream().synchronize()
    source = host.reshape(-1).view(np.uint8)
    ring = _ring(xp, chunk_bytes)
    chunks = [(start, min(start + chunk_bytes, source.size)) for start in range(0, source.size, chunk_bytes)]
    device = out.device.id
    with ring.lock:  # one transfer at a time through the ring
        count = len(ring.slots)
        work = [ring.pool.submit(_copy_chunks, xp, device, slot, source, out.data.ptr, chunks[k::count])
                for k, slot in enumerate(ring.slots)]
        # Every thread and every queued copy ends before the ring is released (or ``out`` freed, on an error):
        # a later transfer must never share a staging buffer with a copy still in flight.
        wait(work)
        for slot in ring.slots:
            slot.stream.synchronize()
            slot.done = None
        for future in work:
            future.result()  # re-raise the first failure, now that nothing is in flight
    return out
