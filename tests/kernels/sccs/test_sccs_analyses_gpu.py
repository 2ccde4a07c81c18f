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
