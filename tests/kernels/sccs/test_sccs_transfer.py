"""Host arrays to the device through the pinned staging ring: every byte arrives, whatever the chunking.

GPU only: on NumPy ``to_device`` is ``np.asarray`` and has nothing to test."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from kernels.backend import get_namespace, to_host
from kernels.sccs import transfer

pytestmark = pytest.mark.gpu


@pytest.fixture
def xp() -> ModuleType:
    return get_namespace("gpu")


def _values(dtype: type, size: int) -> np.ndarray:
    g = np.random.default_rng(size)
    if np.dtype(dtype).kind in "iub":
        return g.integers(-(10**9), 10**9, size).astype(dtype)
    return g.standard_normal(size).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int64, np.float64, np.int32, np.bool_, np.uint8])
@pytest.mark.parametrize("size", [1, 1000, 4097, 50_003])
def test_every_byte_arrives_in_chunks(xp: ModuleType, dtype: type, size: int) -> None:
    host = _values(dtype, size)
    moved = transfer.to_device(xp, host, chunk_bytes=4096, min_bytes=0)  # many chunks, a short last one
    assert to_host(moved).dtype == host.dtype and moved.shape == host.shape
    np.testing.assert_array_equal(to_host(moved), host)


def test_strided_and_two_dimensional_arrays_and_the_small_path(xp: ModuleType) -> None:
    host = _values(np.float64, 30_000)
    np.testing.assert_array_equal(to_host(transfer.to_device(xp, host[::3], chunk_bytes=4096, min_bytes=0)),
                                  host[::3])
    square = host[:22_500].reshape(150, 150)
    np.testing.assert_array_equal(to_host(transfer.to_device(xp, square, chunk_bytes=4096, min_bytes=0)), square)
    np.testing.assert_array_equal(to_host(transfer.to_device(xp, host)), host)  # below min_bytes: asarray
    again = transfer.to_device(xp, host, chunk_bytes=4096, min_bytes=0)
    assert transfer.to_device(xp, again) is again  # already in the namespace: no copy


def test_ring_transfers_back_to_back_keep_their_data() -> None:
    import cupy

    arrays = [_values(np.int64, 100_000 + k) for k in range(6)]
    moved = [transfer.to_device(cupy, a, chunk_bytes=1 << 16, min_bytes=0) for a in arrays]
    # Kernels on the current stream read what the ring's streams wrote: each array equal element by element.
    assert all(bool((m == cupy.asarray(a)).all()) for m, a in zip(moved, arrays, strict=True))
