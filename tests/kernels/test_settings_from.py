"""Kernels' settings made from a job's params by name (kernels.spec.settings_from): every setting named like a
params field takes its value, nothing else is copied, and what the run passes wins."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kernels.crve.bootstrap import BootstrapOptions
from kernels.crve.spec import BootstrapParams
from kernels.dualcontrol.bellman import MinimiserSettings
from kernels.dualcontrol.solve import SolveSettings
from kernels.dualcontrol.spec import DualControlParams
from kernels.sccs.ccd import FitOptions
from kernels.sccs.spec import SccsParams
from kernels.spec import JobParams, settings_from


class _Section(JobParams):
    depth: int = 3
    name: str = "section"


class _Params(JobParams):
    tolerance: float = 1e-3
    label: str = "params"
    section: _Section = _Section()


@dataclasses.dataclass(frozen=True)
class _Settings:
    tolerance: float = 1.0
    depth: int = 0
    label: str = "default"
    scale: float = 2.0


def test_settings_take_the_params_fields_of_their_names() -> None:
    params = _Params(tolerance=0.25, label="job", section=_Section(depth=7))
    assert settings_from(_Settings, params) == _Settings(tolerance=0.25, label="job")
    assert settings_from(_Settings, params, "section") == _Settings(tolerance=0.25, depth=7, label="job")
    assert settings_from(_Settings, params, exclude=("label",), scale=5.0) == _Settings(tolerance=0.25, scale=5.0)
    assert settings_from(_Settings, params, label="run") == _Settings(tolerance=0.25, label="run")


def test_bootstrap_options_copy_every_option_a_job_names() -> None:
    params = BootstrapParams.model_validate({
        "synthetic": {"n_obs": 200, "n_clusters": 10}, "formula": "y ~ x1 + x2", "cluster": "cluster", "param": "x1",
        "r": 0.5, "reps": 499, "weights_type": "webb", "impose_null": False, "p_val_type": ">", "conf_int": False,
        "sign_level": 0.1, "ssc": False, "fixef_method": "map", "fixef_tol": 1e-6, "fixef_maxiter": 50,
        "bootstrap_type": "31", "seed": 9,
    })
    options = BootstrapOptions.from_params(params, block_elements=1_000)
    assert options == BootstrapOptions(
        reps=499, weights_type="webb", impose_null=False, p_val_type=">", conf_int=False, sign_level=0.1, ssc=False,
        seed=9, block_elements=1_000, fixef_method="map", fixef_tol=1e-6, fixef_maxiter=50, bootstrap_type="31",
    )
    assert (options.param, options.r) == (None, 0.0)  # the job's coefficient is text: its restrictions carry it


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_solve_settings_copy_the_acceleration_and_minimizer_sections(precision: str) -> None:
    params = DualControlParams.model_validate({
        "policy": "optimal", "convergence": "sup_norm", "max_iterations": 77, "quadrature_nodes": 12,
        "precision": precision, "interpolation": "residual", "gpus": 2,
        "acceleration": {"evaluation_sweeps": 5, "coarse_to_fine": False, "coarsest_size": 9,
                         "evaluation": "sweeps", "anderson_memory": 3},
        "minimizer": {"scan_points": 6, "golden_iterations": 11},
    })
    settings = SolveSettings.from_params(params, "myopic", 1e-5)
    assert settings == SolveSettings(
        policy="myopic", tolerance=1e-5, max_iterations=77, evaluation_sweeps=5, coarse_to_fine=False,
        coarsest_size=9, criterion="sup_norm", quadrature_nodes=12,
        dtype=np.float64 if precision == "float64" else np.float32, minimiser=MinimiserSettings(6, 11),
        interpolation="residual", evaluation="sweeps", anderson_memory=3, gpus=2,
    )


def test_fit_options_copy_the_fit_fields() -> None:
    params = SccsParams.model_validate({
        "outcomes_dataset_id": "o", "covariates_dataset_id": "c", "tolerance": 1e-6, "max_iterations": 30,
        "convergence": "gradient", "precision": "float32",
    })
    assert FitOptions.from_params(params) == FitOptions(1e-6, 30, "gradient", "float32")
    assert FitOptions.from_params(params, precision="float64").precision == "float64"
