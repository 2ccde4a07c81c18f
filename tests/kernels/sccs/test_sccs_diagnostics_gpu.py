"""The diagnostics' device part (the per-covariate exposure statistics, computed where the data lives) on CuPy
equals NumPy, and a whole sccs_fit job with every diagnostic gives the same diagnostics on the GPU as on
NumPy (issue 15, item 3)."""

from __future__ import annotations

import secrets

import numpy as np
import pandas as pd
import pytest

from kernels.context import local_context, run_kind
from kernels.registry import get_kind
from kernels.sccs import diagnostics as diag
from kernels.sccs import synthetic
from kernels.sccs.examples import cyclops_frames
from kernels.sccs.tables import load_tables

pytestmark = pytest.mark.gpu


def test_exposure_statistics_on_the_gpu_equal_numpy() -> None:
    import cupy

    seed = secrets.randbits(31)
    host = synthetic.generate(np, 5000, 60, seed=seed).data
    device = synthetic.generate(cupy, 5000, 60, seed=seed).data
    on_host, on_device = diag.exposure_statistics(host), diag.exposure_statistics(device)
    np.testing.assert_array_equal(on_device.exposed_cases, on_host.exposed_cases, err_msg=f"seed {seed}")
    for name in ("time_exposed", "time_total", "events"):
        np.testing.assert_allclose(getattr(on_device, name), getattr(on_host, name), rtol=1e-13,
                                   err_msg=f"{name}, seed {seed}")


def test_exposure_statistics_on_the_gpu_are_exact_twice_and_zero_for_a_column_without_eras() -> None:
    # Sums of whole days and event counts: exact in any order, so the device's fixed-order segment sums equal
    # NumPy's bit for bit; covariate 99's only eras belong to a case without events (dropped), so its column is
    # empty and every statistic of it is 0.
    import cupy

    frames = cyclops_frames(n_cases=2000, n_drugs=30, seed=5)
    outcomes, covariates = frames["outcomes_dataset_id"], frames["covariates_dataset_id"]
    outcomes = pd.concat([outcomes, pd.DataFrame({"rowId": [10**9], "stratumId": [10**9], "time": [30.0],
                                                  "y": [0.0]})], ignore_index=True)
    covariates = pd.concat([covariates, pd.DataFrame({"rowId": [10**9], "covariateId": [99],
                                                      "covariateValue": [1.0]})], ignore_index=True)
    host = load_tables(outcomes, covariates).data
    device = load_tables(outcomes, covariates, xp=cupy).data
    on_host = diag.exposure_statistics(host)
    first, second = diag.exposure_statistics(device), diag.exposure_statistics(device)
    column = int(np.flatnonzero(host.covariate_ids == 99)[0])
    for name in ("exposed_cases", "time_exposed", "time_total", "events"):
        assert getattr(first, name).tobytes() == getattr(on_host, name).tobytes() == getattr(second, name).tobytes()
        assert getattr(first, name)[column] == 0


def test_fit_job_diagnostics_on_the_gpu_equal_numpy() -> None:
    frames = cyclops_frames(n_cases=3000, n_drugs=20, seed=8)
    params = {"outcomes_dataset_id": "o", "covariates_dataset_id": "c", "prior": {"type": "normal", "variance": 1.0},
              "diagnostics": {"pre_exposure_covariates": [2, 3], "end_of_observation_covariate": 4}}
    host = run_kind(get_kind("sccs_fit"), params, local_context(device="cpu", datasets=frames))
    device = run_kind(get_kind("sccs_fit"), params, local_context(device="gpu", datasets=frames))
    assert device["device"] != "cpu"
    for host_row, device_row in zip(host["diagnostics"]["mdrr"], device["diagnostics"]["mdrr"], strict=True):
        assert device_row.keys() == host_row.keys()
        for key, value in host_row.items():
            assert device_row[key] == (value if value is None or isinstance(value, bool | int)
                                       else pytest.approx(value, rel=1e-12)), key
    def windows(result: dict) -> list[dict]:
        return [*result["diagnostics"]["pre_exposure"], result["diagnostics"]["end_of_observation"]]

    for host_check, device_check in zip(windows(host), windows(device), strict=True):
        assert device_check["passed"] == host_check["passed"]
        for key in ("ratio", "ci_lower", "ci_upper"):
            assert device_check[key] == pytest.approx(host_check[key], rel=1e-6), key
