"""CuPy draws the NumPy twin's numbers, through the array code and through the CUDA device functions."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import cuda, rng

pytestmark = pytest.mark.gpu

_DRAW_SOURCE = cuda.kernel_source(__file__, "rng_draw.cu", headers=[cuda.PHILOX_HEADER])


def test_cupy_array_path_matches_numpy() -> None:
    import cupy

    index = np.random.default_rng().integers(0, 2**62, size=100_000, dtype=np.uint64)
    seed, stream = 2**40 + 12345, 2**33 + 7
    for host, device in zip(
        rng.philox4x32(np, seed, stream, index), rng.philox4x32(cupy, seed, stream, cupy.asarray(index)), strict=True
    ):
        assert np.array_equal(host, device.get())
    normal_host = rng.normal(np, seed, stream, index)
    normal_device = rng.normal(cupy, seed, stream, cupy.asarray(index)).get()
    assert np.max(np.abs(normal_host - normal_device)) < 1e-13


def test_cuda_device_functions_match_numpy() -> None:
    import cupy

    kernel = cuda.function(_DRAW_SOURCE, "draw")
    n = 100_003
    index = np.random.default_rng().integers(0, 2**62, size=n, dtype=np.uint64)
    seed, stream = 987654321987, 5
    outputs = [cupy.full(n, np.nan) for _ in range(3)]
    kernel(
        ((n + 255) // 256,), (256,), (np.uint64(seed), np.uint64(stream), cupy.asarray(index), np.int32(n), *outputs)
    )
    uniform, normal, sign = (array.get() for array in outputs)
    assert np.array_equal(uniform, rng.uniform(np, seed, stream, index))
    assert np.array_equal(sign, rng.rademacher(np, seed, stream, index))
    assert np.max(np.abs(normal - rng.normal(np, seed, stream, index))) < 1e-13


def test_registered_streams_reach_cuda_as_defines() -> None:
    import cupy

    out = cupy.zeros(3, dtype=cupy.uint64)
    cuda.function(_DRAW_SOURCE, "stream_numbers")((1,), (1,), (out,))
    expected = [rng.STREAMS[name] for name in ("CRVE_WEIGHTS", "SCCS_BOOTSTRAP", "KS_TEST_IDIOSYNCRATIC")]
    assert out.get().tolist() == expected
