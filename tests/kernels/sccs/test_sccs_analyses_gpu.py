"""The batch of single-covariate analyses (kernels/sccs/analyses.py) on CuPy equals NumPy: estimates, interval
ends and likelihood ratios to relative 1e-10 (the GPU sums its bincounts in another order)."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from kernels.sccs import synthetic
from kernels.sccs.analyses import single_covariate_fits

pytestmark = pytest.mark.gpu


def test_single_covariate_fits_on_the_gpu_equal_numpy() -> None:
    import cupy

    seed = secrets.randbits(31)
    host = synthetic.generate(np, 20_000, 120, seed=seed, effect_share=0.3).data
    device = synthetic.generate(cupy, 20_000, 120, seed=seed, effect_share=0.3).data
    columns = np.arange(120)
    on_host, on_device = single_covariate_fits(host, columns), single_covariate_fits(device, columns)
    for name in ("estimate", "lower", "upper", "log_likelihood_ratio", "p_value"):
        expected, got = getattr(on_host, name), getattr(on_device, name)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected), err_msg=f"{name}, seed {seed}")
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12, err_msg=f"{name}, seed {seed}")


def _bytes(fits) -> list[bytes]:
    return [np.ascontiguousarray(getattr(fits, name)).tobytes()
            for name in ("estimate", "lower", "upper", "log_likelihood_ratio", "p_value")]


def test_an_analysis_has_the_same_bits_on_the_gpu_twice_and_in_any_group_of_analyses() -> None:
    # Every sum adds one analysis's own terms in a fixed order (no atomics), so a fanned-out job's parts
    # (kernels/sccs/analyses_chunks.py) give the single run's bits: here all 90 analyses at once, again, and as
    # three groups of other sizes in another order, with a real-valued covariate column among them.
    import cupy

    seed = secrets.randbits(31)
    data = synthetic.generate(cupy, 30_000, 90, seed=seed, effect_share=0.3).data
    data.col_values[: data.col_values.size // 3] *= 1.5
    columns = np.arange(90)
    whole, again = single_covariate_fits(data, columns), single_covariate_fits(data, columns)
    assert _bytes(whole) == _bytes(again), f"seed {seed}"
    groups = [columns[50:], columns[:7], columns[7:50]]
    parts = [single_covariate_fits(data, group) for group in groups]
    order = np.concatenate(groups)
    for name, expected in zip(("estimate", "lower", "upper", "log_likelihood_ratio", "p_value"), _bytes(whole),
                              strict=True):
        joined = np.empty(90)
        joined[order] = np.concatenate([getattr(part, name) for part in parts])
        assert joined.tobytes() == expected, f"{name}, seed {seed}"
