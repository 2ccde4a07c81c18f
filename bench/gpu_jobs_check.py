"""Every job kind run end to end through its runner (params model -> run -> result JSON), once on NumPy and
once on the GPU, with the results compared leaf by leaf. Run on the device machine with the web-free part of
the dependencies carried as wheels (pydantic; pandas and formulaic are there): ``python3 bench/gpu_jobs_check.py``.
The worst leaf is the one nearest its tolerance.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

import numpy as np
import pandas as pd

from kernels.progress import LocalProgress
from kernels.registry import get_kind

TOLERANCE = 1e-9
# Residuals at a converged optimum (a KKT gradient norm) are small differences of large sums: their relative
# error is the sums' rounding divided by the residual, so they are held to the sums' scale instead.
RESIDUAL_TOLERANCE = 1e-6
RESIDUAL_KEYS = {"gradient_norm"}
SKIPPED_KEYS = {"timings", "device", "artifacts", "seconds"}  # seconds: per-level wall times


def _sccs_tables() -> dict[str, pd.DataFrame]:
    from kernels.sccs.synthetic import generate, to_tables

    tables = to_tables(generate(np, n_cases=3_000, n_drugs=40, seed=5).data)
    outcomes = pd.DataFrame(
        {"rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time, "y": tables.y}
    )
    covariates = pd.DataFrame(
        {"rowId": tables.cov_row_id, "covariateId": tables.cov_id, "covariateValue": tables.cov_value}
    )
    return {"outcomes_dataset_id": outcomes, "covariates_dataset_id": covariates}


CASES: list[tuple[str, dict[str, Any], Any]] = [
    (
        "crve_montecarlo",
        {"n_clusters": 30, "cluster_size": 20, "n_regressors": 4, "replications": 2_000, "seed": 3},
        dict,
    ),
    (
        "crve_montecarlo",
        {
            "n_clusters": 20,
            "cluster_size": 10,
            "n_regressors": 3,
            "replications": 200,
            "seed": 4,
            "test": "wild_bootstrap",
            "bootstrap_reps": 199,
        },
        dict,
    ),
    (
        "crve_bootstrap",
        {
            "synthetic": {"n_obs": 20_000, "n_clusters": 40, "n_regressors": 3, "seed": 1},
            "formula": "y ~ x1 + x2 + x3",
            "cluster": "cluster",
            "param": "x1",
            "reps": 9_999,
            "r": 0.1,
            "seed": 2,
        },
        dict,
    ),
    (
        "crve_bootstrap",
        {
            "synthetic": {"n_obs": 5_000, "n_clusters": 12, "n_regressors": 2, "seed": 3},
            "formula": "y ~ x1 + x2",
            "cluster": "cluster",
            "param": "x2",
            "reps": 9_999,
        },
        dict,
    ),
    (
        "sccs_fit",
        {
            "outcomes_dataset_id": "o",
            "covariates_dataset_id": "c",
            "prior": {"type": "laplace", "variance": 0.5, "exclude": []},
            "cross_validation": {"folds": 5, "grid": [0.01, 0.1, 1.0], "seed": 1},
            "bootstrap": {"replicates": 20, "seed": 2},
        },
        _sccs_tables,
    ),
    (
        "ks_solve",
        {
            "n_agents": 10_000,
            "periods": 600,
            "burn_in": 100,
            "max_iterations": 3,
            "k_grid": {"size": 100},
            "K_grid": {"size": 4},
            "seed": 7,
        },
        dict,
    ),
    (
        "dualcontrol_solve",
        {
            "policy": "optimal",
            "quadrature_nodes": 12,
            "tolerance": 1e-4,
            "grid": {
                "x": {"size": 12, "min": -9.0, "max": 11.0},
                "mu": {"size": 12, "min": -4.0, "max": 4.0},
                "sigma": {"size": 12, "min": 0.02, "max": 2.0},
                "concentration": 2.0,
            },
            "report_states": [[1.0, 0.5, 0.5]],
        },
        dict,
    ),
]


def _compare(left: Any, right: Any, path: str, worst: list[tuple[float, float, str]]) -> None:
    if isinstance(left, dict):
        assert set(left) == set(right), f"{path}: keys differ {set(left) ^ set(right)}"
        for key in left:
            if key not in SKIPPED_KEYS:
                _compare(left[key], right[key], f"{path}.{key}", worst)
    elif isinstance(left, list):
        assert len(left) == len(right), f"{path}: lengths differ"
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            _compare(a, b, f"{path}[{index}]", worst)
    elif isinstance(left, float) and isinstance(right, float):
        if math.isnan(left) or math.isnan(right):
            assert math.isnan(left) and math.isnan(right), f"{path}: {left} vs {right}"
            return
        error = abs(left - right) / max(abs(left), abs(right), 1e-300) if left != right else 0.0
        limit = RESIDUAL_TOLERANCE if path.rsplit(".", 1)[-1] in RESIDUAL_KEYS else TOLERANCE
        worst.append((error / limit, error, path))
    else:
        assert left == right, f"{path}: {left!r} vs {right!r}"


def run(kind_name: str, params: dict[str, Any], data: dict[str, Any], device: str) -> tuple[dict[str, Any], float]:
    os.environ["GPUEST_DEVICE"] = device
    kind = get_kind(kind_name)
    started = time.perf_counter()
    result = kind.run(kind.params_model.model_validate(params), data, LocalProgress())
    return result, time.perf_counter() - started


def main() -> int:
    failures = 0
    print(f"{'kind':<18} {'cpu s':>8} {'gpu s':>8} {'gpu device':<24} {'max rel diff':>12}  worst leaf")
    for kind_name, params, make_data in CASES:
        data = make_data()
        cpu, cpu_seconds = run(kind_name, params, data, "cpu")
        gpu, gpu_seconds = run(kind_name, params, data, "gpu")
        worst: list[tuple[float, float, str]] = []
        try:
            _compare(cpu, gpu, kind_name, worst)
            share, error, leaf = max(worst) if worst else (0.0, 0.0, "-")
            ok = share < 1.0 and cpu["device"] == "cpu" and gpu["device"] != "cpu"
        except AssertionError as exc:
            error, leaf, ok = float("inf"), str(exc)[:80], False
        failures += not ok
        print(
            f"{kind_name:<18} {cpu_seconds:8.2f} {gpu_seconds:8.2f} {gpu['device'][:24]:<24} {error:12.2e}  "
            f"{leaf[:70]} {'' if ok else 'FAIL'}"
        )
    print(
        f"{len(CASES) - failures} of {len(CASES)} job runs agree (GPU vs NumPy, relative {TOLERANCE:g}; "
        f"{RESIDUAL_TOLERANCE:g} for {sorted(RESIDUAL_KEYS)})"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
