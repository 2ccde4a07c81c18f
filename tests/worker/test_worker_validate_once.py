"""A worker's run of a job rebuilds its params model from the stored params once and hands that model on: to
the CPU work cap, to the fan-out's plan and to the kind's runner (crve_bootstrap's formula parsed once, by that
validation, and never again before the design is built)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import SMALL, _clear_caches, load, submit

from kernels.crve.spec import BootstrapParams, MonteCarloParams
from kernels.spec import JobParams
from tests.formula_parses import count_parses
from worker.execute import execute_job

BOOTSTRAP = {"synthetic": {"n_obs": 300, "n_clusters": 12, "n_regressors": 2, "n_fe": 3, "seed": 2},
             "formula": "y ~ x1 + x2 | fe", "cluster": "cluster", "param": "x1", "reps": 99, "seed": 3}


@pytest.fixture
def every_path(stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's checks that read params all on: a CPU cap for both kinds (far above these jobs) and fan-out
    (these jobs are too small for it, so their plans are made and run whole)."""
    monkeypatch.setenv("GPUEST_CPU_MAX_WORK", '{"crve_montecarlo": 1e15, "crve_bootstrap": 1e15}')
    monkeypatch.setenv("GPUEST_FANOUT_CHUNKS", "4")
    _clear_caches()


def count_validations(monkeypatch: pytest.MonkeyPatch, model: type[JobParams]) -> list[Any]:
    """The objects ``model.model_validate`` is called with from here on."""
    original = model.model_validate
    calls: list[Any] = []

    def counting(cls: type[JobParams], obj: Any, *args: Any, **kwargs: Any) -> JobParams:
        calls.append(obj)
        return original(obj, *args, **kwargs)

    monkeypatch.setattr(model, "model_validate", classmethod(counting))
    return calls


def test_a_run_rebuilds_the_params_once(every_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = submit(SMALL)
    validations = count_validations(monkeypatch, MonteCarloParams)
    assert execute_job(job_id, worker="w1") == "succeeded"
    assert validations == [SMALL]
    assert load(job_id).result is not None


def test_a_bootstrap_run_parses_its_formula_once(every_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = submit(BOOTSTRAP, kind="crve_bootstrap")
    validations = count_validations(monkeypatch, BootstrapParams)
    parses = count_parses(monkeypatch)
    assert execute_job(job_id, worker="w1") == "succeeded", load(job_id).error
    assert len(validations) == 1 and parses == [BOOTSTRAP["formula"]]
    result = load(job_id).result
    assert result is not None and result["reps"] == BOOTSTRAP["reps"] and result["param"] == "x1"
